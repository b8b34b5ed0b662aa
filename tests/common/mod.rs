//! Shared helpers for the GPU integration tests: one device per test binary, seeded random data, and
//! max-abs-difference reporting.
#![allow(dead_code)]

pub mod cpu;
pub mod fidelity;
pub mod fixtures;
#[cfg(not(target_arch = "wasm32"))]
pub mod hub;

use std::sync::{Arc, OnceLock};

use florence2_wasm::gpu::{Device, DeviceOptions};

/// The test device (lavapipe in CI). Opened once per test binary.
pub fn gpu() -> Arc<Device> {
    static GPU: OnceLock<Arc<Device>> = OnceLock::new();
    GPU.get_or_init(|| {
        let g = pollster::block_on(Device::new(DeviceOptions::default()))
            .expect("a GPU adapter (lavapipe)");
        eprintln!("test adapter: {}", g.describe());
        g
    })
    .clone()
}

/// A small deterministic PRNG (xorshift64*), so tests need no extra crates and every run sees the same
/// data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// Max |a - b| and max |b| (the "peak" the difference is judged against).
pub fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let mut d = 0f32;
    let mut peak = 0f32;
    for (x, y) in a.iter().zip(b) {
        d = d.max((x - y).abs());
        peak = peak.max(y.abs());
    }
    (d, peak)
}

/// Assert `got` is within `tol` (absolute) of `want`, printing the max difference either way.
pub fn assert_close(name: &str, got: &[f32], want: &[f32], tol: f32) {
    let (d, peak) = max_diff(got, want);
    eprintln!("{name}: max |diff| = {d:.3e} (peak {peak:.3e}, tol {tol:.1e})");
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{name}: non-finite output"
    );
    assert!(d <= tol, "{name}: max |diff| {d:e} > tol {tol:e}");
}

/// Upload f32 data.
pub fn tf32(g: &Arc<Device>, shape: &[usize], data: &[f32]) -> florence2_wasm::gpu::Tensor {
    florence2_wasm::gpu::Tensor::from_f32(g, shape, data, "test-in").unwrap()
}

/// Upload u32 data.
pub fn tu32(g: &Arc<Device>, shape: &[usize], data: &[u32]) -> florence2_wasm::gpu::Tensor {
    florence2_wasm::gpu::Tensor::from_u32(g, shape, data, "test-in").unwrap()
}

/// A zero f32 tensor.
pub fn zf32(g: &Arc<Device>, shape: &[usize]) -> florence2_wasm::gpu::Tensor {
    florence2_wasm::gpu::Tensor::zeros(g, shape, florence2_wasm::gpu::DType::F32, "test-out")
        .unwrap()
}

/// A zero u32 tensor.
pub fn zu32(g: &Arc<Device>, shape: &[usize]) -> florence2_wasm::gpu::Tensor {
    florence2_wasm::gpu::Tensor::zeros(g, shape, florence2_wasm::gpu::DType::U32, "test-out")
        .unwrap()
}

/// Record with `f`, submit, and read `out` back as f32.
pub fn run_f32(
    g: &Arc<Device>,
    out: &florence2_wasm::gpu::Tensor,
    f: impl FnOnce(&mut florence2_wasm::gpu::Recorder),
) -> Vec<f32> {
    let mut rec = florence2_wasm::gpu::Recorder::new(g);
    f(&mut rec);
    rec.submit().unwrap();
    florence2_wasm::gpu::readback::to_f32_blocking(g, out).unwrap()
}

/// Assert an op failed with `Error::Shape` for `op`.
pub fn assert_shape_err(res: florence2_wasm::Result<()>, op: &str) {
    match res {
        Err(florence2_wasm::Error::Shape { op: o, msg }) if o == op => {
            eprintln!("{op}: rejected as expected: {msg}")
        }
        other => panic!("{op}: expected Error::Shape, got {other:?}"),
    }
}

/// `sh -c script` in a private mount namespace (`unshare --mount`; as root, else also in a user
/// namespace mapped to root), where a test can mount a small tmpfs that nothing outside it sees.
pub fn in_mount_namespace(script: &str) -> std::process::Command {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    let mut un = std::process::Command::new("unshare");
    if !root {
        un.args(["--user", "--map-root-user"]);
    }
    un.args(["--mount", "sh", "-c", script]);
    un
}
