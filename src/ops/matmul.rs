//! Matrix multiplies: `linear` (PyTorch Linear: x @ w^T + bias, optional exact GELU epilogue, optional
//! residual, optional forced kernel: [`LinearArgs`]) and batched `matmul`. Shaders: `shaders/matmul.wgsl` (portable scalar
//! linear and the workgroup-tiled GEMM), `matmul_rb.wgsl` (register-blocked, no subgroups),
//! `matmul_sg.wgsl`, `matmul_gemv.wgsl`, `shaders/matmul_batched.wgsl`.
//! Which variant runs is the registry's choice ([`crate::gpu::registry`], filled by [`crate::gpu::tune`]).
//!
//! Weights larger than one storage binding (the tied 51328x768 LM head on 128 MiB-binding devices) are
//! bound as row chunks ([`Tensor::row_chunks`]); each chunk is one dispatch writing its own output columns.

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::registry::ShapeClass;
use crate::gpu::Backend;
use crate::gpu::{
    ceil_div, grid_1d, shader, uniform, Caps, DType, Kernel, Recorder, Shader, Tensor,
};
use crate::opdef::check;
use crate::opdef::linear::linear_shapes;
pub use crate::opdef::linear::{Act, LinearArgs, LinearVariant};

shader!(pub static SHADER = "matmul", [
    ("EDGE", EDGE as u32),
    ("TM", SCALAR_BLOCK.0 as u32),
    ("TN", SCALAR_BLOCK.1 as u32),
    ("TILED_WG", TILED_WG as u32),
    ("TN_T", TILED_COLS as u32),
    ("MAX_RM", TILED_MAX_RM as u32),
]);

shader!(pub static SHADER_RB = "matmul_rb", [("RB_MAX_WG", RB_MAX_WG as u32)]);

shader!(pub static SHADER_SG = "matmul_sg", [
    ("SG_WG", SG_WG as u32),
    ("SG_M", SG_BLOCK.0 as u32),
    ("SG_N", SG_BLOCK.1 as u32),
    ("C4_M", SG_C4_BLOCK.0 as u32),
    ("C4_N", SG_C4_BLOCK.1 as u32),
    ("R16_M", SG_R16_BLOCK.0 as u32),
    ("R16_N", SG_R16_BLOCK.1 as u32),
]);

shader!(pub static SHADER_GEMV = "matmul_gemv", [
    ("GEMV_WG", GEMV_WG as u32),
    ("MAX_MR", GEMV_MAX_ROWS as u32),
    ("RW", GEMV_WG_COLS as u32),
]);

shader!(pub static SHADER_BATCHED = "matmul_batched", [
    ("EDGE", EDGE as u32),
    ("TM", SCALAR_BLOCK.0 as u32),
    ("TN", SCALAR_BLOCK.1 as u32),
]);

impl LinearVariant {
    /// Every variant, in the order the tuner tries them (the registry's candidate list for `linear`).
    pub const ALL: [LinearVariant; 15] = [
        LinearVariant::Scalar,
        LinearVariant::Tiled64,
        LinearVariant::Tiled128,
        LinearVariant::Reg4x4,
        LinearVariant::Reg8x8,
        LinearVariant::Reg16x8,
        LinearVariant::Reg16x16,
        LinearVariant::Subgroup,
        LinearVariant::SubgroupC4,
        LinearVariant::SubgroupR16,
        LinearVariant::Gemv,
        LinearVariant::GemvSubgroup,
        LinearVariant::GemvWorkgroup,
        LinearVariant::GemvBlock,
        LinearVariant::GemvBlockSubgroup,
    ];

