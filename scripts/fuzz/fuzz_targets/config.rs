//! config.json parsing on arbitrary text: no panic; an accepted config is inside every stated cost bound
//! (its expected-tensor table is small and its parameter count at most MAX_PARAMETERS). Allocation bound:
//! 64 n + 16 MiB (the JSON tree, then a table of at most ~25k names).
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::config::{Florence2Config, MAX_PARAMETERS};
use florence2_wasm::config::tensors::expected_tensors;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (_, peak) = common::peak_during(|| {
        if let Ok(cfg) = Florence2Config::from_json_str(text) {
            assert!(cfg.parameter_count() <= MAX_PARAMETERS);
            assert!(expected_tensors(&cfg).len() < 30_000);
            let _ = cfg.feature_grid(768, 768);
        }
    });
    common::check_bound("config", data.len(), peak, 64, 16 << 20);
});
