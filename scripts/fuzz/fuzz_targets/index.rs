//! model.safetensors.index.json parsing on arbitrary bytes: no panic; every accepted shard name is a plain
//! relative name. Allocation bound: 64 n + 1 MiB.
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::weights::source::check_relative_name;
use florence2_wasm::weights::CheckpointIndex;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

fuzz_target!(|data: &[u8]| {
    let (_, peak) = common::peak_during(|| {
        if let Ok(idx) = CheckpointIndex::parse(data) {
            for s in &idx.shards {
                assert!(check_relative_name(s), "{s:?}");
                let _ = idx.names_in(s).count();
            }
        }
    });
    common::check_bound("index", data.len(), peak, 64, 1 << 20);
});