    /// Stable name (tuning cache, tables).
    pub fn name(self) -> &'static str {
        match self {
            LinearVariant::Scalar => "scalar",
            LinearVariant::Subgroup => "subgroup",
            LinearVariant::SubgroupC4 => "subgroup_c4",
            LinearVariant::SubgroupR16 => "subgroup_r16",
            LinearVariant::Gemv => "gemv",
            LinearVariant::GemvSubgroup => "gemv_subgroup",
            LinearVariant::GemvWorkgroup => "gemv_wg",
            LinearVariant::Tiled64 => "tiled64",
            LinearVariant::Tiled128 => "tiled128",
            LinearVariant::Reg4x4 => "reg4x4",
            LinearVariant::Reg8x8 => "reg8x8",
            LinearVariant::Reg16x8 => "reg16x8",
            LinearVariant::Reg16x16 => "reg16x16",
            LinearVariant::GemvBlock => "gemv_blk",
            LinearVariant::GemvBlockSubgroup => "gemv_blk_sg",
        }
    }

    pub fn from_name(s: &str) -> Option<LinearVariant> {
        Self::ALL.into_iter().find(|v| v.name() == s)
    }

    /// Whether this variant can run an (M, K) input with weights in `format` on a device with `caps`
    /// (the same rules [`linear`] enforces on a forced variant).
    pub fn supports(self, caps: &Caps, m: usize, k: usize, format: DType) -> bool {
        let sg_ok = !self.needs_subgroups() || (caps.subgroups && caps.subgroup_min_size >= 8);
        // Block-quantized weights are read 8 at a time by `w_load8` (the vec4, subgroup and GEMV
        // kernels), in whole 32-weight blocks.
        let fmt_ok = match format {
            DType::F32 | DType::F16 => true,
            DType::Q8 | DType::Q4 => self.reads_quantized() && k.is_multiple_of(32),
            DType::U32 => false,
        };
        let m_ok = !self.is_gemv() || m <= GEMV_MAX_ROWS;
        sg_ok && fmt_ok && m_ok && k > 0 && k.is_multiple_of(self.k_multiple())
    }

    /// Whether the kernel reads Q8/Q4 weights (through `matmul_common.wgsl`'s `w_load8`).
    fn reads_quantized(self) -> bool {
        !matches!(
            self,
            LinearVariant::Scalar | LinearVariant::Tiled64 | LinearVariant::Tiled128
        )
    }

    fn needs_subgroups(self) -> bool {
        matches!(
            self,
            LinearVariant::Subgroup
                | LinearVariant::SubgroupC4
                | LinearVariant::SubgroupR16
                | LinearVariant::GemvSubgroup
                | LinearVariant::GemvBlockSubgroup
        )
    }
    fn is_gemv(self) -> bool {
        matches!(
            self,
            LinearVariant::Gemv
                | LinearVariant::GemvSubgroup
                | LinearVariant::GemvWorkgroup
                | LinearVariant::GemvBlock
                | LinearVariant::GemvBlockSubgroup
        )
    }
    /// K must be a multiple of this.
    fn k_multiple(self) -> usize {
        match self {
            LinearVariant::Scalar | LinearVariant::Tiled64 | LinearVariant::Tiled128 => 1,
            LinearVariant::GemvSubgroup
            | LinearVariant::GemvBlock
            | LinearVariant::GemvBlockSubgroup => 32,
            _ => 8,
        }
    }
}

/// Largest M the GEMV kernel handles (one decode step with up to 4 beams).
pub const GEMV_MAX_ROWS: usize = 4;

/// The variant [`linear`] uses for an (M, K) input on this device, chosen by measurement on lavapipe
/// (`scripts/bench/kernels.rs`): for decode-sized M the GEMV (with x shared through the subgroup when subgroups
/// of >= 8 lanes exist and K % 32 == 0); otherwise the 8x4 subgroup kernel where subgroups of >= 8 lanes
/// exist, else the 8x8 register-blocked kernel; the scalar kernel
/// only when K is not a multiple of 8.
pub fn choose_linear_variant(caps: &Caps, m: usize, k: usize) -> LinearVariant {
    choose_linear_variant_for(caps, m, k, DType::F32)
}

