//! `--profile` on the CPU backend: each op a launcher runs on the host comes back as one entry, named
//! `cpu:OP`, labelled with the recorder's phase and its operands' shapes, with the wall time it took.

use florence2_wasm::gpu::{profile, DType, Device, Recorder, Tensor};
use florence2_wasm::ops::{matmul, norm};

#[test]
fn host_ops_are_timed_one_entry_each() {
    let g = Device::cpu(2);
    g.profiler.enable(&g, true).unwrap();
    let (m, n, k) = (9, 20, 32);
    let x = Tensor::zeros(&g, &[m, k], DType::F32, "x").unwrap();
    let w = Tensor::zeros(&g, &[n, k], DType::F16, "w").unwrap();
    let out = Tensor::zeros(&g, &[m, n], DType::F32, "out").unwrap();
    let gamma = Tensor::zeros(&g, &[n], DType::F32, "gamma").unwrap();
    let mut rec = Recorder::new(&g);
    assert!(rec.profiling());
    rec.set_phase("test");
    let args = matmul::LinearArgs::default();
    matmul::linear(&mut rec, &x, &w, args, &out).unwrap();
    norm::layer_norm(&mut rec, &out, &gamma, &gamma, 1e-5, &out).unwrap();
    let entries = pollster::block_on(g.profiler.take(&g)).unwrap();
    eprint!("{}", profile::table(&entries));
    let ops: Vec<_> = entries
        .iter()
        .map(|e| (e.op.as_str(), e.shape.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("cpu:linear", "[9, 32] [20, 32] F16"),
            ("cpu:layer_norm", "[9, 20]")
        ]
    );
    assert!(entries
        .iter()
        .all(|e| e.phase == "test" && e.ms.is_finite() && e.ms >= 0.0));
    // Off again: a new recorder times nothing, and nothing is left to take.
    g.profiler.enable(&g, false).unwrap();
    let mut rec = Recorder::new(&g);
    assert!(!rec.profiling());
    matmul::linear(&mut rec, &x, &w, args, &out).unwrap();
    assert!(pollster::block_on(g.profiler.take(&g)).unwrap().is_empty());
}
