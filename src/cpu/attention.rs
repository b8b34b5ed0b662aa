//! Scaled dot-product attention on the CPU, as [`crate::ops::attention`] and
//! [`crate::ops::window_attn`] define it: per head, out = softmax(q k^T + mask) v with q scaled (in f32)
//! before the product, heads interleaved in columns (head h owns columns h*D .. h*D + D), K/V shared by
//! every batch row when Bk = 1. Key j is visible to query row i iff j < kv_len and, when causal,
//! j <= q_offset + i; invisible keys contribute exactly 0 and a row that sees none outputs zeros. K and V
//! are f32 or IEEE half ([`KvRef`]: the decoder's caches and cross K/V when the weights are not fp32),
//! widened to f32 exactly; the arithmetic is f32 (two-pass softmax per row).
//!
//! Work: per (batch row, block of query rows, head): for more than two query rows the head's visible
//! keys are gathered once into K^T (D, L) and V (L, D), scores are computed 4 query rows x 8 keys at a
//! time with D in registers, then the probabilities weight V's rows; a decode step's one or two rows
//! read K and V rows in place (a dot per key). Natively with AVX2 and FMA the blocks run compiled for
//! them.

use half::f16;

use crate::cpu::gemm::{sgemm_nt, MatRef};
use crate::cpu::{check_len, par, softmax::softmax_row, sum8};
use crate::error::{Error, Result};

/// K or V rows: f32 or halves.
#[derive(Clone, Copy, Debug)]
pub enum KvRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvRef<'_> {
    fn len(&self) -> usize {
        match self {
            KvRef::F32(s) => s.len(),
            KvRef::F16(s) => s.len(),
        }
    }
}

/// A KV cache (B, L, D) being written: f32 or halves.
#[derive(Debug)]
pub enum KvMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

/// One attention call's options as the kernel runs them: [`crate::opdef::attention::AttnOpts`] with its
/// run-time values resolved (the key count and query position read, the mask as host values).
#[derive(Clone, Copy, Debug)]
pub struct AttnOpts<'a> {
    pub heads: usize,
    /// Multiplies q before q k^T (usually head_dim^-0.5).
    pub scale: f32,
    pub causal: bool,
    /// Valid key rows (KV-cache fill); `None` = all Tk.
    pub kv_len: Option<usize>,
    /// Absolute position of query row 0 (causal rule).
    pub q_offset: usize,
    /// Additive mask (Tq, Tk), shared by every batch row and head.
    pub mask: Option<&'a [f32]>,
}

/// Where one operand's rows are: row r of batch row b at `(b * rows + r) * stride + off`.
#[derive(Clone, Copy)]
struct Src<T> {
    data: T,
    stride: usize,
    off: usize,
}

/// The shape of one call: B batch rows of Tq queries, Bk (B or 1) batch rows of Tk keys, C = H*D.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    bk: usize,
    tq: usize,
    tk: usize,
    c: usize,
}

/// out (B, Tq, C) = attention of q (B, Tq, C) over k, v (Bk, Tk, C) with Bk = B or 1, C = heads * D.
pub fn attention(
    q: &[f32],
    k: KvRef,
    v: KvRef,
    (b, tq, tk, c): (usize, usize, usize, usize),
    opts: &AttnOpts,
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "cpu attention";
    check_len(OP, "q", q, b * tq * c)?;
    check_len(OP, "out", out, b * tq * c)?;
    let bk = if tk * c > 0 && k.len() == tk * c && b != 1 {
        1
    } else {
        b
    };
    if k.len() != bk * tk * c || v.len() != k.len() {
        return Err(Error::shape(
            OP,
            format!(
                "k, v of {} / {} values are not ({b} or 1, {tk}, {c})",
                k.len(),
                v.len()
            ),
        ));
    }
    if let Some(m) = opts.mask {
        check_len(OP, "mask", m, tq * tk)?;
    }
    let dims = Dims { b, bk, tq, tk, c };
    let src = |data| Src {
        data,
        stride: c,
        off: 0,
    };
    run(q, src(k), src(v), dims, opts, out, c)
}

/// DaViT window attention: out (nW, T, C) from qkv (nW, T, 3C) (columns q | k | v, heads interleaved
/// in each), no mask, `scale` = head_dim^-0.5.
pub fn window_attention(
    qkv: &[f32],
    (nw, t, c): (usize, usize, usize),
    heads: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "cpu window_attention";
    check_len(OP, "qkv", qkv, nw * t * 3 * c)?;
    check_len(OP, "out", out, nw * t * c)?;
    let opts = AttnOpts {
        heads,
        scale,
        causal: false,
        kv_len: None,
        q_offset: 0,
        mask: None,
    };
    let dims = Dims {
        b: nw,
        bk: nw,
        tq: t,
        tk: t,
        c,
    };
    let at = |off| Src {
        data: KvRef::F32(qkv),
        stride: 3 * c,
        off,
    };
    run(qkv, at(c), at(2 * c), dims, &opts, out, 3 * c)
}