/// [`choose_linear_variant`] for weights in `format`: on CPU adapters with subgroups, decode-sized
/// inputs with f16/q8/q4 weights and K % 32 == 0 take the block GEMV (`GemvBlockSubgroup`), whose time
/// follows the bytes read: LM-head-shaped GEMV on lavapipe 0.47-0.71x of the f32 time vs 0.8-1.2x with
/// the per-8-weights GEMV (`scripts/bench/gemv.rs`, CPU time, alternating). f32 keeps `GemvSubgroup`
/// (the two are level there: both read every f32 weight word once).
pub fn choose_linear_variant_for(caps: &Caps, m: usize, k: usize, format: DType) -> LinearVariant {
    let sg = caps.subgroups && caps.subgroup_min_size >= 8;
    if caps.is_cpu
        && sg
        && m <= GEMV_MAX_ROWS
        && k.is_multiple_of(32)
        && matches!(format, DType::F16 | DType::Q8 | DType::Q4)
    {
        return LinearVariant::GemvBlockSubgroup;
    }
    if !k.is_multiple_of(8) {
        LinearVariant::Scalar
    } else if m <= GEMV_MAX_ROWS {
        if sg && k.is_multiple_of(32) {
            LinearVariant::GemvSubgroup
        } else {
            LinearVariant::Gemv
        }
    } else if sg {
        LinearVariant::SubgroupC4
    } else if caps.is_cpu {
        // A CPU adapter without subgroups (Chromium's SwiftShader): taller blocks amortise each weight
        // load over more rows; reg16x8 ran 1.05-1.6x reg8x8 on 8 of 10 GEMM rows of the browser kernel
        // bench (scripts/bench/browser_kernels.sh). The tuner still times every candidate.
        LinearVariant::Reg16x8
    } else {
        LinearVariant::Reg8x8
    }
}

uniform! {
    struct LinearParams: LINEAR_PARAMS_LAYOUT = "include/linear_params" / Params {
        m: u32, n: u32, k: u32, n_off: u32, n_rows: u32, flags: u32, _pad0: u32, _pad1: u32
    }
}

uniform! {
    struct BmmParams: BMM_PARAMS_LAYOUT = "matmul_batched" / Params {
        m: u32, n: u32, k: u32, batch: u32
    }
}

/// Workgroup sizes of the subgroup and GEMV kernels (invocations).
const SG_WG: usize = 32;
const SG4_WG: usize = 64;
const GEMV_WG: usize = 64;
/// Output columns per workgroup of `linear_gemv_wg`.
const GEMV_WG_COLS: usize = 4;
/// Output block (rows, columns) one invocation computes: `linear` and `bmm` (SCALAR_BLOCK, on a workgroup
/// of EDGE x EDGE invocations), `linear_sg`, `linear_sg_c4`, `linear_sg_r16`. The shaders'
/// register arrays are written for these shapes.
const SCALAR_BLOCK: (usize, usize) = (4, 4);
const EDGE: usize = 16;
const SG_BLOCK: (usize, usize) = (8, 8);
const SG_C4_BLOCK: (usize, usize) = (8, 4);
const SG_R16_BLOCK: (usize, usize) = (16, 4);
/// `linear_tiled`: workgroup size, output columns per workgroup (TILED_COLS / 4 invocations across, the
/// rest down), and its rows per invocation (RM) for `Tiled64` and `Tiled128`.
const TILED_WG: usize = 256;
const TILED_COLS: usize = 64;
const TILED_MIN_RM: usize = 4;
const TILED_MAX_RM: usize = 8;
/// Output rows per workgroup of `linear_tiled` with `rm` rows per invocation.
const fn tiled_rows(rm: usize) -> usize {
    TILED_WG / (TILED_COLS / 4) * rm
}
/// Largest workgroup of `linear_rb` ([`rb_wg`]).
const RB_MAX_WG: usize = 64;

