//! Element type conversion (`shaders/cast.wgsl`): f32 to packed f16 for activations stored as halves
//! (the decoder's cross-attention K/V and the cache rows of a fixed-position step, when the weights are
//! not fp32).

use crate::cpu::host;
use crate::error::Result;
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, DType, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "cast", [("WG", WG)]);

const WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "cast" / Params {
        n: u32, words: u32, _pad0: u32, _pad1: u32
    }
}

/// out = x rounded to f16 (`pack2x16float`: WGSL allows either neighbour, a relative error below
/// 2^-10), x f32 and out f16 of the same shape.
pub fn f32_to_f16(rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "f32_to_f16";
    check::f32(OP, "x", x)?;
    check::dtype(OP, "out", out, DType::F16)?;
    check::shape(OP, "out", out, x.shape())?;
    let n = x.numel();
    let words = n.div_ceil(2);
    let params = Params {
        n: check::u32_of(OP, "elements", n)?,
        words: check::u32_of(OP, "words", words)?,
        _pad0: 0,
        _pad1: 0,
    };
    if n == 0 {
        return Ok(());
    }
    match rec.backend()? {
        Backend::Host => rec.host_op("f32_to_f16", &[x], || host::dense::f32_to_f16(x, out)),
        Backend::Wgpu(_) => rec.launch(
            &Kernel::new(&SHADER, "f32_to_f16"),
            &params,
            &[x, out],
            grid_1d(ceil_div(words, WG as usize)),
        ),
    }
}
