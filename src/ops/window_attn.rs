//! DaViT window attention fused over the qkv Linear's output: per window and head, softmax(q k^T * scale)
//! v with no mask. Two kernels ([`WindowAttnVariant`]): the register kernel (`shaders/window_attn.wgsl`,
//! head_dim a multiple of 4 up to 32; every released Florence-2 uses 32), the static choice, and the
//! GPU-class flash kernel of `ops::attention` (`shaders/attention_flash.wgsl`: one workgroup per window
//! block and head, the window's K/V in workgroup memory), reading q, k and v straight from the fused
//! tensor through its strides. [`window_attention`] asks the kernel registry first. Head sizes the
//! register kernel cannot run go through the generic `ops::attention::attention` (see `model::davit`).

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::registry::ShapeClass;
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, Caps, Kernel, Recorder, Tensor};
use crate::opdef::check;
use crate::ops::attention::{record_flash, AttnLayout, AttnOpts, AttnVariant, FLASH_MAX_WG};

shader!(pub static SHADER = "window_attn", [
    ("WG", WG),
    ("QPI", QPI as u32),
    ("MAXD4", (MAX_HEAD_DIM / 4) as u32),
]);

const WG: u32 = 64;
/// Query rows per invocation (the shader's four score lanes).
const QPI: usize = 4;
/// Largest head_dim the fused kernel keeps in registers (the shader's MAXD4 * 4).
pub const MAX_HEAD_DIM: usize = 32;

uniform! {
    struct Params: PARAMS_LAYOUT = "window_attn" / Params {
        total: u32, t: u32, heads: u32, c4: u32, nqg: u32, _pad0: u32, scale: f32, _pad1: u32
    }
}

/// Which kernel runs a [`window_attention`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowAttnVariant {
    /// `window_attn.wgsl`: one invocation per (window, head, 4 query rows), no workgroup memory.
    Rows,
    /// `attention_flash.wgsl` over the fused qkv: K/V tiles in workgroup memory. Head dim up to 64.
    Flash,
}

impl WindowAttnVariant {
    /// Every variant: the tuner's candidates (filtered by [`WindowAttnVariant::supports`]).
    pub const ALL: [WindowAttnVariant; 2] = [WindowAttnVariant::Rows, WindowAttnVariant::Flash];

    pub fn name(self) -> &'static str {
        match self {
            WindowAttnVariant::Rows => "rows",
            WindowAttnVariant::Flash => "flash",
        }
    }

    pub fn from_name(s: &str) -> Option<WindowAttnVariant> {
        WindowAttnVariant::ALL.into_iter().find(|v| v.name() == s)
    }

    /// Whether this variant runs `heads` heads over `c` channels on an adapter with `caps`.
    pub fn supports(self, caps: &Caps, c: usize, heads: usize) -> bool {
        if heads == 0 || !c.is_multiple_of(heads) {
            return false;
        }
        let d = c / heads;
        match self {
            WindowAttnVariant::Rows => supported(c, heads),
            WindowAttnVariant::Flash => AttnVariant::Flash.supports(caps, d),
        }
    }
}

/// Whether [`window_attention`]'s static kernel (the register kernel) handles `heads` heads over `c`
/// channels; the model routes other head sizes through the generic attention.
pub fn supported(c: usize, heads: usize) -> bool {
    heads > 0
        && c.is_multiple_of(heads)
        && (c / heads).is_multiple_of(4)
        && c / heads <= MAX_HEAD_DIM
}

/// out (nW, T, C) = per window and head, softmax(q k^T * scale) v, where qkv (nW, T, 3C) holds q | k | v
/// with heads interleaved in columns (the DaViT `qkv` Linear's layout). Runs the registry's choice for
/// the call's class (`ShapeClass::window_attention`) when the tuner made one, else the register kernel,
/// which requires [`supported`].
pub fn window_attention(
    rec: &mut Recorder,
    qkv: &Tensor,
    heads: usize,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    let variant = {
        let gpu = rec.gpu();
        let (nw, t, c) = match qkv.shape() {
            [nw, t, c3] => (*nw, *t, c3 / 3),
            _ => (0, 0, 0),
        };
        let d = c.checked_div(heads).unwrap_or(0);
        // One image's windows (`Recorder::set_images`): each image gets the kernel it gets alone.
        let nw = nw.div_ceil(rec.images());
        gpu.choices
            .get(&ShapeClass::window_attention(nw, t, d, heads))
            .and_then(WindowAttnVariant::from_name)
            .filter(|v| v.supports(&gpu.caps, c, heads))
            .unwrap_or(WindowAttnVariant::Rows)
    };
    window_attention_variant(rec, variant, qkv, heads, scale, out)
}