/// The consecutive weight rows each lane of `linear_gemv_blk` computes (`RL`): 8 rows per lane make
/// each lane's weight stream 8 rows long (3.4 KiB at q4, K = 768) instead of one short row, which the
/// CPU's prefetcher follows (`scripts/bench/gemv.rs`: a shader reading 64 MiB with 4 KiB per lane ran
/// 1.8-4.4x faster than with 1 KiB per lane on lavapipe).
const GEMV_BLK_ROWS: usize = 8;

/// Workgroup size of `linear_gemv_blk` for `rows` output columns: 32 lanes, or 8 when that leaves
/// fewer than 8 workgroups (a CPU adapter runs one workgroup per thread at a time: N = 768 at 32 lanes
/// is 3 workgroups on 2 threads, one thread doing two; at 8 lanes 12). Measured on lavapipe (gemv
/// bench, N = 768): wall time 0.45-0.6x at 8 lanes in the quieter of two runs, CPU time ~1.1x.
fn gemv_blk_wg(rows: usize) -> usize {
    if rows >= 8 * 32 * GEMV_BLK_ROWS {
        32
    } else {
        8
    }
}

/// Grid of the register-blocked kernels whose workgroups of `wg` invocations share `block.0` rows of x
/// (grid x) and take consecutive `block.1`-column groups of the `rows` weight rows (grid y).
fn block_grid(m: usize, rows: usize, block: (usize, usize), wg: usize) -> [u32; 3] {
    [ceil_div(m, block.0), ceil_div(rows, block.1 * wg), 1]
}

/// Rows and columns of the output block one invocation of `linear_rb` computes (`RM`, `RN` in
/// `matmul_rb.wgsl`), for the register-blocked variants.
fn rb_block(v: LinearVariant) -> Option<(usize, usize)> {
    match v {
        LinearVariant::Reg4x4 => Some((4, 4)),
        LinearVariant::Reg8x8 => Some((8, 8)),
        LinearVariant::Reg16x8 => Some((16, 8)),
        LinearVariant::Reg16x16 => Some((16, 16)),
        _ => None,
    }
}

/// Workgroup size of `linear_rb` (each invocation computes RN = 4, 8 or 16 output columns), shrunk for
/// narrow outputs so that few lanes idle (N = 128 at RN = 16 fills 8 lanes): the smallest power of two
/// covering N / RN, clamped to [16, 64].
fn rb_wg(n: usize, rn: usize) -> usize {
    n.div_ceil(rn).next_power_of_two().clamp(16, RB_MAX_WG)
}

/// out (M, N) = act(x (M, K) @ w (N, K)^T + bias (N)) (+ residual (M, N)), as `args` says. `w` is f32,
/// F16 (packed pairs) or block-quantized Q8/Q4 ([`crate::quant`], K % 32 == 0, dequantized in
/// registers); it may exceed the device's storage-binding limit, in which case it is processed in row
/// chunks.
pub fn linear(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Tensor,
    args: LinearArgs,
    out: &Tensor,
) -> Result<()> {
    match rec.backend()? {
        Backend::Host => rec.host_op("linear", &[x, w], || host::dense::linear(x, w, &args, out)),
        Backend::Wgpu(_) => {
            let variant = match args.variant {
                Some(v) => v,
                None if args.per_row => chosen_variant_for(rec, 1, x.dim(-1), w),
                // One image's rows (`Recorder::set_images`): each image gets the kernel it gets alone.
                None => chosen_variant_for(rec, x.dim(0).div_ceil(rec.images()), x.dim(-1), w),
            };
            let Some((m, n, k)) = check_linear(rec.gpu(), variant, x, w, &args, out)? else {
                return Ok(());
            };
            record_linear(rec, variant, x, w, &args, out, (m, n, k))
        }
    }
}

/// The registry's choice for the shape class of an (M, K) input when the tuner made one that runs it,
/// else [`choose_linear_variant_for`]. Shapes are checked later.
fn chosen_variant_for(rec: &Recorder, m: usize, k: usize, w: &Tensor) -> LinearVariant {
    let caps = &rec.gpu().caps;
    let class = ShapeClass::linear(m, w.dim(0), k, w.dtype());
    rec.gpu()
        .choices
        .get(&class)
        .and_then(LinearVariant::from_name)
        .filter(|v| v.supports(caps, m, k, w.dtype()))
        .unwrap_or_else(|| choose_linear_variant_for(caps, m, k, w.dtype()))
}

