//! The kernels that copy or add values: element-wise ops, the projector's position terms, window
//! partition / reverse, the embedding gather (every table format), argmax / top-k (the beam tails) and
//! the spatial mean.
//!
//! Tolerances: 0 (bit-exact) wherever the kernel performs the reference's own f32 operations in the
//! same order (adds, copies, `d * q` dequantization, comparisons). mean_rows sums N values in f32:
//! relative error ~N u in the worst case, ~sqrt(N) u typically; 1e-5 on |x| <= 1 (1e-6 for N <= 7), as
//! tests/kernels/reduce.rs.

use florence2_wasm::cpu::elementwise::{add, add_row, add_rows_at, pos2d_temporal_add, scale};
use florence2_wasm::cpu::embedding::embedding;
use florence2_wasm::cpu::reduce::{argmax_rows, mean_rows, topk_rows};
use florence2_wasm::cpu::window::{window_partition, window_reverse};
use florence2_wasm::cpu::Weight;
use florence2_wasm::quant::{dequantize_rows, quantize_rows, QFormat};
use half::f16;

use crate::common::cpu::{
    add_row_ref, add_rows_at_ref, argmax_ref, embedding_ref, mean_rows_ref, topk_ref,
};
use crate::common::{assert_close, Rng};

#[test]
fn elementwise_and_position_terms_are_exact() {
    let mut rng = Rng::new(1);
    let (x, y, row) = (
        rng.vec(3 * 40_000, 1.0),
        rng.vec(3 * 40_000, 1.0),
        rng.vec(40_000, 1.0),
    );
    let mut a = x.clone();
    add(&mut a, &y).unwrap();
    assert!(a
        .iter()
        .zip(x.iter().zip(&y))
        .all(|(&s, (&p, &q))| s == p + q));
    let mut s = x.clone();
    scale(&mut s, 0.3);
    assert!(s.iter().zip(&x).all(|(&v, &p)| v == p * 0.3));
    let mut r = x.clone();
    add_row(&mut r, &row).unwrap();
    assert_eq!(r, add_row_ref(&x, &row));
    let table = rng.vec(10 * 6, 1.0);
    let mut t = x[..4 * 6].to_vec();
    add_rows_at(&mut t, &table, 6, 5).unwrap();
    assert_eq!(t, add_rows_at_ref(&x[..24], &table, 5, 6));
    assert!(add_rows_at(&mut t, &table, 6, 7).is_err());
    // Projector: (h, w) = (3, 4), C = 5 (column half 3 wide, row half 2), tables of 6 rows, B = 2.
    let (h, w, c) = (3, 4, 5);
    let feats = rng.vec(2 * h * w * c, 1.0);
    let (col, rowt, temporal) = (
        rng.vec(6 * 3, 1.0),
        rng.vec(6 * 2, 1.0),
        rng.vec(2 * c, 1.0),
    );
    let mut got = feats.clone();
    pos2d_temporal_add(&mut got, (h, w, c), &col, &rowt, &temporal).unwrap();
    for (i, (&g, &f)) in got.iter().zip(&feats).enumerate() {
        let (ch, tok) = (i % c, i / c % (h * w));
        let pos = if ch < 3 {
            col[(tok % w) * 3 + ch]
        } else {
            rowt[(tok / w) * 2 + ch - 3]
        };
        assert_eq!(g, (f + pos) + temporal[ch], "element {i}");
    }
}

#[test]
fn window_partition_and_reverse_are_exact() {
    for (b, h, w, c, ws) in [(1, 5, 7, 3, 3), (2, 6, 6, 2, 3), (1, 24, 24, 4, 12)] {
        let x = Rng::new(2).vec(b * h * w * c, 1.0);
        let (nh, nw) = (h.div_ceil(ws), w.div_ceil(ws));
        let mut win = vec![f32::NAN; b * nh * nw * ws * ws * c];
        window_partition(&x, (b, h, w, c), ws, &mut win).unwrap();
        for (widx, wv) in win.chunks(ws * ws * c).enumerate() {
            let (bi, wy, wx) = (widx / (nh * nw), widx / nw % nh, widx % nw);
            for (t, tok) in wv.chunks(c).enumerate() {
                let (y, xx) = (wy * ws + t / ws, wx * ws + t % ws);
                let want = if y < h && xx < w {
                    x[((bi * h + y) * w + xx) * c..][..c].to_vec()
                } else {
                    vec![0.0; c]
                };
                assert_eq!(tok, &want[..], "window {widx} token {t}");
            }
        }
        let mut back = vec![f32::NAN; x.len()];
        window_reverse(&win, (b, h, w, c), ws, &mut back).unwrap();
        assert_eq!(back, x);
    }
}