/// Check the heads and split the work. Many batch rows (DaViT windows): chunks of batch rows in
/// parallel, every head of a row in turn, written in place. Few (the encoder, decode steps): tasks of
/// (batch row, query block, head), each computing its (rows, D) block apart, then copied into its
/// columns; query blocks are small enough for about four tasks per thread, or whole when the block
/// runs on the (threaded) GEMM.
fn run(
    q: &[f32],
    k: Src<KvRef>,
    v: Src<KvRef>,
    d: Dims,
    opts: &AttnOpts,
    out: &mut [f32],
    q_stride: usize,
) -> Result<()> {
    if opts.heads == 0 || !d.c.is_multiple_of(opts.heads) {
        return Err(Error::shape(
            "cpu attention",
            format!("{} columns are not {} heads", d.c, opts.heads),
        ));
    }
    if d.b * d.tq * d.c == 0 {
        return Ok(());
    }
    let qs = Src {
        data: q,
        stride: q_stride,
        off: 0,
    };
    let (heads, hd) = (opts.heads, d.c / opts.heads);
    let want = 4 * par::threads();
    let job = Job {
        q: qs,
        k,
        v,
        d,
        opts,
    };
    if d.b >= want {
        par::chunks_mut(out, d.tq * d.c, |bi, ob| {
            for h in 0..heads {
                let dst = Dst {
                    stride: d.c,
                    col: h * hd,
                };
                block(&job, (bi, 0, h), ob, dst);
            }
        });
        return Ok(());
    }
    // Blocks that run on the GEMM are threaded inside it: their heads are split no further.
    let splits = if d.tq * d.tk * hd >= GEMM_WORK {
        1
    } else {
        want.div_ceil(d.b * heads).min(d.tq.div_ceil(4)).max(1)
    };
    let qchunk = d.tq.div_ceil(splits);
    let nq = d.tq.div_ceil(qchunk);
    let blocks = par::map(d.b * nq * heads, |t| {
        let (h, qi, bi) = (t % heads, t / heads % nq, t / heads / nq);
        let rows = qchunk.min(d.tq - qi * qchunk);
        let mut o = vec![0f32; rows * hd];
        let dst = Dst { stride: hd, col: 0 };
        block(&job, (bi, qi * qchunk, h), &mut o, dst);
        o
    });
    for (t, o) in blocks.iter().enumerate() {
        let (h, qi, bi) = (t % heads, t / heads % nq, t / heads / nq);
        for (r, src) in o.chunks_exact(hd).enumerate() {
            let row = bi * d.tq + qi * qchunk + r;
            out[row * d.c + h * hd..][..hd].copy_from_slice(src);
        }
    }
    Ok(())
}

/// Where a block's output rows go: row r, element e at `r * stride + col + e`.
#[derive(Clone, Copy)]
struct Dst {
    stride: usize,
    col: usize,
}

/// The operands and options every block of one call shares.
struct Job<'a> {
    q: Src<&'a [f32]>,
    k: Src<KvRef<'a>>,
    v: Src<KvRef<'a>>,
    d: Dims,
    opts: &'a AttnOpts<'a>,
}

