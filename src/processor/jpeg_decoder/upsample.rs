//! Chroma upsampling and colour conversion as libjpeg does them by default (`jdsample.c` with
//! `do_fancy_upsampling`, `jdcolor.c`): the triangle ("fancy") filters for 2:1 horizontal (h2v1), 2:1
//! both ways (h2v2) and 2:1 vertical (h1v2), with libjpeg's edge rules and its context rows (the rows
//! above the first and below the last are copies of them); plain replication for other integral ratios
//! and for components 2 samples wide or less; fixed-point YCbCr -> RGB with libjpeg's tables.

/// One component's samples: `width` x `height` valid, rows `stride` apart.
pub(super) struct Plane<'a> {
    pub data: &'a [u8],
    pub stride: usize,
    pub width: usize,
    pub height: usize,
}

impl Plane<'_> {
    /// Row `r`, clamped to the valid rows (libjpeg's context rows at the top and bottom).
    fn row(&self, r: isize) -> &[u8] {
        let r = r.clamp(0, self.height as isize - 1) as usize;
        &self.data[r * self.stride..r * self.stride + self.width]
    }
}

/// Upsample `p` by (`fh`, `fv`) into a plane of `out_w` x `out_h` (cropped from the full
/// `fh * width` x `fv * height`). `None` for a ratio libjpeg cannot upsample.
pub(super) fn upsample(
    p: &Plane,
    fh: usize,
    fv: usize,
    out_w: usize,
    out_h: usize,
) -> Option<Vec<u8>> {
    let w = p.width;
    let full_w = w * fh;
    let mut out = vec![0u8; full_w * out_h];
    let fancy = |n: usize| n > 2;
    match (fh, fv) {
        (1, 1) => {
            for y in 0..out_h {
                out[y * full_w..(y + 1) * full_w].copy_from_slice(p.row(y as isize));
            }
        }
        (2, 1) if fancy(w) => {
            for y in 0..out_h {
                h2v1(p.row(y as isize), &mut out[y * full_w..(y + 1) * full_w]);
            }
        }
        (2, 2) if fancy(w) => {
            for y in 0..out_h {
                let (r, v) = ((y / 2) as isize, y % 2);
                let near = p.row(r);
                let far = p.row(if v == 0 { r - 1 } else { r + 1 });
                h2v2(near, far, &mut out[y * full_w..(y + 1) * full_w]);
            }
        }
        (1, 2) => {
            for y in 0..out_h {
                let (r, v) = ((y / 2) as isize, y % 2);
                let near = p.row(r);
                let far = p.row(if v == 0 { r - 1 } else { r + 1 });
                let bias = if v == 0 { 1 } else { 2 };
                for ((o, &a), &b) in out[y * full_w..(y + 1) * full_w]
                    .iter_mut()
                    .zip(near)
                    .zip(far)
                {
                    *o = ((u32::from(a) * 3 + u32::from(b) + bias) >> 2) as u8;
                }
            }
        }
        (1..=4, 1..=4) => {
            // Replication (libjpeg's int_upsample, h2v1_upsample, h2v2_upsample).
            for y in 0..out_h {
                let src = p.row((y / fv) as isize);
                let dst = &mut out[y * full_w..(y + 1) * full_w];
                for (x, o) in dst.iter_mut().enumerate() {
                    *o = src[x / fh];
                }
            }
        }
        _ => return None,
    }
    if full_w == out_w {
        return Some(out);
    }
    Some(
        out.chunks_exact(full_w)
            .flat_map(|r| r[..out_w].iter().copied())
            .collect(),
    )
}

/// libjpeg's `h2v1_fancy_upsample` of one row (`inp.len() > 2`).
fn h2v1(inp: &[u8], out: &mut [u8]) {
    fancy_row(inp.len(), |i| u32::from(inp[i]), (1, 2, 2), out);
}

