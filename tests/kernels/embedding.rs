//! Embedding gather against a CPU gather. A gather copies values: bit-exact (tolerance 0).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::sync::Arc;

use common::cpu::embedding_ref;
use common::{assert_close, assert_shape_err, gpu, run_f32, tf32, tu32, zf32, Rng};
use florence2_wasm::gpu::{Device, DeviceOptions, Recorder};
use florence2_wasm::ops;

fn case(g: &Arc<Device>, v: usize, c: usize, ids: &[u32], seed: u64) {
    let mut rng = Rng::new(seed);
    let table = rng.vec(v * c, 1.0);
    let want = embedding_ref(ids, &table, c);
    let tt = tf32(g, &[v, c], &table);
    let ti = tu32(g, &[ids.len()], ids);
    // Pre-fill out with garbage so zero rows for out-of-range ids are really written.
    let to = tf32(g, &[ids.len(), c], &vec![7.0; ids.len() * c]);
    let chunks = tt.row_chunks(g, c).unwrap().len();
    let got = run_f32(g, &to, |r| {
        ops::embedding::embedding(r, &ti, &tt, &to).unwrap()
    });
    assert_close(
        &format!("embedding V={v} C={c} T={} ({chunks} chunks)", ids.len()),
        &got,
        &want,
        0.0,
    );
}

#[test]
fn embedding_matches_cpu() {
    let g = gpu();
    case(
        &g,
        50,
        37,
        &[0, 49, 3, 3, 17, 50, 1_000_000, u32::MAX, 25],
        41,
    );
    case(&g, 1, 1, &[0], 42); // degenerate: 1 row, 1 column, 1 token
    case(&g, 9, 5, &[8], 43);
    // C multiple of 4: the vec4 entry.
    case(
        &g,
        50,
        36,
        &[0, 49, 3, 3, 17, 50, 1_000_000, u32::MAX, 25],
        46,
    );
}

#[test]
fn embedding_table_larger_than_binding_limit() {
    // A second device whose storage bindings are capped at 64 KiB; tables of 1000 x 33 f32 = 132 KB
    // (scalar entry) and 1000 x 32 = 128 KB (vec4 entry) are bound in row chunks, and ids from every
    // chunk, at chunk edges and out of range must all come out right.
    let g2 = pollster::block_on(Device::new(DeviceOptions {
        max_storage_binding_size: Some(64 * 1024),
        ..Default::default()
    }))
    .unwrap();
    for (c, seed) in [(33usize, 45u64), (32, 47)] {
        let v = 1000usize;
        let t = Tensor::zeros(&g2, &[v, c], florence2_wasm::gpu::DType::F32, "t").unwrap();
        let chunks = t.row_chunks(&g2, c).unwrap();
        assert!(chunks.len() >= 2, "expected a split table, got {chunks:?}");
        let mut ids: Vec<u32> = vec![0, 999, 1000, 5000];
        for ch in &chunks {
            let s = ch.row_start as u32;
            let e = (ch.row_start + ch.rows) as u32;
            ids.extend([s, s + 1, e - 1]);
        }
        let mut rng = Rng::new(seed);
        ids.extend((0..40).map(|_| (rng.next_u64() % 1100) as u32));
        case(&g2, v, c, &ids, seed);
    }
}

use florence2_wasm::gpu::Tensor;

#[test]
fn embedding_rejects_mismatched_shapes() {
    let g = gpu();
    let mut rec = Recorder::new(&g);
    let table = zf32(&g, &[10, 4]);
    let ids = tu32(&g, &[3], &[0, 1, 2]);
    assert_shape_err(
        ops::embedding::embedding(&mut rec, &ids, &table, &zf32(&g, &[3, 5])),
        "embedding",
    );
    // f32 ids are rejected
    assert_shape_err(
        ops::embedding::embedding(&mut rec, &zf32(&g, &[3]), &table, &zf32(&g, &[3, 4])),
        "embedding",
    );
}

/// Packed tables (f16 pairs, q8/q4 rows): the gather must return exactly the host's widening /
/// dequantization of the same bytes (a copy of `d * q`, exact in f32), so the tolerance is 0. Run on
/// the default device and on one with 4 KiB bindings, where the tables are bound in row chunks.
#[test]
fn embedding_packed_tables() {
    use florence2_wasm::gpu::{DType, Tensor};
    use florence2_wasm::quant;
    let g2 = pollster::block_on(Device::new(DeviceOptions {
        max_storage_binding_size: Some(4 * 1024),
        ..Default::default()
    }))
    .unwrap();
    for g in [gpu(), g2] {
        let (v, c) = (97, 64);
        let mut rng = Rng::new(47);
        let table = rng.vec(v * c, 2.0);
        let ids = [0, 96, 3, 3, 50, 97, 1_000_000, u32::MAX, 25];
        let ti = tu32(&g, &[ids.len()], &ids);
        for dt in [DType::F16, DType::Q8, DType::Q4] {
            let (tt, host) = match dt.qformat() {
                None => {
                    let h: Vec<f32> = table
                        .iter()
                        .map(|&x| half::f16::from_f32(x).to_f32())
                        .collect();
                    (
                        Tensor::from_f32_as_f16(&g, &[v, c], &table, "t").unwrap(),
                        h,
                    )
                }
                Some(fmt) => {
                    let mut bytes = Vec::new();
                    quant::quantize_rows(fmt, c, &table, &mut bytes).unwrap();
                    let h = quant::dequantize_rows(fmt, c, &bytes).unwrap();
                    let t = Tensor::from_f32_quantized(&g, &[v, c], &table, fmt, "t").unwrap();
                    (t, h)
                }
            };
            let want = embedding_ref(&ids, &host, c);
            let to = tf32(&g, &[ids.len(), c], &vec![7.0; ids.len() * c]);
            let chunks = tt.row_chunks(&g, c).unwrap().len();
            let got = run_f32(&g, &to, |r| {
                ops::embedding::embedding(r, &ti, &tt, &to).unwrap()
            });
            assert_close(
                &format!("embedding {dt:?} V={v} C={c} ({chunks} chunks)"),
                &got,
                &want,
                0.0,
            );
        }
    }
}