/// One head of query rows i0 .. i0 + out.len() / dst.stride of batch row `bi`, into `out`. On x86_64
/// CPUs with AVX2 and FMA the same code runs compiled for them (chosen at run time; no operation is
/// fused, so the results do not change).
fn block(job: &Job, at: (usize, usize, usize), out: &mut [f32], dst: Dst) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features `block_avx2` is compiled for were detected just above.
        unsafe { block_avx2(job, at, out, dst) };
        return;
    }
    block_body(job, at, out, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(job: &Job, at: (usize, usize, usize), out: &mut [f32], dst: Dst) {
    block_body(job, at, out, dst)
}

/// [`block`]'s body. Up to [`DIRECT_ROWS`] query rows (decode steps) read each key and value row where
/// it is; more rows first gather the head's visible keys into K^T (D, L) and V (L, D), then score 4
/// query rows x 8 keys at a time with D in registers (or, for long blocks, run both products on the
/// GEMM).
#[inline(always)]
fn block_body(job: &Job, (bi, i0, h): (usize, usize, usize), out: &mut [f32], dst: Dst) {
    let b = Block::new(job, (bi, i0, h), out.len().div_ceil(dst.stride));
    if b.rows <= DIRECT_ROWS {
        b.direct(out, dst);
    } else if b.rows * b.l * b.hd < GEMM_WORK || !b.on_gemm(out, dst) {
        b.gathered(out, dst);
    }
}

/// Keys query row `i` sees: the first `kv_len`, and under the causal rule none past its position.
#[inline(always)]
fn vis_end(o: &AttnOpts, kv_len: usize, i: usize) -> usize {
    if o.causal {
        kv_len.min(o.q_offset + i + 1)
    } else {
        kv_len
    }
}

/// One block's place: batch row `bi`, head `h`, query rows `i0 .. i0 + rows`, the first `l` keys.
struct Block<'a, 'j> {
    job: &'j Job<'a>,
    bi: usize,
    i0: usize,
    h: usize,
    hd: usize,
    rows: usize,
    kv_len: usize,
    l: usize,
    /// The K/V batch row (0 when K and V are shared by every batch row).
    kb: usize,
}

impl<'a, 'j> Block<'a, 'j> {
    #[inline(always)]
    fn new(job: &'j Job<'a>, (bi, i0, h): (usize, usize, usize), rows: usize) -> Self {
        let (d, o) = (job.d, job.opts);
        let kv_len = o.kv_len.unwrap_or(d.tk).min(d.tk);
        Block {
            job,
            bi,
            i0,
            h,
            hd: d.c / o.heads,
            rows,
            kv_len,
            l: vis_end(o, kv_len, i0 + rows - 1), // keys any row of the block sees
            kb: if d.bk == 1 { 0 } else { bi },
        }
    }

    /// Keys query row `i` sees.
    #[inline(always)]
    fn vis_end(&self, i: usize) -> usize {
        vis_end(self.job.opts, self.kv_len, i)
    }

    /// Query row r of the block, scaled, into `dst` (D).
    #[inline(always)]
    fn qrow_into(&self, r: usize, dst: &mut [f32]) {
        let (q, d, hd) = (&self.job.q, self.job.d, self.hd);
        let base = (self.bi * d.tq + self.i0 + r) * q.stride + q.off + self.h * hd;
        let scale = self.job.opts.scale;
        dst.iter_mut()
            .zip(&q.data[base..base + hd])
            .for_each(|(o, &x)| *o = x * scale);
    }

    #[inline(always)]
    fn qrow(&self, r: usize) -> Vec<f32> {
        let mut v = vec![0f32; self.hd];
        self.qrow_into(r, &mut v);
        v
    }

    /// Adds the mask's row `i` to the scores `sr`.
    #[inline(always)]
    fn mask_row(&self, i: usize, sr: &mut [f32]) {
        if let Some(m) = self.job.opts.mask {
            let (n, tk) = (sr.len(), self.job.d.tk);
            sr.iter_mut()
                .zip(&m[i * tk..i * tk + n])
                .for_each(|(x, &mv)| *x += mv);
        }
    }

    /// Key row j's K or V slice (D) of this block's head.
    #[inline(always)]
    fn kv_row<'s>(&self, src: &'s Src<KvRef<'_>>, j: usize, tmp: &'s mut [f32]) -> &'s [f32] {
        src.row(self.kb * self.job.d.tk + j, self.h * self.hd, self.hd, tmp)
    }

    /// Few query rows: each key and value row read where it is.
    #[inline(always)]
    fn direct(&self, out: &mut [f32], dst: Dst) {
        let hd = self.hd;
        let mut s = vec![0f32; self.l.max(1)];
        let mut kr = vec![0f32; hd];
        let mut qr = vec![0f32; hd];
        for r in 0..self.rows {
            let i = self.i0 + r;
            let n = self.vis_end(i);
            let orow = &mut out[r * dst.stride + dst.col..][..hd];
            orow.fill(0.0);
            if n == 0 {
                continue; // no visible key: zeros
            }
            self.qrow_into(r, &mut qr);
            for (j, sj) in s[..n].iter_mut().enumerate() {
                *sj = dot8(&qr, self.kv_row(&self.job.k, j, &mut kr));
            }
            self.mask_row(i, &mut s[..n]);
            softmax_row(&mut s[..n]);
            for (j, &p) in s[..n].iter().enumerate() {
                let vr = self.kv_row(&self.job.v, j, &mut kr);
                orow.iter_mut().zip(vr).for_each(|(a, &x)| *a += p * x);
            }
        }
    }

    /// Long blocks: both products on the GEMM. False when the GEMM declines (nothing written).
    #[inline(always)]
    fn on_gemm(&self, out: &mut [f32], dst: Dst) -> bool {
        let (rows, l, hd) = (self.rows, self.l, self.hd);
        let qh: Vec<f32> = (0..rows).flat_map(|r| self.qrow(r)).collect(); // (rows, D)
        let mut s = vec![0f32; rows * l];
        let mut o = vec![0f32; rows * hd];
        let mut kr = vec![0f32; hd];
        let mut kh = Vec::with_capacity(l * hd); // (L, D)
        let mut vt = vec![0f32; hd * l]; // V^T (D, L)
        for j in 0..l {
            kh.extend_from_slice(self.kv_row(&self.job.k, j, &mut kr));
            for (e, &x) in self.kv_row(&self.job.v, j, &mut kr).iter().enumerate() {
                vt[e * l + j] = x;
            }
        }
        let ok = gemm_block(&qh, &kh, &vt, (rows, l, hd), &mut s, &mut o, |r, sr| {
            let i = self.i0 + r;
            let n = self.vis_end(i);
            self.mask_row(i, &mut sr[..n]);
            sr[n..].fill(0.0);
            if n > 0 {
                softmax_row(&mut sr[..n]);
            }
        });
        if ok {
            for (r, src) in o.chunks_exact(hd).enumerate() {
                out[r * dst.stride + dst.col..][..hd].copy_from_slice(src);
            }
        }
        ok
    }

    /// The visible keys gathered into K^T (D, L) and V (L, D), then 4 query rows x 8 keys at a time.
    #[inline(always)]
    fn gathered(&self, out: &mut [f32], dst: Dst) {
        let (rows, l, hd, d) = (self.rows, self.l, self.hd, self.job.d);
        let (kt, vv) = gather(
            self.job.k,
            self.job.v,
            (self.kb * d.tk, l),
            (self.h * hd, hd),
        );
        let mut s = vec![0f32; 4 * l.max(1)];
        let mut o = vec![0f32; 4 * hd];
        for r0 in (0..rows).step_by(4) {
            let qb = 4.min(rows - r0);
            let qr: Vec<Vec<f32>> = (0..qb).map(|r| self.qrow(r0 + r)).collect();
            scores(&qr, &kt, l, &mut s);
            o.fill(0.0);
            for r in 0..qb {
                let i = self.i0 + r0 + r;
                let n = self.vis_end(i);
                let sr = &mut s[r * l..r * l + n];
                self.mask_row(i, sr);
                if n == 0 {
                    continue; // no visible key: zeros
                }
                softmax_row(sr);
                let orow = &mut o[r * hd..(r + 1) * hd];
                for (j, &p) in sr.iter().enumerate() {
                    let vr = &vv[j * hd..(j + 1) * hd];
                    orow.iter_mut().zip(vr).for_each(|(a, &x)| *a += p * x);
                }
            }
            for r in 0..qb {
                out[(r0 + r) * dst.stride + dst.col..][..hd]
                    .copy_from_slice(&o[r * hd..(r + 1) * hd]);
            }
        }
    }
}

