//! DaViT window partition / reverse (`shaders/window.wgsl`): zero-pad to multiples of the window, cut
//! into ws x ws windows (row-major windows, row-major tokens), and the inverse with the padding cropped.

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "window", [("WG", WG)]);

const WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "window" / Params {
        n: u32, h: u32, w: u32, c: u32, ws: u32, nwh: u32, nww: u32, _pad0: u32
    }
}

pub use crate::cpu::window::window_grid;

#[allow(clippy::too_many_arguments)]
fn launch(
    rec: &mut Recorder,
    entry: &'static str,
    src: &Tensor,
    dst: &Tensor,
    h: usize,
    w: usize,
    c: usize,
    ws: usize,
) -> Result<()> {
    let mut n = dst.numel();
    if n == 0 {
        return Ok(());
    }
    match rec.backend()? {
        Backend::Host => rec.host_op(entry, &[src], || match entry {
            "window_partition" => host::vision::window_partition(src, ws, dst),
            _ => host::vision::window_reverse(src, ws, (h, w), dst),
        }),
        Backend::Wgpu(_) => {
            // The VEC4 variant when whole tokens are whole vec4s.
            let vec4 = c.is_multiple_of(4);
            let c = if vec4 {
                n /= 4;
                c / 4
            } else {
                c
            };
            let n32 = check::u32_of(entry, "elements", n)?;
            let (nwh, nww) = window_grid(h, w, ws);
            let params = Params {
                n: n32,
                h: h as u32,
                w: w as u32,
                c: c as u32,
                ws: ws as u32,
                nwh: nwh as u32,
                nww: nww as u32,
                _pad0: 0,
            };
            rec.launch(
                &Kernel::new(&SHADER, entry).defines(if vec4 { &["VEC4"] } else { &[] }),
                &params,
                &[src, dst],
                grid_1d(ceil_div(n, WG as usize)),
            )
        }
    }
}

/// x (B, H, W, C) -> out (B*nWh*nWw, ws*ws, C), zero-padding H and W up to multiples of `ws` first
/// (bottom/right, like the reference's `F.pad`). Window order: batch, window row, window column.
pub fn window_partition(rec: &mut Recorder, x: &Tensor, ws: usize, out: &Tensor) -> Result<()> {
    const OP: &str = "window_partition";
    check::f32(OP, "x", x)?;
    check::f32(OP, "out", out)?;
    if x.rank() != 4 || ws == 0 {
        return Err(Error::shape(
            OP,
            format!("x {:?} must be (B, H, W, C), ws {ws} > 0", x.shape()),
        ));
    }
    let (b, h, w, c) = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
    let (nwh, nww) = window_grid(h, w, ws);
    let want = [b * nwh * nww, ws * ws, c];
    if out.shape() != want {
        return Err(Error::shape(
            OP,
            format!("out {:?} must be {want:?}", out.shape()),
        ));
    }
    launch(rec, OP, x, out, h, w, c, ws)
}

/// x (B*nWh*nWw, ws*ws, C) -> out (B, H, W, C): the inverse of [`window_partition`], dropping the rows
/// and columns that were padding.
pub fn window_reverse(
    rec: &mut Recorder,
    x: &Tensor,
    ws: usize,
    h: usize,
    w: usize,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "window_reverse";
    check::f32(OP, "x", x)?;
    check::f32(OP, "out", out)?;
    if out.rank() != 4 || x.rank() != 3 || ws == 0 {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?} must be (nW, ws*ws, C), out {:?} (B, H, W, C), ws {ws} > 0",
                x.shape(),
                out.shape()
            ),
        ));
    }
    let (b, c) = (out.dim(0), out.dim(3));
    if out.dim(1) != h || out.dim(2) != w {
        return Err(Error::shape(
            OP,
            format!("out {:?} is not {h}x{w}", out.shape()),
        ));
    }
    let (nwh, nww) = window_grid(h, w, ws);
    let want = [b * nwh * nww, ws * ws, c];
    if x.shape() != want {
        return Err(Error::shape(
            OP,
            format!("x {:?} must be {want:?}", x.shape()),
        ));
    }
    launch(rec, OP, x, out, h, w, c, ws)
}
