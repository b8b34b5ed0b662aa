//! `cpu::attention` (causal prefill with an offset, KV-cache fill, additive mask, K/V shared across the
//! batch, decode rows, f32 and f16 K/V), `window_attention` over a fused qkv, and the KV-cache writes,
//! against f64 references.
//!
//! Tolerance (attention, as tests/kernels/attention.rs): 2e-6 absolute on outputs of magnitude <= 1
//! (convex combinations of v in [-1, 1]). Scores of magnitude <= ~4 summed over D <= 64 terms carry
//! ~sqrt(D) 2^-24 4 ~ 2e-6 of random-signed rounding, which moves each softmax weight by about that
//! relative amount; the weighted sums add ~sqrt(Tk) 2^-24. A wrong mask, offset or broadcast is off by
//! O(0.1). f16 K/V: the reference uses the same f16 values (widening is exact): same tolerance.
//! Window attention: the bound of tests/kernels/window_attn.rs computed from the data,
//! (e^(2 delta) - 1 + 3 (T + D + 2) u) max|v| with delta the scores' own rounding bound.
//! KV writes and the f16 cast are copies / IEEE round-to-nearest: exact.

use florence2_wasm::cpu::attention::{
    attention, f32_to_f16, kv_write, window_attention, AttnOpts, KvMut, KvRef,
};
use half::f16;

use crate::common::{assert_close, max_diff, Rng};
use crate::U;

pub const TOL: f32 = 2e-6;

/// One attention call's shape and options.
#[derive(Clone, Copy)]
pub struct Case {
    pub b: usize,
    pub bk: usize,
    pub tq: usize,
    pub tk: usize,
    pub heads: usize,
    pub d: usize,
    pub causal: bool,
    pub kv_len: Option<usize>,
    pub q_offset: usize,
    pub mask: bool,
}

impl Case {
    pub fn new(b: usize, tq: usize, tk: usize, heads: usize, d: usize) -> Self {
        Case {
            b,
            bk: b,
            tq,
            tk,
            heads,
            d,
            causal: false,
            kv_len: None,
            q_offset: 0,
            mask: false,
        }
    }

    pub fn scale(&self) -> f32 {
        (self.d as f32).powf(-0.5)
    }

    /// q, k, v and the mask (random).
    pub fn data(&self, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut rng = Rng::new(seed);
        let c = self.heads * self.d;
        (
            rng.vec(self.b * self.tq * c, 1.0),
            rng.vec(self.bk * self.tk * c, 1.0),
            rng.vec(self.bk * self.tk * c, 1.0),
            rng.vec(self.tq * self.tk, 2.0),
        )
    }