/// Query rows up to which a block reads K and V rows in place instead of gathering them.
const DIRECT_ROWS: usize = 2;

/// Multiply-adds of q k^T (rows x keys x D) from which a block runs its two products on the GEMM
/// ([`sgemm_nt`]); smaller blocks on the register-blocked loops here. DaViT's 144-token windows
/// (144 x 144 x 32 = 663K per head) run on the GEMM: on the base tower at 768 px the window attention
/// took 40% less time there than on the loops (docs/performance.md).
const GEMM_WORK: usize = 1 << 18;

/// S (R, L) = Qh (R, D) Kh (L, D)^T; `probs(r, S[r])` turns row r into probabilities in place (0 past
/// the visible keys); O (R, D) = P (R, L) (V^T (D, L))^T. False if a shape does not hold (never, for
/// the shapes [`block_body`] passes; it then falls back to its loops).
fn gemm_block(
    qh: &[f32],
    kh: &[f32],
    vt: &[f32],
    (rows, l, hd): (usize, usize, usize),
    s: &mut [f32],
    o: &mut [f32],
    probs: impl Fn(usize, &mut [f32]),
) -> bool {
    if sgemm_nt(MatRef::new(qh, rows, hd), MatRef::new(kh, l, hd), s, l, 0).is_err() {
        return false;
    }
    for (r, sr) in s.chunks_exact_mut(l).enumerate() {
        probs(r, sr);
    }
    sgemm_nt(MatRef::new(s, rows, l), MatRef::new(vt, hd, l), o, hd, 0).is_ok()
}