/// [`window_attention`] with a given kernel (tests, benchmarks and the tuner run every variant). Errors
/// with `Error::Shape` when `variant` does not support the head size.
pub fn window_attention_variant(
    rec: &mut Recorder,
    variant: WindowAttnVariant,
    qkv: &Tensor,
    heads: usize,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "window_attention";
    for (n, t) in [("qkv", qkv), ("out", out)] {
        check::f32(OP, n, t)?;
        check::rank(OP, n, t, 3)?;
    }
    let (nw, t, c3) = (qkv.dim(0), qkv.dim(1), qkv.dim(2));
    let c = c3 / 3;
    if c3 % 3 != 0 || out.shape() != [nw, t, c] {
        return Err(Error::shape(
            OP,
            format!("qkv {:?} and out {:?} disagree", qkv.shape(), out.shape()),
        ));
    }
    match rec.backend()? {
        Backend::Host => rec.host_op("window_attention", &[qkv], || {
            host::vision::window_attention(qkv, heads, scale, out)
        }),
        Backend::Wgpu(_) => {
            let max_d = match variant {
                WindowAttnVariant::Rows => MAX_HEAD_DIM,
                WindowAttnVariant::Flash => crate::ops::attention::FLASH_MAX_HEAD_DIM,
            };
            if !variant.supports(&rec.gpu().caps, c, heads) {
                return Err(Error::shape(
                    OP,
                    format!(
                        "{c} channels in {heads} heads: the {} kernel needs head_dim a multiple of 4 <= {max_d}",
                        variant.name()
                    ),
                ));
            }
            check::distinct(OP, ("qkv", qkv), ("out", out))?;
            if nw == 0 || t == 0 {
                return Ok(());
            }
            match variant {
                WindowAttnVariant::Flash => record_window_flash(rec, qkv, (heads, scale), out),
                WindowAttnVariant::Rows => record_window_rows(rec, qkv, (heads, scale), out),
            }
        }
    }
}

/// The flash kernel over the fused rows: q, k, v are column ranges of them, B = Bk = nW windows of T
/// tokens.
fn record_window_flash(
    rec: &mut Recorder,
    qkv: &Tensor,
    (heads, scale): (usize, f32),
    out: &Tensor,
) -> Result<()> {
    let (nw, t, c3) = (qkv.dim(0), qkv.dim(1), qkv.dim(2));
    let c = c3 / 3;
    let layout = AttnLayout {
        batch: nw,
        bk: nw,
        tq: t,
        tk: t,
        heads,
        d: c / heads,
        kv_len: t,
        q_stride: c3,
        kv_stride: c3,
        k_off: c,
        v_off: 2 * c,
    };
    let opts = AttnOpts {
        heads,
        scale,
        ..AttnOpts::default()
    };
    let tensors = [qkv, qkv, qkv, qkv];
    record_flash(rec, &layout, FLASH_MAX_WG, &opts, tensors, None, out)
}

/// The register kernel: one invocation per (window, head, group of QPI query rows).
fn record_window_rows(
    rec: &mut Recorder,
    qkv: &Tensor,
    (heads, scale): (usize, f32),
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "window_attention";
    let (nw, t, c) = (qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3);
    let nqg = t.div_ceil(QPI);
    let total = nw * heads * nqg;
    check::u32_of(OP, "qkv elements", qkv.numel())?;
    let total32 = check::u32_of(OP, "invocations", total)?;
    let params = Params {
        total: total32,
        t: t as u32,
        heads: heads as u32,
        c4: (c / 4) as u32,
        nqg: nqg as u32,
        _pad0: 0,
        scale,
        _pad1: 0,
    };
    let d4 = (c / heads / 4) as f64;
    rec.launch(
        &Kernel::new(&SHADER, "window_attention").with(&[("D4", d4)]),
        &params,
        &[qkv, out],
        grid_1d(ceil_div(total, WG as usize)),
    )
}

/// Windows timed by the tuner in `auto` (stage 0 of a 768 px image has 256; each costs the same).
const AUTO_WINDOWS: usize = 32;

/// A window-attention call shape for the tuner ([`crate::gpu::tune::TuneCase`]): qkv (windows, t, 3c).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowShape {
    pub windows: usize,
    pub t: usize,
    pub c: usize,
    pub heads: usize,
}

impl crate::gpu::tune::TuneCase for WindowShape {
    fn class(&self) -> ShapeClass {
        let d = self.c.checked_div(self.heads).unwrap_or(0);
        ShapeClass::window_attention(self.windows, self.t, d, self.heads)
    }

    fn candidates(&self, caps: &Caps) -> Vec<&'static str> {
        WindowAttnVariant::ALL
            .into_iter()
            .filter(|v| v.supports(caps, self.c, self.heads))
            .map(WindowAttnVariant::name)
            .collect()
    }

    fn flops(&self) -> f64 {
        4.0 * (self.windows * self.t * self.t * self.c) as f64
    }

    fn auto_shape(&self) -> Option<Box<dyn crate::gpu::tune::TuneCase>> {
        let windows = AUTO_WINDOWS;
        crate::gpu::tune::shrunk(self.windows > windows, || WindowShape { windows, ..*self })
    }

    fn prepare(
        &self,
        gpu: &std::sync::Arc<crate::gpu::Device>,
    ) -> Result<crate::gpu::tune::CaseRunner> {
        let s = *self;
        let qkv = Tensor::zeros(
            gpu,
            &[s.windows, s.t, 3 * s.c],
            crate::gpu::DType::F32,
            "tune.qkv",
        )?;
        let out = Tensor::zeros(
            gpu,
            &[s.windows, s.t, s.c],
            crate::gpu::DType::F32,
            "tune.win",
        )?;
        Ok(Box::new(move |rec: &mut Recorder, name: &'static str| {
            let variant = WindowAttnVariant::from_name(name)
                .ok_or_else(|| Error::shape("window_attention", format!("no variant {name:?}")))?;
            window_attention_variant(rec, variant, &qkv, s.heads, 1.0, &out)
        }))
    }
}
