//! Element-wise kernels against plain Rust. Exact in f32: one rounding per element on both sides.
mod common;

use common::{assert_close, gpu, Rng};
use florence2_wasm::gpu::{readback, Recorder, Tensor};
use florence2_wasm::ops;

#[test]
fn add_matches_cpu_including_odd_and_large_sizes() {
    let g = gpu();
    let mut rng = Rng::new(1);
    // 1 element, a non-multiple of the workgroup, and more than 65535 workgroups' worth (grid folding).
    for n in [1usize, 1000, 256 * 65536 + 3] {
        let a = rng.vec(n, 1.0);
        let b = rng.vec(n, 1.0);
        let ta = Tensor::from_f32(&g, &[n], &a, "a").unwrap();
        let tb = Tensor::from_f32(&g, &[n], &b, "b").unwrap();
        let to = Tensor::zeros(&g, &[n], florence2_wasm::gpu::DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&g);
        ops::elementwise::add(&mut rec, &ta, &tb, &to).unwrap();
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(&g, &to).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_close(&format!("add n={n}"), &got, &want, 0.0);
    }
}

#[test]
fn add_rejects_mismatched_shapes() {
    let g = gpu();
    let a = Tensor::zeros(&g, &[4], florence2_wasm::gpu::DType::F32, "a").unwrap();
    let b = Tensor::zeros(&g, &[5], florence2_wasm::gpu::DType::F32, "b").unwrap();
    let mut rec = Recorder::new(&g);
    let err = ops::elementwise::add(&mut rec, &a, &b, &a).unwrap_err();
    assert!(
        matches!(err, florence2_wasm::Error::Shape { op: "add", .. }),
        "{err}"
    );
}