/// a . b in 8 lane-wise partial sums added pairwise (the tail past whole groups of 8 added last).
#[inline(always)]
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let body = a.len() / 8 * 8;
    for (ac, bc) in a[..body].chunks_exact(8).zip(b[..body].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ac[l] * bc[l];
        }
    }
    let mut s = sum8(&acc);
    for (x, y) in a[body..].iter().zip(&b[body..]) {
        s += x * y;
    }
    s
}

impl<'a> Src<KvRef<'a>> {
    /// Columns `col .. col + len` of row `row` as f32: in place when f32, else widened into `buf`.
    #[inline(always)]
    fn row<'b>(&self, row: usize, col: usize, len: usize, buf: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        let at = row * self.stride + self.off + col;
        match self.data {
            KvRef::F32(s) => &s[at..at + len],
            KvRef::F16(s) => {
                crate::cpu::widen::f16_to_f32(&s[at..at + len], &mut buf[..len]);
                &buf[..len]
            }
        }
    }
}

/// K^T (D, L) and V (L, D) of one head: key rows `row0 .. row0 + L` (absolute rows of the sources),
/// columns `col .. col + D`, widened to f32.
#[inline(always)]
fn gather(
    k: Src<KvRef>,
    v: Src<KvRef>,
    (row0, l): (usize, usize),
    (col, hd): (usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    let mut kt = vec![0f32; hd * l];
    let mut vv = vec![0f32; l * hd];
    let mut kr = vec![0f32; hd];
    for j in 0..l {
        let krow = k.row(row0 + j, col, hd, &mut kr);
        for (e, &x) in krow.iter().enumerate() {
            kt[e * l + j] = x;
        }
        let vrow = v.row(row0 + j, col, hd, &mut kr);
        vv[j * hd..(j + 1) * hd].copy_from_slice(vrow);
    }
    (kt, vv)
}

/// s[r, j] = q[r] . K^T[:, j] for the block's rows (<= 4) and the L keys: 8 keys x every row per step,
/// the D-long sums in registers.
#[inline(always)]
fn scores(q: &[Vec<f32>], kt: &[f32], l: usize, s: &mut [f32]) {
    let hd = q.first().map_or(0, Vec::len);
    let body = l / 8 * 8;
    for j0 in (0..body).step_by(8) {
        let mut acc = [[0f32; 8]; 4];
        for e in 0..hd {
            let kv = &kt[e * l + j0..e * l + j0 + 8];
            for (r, qr) in q.iter().enumerate() {
                let qv = qr[e];
                for x in 0..8 {
                    acc[r][x] += qv * kv[x];
                }
            }
        }
        for (r, a) in acc.iter().enumerate().take(q.len()) {
            s[r * l + j0..r * l + j0 + 8].copy_from_slice(a);
        }
    }
    for j in body..l {
        for (r, qr) in q.iter().enumerate() {
            s[r * l + j] = (0..hd).map(|e| qr[e] * kt[e * l + j]).sum();
        }
    }
}

/// cache[r, pos, :] = rows[r, :] for a cache (B, L, D) and rows (B, D) (halves rounded to nearest
/// even; the GPU's `pack2x16float` may take either neighbour). A `pos` past L writes nothing.
pub fn kv_write(
    mut cache: KvMut,
    (b, l, d): (usize, usize, usize),
    pos: usize,
    rows: &[f32],
) -> Result<()> {
    const OP: &str = "cpu kv_write";
    check_len(OP, "rows", rows, b * d)?;
    let len = match &cache {
        KvMut::F32(c) => c.len(),
        KvMut::F16(c) => c.len(),
    };
    if len != b * l * d {
        return Err(Error::shape(
            OP,
            format!("cache of {len} values is not ({b}, {l}, {d})"),
        ));
    }
    if pos >= l || d == 0 {
        return Ok(());
    }
    for (r, src) in rows.chunks_exact(d).enumerate() {
        let at = (r * l + pos) * d;
        match &mut cache {
            KvMut::F32(c) => c[at..at + d].copy_from_slice(src),
            KvMut::F16(c) => f32_to_f16(src, &mut c[at..at + d])?,
        }
    }
    Ok(())
}

/// out = x rounded to IEEE half (nearest even), same lengths.
pub fn f32_to_f16(x: &[f32], out: &mut [f16]) -> Result<()> {
    use half::slice::HalfFloatSliceExt;
    check_len("cpu f32_to_f16", "out", out, x.len())?;
    out.convert_from_f32_slice(x);
    Ok(())
}
