//! Element-wise ops (`shaders/elementwise.wgsl`).

use crate::error::{Error, Result};
use crate::gpu::{ceil_div, grid_1d, DType, Kernel, Recorder, Shader, Tensor};

pub static SHADER: Shader = Shader {
    name: "elementwise",
    source: include_str!("../../shaders/elementwise.wgsl"),
};

const WG: u32 = 256;

/// Mirrors `Params` in `shaders/elementwise.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
}

fn check_f32(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::shape(
            op,
            format!("expected f32, got {:?}", t.dtype()),
        ));
    }
    Ok(())
}

/// out = a + b (same shapes).
pub fn add(rec: &mut Recorder, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    for t in [a, b, out] {
        check_f32("add", t)?;
    }
    if a.shape() != b.shape() || a.shape() != out.shape() {
        return Err(Error::shape(
            "add",
            format!(
                "shapes {:?} + {:?} -> {:?}",
                a.shape(),
                b.shape(),
                out.shape()
            ),
        ));
    }
    let n = a.numel();
    let gpu = rec.gpu().clone();
    let params = Params {
        n: n as u32,
        scale: 1.0,
        _pad0: 0,
        _pad1: 0,
    };
    rec.dispatch(
        &Kernel::new(&SHADER, "add").with(&[("WG", WG as f64)]),
        &params,
        &[a.binding(&gpu)?, b.binding(&gpu)?, out.binding(&gpu)?],
        grid_1d(ceil_div(n, WG as usize)),
    )
}