/// libjpeg's `h2v2_fancy_upsample` of one output row from its nearer and farther input rows.
fn h2v2(near: &[u8], far: &[u8], out: &mut [u8]) {
    let sum = |i: usize| u32::from(near[i]) * 3 + u32::from(far[i]);
    fancy_row(near.len(), sum, (8, 7, 4), out);
}

/// The horizontal step of libjpeg's fancy (triangle) 2x upsampling over `n >= 2` samples `x(i)`: output
/// `2i` is `(3 x(i) + x(i - 1) + even) >> shift`, output `2i + 1` is `(3 x(i) + x(i + 1) + odd) >> shift`,
/// with the edge sample standing in for its missing neighbour.
#[inline(always)]
fn fancy_row(
    n: usize,
    x: impl Fn(usize) -> u32,
    (even, odd, shift): (u32, u32, u32),
    out: &mut [u8],
) {
    out[0] = ((x(0) * 4 + even) >> shift) as u8;
    out[1] = ((x(0) * 3 + x(1) + odd) >> shift) as u8;
    for i in 1..n - 1 {
        let this = x(i) * 3;
        out[2 * i] = ((this + x(i - 1) + even) >> shift) as u8;
        out[2 * i + 1] = ((this + x(i + 1) + odd) >> shift) as u8;
    }
    out[2 * n - 2] = ((x(n - 1) * 3 + x(n - 2) + even) >> shift) as u8;
    out[2 * n - 1] = ((x(n - 1) * 4 + odd) >> shift) as u8;
}

/// libjpeg's YCbCr -> RGB tables (`build_ycc_rgb_table`): Cr -> R, Cb -> B, and the two G terms.
pub(super) struct YccTables {
    cr_r: [i32; 256],
    cb_b: [i32; 256],
    cr_g: [i32; 256],
    cb_g: [i32; 256],
}

impl YccTables {
    pub(super) fn new() -> Self {
        const HALF: i64 = 1 << 15;
        let fix = |x: f64| (x * 65536.0 + 0.5) as i64;
        let mut t = YccTables {
            cr_r: [0; 256],
            cb_b: [0; 256],
            cr_g: [0; 256],
            cb_g: [0; 256],
        };
        for i in 0..256usize {
            let x = i as i64 - 128;
            t.cr_r[i] = ((fix(1.40200) * x + HALF) >> 16) as i32;
            t.cb_b[i] = ((fix(1.77200) * x + HALF) >> 16) as i32;
            t.cr_g[i] = (-fix(0.71414) * x) as i32;
            t.cb_g[i] = (-fix(0.34414) * x + HALF) as i32;
        }
        t
    }

    /// One pixel to (R, G, B).
    #[inline]
    pub(super) fn rgb(&self, y: u8, cb: u8, cr: u8) -> [u8; 3] {
        let y = i32::from(y);
        let (cb, cr) = (usize::from(cb), usize::from(cr));
        let clamp = |v: i32| v.clamp(0, 255) as u8;
        [
            clamp(y + self.cr_r[cr]),
            clamp(y + ((self.cb_g[cb] + self.cr_g[cr]) >> 16)),
            clamp(y + self.cb_b[cb]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fancy_filters_keep_flat_planes_flat_and_weigh_three_to_one() {
        let out = {
            let mut o = [0u8; 6];
            h2v1(&[0, 100, 200], &mut o);
            o
        };
        // 3/4 nearer + 1/4 farther, libjpeg's alternating rounding; the ends repeat the edge sample.
        assert_eq!(out, [0, 25, 75, 125, 175, 200]);
        let mut o = [0u8; 6];
        h2v2(&[80, 80, 80], &[80, 80, 80], &mut o);
        assert_eq!(o, [80; 6]);
        let t = YccTables::new();
        assert_eq!(t.rgb(128, 128, 128), [128, 128, 128]);
        assert_eq!(t.rgb(255, 128, 255), [255, 164, 255]);
    }
}