const OP: &str = "linear";

/// Dtypes and shapes of a linear call on `variant`: `Some((M, N, K))`, or `None` when there is nothing
/// to compute.
fn check_linear(
    gpu: &crate::gpu::Device,
    variant: LinearVariant,
    x: &Tensor,
    w: &Tensor,
    args: &LinearArgs,
    out: &Tensor,
) -> Result<Option<(usize, usize, usize)>> {
    let (m, n, k) = linear_shapes(x, w, out)?;
    if !matches!(w.dtype(), DType::F32 | DType::F16) && w.dtype().qformat().is_none() {
        return Err(Error::shape(
            OP,
            format!("w must be f32, f16, q8 or q4, got {:?}", w.dtype()),
        ));
    }
    if w.dtype().qformat().is_some() && !variant.reads_quantized() {
        return Err(Error::shape(
            OP,
            format!(
                "the {variant:?} kernel does not read {:?} weights",
                w.dtype()
            ),
        ));
    }
    check_epilogue(args, n, out)?;
    if m == 0 || n == 0 {
        return Ok(None);
    }
    if k == 0 {
        return Err(Error::shape(OP, "K = 0"));
    }
    if let Some(q) = w.dtype().qformat() {
        q.check_k("linear weight", k)?;
    }
    check_variant(gpu, variant, k)?;
    Ok(Some((m, n, k)))
}

/// The bias is f32 (N) and the residual f32 with out's shape, in another buffer.
fn check_epilogue(args: &LinearArgs, n: usize, out: &Tensor) -> Result<()> {
    if let Some(b) = args.bias {
        check::f32(OP, "bias", b)?;
        if b.shape() != [n] {
            return Err(Error::shape(
                OP,
                format!("bias {:?} must be ({n})", b.shape()),
            ));
        }
    }
    if let Some(r) = args.residual {
        check::f32(OP, "residual", r)?;
        if r.shape() != out.shape() {
            return Err(Error::shape(
                OP,
                format!(
                    "residual {:?} must have the shape of out {:?}",
                    r.shape(),
                    out.shape()
                ),
            ));
        }
        check::distinct(OP, ("residual", r), ("out", out))?;
    }
    Ok(())
}

/// Whether `variant` runs an (M, K) input on this device (the rules of [`LinearVariant::supports`],
/// as errors).
fn check_variant(gpu: &crate::gpu::Device, variant: LinearVariant, k: usize) -> Result<()> {
    if !k.is_multiple_of(variant.k_multiple()) {
        return Err(Error::shape(
            OP,
            format!(
                "{variant:?} kernel needs K % {} == 0, K = {k}",
                variant.k_multiple()
            ),
        ));
    }
    if variant.needs_subgroups() && !(gpu.caps.subgroups && gpu.caps.subgroup_min_size >= 8) {
        return Err(Error::Limit {
            what: "subgroup linear kernel: subgroup size".into(),
            requested: 8,
            max: gpu.caps.subgroup_min_size as u64,
        });
    }
    Ok(())
}

/// How a linear variant is launched: its shader, entry point, defines and override constants.
struct Launch {
    shader: &'static Shader,
    entry: &'static str,
    defines: &'static [&'static str],
    overrides: Vec<(&'static str, f64)>,
}

