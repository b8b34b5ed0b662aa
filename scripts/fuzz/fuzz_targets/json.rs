//! Strict JSON (duplicate keys refused) against serde_json's own Value parser: where serde_json fails,
//! strict fails; where strict succeeds, both agree exactly; strict fails on a success of serde_json only
//! for a duplicate key. Allocation bound: 64 n + 64 KiB.
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::json::parse_strict;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (_, peak) = common::peak_during(|| {
        let plain: Result<serde_json::Value, _> = serde_json::from_str(text);
        match (parse_strict(text), plain) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Ok(_), Err(e)) => panic!("strict accepted what serde_json refused: {e}"),
            (Err(e), Ok(_)) => assert!(e.to_string().contains("duplicate key"), "{e}"),
            (Err(_), Err(_)) => {}
        }
    });
    common::check_bound("json", data.len(), peak, 64, 64 << 10);
});
