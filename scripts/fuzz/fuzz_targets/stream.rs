//! The push-style streaming loader fed arbitrary files in arbitrary chunkings (tiny config, lavapipe or any
//! GPU; the device is made once). Differential: the first 8 bytes of the input choose chunk sizes; the
//! rest is the file, streamed both whole and chunked: both must agree on success or failure (and on the
//! error's kind), and neither may panic or hang. Allocation bound (host): 64 n + 64 MiB. The fixed part is
//! wide because the counting allocator also sees wgpu's own allocations, which do not depend on the input
//! (command pools, trackers and pipeline caches growing, other threads): a CI run once measured 21 MB for a
//! 5 KB input that takes 3 ms and allocates far less when rerun alone. An input that makes the loader hold a
//! declared tensor's size in host memory still fails it.
#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::{Arc, OnceLock};

use florence2_wasm::gpu::{Gpu, GpuOptions};
use florence2_wasm::model::config::Florence2Config;
use florence2_wasm::weights::{Assembler, LoadOptions, StreamLoader};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

fn setup() -> &'static (Arc<Gpu>, Florence2Config) {
    static S: OnceLock<(Arc<Gpu>, Florence2Config)> = OnceLock::new();
    S.get_or_init(|| {
        let gpu = pollster::block_on(Gpu::new(GpuOptions::default())).expect("a GPU adapter");
        let cfg = Florence2Config::from_json_str(include_str!("../tiny_config.json"))
            .expect("the tiny config parses");
        (gpu, cfg)
    })
}

fn stream(file: &[u8], sizes: &[usize], known_len: bool) -> Result<(), String> {
    let (gpu, cfg) = setup();
    let mut asm = Assembler::new(gpu, cfg, LoadOptions::default());
    let mut s = StreamLoader::new("model.safetensors", known_len.then_some(file.len() as u64));
    let mut off = 0;
    let mut i = 0;
    while off < file.len() {
        let n = sizes[i % sizes.len()].min(file.len() - off);
        s.feed(&mut asm, &file[off..off + n])
            .map_err(|e| e.name().to_owned())?;
        off += n;
        i += 1;
    }
    s.finish(&mut asm).map_err(|e| e.name().to_owned())?;
    asm.finish().map(|_| ()).map_err(|e| e.name().to_owned())
}

fuzz_target!(|data: &[u8]| {
    let _ = setup();
    if data.len() < 8 {
        return;
    }
    let (head, file) = data.split_at(8);
    let sizes: Vec<usize> = head.iter().map(|&b| 1 + usize::from(b)).collect();
    let known = head[0] & 1 == 1;
    let (_, peak) = common::peak_during(|| {
        let whole = stream(file, &[file.len().max(1)], known);
        let chunked = stream(file, &sizes, known);
        assert_eq!(whole, chunked, "whole vs chunks {sizes:?}");
    });
    common::check_bound("stream", data.len(), peak, 64, 64 << 20);
});
