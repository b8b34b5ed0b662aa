//! The reference suite: tests that read reference data kept OUTSIDE the repository (`../shared/reference`
//! beside the clone, or `$FLORENCE2_REFERENCE_DIR`): the verified real Florence-2 tokenizer, the key list of
//! a real HF-native base checkpoint and the original -> HF-native key mapping. That data may not be copied
//! into the repository, so these tests are one separate target, built only with the `reference-data`
//! feature:
//!
//! ```sh
//! cargo test --features reference-data --test reference
//! ```
//!
//! `scripts/test.sh` runs it when the directory exists and otherwise prints that it was NOT run;
//! `.ci/run` sets `FLORENCE2_REQUIRE_REFERENCE=1`, which makes a missing directory a failure. Inside the
//! suite a missing file is a failure, never a skip. No other test reads outside the repository.
#![cfg(not(target_arch = "wasm32"))]

#[path = "../weights_util/mod.rs"]
mod weights_util;

mod expected;
mod layouts;
mod stream;
mod tokenizer;

pub use weights_util::reference_file;
