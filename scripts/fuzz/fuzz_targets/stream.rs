//! The push-style streaming loader fed arbitrary files in arbitrary chunkings (tiny config), into both
//! backends: a GPU (lavapipe or any adapter) and the CPU backend's host memory; the devices are made once.
//! Differential: the first 8 bytes of the input choose chunk sizes (and bits of them the resident dtype
//! and whether the config is the quantized-checkpoint variant, whose `quantization` entry lists the tiny
//! config's matrices with whole 32-weight rows as q8 or q4 `.qweight` tensors); the rest is the file,
//! streamed whole and chunked into the GPU and chunked into the CPU backend: all three must agree on
//! success or failure (and on the error's kind), and none may panic or hang. Allocation bound (host): 64 n + 64 MiB. The fixed part is
//! wide because the counting allocator also sees wgpu's own allocations, which do not depend on the input
//! (command pools, trackers and pipeline caches growing, other threads): a CI run once measured 21 MB for a
//! 5 KB input that takes 3 ms and allocates far less when rerun alone. An input that makes the loader hold a
//! declared tensor's size in host memory still fails it.
#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::{Arc, OnceLock};

use florence2_wasm::gpu::{Device, DeviceOptions};
use florence2_wasm::config::Florence2Config;
use florence2_wasm::weights::{Assembler, LoadOptions, StreamLoader, WeightDType};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

/// The tiny config's matrices whose rows are whole 32-weight blocks (the ones a quantized checkpoint
/// stores as `.qweight`).
pub const QUANTIZED: [&str; 3] = [
    "model.language_model.decoder.layers.0.fc2.weight",
    "model.language_model.decoder.layers.1.fc2.weight",
    "model.vision_tower.blocks.0.0.spatial_block.ffn.fc2.weight",
];

struct Setup {
    /// [the GPU, the CPU backend]
    devices: [Arc<Device>; 2],
    /// The tiny config, and the same with q8 / q4 `quantization` entries.
    cfgs: [Florence2Config; 3],
}

fn setup() -> &'static Setup {
    static S: OnceLock<Setup> = OnceLock::new();
    S.get_or_init(|| {
        let gpu = pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter");
        let text = include_str!("../tiny_config.json");
        let plain = Florence2Config::from_json_str(text).expect("the tiny config parses");
        let quantized = |bits: u32| {
            let mut v: serde_json::Value = serde_json::from_str(text).expect("JSON");
            v["quantization"] = serde_json::json!({"format": "florence2-wasm-block", "bits": bits,
                "block_size": 32, "scale_dtype": "float16", "tensors": QUANTIZED});
            Florence2Config::from_json(&v).expect("the quantized tiny config parses")
        };
        Setup {
            devices: [gpu, Device::cpu(1)],
            cfgs: [plain, quantized(8), quantized(4)],
        }
    })
}

fn stream(
    device: usize,
    file: &[u8],
    sizes: &[usize],
    known_len: bool,
    cfg: usize,
    dtype: WeightDType,
) -> Result<(), String> {
    let s = setup();
    let (gpu, cfg) = (&s.devices[device], &s.cfgs[cfg]);
    let mut asm = Assembler::new(gpu, cfg, LoadOptions::with_dtype(dtype));
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
    // Bits of the chunk sizes also pick the config (plain, q8 or q4 checkpoint) and the resident dtype.
    let cfg = usize::from(head[1] % 3);
    let dtype = WeightDType::ALL[usize::from(head[2] % 4)];
    let (_, peak) = common::peak_during(|| {
        let whole = stream(0, file, &[file.len().max(1)], known, cfg, dtype);
        let chunked = stream(0, file, &sizes, known, cfg, dtype);
        assert_eq!(whole, chunked, "whole vs chunks {sizes:?}");
        let host = stream(1, file, &sizes, known, cfg, dtype);
        assert_eq!(whole, host, "GPU vs CPU backend, chunks {sizes:?}");
    });
    common::check_bound("stream", data.len(), peak, 64, 64 << 20);
});
