//! Matrix multiplies: `linear` (PyTorch Linear: x @ w^T + bias, optional exact GELU epilogue) and batched
//! `matmul`. Shaders: `shaders/matmul.wgsl` (portable register-blocked linear), `shaders/matmul_batched.wgsl`.
//!
//! Weights larger than one storage binding (the tied 51328x768 LM head on 128 MiB-binding devices) are
//! bound as row chunks ([`Tensor::row_chunks`]); each chunk is one dispatch writing its own output columns.

use crate::error::{Error, Result};
use crate::gpu::{ceil_div, DType, Kernel, Recorder, Shader, Tensor};

pub static SHADER: Shader = Shader {
    name: "matmul",
    source: include_str!("../../shaders/matmul.wgsl"),
};

pub static SHADER_BATCHED: Shader = Shader {
    name: "matmul_batched",
    source: include_str!("../../shaders/matmul_batched.wgsl"),
};

/// Epilogue applied after the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    None,
    /// Exact (erf-based) GELU, as PyTorch's `nn.GELU()` / `F.gelu` default.
    Gelu,
}

/// Mirrors `Params` in `shaders/matmul.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct LinearParams {
    m: u32,
    n: u32,
    k: u32,
    n_off: u32,
    n_rows: u32,
    flags: u32,
    _pad0: u32,
    _pad1: u32,
}

/// Mirrors `Params` in `shaders/matmul_batched.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct BmmParams {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
}

/// Outputs per workgroup edge of the portable kernels (16 invocations x 4 outputs each).
const BLOCK: usize = 64;

fn check_f32(op: &'static str, what: &str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::shape(
            op,
            format!("{what} must be f32, got {:?}", t.dtype()),
        ));
    }
    Ok(())
}

fn to_u32(op: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::shape(op, format!("size {v} exceeds u32")))
}

/// out (M, N) = act(x (M, K) @ w (N, K)^T + bias (N)). `w` is f32 or F16 (packed pairs); it may exceed
/// the device's storage-binding limit, in which case it is processed in row chunks.
pub fn linear(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    act: Act,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "linear";
    check_f32(OP, "x", x)?;
    check_f32(OP, "out", out)?;
    if w.dtype() != DType::F32 && w.dtype() != DType::F16 {
        return Err(Error::shape(
            OP,
            format!("w must be f32 or f16, got {:?}", w.dtype()),
        ));
    }
    if x.rank() != 2 || w.rank() != 2 || out.rank() != 2 {
        return Err(Error::shape(
            OP,
            format!(
                "expected x (M, K), w (N, K), out (M, N); got {:?}, {:?}, {:?}",
                x.shape(),
                w.shape(),
                out.shape()
            ),
        ));
    }
    let (m, k) = (x.dim(0), x.dim(1));
    let n = w.dim(0);
    if w.dim(1) != k || out.dim(0) != m || out.dim(1) != n {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?} @ w {:?}^T does not give out {:?}",
                x.shape(),
                w.shape(),
                out.shape()
            ),
        ));
    }
    if let Some(b) = bias {
        check_f32(OP, "bias", b)?;
        if b.shape() != [n] {
            return Err(Error::shape(
                OP,
                format!("bias {:?} must be ({n})", b.shape()),
            ));
        }
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        return Err(Error::shape(OP, "K = 0"));
    }
    let gpu = rec.gpu().clone();
    let flags = u32::from(bias.is_some()) | (u32::from(act == Act::Gelu) << 1);
    let overrides: &[(&'static str, f64)] = if w.dtype() == DType::F16 {
        &[("W_F16", 1.0)]
    } else {
        &[("W_F16", 0.0)]
    };
    let kernel = Kernel::new(&SHADER, "linear").with(overrides);
    let x_b = x.binding(&gpu)?;
    let out_b = out.binding(&gpu)?;
    // Without a bias the shader never reads binding 3; bind x (read-only) as a placeholder.
    let bias_b = match bias {
        Some(b) => b.binding(&gpu)?,
        None => x.binding(&gpu)?,
    };
    for chunk in w.row_chunks(&gpu, k)? {
        let params = LinearParams {
            m: to_u32(OP, m)?,
            n: to_u32(OP, n)?,
            k: to_u32(OP, k)?,
            n_off: to_u32(OP, chunk.row_start)?,
            n_rows: to_u32(OP, chunk.rows)?,
            flags,
            _pad0: 0,
            _pad1: 0,
        };
        rec.dispatch(
            &kernel,
            &params,
            &[
                x_b.clone(),
                w.binding_range(chunk.byte_offset, chunk.byte_size),
                bias_b.clone(),
                out_b.clone(),
            ],
            [ceil_div(chunk.rows, BLOCK), ceil_div(m, BLOCK), 1],
        )?;
    }
    Ok(())
}

/// out (B, M, N) = a (B, M, K) @ b (B, K, N), all f32.
pub fn matmul(rec: &mut Recorder, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "matmul";
    for (name, t) in [("a", a), ("b", b), ("out", out)] {
        check_f32(OP, name, t)?;
    }
    if a.rank() != 3 || b.rank() != 3 || out.rank() != 3 {
        return Err(Error::shape(
            OP,
            format!(
                "expected a (B, M, K), b (B, K, N), out (B, M, N); got {:?}, {:?}, {:?}",
                a.shape(),
                b.shape(),
                out.shape()
            ),
        ));
    }
    let (bt, m, k) = (a.dim(0), a.dim(1), a.dim(2));
    let n = b.dim(2);
    if b.dim(0) != bt || b.dim(1) != k || out.shape() != [bt, m, n] {
        return Err(Error::shape(
            OP,
            format!(
                "a {:?} @ b {:?} does not give out {:?}",
                a.shape(),
                b.shape(),
                out.shape()
            ),
        ));
    }
    if bt == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        return Err(Error::shape(OP, "K = 0"));
    }
    let gpu = rec.gpu().clone();
    let params = BmmParams {
        m: to_u32(OP, m)?,
        n: to_u32(OP, n)?,
        k: to_u32(OP, k)?,
        batch: to_u32(OP, bt)?,
    };
    rec.dispatch(
        &Kernel::new(&SHADER_BATCHED, "bmm"),
        &params,
        &[a.binding(&gpu)?, b.binding(&gpu)?, out.binding(&gpu)?],
        [ceil_div(n, BLOCK), ceil_div(m, BLOCK), to_u32(OP, bt)?],
    )
}