/// The launch table: `variant`'s kernel for weights in `w_dtype`, M rows and N output columns.
fn launch(variant: LinearVariant, w_dtype: DType, m: usize, n: usize) -> Launch {
    use LinearVariant as V;
    let f16 = if w_dtype == DType::F16 { 1.0 } else { 0.0 };
    let q = w_dtype.qformat().map_or(0.0, |q| q.bits() as f64);
    let (shader, entry): (&'static Shader, &'static str) = match variant {
        V::Scalar => (&SHADER, "linear"),
        V::Tiled64 | V::Tiled128 => (&SHADER, "linear_tiled"),
        V::Subgroup => (&SHADER_SG, "linear_sg"),
        V::SubgroupC4 => (&SHADER_SG, "linear_sg_c4"),
        V::SubgroupR16 => (&SHADER_SG, "linear_sg_r16"),
        V::Gemv => (&SHADER_GEMV, "linear_gemv"),
        V::GemvSubgroup => (&SHADER_SG, "linear_gemv_sg"),
        V::GemvWorkgroup => (&SHADER_GEMV, "linear_gemv_wg"),
        V::GemvBlock | V::GemvBlockSubgroup => (&SHADER_GEMV, "linear_gemv_blk"),
        V::Reg4x4 | V::Reg8x8 | V::Reg16x8 | V::Reg16x16 => (&SHADER_RB, "linear_rb"),
    };
    let mut overrides = vec![("W_F16", f16)];
    if variant.reads_quantized() {
        overrides.push(("W_Q", q));
    }
    let wg = |n: usize| ("WG", n as f64);
    overrides.extend(match variant {
        V::Scalar => vec![],
        V::Tiled64 => vec![("RM", TILED_MIN_RM as f64)],
        V::Tiled128 => vec![("RM", TILED_MAX_RM as f64)],
        V::Subgroup => vec![wg(SG_WG)],
        V::SubgroupC4 | V::SubgroupR16 => vec![wg(SG4_WG)],
        V::Gemv | V::GemvSubgroup | V::GemvWorkgroup => vec![wg(GEMV_WG), ("MR", gemv_mr(m))],
        // From the whole weight's N: every row chunk runs the same kernel.
        V::GemvBlock | V::GemvBlockSubgroup => vec![
            wg(gemv_blk_wg(n)),
            ("MR", gemv_mr(m)),
            ("RL", GEMV_BLK_ROWS as f64),
        ],
        V::Reg4x4 | V::Reg8x8 | V::Reg16x8 | V::Reg16x16 => {
            let (rm, rn) = rb_block(variant).unwrap_or((4, 4));
            vec![wg(rb_wg(n, rn)), ("RM", rm as f64), ("RN", rn as f64)]
        }
    });
    let defines: &'static [&'static str] = match variant {
        V::GemvBlockSubgroup => &["SG"],
        _ => &[],
    };
    Launch {
        shader,
        entry,
        defines,
        overrides,
    }
}

/// Rows of x per row group of the GEMV kernels (`MR`): M up to [`GEMV_MAX_ROWS`], in groups of it past.
fn gemv_mr(m: usize) -> f64 {
    m.clamp(1, GEMV_MAX_ROWS) as f64
}

/// The grid of `variant` over `rows` weight rows (one chunk) of a weight with N rows, for M rows of x.
/// The GEMV kernels take their row groups along z.
fn grid(variant: LinearVariant, m: usize, rows: usize, n: usize) -> [u32; 3] {
    let g = grid_2d(variant, m, rows, n);
    if variant.is_gemv() {
        [g[0], g[1], ceil_div(m, GEMV_MAX_ROWS)]
    } else {
        g
    }
}

