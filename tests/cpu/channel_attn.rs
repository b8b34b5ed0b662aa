//! `cpu::channel_attn` against the f64 reference the GPU kernel's test uses (tests/common/cpu.rs).
//!
//! Tolerance (same analysis, computed from the data): a logit is an N-term sum, so its f32 error is at
//! most delta = N u sum_n |q_n k_n| * scale; softmax weights move within e^(+-2 delta); the d-term output
//! sums add (d + 8) u; so |out - ref| <= (e^(2 delta) - 1 + (d + 8) u) max|v| + u.

use florence2_wasm::cpu::channel_attn::{channel_attention, channel_logits};

use crate::common::{max_diff, Rng};

/// (out (B, N, C), tolerance): the kernels test's f64 reference.
pub fn channel_ref(
    qkv: &[f32],
    (b, n, c): (usize, usize, usize),
    groups: usize,
) -> (Vec<f32>, f64) {
    crate::common::cpu::channel_attn_ref(qkv, b, n, c, groups)
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
