//! `cpu::channel_attn` against the f64 transcription of tests/kernels/channel_attn.rs.
//!
//! Tolerance (same analysis, computed from the data): a logit is an N-term sum, so its f32 error is at
//! most delta = N u sum_n |q_n k_n| * scale; softmax weights move within e^(+-2 delta); the d-term output
//! sums add (d + 8) u; so |out - ref| <= (e^(2 delta) - 1 + (d + 8) u) max|v| + u.

use florence2_wasm::cpu::channel_attn::{channel_attention, channel_logits};

use crate::common::{max_diff, Rng};
use crate::U;

/// (out (B, N, C), tolerance).
pub fn channel_ref(
    qkv: &[f32],
    (b, n, c): (usize, usize, usize),
    groups: usize,
) -> (Vec<f32>, f64) {
    let d = c / groups;
    let scale = (n as f64).powf(-0.5);
    let mut out = vec![0f32; b * n * c];
    let (mut delta, mut vmax) = (0f64, 0f64);
    let at = |bi: usize, t: usize, col: usize| qkv[(bi * n + t) * 3 * c + col] as f64;
    for bi in 0..b {
        for gi in 0..groups {
            let mut attn = vec![0f64; d * d];
            for i in 0..d {
                let mut row = vec![0f64; d];
                for (j, r) in row.iter_mut().enumerate() {
                    let (mut s, mut abs) = (0f64, 0f64);
                    for t in 0..n {
                        let p = at(bi, t, gi * d + i) * at(bi, t, c + gi * d + j);
                        s += p;
                        abs += p.abs();
                    }
                    *r = s * scale;
                    delta = delta.max(n as f64 * U * abs * scale);
                }
                let mx = row.iter().cloned().fold(f64::MIN, f64::max);
                let sum: f64 = row.iter().map(|v| (v - mx).exp()).sum();
                for j in 0..d {
                    attn[i * d + j] = (row[j] - mx).exp() / sum;
                }
            }
            for t in 0..n {
                for i in 0..d {
                    let mut s = 0f64;
                    for j in 0..d {
                        let v = at(bi, t, 2 * c + gi * d + j);
                        vmax = vmax.max(v.abs());
                        s += attn[i * d + j] * v;
                    }
                    out[(bi * n + t) * c + gi * d + i] = s as f32;
                }
            }
        }
    }
    let tol = ((2.0 * delta).exp_m1() + (d as f64 + 8.0) * U) * vmax + U;
    (out, tol)
}

#[test]
fn channel_attention_matches_the_f64_reference() {
    for (seed, (b, n, c, groups)) in [
        (1, 144, 128, 4),
        (2, 37, 64, 2),
        (1, 5, 96, 3),
        (3, 1, 32, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let qkv = Rng::new(seed as u64 + 70).vec(b * n * 3 * c, 1.0);
        let (want, tol) = channel_ref(&qkv, (b, n, c), groups);
        let mut got = vec![f32::NAN; b * n * c];
        channel_attention(&qkv, (b, n, c), groups, &mut got).unwrap();
        let (dm, peak) = max_diff(&got, &want);
        eprintln!("channel_attention B{b} N{n} C{c} groups{groups}: max |diff| = {dm:.3e} (peak {peak:.3e}, tol {tol:.2e})");
        assert!((dm as f64) <= tol);
        // q|k and v from separate tensors (the arena's split path): the same values, bit for bit.
        let qk: Vec<f32> = qkv
            .chunks(3 * c)
            .flat_map(|r| r[..2 * c].to_vec())
            .collect();
        let v: Vec<f32> = qkv
            .chunks(3 * c)
            .flat_map(|r| r[2 * c..].to_vec())
            .collect();
        let l = channel_logits(&qk, 2 * c, (b, n, c), groups).unwrap();
        let mut split = vec![f32::NAN; b * n * c];
        l.apply(&v, (c, 0), n, &mut split).unwrap();
        assert_eq!(split, got);
    }
    assert!(channel_attention(&[0.0; 30], (1, 2, 5), 2, &mut [0.0; 10]).is_err());
}