    pub fn opts<'a>(&self, mask: &'a [f32]) -> AttnOpts<'a> {
        AttnOpts {
            heads: self.heads,
            scale: self.scale(),
            causal: self.causal,
            kv_len: self.kv_len,
            q_offset: self.q_offset,
            mask: self.mask.then_some(mask),
        }
    }

    /// f64 two-pass reference.
    pub fn reference(&self, q: &[f32], k: &[f32], v: &[f32], mask: &[f32]) -> Vec<f32> {
        let c = self.heads * self.d;
        let kv_len = self.kv_len.unwrap_or(self.tk);
        let mut out = vec![0f32; self.b * self.tq * c];
        for b in 0..self.b {
            let kb = if self.bk == 1 { 0 } else { b };
            for h in 0..self.heads {
                for i in 0..self.tq {
                    let qrow = &q[(b * self.tq + i) * c + h * self.d..][..self.d];
                    let mut s: Vec<(usize, f64)> = Vec::new();
                    for j in 0..kv_len {
                        if self.causal && j > self.q_offset + i {
                            continue;
                        }
                        let krow = &k[(kb * self.tk + j) * c + h * self.d..][..self.d];
                        let mut x: f64 = qrow
                            .iter()
                            .zip(krow)
                            .map(|(&a, &b)| (a * self.scale()) as f64 * b as f64)
                            .sum();
                        if self.mask {
                            x += mask[i * self.tk + j] as f64;
                        }
                        s.push((j, x));
                    }
                    let mx = s.iter().map(|p| p.1).fold(f64::MIN, f64::max);
                    let sum: f64 = s.iter().map(|p| (p.1 - mx).exp()).sum();
                    for e in 0..self.d {
                        let o: f64 = s
                            .iter()
                            .map(|&(j, x)| {
                                (x - mx).exp() / sum
                                    * v[(kb * self.tk + j) * c + h * self.d + e] as f64
                            })
                            .sum();
                        out[(b * self.tq + i) * c + h * self.d + e] = o as f32;
                    }
                }
            }
        }
        out
    }

    /// Run on the CPU with K/V as f32 or rounded to f16 (then returns the f16-rounded K/V it used).
    pub fn run(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: &[f32],
        f16kv: bool,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let c = self.heads * self.d;
        let mut out = vec![f32::NAN; self.b * self.tq * c];
        let dims = (self.b, self.tq, self.tk, c);
        if f16kv {
            let kh: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
            let vh: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
            attention(
                q,
                KvRef::F16(&kh),
                KvRef::F16(&vh),
                dims,
                &self.opts(mask),
                &mut out,
            )
            .unwrap();
            let back = |h: &[f16]| h.iter().map(|x| x.to_f32()).collect();
            (out, back(&kh), back(&vh))
        } else {
            attention(
                q,
                KvRef::F32(k),
                KvRef::F32(v),
                dims,
                &self.opts(mask),
                &mut out,
            )
            .unwrap();
            (out, k.to_vec(), v.to_vec())
        }
    }
}

pub fn cases() -> Vec<(&'static str, Case)> {
    let mut v = vec![
        ("encoder self", Case::new(1, 37, 37, 4, 16)),
        ("batched", Case::new(3, 9, 21, 2, 32)),
        ("head dim 64", Case::new(2, 5, 70, 3, 64)),
    ];
    let mut causal = Case::new(2, 13, 40, 2, 16);
    causal.causal = true;
    causal.q_offset = 7;
    causal.kv_len = Some(20);
    v.push(("causal prefill, offset 7, kv_len 20", causal));
    let mut dec = Case::new(3, 1, 64, 4, 16);
    dec.causal = true;
    dec.q_offset = 10;
    dec.kv_len = Some(11);
    v.push(("decode row, cache fill 11", dec));
    let mut cross = Case::new(3, 1, 30, 4, 16);
    cross.bk = 1;
    v.push(("cross, K/V shared (Bk = 1)", cross));
    let mut masked = Case::new(2, 6, 17, 2, 8);
    masked.mask = true;
    v.push(("additive mask", masked));
    // Blocks of at least 2^18 multiply-adds in q k^T run their products on the GEMM.
    v.push(("long, on the GEMM", Case::new(1, 260, 270, 3, 64)));
    let mut long_causal = Case::new(2, 130, 140, 2, 64);
    long_causal.causal = true;
    long_causal.q_offset = 5;
    long_causal.kv_len = Some(137);
    long_causal.mask = true;
    v.push(("long causal + mask, kv_len 137, on the GEMM", long_causal));
    let mut none = Case::new(1, 4, 8, 1, 8);
    none.kv_len = Some(0);
    v.push(("no visible key: zeros", none));
    v
}

#[test]
fn attention_matches_the_f64_reference() {
    for (seed, (name, c)) in cases().into_iter().enumerate() {
        let (q, k, v, m) = c.data(seed as u64 + 1);
        for f16kv in [false, true] {
            let (got, kk, vv) = c.run(&q, &k, &v, &m, f16kv);
            let want = c.reference(&q, &kk, &vv, &m);
            assert_close(
                &format!("attention {name} f16 K/V {f16kv}"),
                &got,
                &want,
                TOL,
            );
        }
    }
}