fn grid_2d(variant: LinearVariant, m: usize, rows: usize, n: usize) -> [u32; 3] {
    use LinearVariant as V;
    match variant {
        V::Scalar => [
            ceil_div(rows, EDGE * SCALAR_BLOCK.1),
            ceil_div(m, EDGE * SCALAR_BLOCK.0),
            1,
        ],
        V::Tiled64 => [
            ceil_div(rows, TILED_COLS),
            ceil_div(m, tiled_rows(TILED_MIN_RM)),
            1,
        ],
        V::Tiled128 => [
            ceil_div(rows, TILED_COLS),
            ceil_div(m, tiled_rows(TILED_MAX_RM)),
            1,
        ],
        V::Subgroup => block_grid(m, rows, SG_BLOCK, SG_WG),
        V::SubgroupC4 => block_grid(m, rows, SG_C4_BLOCK, SG4_WG),
        V::SubgroupR16 => block_grid(m, rows, SG_R16_BLOCK, SG4_WG),
        V::Gemv | V::GemvSubgroup => grid_1d(ceil_div(rows, GEMV_WG)),
        V::GemvBlock | V::GemvBlockSubgroup => {
            grid_1d(ceil_div(rows, gemv_blk_wg(n) * GEMV_BLK_ROWS))
        }
        V::GemvWorkgroup => grid_1d(ceil_div(rows, GEMV_WG_COLS)),
        V::Reg4x4 | V::Reg8x8 | V::Reg16x8 | V::Reg16x16 => {
            let (rm, rn) = rb_block(variant).unwrap_or((4, 4));
            [ceil_div(rows, rn * rb_wg(n, rn)), ceil_div(m, rm), 1]
        }
    }
}

/// Record a checked linear call: one dispatch per row chunk of `w`.
fn record_linear(
    rec: &mut Recorder,
    variant: LinearVariant,
    x: &Tensor,
    w: &Tensor,
    args: &LinearArgs,
    out: &Tensor,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let gpu = rec.gpu().clone();
    let l = launch(variant, w.dtype(), m, n);
    let kernel = Kernel::new(l.shader, l.entry)
        .defines(l.defines)
        .with(&l.overrides);
    let flags = u32::from(args.bias.is_some())
        | (u32::from(args.act == Act::Gelu) << 1)
        | (u32::from(args.residual.is_some()) << 2);
    let note = rec.profiling().then(|| {
        let dtype = format!("{:?}", w.dtype()).to_lowercase();
        format!("M={m} N={n} K={k} {dtype} {}", variant.name())
    });
    let x_b = x.binding(&gpu)?;
    let out_b = out.binding(&gpu)?;
    // Without a bias the shader never reads binding 3, nor binding 5 without a residual (flags & 4):
    // x (read-only) binds there as a placeholder.
    let bias_b = args.bias.unwrap_or(x).binding(&gpu)?;
    let res_b = args.residual.unwrap_or(x).binding(&gpu)?;
    for chunk in w.row_chunks(&gpu, k)? {
        let params = LinearParams {
            m: check::u32_of(OP, "M", m)?,
            n: check::u32_of(OP, "N", n)?,
            k: check::u32_of(OP, "K", k)?,
            n_off: check::u32_of(OP, "chunk start", chunk.row_start)?,
            n_rows: check::u32_of(OP, "chunk rows", chunk.rows)?,
            flags,
            _pad0: 0,
            _pad1: 0,
        };
        if let Some(n) = &note {
            rec.note_shape(n.clone());
        }
        let bindings = [
            x_b.clone(),
            w.binding_range(chunk.byte_offset, chunk.byte_size)?,
            bias_b.clone(),
            out_b.clone(),
            res_b.clone(),
        ];
        rec.dispatch(&kernel, &params, &bindings, grid(variant, m, chunk.rows, n))?;
    }
    Ok(())
}

/// out (B, M, N) = a (B, M, K) @ b (B, K, N), all f32.
pub fn matmul(rec: &mut Recorder, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "matmul";
    for (name, t) in [("a", a), ("b", b), ("out", out)] {
        check::f32(OP, name, t)?;
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
    let params = BmmParams {
        m: check::u32_of(OP, "M", m)?,
        n: check::u32_of(OP, "N", n)?,
        k: check::u32_of(OP, "K", k)?,
        batch: check::u32_of(OP, "batch", bt)?,
    };
    rec.launch(
        &Kernel::new(&SHADER_BATCHED, "bmm"),
        &params,
        &[a, b, out],
        [
            ceil_div(n, EDGE * SCALAR_BLOCK.1),
            ceil_div(m, EDGE * SCALAR_BLOCK.0),
            check::u32_of(OP, "batch", bt)?,
        ],
    )
}
