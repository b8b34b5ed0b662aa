//! Plain-Rust CPU references for the kernels, shared by the kernel, model and browser tests.
//! Reductions accumulate in f64, so the reference is closer to the exact value than any f32 kernel and
//! the measured difference is the kernel's own error.
#![allow(dead_code)]

/// erf in f64 via the all-positive series erf(x) = 2/sqrt(pi) e^{-x^2} sum_n 2^n x^{2n+1} / (2n+1)!!
/// (no cancellation, so ~1e-15 relative for |x| < 6); |x| >= 6 gives +-1 (1 - erf(6) < 3e-17).
pub fn erf_f64(x: f64) -> f64 {
    let ax = x.abs();
    if ax >= 6.0 {
        return x.signum();
    }
    let x2 = ax * ax;
    let mut term = ax; // n = 0
    let mut sum = ax;
    let mut n = 0.0;
    while term > sum * 1e-17 {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
    }
    let r = 2.0 / std::f64::consts::PI.sqrt() * (-x2).exp() * sum;
    r.copysign(x)
}

/// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)), in f64.
pub fn gelu_ref(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let v = v as f64;
            (0.5 * v * (1.0 + erf_f64(v / std::f64::consts::SQRT_2))) as f32
        })
        .collect()
}

/// LayerNorm over rows of `c` (biased variance, like torch).
pub fn layer_norm_ref(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, c: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(c) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (j, &v) in row.iter().enumerate() {
            out.push(((v as f64 - mean) * inv * gamma[j] as f64 + beta[j] as f64) as f32);
        }
    }
    out
}

/// Softmax over rows of `c`.
pub fn softmax_ref(x: &[f32], c: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(c) {
        let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        out.extend(row.iter().map(|&v| ((v as f64 - m).exp() / s) as f32));
    }
    out
}

/// Log-softmax over rows of `c`.
pub fn log_softmax_ref(x: &[f32], c: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(c) {
        let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        let shift = m + s.ln();
        out.extend(row.iter().map(|&v| (v as f64 - shift) as f32));
    }
    out
}

/// out[r, :] = x[r, :] + row.
pub fn add_row_ref(x: &[f32], row: &[f32]) -> Vec<f32> {
    let c = row.len();
    x.iter().enumerate().map(|(i, &v)| v + row[i % c]).collect()
}

/// out[t, :] = x[t, :] + table[start + t, :].
pub fn add_rows_at_ref(x: &[f32], table: &[f32], start: usize, c: usize) -> Vec<f32> {
    x.iter()
        .enumerate()
        .map(|(i, &v)| v + table[start * c + i])
        .collect()
}

/// out[t, :] = table[ids[t], :], zero rows for ids >= V.
pub fn embedding_ref(ids: &[u32], table: &[f32], c: usize) -> Vec<f32> {
    let v = table.len() / c;
    let mut out = Vec::with_capacity(ids.len() * c);
    for &id in ids {
        if (id as usize) < v {
            out.extend_from_slice(&table[id as usize * c..(id as usize + 1) * c]);
        } else {
            out.extend(std::iter::repeat_n(0.0, c));
        }
    }
    out
}

/// Total order used by argmax/topk: NaN above everything, -0 == +0, ties broken by lower index.
fn better(a: f32, ia: usize, b: f32, ib: usize) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => ia < ib,
        (true, false) => true,
        (false, true) => false,
        _ => a > b || (a == b && ia < ib),
    }
}

/// Index of the largest value in each row of `v` (first one on ties; NaN counts as largest, like
/// torch.argmax).
pub fn argmax_ref(x: &[f32], v: usize) -> Vec<u32> {
    x.chunks(v)
        .map(|row| {
            let mut best = 0;
            for (i, &val) in row.iter().enumerate() {
                if better(val, i, row[best], best) {
                    best = i;
                }
            }
            best as u32
        })
        .collect()
}

/// Top-k per row, descending, ties -> lower index first (a stable sort by value).
pub fn topk_ref(x: &[f32], v: usize, k: usize) -> (Vec<f32>, Vec<u32>) {
    let mut vals = Vec::new();
    let mut ids = Vec::new();
    for row in x.chunks(v) {
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&a, &b| {
            if better(row[a], a, row[b], b) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        for &i in &order[..k] {
            vals.push(row[i]);
            ids.push(i as u32);
        }
    }
    (vals, ids)
}

/// Mean over N of x (B, N, C) -> (B, C).
pub fn mean_rows_ref(x: &[f32], b: usize, n: usize, c: usize) -> Vec<f32> {
    let mut out = vec![0f32; b * c];
    for bi in 0..b {
        for ci in 0..c {
            let s: f64 = (0..n).map(|ni| x[(bi * n + ni) * c + ci] as f64).sum();
            out[bi * c + ci] = (s / n as f64) as f32;
        }
    }
    out
}

/// x.permute(dims) for a row-major x of `shape`.
pub fn permute_ref<T: Copy>(x: &[T], shape: &[usize], dims: &[usize]) -> Vec<T> {
    let rank = shape.len();
    let mut stride = vec![1usize; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        stride[i] = stride[i + 1] * shape[i + 1];
    }
    let out_shape: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; rank];
    for _ in 0..n {
        let src: usize = (0..rank).map(|i| idx[i] * stride[dims[i]]).sum();
        out.push(x[src]);
        for i in (0..rank).rev() {
            idx[i] += 1;
            if idx[i] < out_shape[i] {
                break;
            }
            idx[i] = 0;
        }
    }
    out
}

/// q, k, v = the three C-column thirds of each (3C) row.
pub fn split_qkv_ref(qkv: &[f32], c: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for row in qkv.chunks(3 * c) {
        q.extend_from_slice(&row[..c]);
        k.extend_from_slice(&row[c..2 * c]);
        v.extend_from_slice(&row[2 * c..]);
    }
    (q, k, v)
}

const CA_U: f64 = f32::EPSILON as f64 / 2.0;

/// Grouped channel attention in f64 for qkv (B, N, 3C): (out (B, N, C), the f32 tolerance of
/// tests/kernels/channel_attn.rs's header). CA_U is the f32 unit roundoff.
pub fn channel_attn_ref(
    qkv: &[f32],
    b: usize,
    n: usize,
    c: usize,
    groups: usize,
) -> (Vec<f32>, f64) {
    let d = c / groups;
    let scale = (n as f64).powf(-0.5);
    let mut out = vec![0f32; b * n * c];
    let mut delta: f64 = 0.0;
    let mut vmax: f64 = 0.0;
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
                    delta = delta.max(n as f64 * CA_U * abs * scale);
                }
                let mx = row.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = row.iter().map(|v| (v - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                for j in 0..d {
                    attn[i * d + j] = e[j] / sum;
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
    let tol = ((2.0 * delta).exp_m1() + (d as f64 + 8.0) * CA_U) * vmax + CA_U;
    (out, tol)
}