#[test]
fn window_attention_matches_the_f64_reference() {
    for (seed, (nw, t, c, heads)) in [(2, 144, 64, 2), (3, 16, 96, 3), (1, 9, 32, 4)]
        .into_iter()
        .enumerate()
    {
        let qkv = Rng::new(seed as u64 + 40).vec(nw * t * 3 * c, 1.0);
        let d = c / heads;
        let scale = (d as f64).powf(-0.5);
        let (mut delta, mut vmax) = (0f64, 0f64);
        let at = |w: usize, tok: usize, col: usize| qkv[(w * t + tok) * 3 * c + col] as f64;
        let mut want = vec![0f32; nw * t * c];
        for w in 0..nw {
            for h in 0..heads {
                for i in 0..t {
                    let s: Vec<f64> = (0..t)
                        .map(|j| {
                            let pr: Vec<f64> = (0..d)
                                .map(|e| at(w, i, h * d + e) * at(w, j, c + h * d + e))
                                .collect();
                            delta = delta.max(
                                (d + 1) as f64
                                    * U
                                    * pr.iter().map(|p| p.abs()).sum::<f64>()
                                    * scale,
                            );
                            pr.iter().sum::<f64>() * scale
                        })
                        .collect();
                    let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                    let sum: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                    for e in 0..d {
                        let mut o = 0f64;
                        for (j, sj) in s.iter().enumerate() {
                            let vv = at(w, j, 2 * c + h * d + e);
                            vmax = vmax.max(vv.abs());
                            o += (sj - mx).exp() / sum * vv;
                        }
                        want[(w * t + i) * c + h * d + e] = o as f32;
                    }
                }
            }
        }
        let tol = ((2.0 * delta).exp_m1() + 3.0 * (t + d + 2) as f64 * U) * vmax + U;
        let mut got = vec![f32::NAN; nw * t * c];
        window_attention(&qkv, (nw, t, c), heads, scale as f32, &mut got).unwrap();
        let (dm, peak) = max_diff(&got, &want);
        eprintln!("window_attention nW{nw} T{t} C{c} heads{heads}: max |diff| = {dm:.3e} (peak {peak:.3e}, tol {tol:.2e})");
        assert!((dm as f64) <= tol);
    }
}

#[test]
fn kv_writes_and_the_f16_cast_are_exact() {
    let (b, l, d) = (3, 5, 6);
    let rows = Rng::new(9).vec(b * d, 3.0);
    let mut c32 = vec![0f32; b * l * d];
    let mut c16 = vec![f16::ZERO; b * l * d];
    kv_write(KvMut::F32(&mut c32), (b, l, d), 2, &rows).unwrap();
    kv_write(KvMut::F16(&mut c16), (b, l, d), 2, &rows).unwrap();
    for r in 0..b {
        for e in 0..d {
            let at = (r * l + 2) * d + e;
            assert_eq!(c32[at], rows[r * d + e]);
            assert_eq!(c16[at], f16::from_f32(rows[r * d + e]));
        }
    }
    assert_eq!(c32.iter().filter(|&&v| v != 0.0).count(), b * d);
    let before = c32.clone();
    kv_write(KvMut::F32(&mut c32), (b, l, d), l, &rows).unwrap(); // past L: nothing
    assert_eq!(before, c32);
    assert!(kv_write(KvMut::F32(&mut c32), (b, l + 1, d), 0, &rows).is_err());
    let x = [1.0f32, 1.0 + 1.0 / 4096.0, 65520.0, -3.3e-8, 0.1];
    let mut h = [f16::ZERO; 5];
    f32_to_f16(&x, &mut h).unwrap();
    for (a, b) in x.iter().zip(&h) {
        assert_eq!(*b, f16::from_f32(*a));
    }
}