#[test]
fn embedding_gathers_every_table_format_exactly() {
    let (v, c) = (11, 64);
    let table = Rng::new(3).vec(v * c, 1.0);
    let ids = [0u32, 10, 3, 11, 99, 3];
    let h: Vec<f16> = table.iter().map(|&x| f16::from_f32(x)).collect();
    let hf: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
    let mut out = vec![f32::NAN; ids.len() * c];
    embedding(&ids, Weight::F32(&table), (v, c), &mut out).unwrap();
    assert_eq!(out, embedding_ref(&ids, &table, c));
    embedding(&ids, Weight::F16(&h), (v, c), &mut out).unwrap();
    assert_eq!(out, embedding_ref(&ids, &hf, c));
    for q in [QFormat::Q8, QFormat::Q4] {
        let mut bytes = Vec::new();
        quantize_rows(q, c, &table, &mut bytes).unwrap();
        embedding(&ids, Weight::Quant(q, &bytes), (v, c), &mut out).unwrap();
        assert_eq!(
            out,
            embedding_ref(&ids, &dequantize_rows(q, c, &bytes).unwrap(), c),
            "{q:?}"
        );
    }
}

#[test]
fn argmax_topk_and_mean_follow_the_reference_order() {
    let v = 51328;
    let mut x = Rng::new(4).vec(3 * v, 10.0);
    x[5] = 50.0; // ties: the lower index first
    x[900] = 50.0;
    x[v + 77] = f32::NAN; // NaN ranks highest
    x[2 * v + 3] = -0.0;
    let mut am = [0u32; 3];
    argmax_rows(&x, v, &mut am).unwrap();
    assert_eq!(am.to_vec(), argmax_ref(&x, v));
    for k in [1, 3, 6, 16] {
        let (mut vals, mut ids) = (vec![0f32; 3 * k], vec![0u32; 3 * k]);
        topk_rows(&x, v, k, &mut vals, &mut ids).unwrap();
        let (wv, wi) = topk_ref(&x, v, k);
        assert_eq!(ids, wi, "k = {k}");
        assert!(vals
            .iter()
            .zip(&wv)
            .all(|(a, b)| a == b || (a.is_nan() && b.is_nan())));
    }
    assert!(topk_rows(&x, v, 17, &mut [0.0; 51], &mut [0; 51]).is_err());
    for (b, n, c, tol) in [(1, 577, 1024, 1e-5), (2, 7, 5, 1e-6)] {
        let x = Rng::new(5).vec(b * n * c, 1.0);
        let mut got = vec![0f32; b * c];
        mean_rows(&x, (b, n, c), &mut got).unwrap();
        assert_close(
            &format!("mean_rows ({b}, {n}, {c})"),
            &got,
            &mean_rows_ref(&x, b, n, c),
            tol,
        );
    }
}

/// The f16 widening the CPU kernels use equals `half`'s `to_f32` on every one of the 65536 halves, bit
/// for bit (NaNs included), at every alignment of a slice's tail.
#[test]
fn f16_widening_is_exact_for_every_half() {
    use florence2_wasm::cpu::widen::f16_to_f32;
    let all: Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).collect();
    for skip in 0..9 {
        let src = &all[skip..];
        let mut got = vec![0f32; src.len()];
        f16_to_f32(src, &mut got);
        for (h, g) in src.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                h.to_f32().to_bits(),
                "half {:#06x}",
                h.to_bits()
            );
        }
    }
}
