//! A packed GEMM on four-lane vectors ([`V4`]), the wasm build's: `c[i, c0 + j] = sum_k a[i, k] *
//! b[j, k]` like [`crate::cpu::gemm::sgemm_nt`], in the loop nest of BLIS. B is packed per (KC, NC) block
//! into NR-column slivers and A per (MC, KC) block into MR-row slivers, both k-major and zero-padded to
//! whole slivers; an MR x NR microkernel keeps its 8 four-lane accumulators in registers (as many
//! independent multiply-add chains as a core with two FMA units and 4-cycle latency keeps busy, leaving
//! V8's 15 allocatable vector registers room for two B vectors and one A broadcast), reading one B
//! sliver (8 KiB) from L1 while the A slivers of a block (72 KiB) stream from L2. Of the tiles measured
//! in V8 (6x8, 4x12, 4x8, 3x16, 8x8, 2x16), 4x8 was the fastest with and without relaxed SIMD.
//!
//! Where the module is built with `+relaxed-simd` the multiply-add is `f32x4.relaxed_madd`, one fused
//! instruction on CPUs with FMA, which the `gemm` crate's SIMD128 kernels (a multiply and an add) cannot
//! use. The sums run over k in order per output, one K block (KC) after another, so results differ from
//! the other GEMMs' by summation order (and by fusion where the engine fuses): within the tolerance the
//! tests state against an f64 product.

use std::cell::RefCell;

use crate::cpu::lanes::V4;
use crate::cpu::mat::MatRef;
use crate::cpu::par;

/// Microkernel rows and columns (two V4 per row).
const MR: usize = 4;
const NR: usize = 8;
/// Depth of a packed block, rows of an A block, columns of a B block.
const KC: usize = 256;
const MC: usize = 72;
const NC: usize = 1024;

thread_local! {
    /// The A block this thread packs, kept across blocks and calls (one allocation per thread).
    static A_PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One (KC, NC) block of B, packed, and where its products go.
struct Block<'a> {
    bp: &'a [f32],
    j0: usize,
    nc: usize,
    k0: usize,
    kc: usize,
    ldc: usize,
    c0: usize,
}

/// c (M, ldc)[.., c0 .. c0 + N] = a (M, K) @ b (N, K)^T; the caller checked the shapes (M, N, K > 0).
pub(crate) fn sgemm(a: MatRef, b: MatRef, c: &mut [f32], ldc: usize, c0: usize) {
    let (n, k) = (b.rows, a.cols);
    let mut bp = Vec::new();
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            pack::<NR>(b, j0, nc, k0, kc, &mut bp);
            let block = Block {
                bp: &bp,
                j0,
                nc,
                k0,
                kc,
                ldc,
                c0,
            };
            par::chunks_mut(c, MC * ldc, |t, cc| block.rows(a, t * MC, cc));
        }
    }
}

impl Block<'_> {
    /// The block's products for a's rows r0 .. (the rows of `cc`, c's rows from r0 on).
    fn rows(&self, a: MatRef, r0: usize, cc: &mut [f32]) {
        let (kc, ldc) = (self.kc, self.ldc);
        let rows = cc.len() / ldc;
        A_PACK.with_borrow_mut(|ap| {
            pack::<MR>(a, r0, rows, self.k0, kc, ap);
            self.products(ap, rows, cc);
        });
    }

    /// The products of the packed A block `ap` (`rows` rows) with the block's B, into `cc`.
    fn products(&self, ap: &[f32], rows: usize, cc: &mut [f32]) {
        let (kc, ldc) = (self.kc, self.ldc);
        let (bs, _) = self.bp.as_chunks::<NR>();
        let (as_, _) = ap.as_chunks::<MR>();
        for (s, bsl) in bs.chunks_exact(kc).enumerate() {
            let j = s * NR;
            let cols = NR.min(self.nc - j);
            for (q, asl) in as_.chunks_exact(kc).enumerate() {
                let i = q * MR;
                let tile = micro(asl, bsl);
                let dst = &mut cc[i * ldc + self.c0 + self.j0 + j..];
                store(&tile, dst, ldc, (MR.min(rows - i), cols), self.k0 == 0);
            }
        }
    }
}

/// The MR x NR products of one A sliver (kc, MR) and one B sliver (kc, NR), summed over k in order.
#[inline(always)]
fn micro(a: &[[f32; MR]], b: &[[f32; NR]]) -> [[f32; NR]; MR] {
    let zero = V4::splat(0.0);
    let mut acc = [[zero; 2]; MR];
    for (ak, bk) in a.iter().zip(b) {
        let (bh, _) = bk.as_chunks::<4>();
        let (b0, b1) = (V4::load(&bh[0]), V4::load(&bh[1]));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let ar = V4::splat(ak[r]);
            acc_r[0] = ar.madd(b0, acc_r[0]);
            acc_r[1] = ar.madd(b1, acc_r[1]);
        }
    }
    let mut out = [[0f32; NR]; MR];
    for (o, v) in out.iter_mut().zip(acc) {
        let (oh, _) = o.as_chunks_mut::<4>();
        v[0].store(&mut oh[0]);
        v[1].store(&mut oh[1]);
    }
    out
}

/// The (rows, cols) corner of a tile into dst (row stride ldc): written on the first K block, added on
/// the later ones.
#[inline(always)]
fn store(
    tile: &[[f32; NR]; MR],
    dst: &mut [f32],
    ldc: usize,
    (rows, cols): (usize, usize),
    first: bool,
) {
    for (r, t) in tile.iter().enumerate().take(rows) {
        let d = &mut dst[r * ldc..r * ldc + cols];
        if first {
            d.copy_from_slice(&t[..cols]);
        } else {
            d.iter_mut().zip(t).for_each(|(d, &v)| *d += v);
        }
    }
}

/// Rows r0 .. r0 + len of m, columns k0 .. k0 + kc, into `out` as L-row slivers, k-major: sliver s holds
/// `out[(s * kc + kk) * L + t] = m[r0 + s * L + t, k0 + kk]`, zero past the last row.
fn pack<const L: usize>(
    m: MatRef,
    r0: usize,
    len: usize,
    k0: usize,
    kc: usize,
    out: &mut Vec<f32>,
) {
    out.clear();
    out.resize(len.div_ceil(L) * kc * L, 0.0);
    for (s, dst) in out.chunks_exact_mut(kc * L).enumerate() {
        for t in 0..L.min(len - s * L) {
            let row = &m.row(r0 + s * L + t)[k0..k0 + kc];
            for (kk, &v) in row.iter().enumerate() {
                dst[kk * L + t] = v;
            }
        }
    }
}
