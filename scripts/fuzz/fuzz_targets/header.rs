//! Safetensors header parser on arbitrary bytes (a whole or partial file): no panic; `NeedMore` only asks
//! for bytes past the prefix; a parsed header's ranges tile its data section; the file-length check never
//! overflows. Allocation bound: 64 n + 1 MiB (the JSON tree of the header, at most the input).
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::weights::{parse_header, HeaderState};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

fuzz_target!(|data: &[u8]| {
    let (_, peak) = common::peak_during(|| match parse_header(data, "fuzz.safetensors") {
        Ok(HeaderState::NeedMore(n)) => assert!(n > data.len() as u64),
        Ok(HeaderState::Done(h)) => {
            let mut pos = 0;
            for t in &h.tensors {
                assert_eq!(t.start, pos);
                assert!(t.end >= t.start);
                assert_eq!(
                    t.byte_len(),
                    t.numel() as u64 * t.dtype.size() as u64,
                    "{}",
                    t.name
                );
                pos = t.end;
            }
            assert_eq!(pos, h.data_len);
            let _ = h.check_file_len("fuzz.safetensors", data.len() as u64);
            let _ = h.check_file_len("fuzz.safetensors", u64::MAX);
        }
        Err(_) => {}
    });
    common::check_bound("header", data.len(), peak, 64, 1 << 20);
});
