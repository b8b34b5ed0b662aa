//! `ops::cast::f32_to_f16` (the packing of the decoder's f16 KV caches and cross K/V) against the host's
//! IEEE conversion (`half::f16::from_f32`, round to nearest even).
//!
//! WGSL's `pack2x16float` may round a value that f16 cannot hold to either neighbour, so the exact
//! assertion is: every output is the host's f16, or the other f16 neighbour of the input (a relative
//! error below 2^-10, the bound the fidelity test's derivation uses); values f16 holds exactly come back
//! exactly. How many outputs equal round-to-nearest is printed (all of them on lavapipe). A wrong half
//! of a word, a shifted element or an f32 bit pattern read as f16 fails by O(1).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::{gpu, Rng};
use florence2_wasm::gpu::{readback, DType, Recorder, Tensor};
use florence2_wasm::ops;
use half::f16;

/// The f16 on the other side of `x` from `near` (x not representable): one step away from `near`.
fn other_neighbour(x: f32, near: f16) -> f16 {
    // Sign-magnitude encoding: the magnitude one step up or down, same sign as x (and as `near`).
    let bits = near.to_bits();
    let up = near.to_f32().abs() < x.abs();
    f16::from_bits(if up { bits + 1 } else { bits.wrapping_sub(1) })
}

#[test]
fn f32_to_f16_rounds_to_a_neighbour_and_packs_pairs() {
    let g = gpu();
    let mut rng = Rng::new(3);
    // Odd count (the last word's high half is padding), magnitudes over f16's normal and subnormal
    // range, exact halves, and midpoints between consecutive halves (ties).
    let mut x: Vec<f32> = Vec::new();
    for scale in [1e-6f32, 1e-3, 0.5, 3.0, 100.0, 6e4] {
        x.extend(rng.vec(150, scale));
    }
    for i in 0..100u16 {
        let h = f16::from_bits(0x3c00 + 37 * i); // exact halves in [1, ~4)
        x.push(h.to_f32());
        let next = f16::from_bits(0x3c00 + 37 * i + 1);
        x.push((h.to_f32() + next.to_f32()) / 2.0); // a tie
    }
    x.extend([0.0, -0.0, 65504.0, -65504.0, 6.1e-5, -5.96e-8]);
    if x.len().is_multiple_of(2) {
        x.push(0.25);
    }
    let n = x.len();
    let tx = Tensor::from_f32(&g, &[n], &x, "x").unwrap();
    // The output is an F16 view of a U32 buffer pre-filled with ones, so the padding half can be read.
    let words =
        Tensor::from_u32(&g, &[n.div_ceil(2)], &vec![u32::MAX; n.div_ceil(2)], "w").unwrap();
    let out = words.view(&[n], DType::F16).unwrap();
    let mut rec = Recorder::new(&g);
    ops::cast::f32_to_f16(&mut rec, &tx, &out).unwrap();
    rec.submit().unwrap();
    let got = readback::to_u32_blocking(&g, &words).unwrap();
    let halves: Vec<f16> = got
        .iter()
        .flat_map(|w| [f16::from_bits(*w as u16), f16::from_bits((*w >> 16) as u16)])
        .collect();
    let mut nearest = 0;
    for (i, &xi) in x.iter().enumerate() {
        let (h, rne) = (halves[i], f16::from_f32(xi));
        if h.to_bits() == rne.to_bits() {
            nearest += 1;
            continue;
        }
        assert!(
            rne.to_f32() != xi && h.to_bits() == other_neighbour(xi, rne).to_bits(),
            "element {i}: {xi:e} -> {} ({:#06x}), nearest {} ({:#06x})",
            h,
            h.to_bits(),
            rne,
            rne.to_bits()
        );
    }
    eprintln!("f32_to_f16: {nearest}/{n} outputs equal round-to-nearest-even");
    assert_eq!(halves[n].to_bits(), 0, "the padding half is written as 0");
    // Through the generic readback too (widened f16 values).
    let widened = readback::to_f32_blocking(&g, &out).unwrap();
    assert_eq!(widened.len(), n);
    assert!(widened
        .iter()
        .zip(&halves)
        .all(|(a, h)| a.to_bits() == h.to_f32().to_bits()));
}

#[test]
fn f32_to_f16_checks_dtypes_and_shapes() {
    let g = gpu();
    let x = Tensor::zeros(&g, &[4, 6], DType::F32, "x").unwrap();
    let mut rec = Recorder::new(&g);
    let f32_out = Tensor::zeros(&g, &[4, 6], DType::F32, "o").unwrap();
    assert!(ops::cast::f32_to_f16(&mut rec, &x, &f32_out).is_err());
    let wrong = Tensor::zeros(&g, &[6, 4], DType::F16, "o").unwrap();
    assert!(ops::cast::f32_to_f16(&mut rec, &x, &wrong).is_err());
    let h = Tensor::zeros(&g, &[4, 6], DType::F16, "h").unwrap();
    assert!(ops::cast::f32_to_f16(&mut rec, &h, &h).is_err());
    ops::cast::f32_to_f16(&mut rec, &x, &h).unwrap();
}
