//! The DaViT vision tower (`model.vision_tower.*`), following transformers' `Florence2VisionBackbone`.
//!
//! Tokens stay channels-last, (B, H, W, C) = (B*H*W, C) rows, for the whole tower, so every LayerNorm and
//! Linear is a plain row op and no NCHW <-> NHWC transposes are needed between blocks (the reference
//! flattens/transposes around each half; those are layout no-ops here). Per stage s:
//! - ConvEmbed: `conv` (k, stride, pad from the config) with its LayerNorm on the INPUT channels
//!   (`patch_prenorm[s]`, stages 1..) or on the output (stage 0).
//! - `depths[s]` blocks of SpatialBlock then ChannelBlock. Each half:
//!   x = x + dwconv3x3(x); x = x + attn(norm1(x)); x = x + dwconv3x3(x); x = x + ffn(norm2(x)).
//!   Window attention zero-pads H, W up to multiples of the window AFTER norm1 (padded tokens then carry
//!   qkv = bias, and take part in their windows' attention, exactly as in the reference), attends within
//!   ws x ws windows with scale head_dim^-0.5, and crops. Channel attention scales by N^-0.5 (N = tokens).
//!
//! DropPath is the identity at inference; every LayerNorm uses eps 1e-5 (PyTorch's default,
//! [`crate::model::layers::LN_EPS`]).
//!
//! Buffers: one activation arena per forward ([`ArenaPlan`]): four buffers sized for the largest stage,
//! viewed with each stage's shapes and reused by every block of every stage (dispatches execute in
//! recording order, so reuse is safe inside one command buffer). Within a half the residual stream
//! ping-pongs between two of them, and a buffer takes the next tensor as soon as its contents are dead.
//! The windows and attention outputs share the residual-stream buffers; the MLP (4x hidden) runs in
//! row chunks and the window qkv (3x) in chunks of whole windows, in place through views at offsets,
//! and channel attention computes q|k (2x) and v apart, so that the largest activation is 2 x tokens
//! x C. For Florence-2-base at 768 px that is 4 stage-0 activations and the Gram partials (78 MB)
//! instead of the 11 activations (208 MB) a set of buffers per op family took. The pixels can come
//! from the CPU straight into the arena ([`DaVit::forward_host`]), and the caller can use the arena's
//! spare buffers until its submit ([`DaVit::forward_spare`]). Taps copy into fresh tensors.

use crate::config::tensors::davit_mlp_hidden;
use crate::config::VisionConfig;
use crate::error::{Error, Result};
use crate::gpu::{DType, Recorder, Tensor};
use crate::model::davit_plan::{qkv_split_aligned, StageShape};
pub use crate::model::davit_plan::{ArenaPlan, StageDesc, TowerShape};
use crate::model::layers::{Conv2d, LayerNorm, Linear};
use crate::ops;
use crate::ops::attention::AttnOpts;
use crate::ops::matmul::Act;
use crate::weights::WeightsView;

/// Optional activation taps: (name, tensor) pairs, read back by the caller after the submit.
pub type Taps<'a> = Option<&'a mut Vec<(String, Tensor)>>;

/// Where [`DaVit::forward_spare`]'s pixels come from.
#[derive(Clone, Copy, Debug)]
pub enum PixelSource<'a> {
    /// A GPU tensor (B, Cin, H, W) the caller holds.
    Gpu(&'a Tensor),
    /// NCHW values on the CPU, uploaded into the arena.
    Host(&'a [f32]),
}

/// What [`DaVit::forward_spare`] returns: the last stage's tokens (B, N, C_last), a view of one arena
/// buffer, their (h, w) grid, and the arena's other buffers (dead once the tower is recorded), which
/// the caller may use as scratch for the rest of its submit (the projector does) and drop after it.
pub struct VisionOut {
    pub tokens: Tensor,
    pub grid: (usize, usize),
    pub spare: Vec<Tensor>,
}

/// `Florence2VisionConvEmbed`: strided conv + LayerNorm (on the input when `pre_norm`, else the output).
#[derive(Clone, Debug)]
pub struct ConvEmbed {
    pub conv: Conv2d,
    pub norm: LayerNorm,
    pub pre_norm: bool,
    pub in_channels: usize,
    pub embed_dim: usize,
}

/// `Florence2VisionMLP`: fc1 -> exact GELU -> fc2.
#[derive(Clone, Debug)]
pub struct Mlp {
    pub fc1: Linear,
    pub fc2: Linear,
}

/// The two linears of `Florence2VisionWindowAttention` and `Florence2VisionChannelAttention` (the same
/// weights; the attentions differ in what they attend over).
#[derive(Clone, Debug)]
pub struct AttnLinears {
    pub qkv: Linear,
    pub proj: Linear,
}

/// One half of a DaViT block, `Florence2VisionSpatialBlock` (window attention) or
/// `Florence2VisionChannelBlock` (channel attention): the same parts in the same order.
#[derive(Clone, Debug)]
pub struct BlockHalf {
    pub conv1: Conv2d,
    pub norm1: LayerNorm,
    /// `window_attn` or `channel_attn` in the checkpoint.
    pub attn: AttnLinears,
    pub conv2: Conv2d,
    pub norm2: LayerNorm,
    pub ffn: Mlp,
}

/// `Florence2VisionSpatialBlock`.
pub type SpatialBlock = BlockHalf;
/// `Florence2VisionChannelBlock`.
pub type ChannelBlock = BlockHalf;

/// `Florence2VisionBlock`: a spatial block then a channel block.
#[derive(Clone, Debug)]
pub struct Block {
    pub spatial_block: SpatialBlock,
    pub channel_block: ChannelBlock,
}

/// The DaViT backbone. `convs[s]` and `blocks[s][b]` mirror the checkpoint's `convs.{s}` and
/// `blocks.{s}.{b}`.
#[derive(Clone, Debug)]
pub struct DaVit {
    pub convs: Vec<ConvEmbed>,
    pub blocks: Vec<Vec<Block>>,
    pub num_heads: Vec<usize>,
    pub num_groups: Vec<usize>,
    pub window_size: usize,
    pub in_channels: usize,
    /// Largest MLP hidden activation (and window-attention qkv), in bytes, computed in one piece. Above it (Florence-2-large's stage
    /// 0 hidden is 36864 x 1024 f32 = 151 MB, over the 128 MiB binding limit of lavapipe and of browsers'
    /// default limits) the MLP runs in row chunks. Defaults to the device's binding limit; tests lower it.
    pub mlp_chunk_bytes: u64,
    /// Use the fused window-attention kernel (`ops::window_attn`) where it applies (head_dim a multiple
    /// of 4 up to 32: every released model); false forces the generic `ops::attention` path.
    pub fused_window_attention: bool,
}

/// The whole tower's arena: allocated once per forward, dropped when the forward's output (a view
/// of `ra`) is the only tensor left.
struct Arena {
    ra: Tensor,
    rb: Tensor,
    /// Only when a stage pads its windows.
    x: Option<Tensor>,
    big: Tensor,
    split: Option<(Tensor, Tensor, Tensor)>,
    /// Only when a stage computes channel attention's q|k and v apart.
    partials: Option<Tensor>,
}

/// One stage's views of the [`Arena`] (no allocation).
struct StageBufs {
    /// Residual stream, (B, H, W, C): each half's input and output, and its LayerNorm output.
    a: Tensor,
    /// Stream after a positional conv, (B, H, W, C).
    b: Tensor,
    /// Channel-attention output, (B, H*W, C), in `ra` (after the Gram partials there).
    chan_out: Tensor,
    /// The stream after the channel half's attention, (B, H, W, C), in `big`.
    big_stream: Tensor,
    /// Window-attention output cropped back to the image, (B, H, W, C), in the `big` buffer.
    rev: Tensor,
    /// MLP hidden, (rows per MLP chunk, hidden), in `big`.
    hid: Tensor,
    /// Rows of one MLP chunk (the stage's rows when the MLP runs whole).
    mlp_rows: usize,
    /// Shape of the channel-attention qkv, (B, H*W, 3C), viewed in `big` when it runs whole.
    cqkv: (usize, usize, usize),
    /// Windows (nW, ws*ws, C), and the shape of their qkv (nW, ws*ws, 3C), viewed in `big` when it
    /// runs whole. The windows are in `ra` when
    /// the token grid is a whole number of windows (`padded` false), else zero-padded in `x`.
    win: Tensor,
    padded: bool,
    wqkv: (usize, usize, usize),
    /// Separate q, k, v for the generic attention kernel; None when the fused window kernel runs.
    qkv_split: Option<(Tensor, Tensor, Tensor)>,
    /// Windows per window-attention chunk.
    win_chunk: usize,
    /// The `big` buffer itself (chunk views).
    big: Tensor,
    /// Channel attention's Gram partials when q|k and v are computed apart
    /// ([`StageShape::channel_split`]); None otherwise.
    partials: Option<Tensor>,
}

fn zeros(rec: &Recorder, shape: &[usize], label: &str) -> Result<Tensor> {
    Tensor::zeros(rec.gpu(), shape, DType::F32, label)
}

fn f32_view(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    t.view(shape, DType::F32)
}

impl Arena {
    /// The tower's buffers, sized by its plan.
    fn new(rec: &Recorder, plan: &ArenaPlan) -> Result<Self> {
        let some = |n: usize, label: &str| -> Result<Option<Tensor>> {
            Ok(if n > 0 {
                Some(zeros(rec, &[n], label)?)
            } else {
                None
            })
        };
        let split = match plan.split {
            0 => None,
            n => Some((
                zeros(rec, &[n], "davit.arena.q")?,
                zeros(rec, &[n], "davit.arena.k")?,
                zeros(rec, &[n], "davit.arena.v")?,
            )),
        };
        Ok(Arena {
            ra: zeros(rec, &[plan.stream], "davit.arena.ra")?,
            rb: zeros(rec, &[plan.stream], "davit.arena.rb")?,
            x: some(plan.windows, "davit.arena.x")?,
            big: zeros(rec, &[plan.big.max(1)], "davit.arena.big")?,
            split,
            partials: some(plan.partials, "davit.arena.partials")?,
        })
    }

    /// Every buffer but `ra` (which holds the output tokens), for the caller to reuse.
    fn into_spare(self) -> Vec<Tensor> {
        let mut spare = vec![self.rb, self.big];
        spare.extend(self.x);
        spare.extend(self.partials);
        if let Some((q, k, v)) = self.split {
            spare.extend([q, k, v]);
        }
        spare
    }
}

/// NCHW -> NHWC once, into `ra` (the stem conv writes `rb`); everything after stays channels-last.
fn stem_input(
    rec: &mut Recorder,
    pixels: PixelSource,
    arena: &Arena,
    [bsz, cin, ih, iw]: [usize; 4],
) -> Result<Tensor> {
    let x = f32_view(&arena.ra, &[bsz, ih, iw, cin])?;
    match pixels {
        PixelSource::Gpu(t) => ops::layout::permute(rec, t, &[0, 2, 3, 1], &x)?, // (B, H, W, Cin)
        PixelSource::Host(values) => {
            // Uploaded into `rb` (the stream buffer holds at least the pixels; the stem's output
            // overwrites them only after the permute has read them). A queue write lands before the
            // commands of the next submit, which is this recorder's.
            let nchw = f32_view(&arena.rb, &[bsz, cin, ih, iw])?;
            nchw.write_bytes(rec.gpu(), 0, bytemuck::cast_slice(values))?;
            ops::layout::permute(rec, &nchw, &[0, 2, 3, 1], &x)?; // (B, H, W, Cin)
        }
    }
    Ok(x)
}

impl StageBufs {
    fn new(ar: &Arena, st: &StageShape, ws: usize) -> Result<Self> {
        let (b, h, w, c) = st.dims;
        let rows = b * h * w;
        let (nwh, nww) = ops::window::window_grid(h, w, ws);
        let nw = b * nwh * nww;
        let t = ws * ws;
        let padded = nw * t != rows;
        let win = match (&ar.x, padded) {
            (_, false) => f32_view(&ar.ra, &[nw, t, c])?,
            (Some(x), true) => f32_view(x, &[nw, t, c])?,
            (None, true) => {
                return Err(Error::shape(
                    "DaVit::forward",
                    "the arena has no buffer for zero-padded windows",
                ))
            }
        };
        Ok(StageBufs {
            a: f32_view(&ar.ra, &[b, h, w, c])?,
            b: f32_view(&ar.rb, &[b, h, w, c])?,
            chan_out: f32_view(&ar.ra, &[b, h * w, c])?,
            big_stream: f32_view(&ar.big, &[b, h, w, c])?,
            rev: f32_view(&ar.big, &[b, h, w, c])?,
            hid: f32_view(&ar.big, &[st.mlp_rows.min(rows), st.hidden])?,
            mlp_rows: st.mlp_rows.min(rows),
            cqkv: (b, h * w, 3 * c),
            win,
            padded,
            wqkv: (nw, t, 3 * c),
            qkv_split: match (&ar.split, st.fused) {
                (Some((q, k, v)), false) => Some((
                    f32_view(q, &[nw, t, c])?,
                    f32_view(k, &[nw, t, c])?,
                    f32_view(v, &[nw, t, c])?,
                )),
                (None, false) => {
                    return Err(Error::shape(
                        "DaVit::forward",
                        "the arena has no q/k/v buffers for the generic attention path",
                    ))
                }
                (_, true) => None,
            },
            win_chunk: st.win_chunk,
            big: ar.big.clone(),
            partials: match (&ar.partials, st.channel_split) {
                (Some(p), true) => Some(f32_view(p, &[st.partials])?),
                _ => None,
            },
        })
    }
}

/// The q|k rows and the v rows of a channel-attention qkv Linear (weight (3C, C), bias (3C)) as two
/// Linears viewing its tensors, when both parts can be bound at their byte offsets (multiples of
/// `davit_plan::CHUNK_ALIGN`); None otherwise. Each output column is the same dot product either way.
fn split_qkv(l: &Linear, c: usize) -> Option<(Linear, Linear)> {
    let w = &l.weight;
    if w.shape() != [3 * c, c] {
        return None;
    }
    if l.bias.as_ref().is_some_and(|b| b.dtype() != DType::F32)
        || !qkv_split_aligned(
            c,
            w.dtype(),
            w.offset(),
            l.bias.as_ref().map(Tensor::offset),
        )
    {
        return None;
    }
    let v_at = w.offset() + (2 * w.dtype().row_bytes(c)) as u64 * c as u64;
    let qk_w = w.view_at(w.offset(), &[2 * c, c], w.dtype()).ok()?;
    let v_w = w.view_at(v_at, &[c, c], w.dtype()).ok()?;
    let (qk_b, v_b) = match &l.bias {
        None => (None, None),
        Some(b) => {
            let v_at = b.offset() + (8 * c) as u64;
            (
                Some(b.view_at(b.offset(), &[2 * c], DType::F32).ok()?),
                Some(b.view_at(v_at, &[c], DType::F32).ok()?),
            )
        }
    };
    Some((
        Linear {
            weight: qk_w,
            bias: qk_b,
        },
        Linear {
            weight: v_w,
            bias: v_b,
        },
    ))
}

fn stage_param(list: &[usize], s: usize, what: &str) -> Result<usize> {
    list.get(s).copied().ok_or_else(|| {
        Error::shape(
            "DaVit::forward",
            format!("{what} has no entry for stage {s}"),
        )
    })
}

/// Record a copy of `t` (viewed as `shape`) into a fresh tensor and push it as tap `name`.
fn tap(
    rec: &mut Recorder,
    taps: &mut Taps,
    name: String,
    t: &Tensor,
    shape: &[usize],
) -> Result<()> {
    if let Some(v) = taps.as_deref_mut() {
        let copy = Tensor::zeros(rec.gpu(), shape, DType::F32, &name)?;
        rec.copy(t, &copy)?;
        v.push((name, copy));
    }
    Ok(())
}

impl ConvEmbed {
    /// Stage `s`'s patch embedding from `cw` (`convs.{s}`).
    fn new(cfg: &VisionConfig, s: usize, cw: &WeightsView) -> Result<Self> {
        let c = cfg.embed_dim[s];
        let cin = if s == 0 {
            cfg.in_channels
        } else {
            cfg.embed_dim[s - 1]
        };
        let (k, stride, pad) = (cfg.patch_size[s], cfg.patch_stride[s], cfg.patch_padding[s]);
        let pre_norm = cfg.patch_prenorm[s];
        Ok(ConvEmbed {
            conv: Conv2d::new(&cw.pp("conv"), cin, c, k, stride, pad)?,
            norm: LayerNorm::new(&cw.pp("norm"), if pre_norm { cin } else { c })?,
            pre_norm,
            in_channels: cin,
            embed_dim: c,
        })
    }
}

impl BlockHalf {
    /// One block half of `c` channels from `v`, its attention's linears under `attn`.
    fn new(v: &WeightsView, attn: &str, c: usize, hidden: usize, qkv_bias: bool) -> Result<Self> {
        // The positional convs: depthwise 3x3, stride 1, padding 1.
        let dw = |name: &str| Conv2d::depthwise(&v.pp(name), c, 3, 1, 1);
        let a = v.pp(attn);
        let f = v.pp("ffn");
        Ok(BlockHalf {
            conv1: dw("conv1")?,
            norm1: LayerNorm::new(&v.pp("norm1"), c)?,
            attn: AttnLinears {
                qkv: Linear::new(&a.pp("qkv"), c, 3 * c, qkv_bias)?,
                proj: Linear::new(&a.pp("proj"), c, c, true)?,
            },
            conv2: dw("conv2")?,
            norm2: LayerNorm::new(&v.pp("norm2"), c)?,
            ffn: Mlp {
                fc1: Linear::new(&f.pp("fc1"), c, hidden, true)?,
                fc2: Linear::new(&f.pp("fc2"), hidden, c, true)?,
            },
        })
    }
}

impl DaVit {
    /// Load every tensor under `w` (the `model.vision_tower` view), checking each shape against `cfg`.
    pub fn new(cfg: &VisionConfig, w: WeightsView) -> Result<Self> {
        let stages = crate::model::davit_plan::stage_count(cfg)?;
        let mut convs = Vec::with_capacity(stages);
        let mut blocks = Vec::with_capacity(stages);
        for s in 0..stages {
            convs.push(ConvEmbed::new(cfg, s, &w.pp("convs").pp(&s.to_string()))?);
            let c = cfg.embed_dim[s];
            let hidden = davit_mlp_hidden(c, cfg.mlp_ratio);
            let stage = (0..cfg.depths[s])
                .map(|b| {
                    let bw = w.pp("blocks").pp(&s.to_string()).pp(&b.to_string());
                    Ok(Block {
                        spatial_block: BlockHalf::new(
                            &bw.pp("spatial_block"),
                            "window_attn",
                            c,
                            hidden,
                            cfg.qkv_bias,
                        )?,
                        channel_block: BlockHalf::new(
                            &bw.pp("channel_block"),
                            "channel_attn",
                            c,
                            hidden,
                            cfg.qkv_bias,
                        )?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            blocks.push(stage);
        }
        Ok(DaVit {
            convs,
            blocks,
            num_heads: cfg.num_heads.clone(),
            num_groups: cfg.num_groups.clone(),
            window_size: cfg.window_size,
            in_channels: cfg.in_channels,
            mlp_chunk_bytes: u64::MAX,
            fused_window_attention: true,
        })
    }

    /// Put every convolution's weight in the layout its kernel reads ([`Conv2d::prepare`]), recorded
    /// into `rec`: once at load instead of a padding / transposition per conv per forward.
    pub fn prepare(&mut self, rec: &mut Recorder) -> Result<()> {
        for ce in &mut self.convs {
            ce.conv.prepare(rec)?;
        }
        for blk in self.blocks.iter_mut().flatten() {
            for conv in [
                &mut blk.spatial_block.conv1,
                &mut blk.spatial_block.conv2,
                &mut blk.channel_block.conv1,
                &mut blk.channel_block.conv2,
            ] {
                conv.prepare(rec)?;
            }
        }
        Ok(())
    }

    /// The shapes the arena is planned from ([`TowerShape`]), read off the loaded tower.
    pub fn tower_shape(&self) -> Result<TowerShape> {
        let mut stages = Vec::with_capacity(self.convs.len());
        for (s, (ce, stage_blocks)) in self.convs.iter().zip(&self.blocks).enumerate() {
            let c = ce.embed_dim;
            stages.push(StageDesc {
                in_channels: ce.in_channels,
                embed_dim: c,
                kernel: ce.conv.kernel_size(),
                stride: ce.conv.stride,
                padding: ce.conv.padding,
                conv_dtype: ce.conv.weight.dtype(),
                hidden: stage_blocks
                    .first()
                    .map(|b| b.spatial_block.ffn.fc1.weight.dim(0))
                    .unwrap_or(1),
                heads: stage_param(&self.num_heads, s, "num_heads")?,
                groups: stage_param(&self.num_groups, s, "num_groups")?,
                channel_split: stage_blocks
                    .iter()
                    .all(|b| split_qkv(&b.channel_block.attn.qkv, c).is_some()),
            });
        }
        Ok(TowerShape {
            in_channels: self.in_channels,
            window_size: self.window_size,
            stages,
            mlp_chunk_bytes: self.mlp_chunk_bytes,
            fused_window_attention: self.fused_window_attention,
        })
    }

    /// Token grid (h, w) after every stage for an input of `h` x `w` pixels, or an error if a stage
    /// would produce no output.
    pub fn stage_grids(&self, h: usize, w: usize) -> Result<Vec<(usize, usize)>> {
        self.tower_shape()?.stage_grids(h, w)
    }

    /// Record the whole tower. `pixels` (B, Cin, H, W) NCHW as the processor produces them. Returns the
    /// last stage's tokens (B, N, C_last), row-major over the (h, w) token grid, and that grid.
    ///
    /// Memory: one arena ([`TowerShape::arena_plan`]: three or four buffers sized for the largest stage)
    /// serves every stage and block; the returned tokens are a view of one of its buffers, the others
    /// are released when this returns ([`DaVit::forward_spare`] hands them back instead). `pixels` stays with the caller: [`DaVit::forward_host`] takes them from the
    /// CPU straight into the arena instead, so no pixel tensor is held beside it.
    pub fn forward(
        &self,
        rec: &mut Recorder,
        pixels: &Tensor,
        taps: Taps,
    ) -> Result<(Tensor, (usize, usize))> {
        let shape = [pixels.dim(0), pixels.dim(1), pixels.dim(2), pixels.dim(3)];
        let out = self.forward_spare(rec, PixelSource::Gpu(pixels), shape, taps)?;
        Ok((out.tokens, out.grid))
    }

    /// [`DaVit::forward`] on pixels `values` (B, Cin, H, W) NCHW on the CPU (`shape`): they are written
    /// straight into the arena (the buffer the first stage's conv output takes later), so the vision
    /// phase holds no pixel tensor beside the arena. Same values as [`DaVit::forward`] on a tensor of
    /// them: the same kernels read the same bytes.
    pub fn forward_host(
        &self,
        rec: &mut Recorder,
        values: &[f32],
        shape: [usize; 4],
        taps: Taps,
    ) -> Result<(Tensor, (usize, usize))> {
        let out = self.forward_spare(rec, PixelSource::Host(values), shape, taps)?;
        Ok((out.tokens, out.grid))
    }

    /// [`DaVit::forward`] or [`DaVit::forward_host`] (by `pixels`, of NCHW `shape`), also handing back
    /// the arena's buffers other than the output's ([`VisionOut::spare`]): scratch for what the caller
    /// records next in the same submit, so that nothing it allocates is counted as free while the GPU
    /// still holds the arena (wgpu keeps a dropped buffer alive until its submit completes; the memory
    /// counter would not).
    pub fn forward_spare(
        &self,
        rec: &mut Recorder,
        pixels: PixelSource,
        [bsz, cin, ih, iw]: [usize; 4],
        mut taps: Taps,
    ) -> Result<VisionOut> {
        self.check_input(&pixels, [bsz, cin, ih, iw])?;
        let max_binding = rec.gpu().caps.max_storage_binding;
        let tower = self.tower_shape()?;
        let shapes = tower.stage_shapes(max_binding, bsz, (ih, iw))?;
        let arena = Arena::new(rec, &tower.arena_plan(max_binding, bsz, (ih, iw))?)?;
        let mut x = stem_input(rec, pixels, &arena, [bsz, cin, ih, iw])?; // (B, H, W, Cin) in `ra`
        let mut grid = (ih, iw);
        for (s, st) in shapes.iter().enumerate() {
            x = self.stage(rec, s, st, &arena, &x, grid, &mut taps)?;
            grid = (st.dims.1, st.dims.2);
        }
        let (h, w) = grid;
        let c_last = x.dim(3);
        let out = x.reshape(&[bsz, h * w, c_last])?; // (B, N, C_last)
        if let Some(v) = taps {
            // The last stage's stream is not written again: tap it without a copy.
            v.push(("vision.out".to_owned(), out.clone()));
        }
        Ok(VisionOut {
            tokens: out,
            grid: (h, w),
            spare: arena.into_spare(),
        })
    }

    /// The pixels' shape and source against the tower: named errors before anything is recorded.
    fn check_input(&self, pixels: &PixelSource, shape: [usize; 4]) -> Result<()> {
        const OP: &str = "DaVit::forward";
        let [bsz, cin, _, _] = shape;
        match pixels {
            PixelSource::Gpu(t) if t.shape() != shape || t.dtype() != DType::F32 => {
                return Err(Error::shape(
                    OP,
                    format!(
                        "pixels {:?} {:?} must be f32 (B, {}, H, W)",
                        t.dtype(),
                        t.shape(),
                        self.in_channels
                    ),
                ))
            }
            PixelSource::Host(values) if values.len() != shape.iter().product::<usize>() => {
                return Err(Error::shape(
                    OP,
                    format!("{} pixel values for shape {shape:?}", values.len()),
                ))
            }
            _ => {}
        }
        if cin != self.in_channels {
            return Err(Error::shape(
                OP,
                format!(
                    "pixels (B, {cin}, H, W) must have {} channels",
                    self.in_channels
                ),
            ));
        }
        if bsz == 0 {
            return Err(Error::shape(OP, "empty batch"));
        }
        if self.blocks.len() != self.convs.len() {
            return Err(Error::shape(
                OP,
                "blocks and convs disagree on the stage count",
            ));
        }
        Ok(())
    }

    /// Stage `s`: its ConvEmbed on `x` (the NHWC pixels or the last stage's stream, both in `ra`; `rb`
    /// takes the intermediate), then its blocks; returns the stage's stream `bufs.a`, (B, h, w, C).
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &self,
        rec: &mut Recorder,
        s: usize,
        st: &StageShape,
        arena: &Arena,
        x: &Tensor,
        (h, w): (usize, usize),
        taps: &mut Taps,
    ) -> Result<Tensor> {
        let (Some(ce), Some(stage_blocks)) = (self.convs.get(s), self.blocks.get(s)) else {
            return Err(Error::shape(
                "DaVit::forward",
                format!("no stage {s} in the tower"),
            ));
        };
        let (bsz, h2, w2, c) = st.dims;
        let bufs = StageBufs::new(arena, st, self.window_size)?;
        if ce.pre_norm {
            let normed = f32_view(&arena.rb, &[bsz, h, w, ce.in_channels])?;
            ce.norm.forward(rec, x, &normed)?; // (B, H, W, Cin)
            ce.conv
                .forward_with_scratch(rec, &normed, &bufs.a, &arena.big)?; // (B, h, w, C)
        } else {
            ce.conv.forward_with_scratch(rec, x, &bufs.b, &arena.big)?; // (B, h, w, C)
            ce.norm.forward(rec, &bufs.b, &bufs.a)?; // (B, h, w, C)
        }
        let tok = [bsz, h2 * w2, c];
        tap(rec, taps, format!("vision.convs.{s}"), &bufs.a, &tok)?;
        for (bi, block) in stage_blocks.iter().enumerate() {
            self.spatial(rec, &block.spatial_block, s, &bufs, (bsz, h2, w2, c))?;
            let name = format!("vision.blocks.{s}.{bi}.spatial");
            tap(rec, taps, name, &bufs.a, &tok)?;
            self.channel(rec, &block.channel_block, s, &bufs, (bsz, h2, w2, c))?;
            let name = format!("vision.blocks.{s}.{bi}.channel");
            tap(rec, taps, name, &bufs.a, &tok)?;
        }
        Ok(bufs.a)
    }

    /// x = x + dwconv(x); x = x + ffn(norm(x)) with x in `src` (`bufs.a` or `bufs.big_stream`) in and
    /// `bufs.a` out.
    #[allow(clippy::too_many_arguments)]
    fn conv_mlp_half(
        rec: &mut Recorder,
        conv: &Conv2d,
        norm: &LayerNorm,
        ffn: &Mlp,
        bufs: &StageBufs,
        src: &Tensor,
        rows: usize,
        c: usize,
    ) -> Result<()> {
        conv.forward_residual(rec, src, &bufs.b)?; // (B, H, W, C)
        let x2 = bufs.b.reshape(&[rows, c])?; // (B*H*W, C)
                                              // The stream in `src` is dead after the conv: `a` takes the LayerNorm output, then (read by
                                              // fc1) the block's output.
        let a2 = bufs.a.reshape(&[rows, c])?;
        norm.forward(rec, &x2, &a2)?; // (B*H*W, C)
        if bufs.mlp_rows >= rows {
            ffn.fc1.forward(rec, &a2, Act::Gelu, &bufs.hid)?; // (B*H*W, hidden)
            return ffn
                .fc2
                .forward_residual(rec, &bufs.hid, Act::None, &x2, &a2); // (B*H*W, C)
        }
        // Row chunks, in place through views at row offsets: tokens are independent, so each chunk's
        // fc2 overwrites exactly the LayerNorm rows its fc1 has read, and the hidden activation never
        // exceeds one chunk of `big` (and one storage binding).
        let hidden = bufs.hid.dim(1);
        let mut r0 = 0;
        while r0 < rows {
            let n = bufs.mlp_rows.min(rows - r0);
            let off = (r0 * c * 4) as u64;
            let normed = bufs.a.view_at(off, &[n, c], DType::F32)?; // rows of a2
            let stream = bufs.b.view_at(off, &[n, c], DType::F32)?; // rows of x2
            let hid = f32_view(&bufs.hid, &[n, hidden])?;
            ffn.fc1.forward(rec, &normed, Act::Gelu, &hid)?; // (n, hidden)
            ffn.fc2
                .forward_residual(rec, &hid, Act::None, &stream, &normed)?; // (n, C)
            r0 += n;
        }
        Ok(())
    }

    fn spatial(
        &self,
        rec: &mut Recorder,
        blk: &SpatialBlock,
        s: usize,
        bufs: &StageBufs,
        (bsz, h, w, c): (usize, usize, usize, usize),
    ) -> Result<()> {
        let rows = bsz * h * w;
        let ws = self.window_size;
        let heads = stage_param(&self.num_heads, s, "num_heads")?;
        // x = x + dwconv(x)
        blk.conv1.forward_residual(rec, &bufs.a, &bufs.b)?; // (B, H, W, C)
        let x2 = bufs.b.reshape(&[rows, c])?; // (B*H*W, C)
        let a2 = bufs.a.reshape(&[rows, c])?;
        let wrows = bufs.win.dim(0) * ws * ws;
        let win2 = bufs.win.reshape(&[wrows, c])?;
        // x = x + window_attn(norm1(x))
        if bufs.padded {
            // Padding comes after the LayerNorm (padded tokens are zeros): normalise into `a` (dead
            // after the conv), then partition into the zero-padded windows in `x`.
            blk.norm1.forward(rec, &x2, &a2)?; // (B*H*W, C)
            ops::window::window_partition(rec, &bufs.a, ws, &bufs.win)?; // (nW, ws*ws, C)
        } else {
            // Partition into `a` (dead after the conv), then normalise in place: the LayerNorm is per
            // token, so this is the reference's norm-then-partition, value for value.
            ops::window::window_partition(rec, &bufs.b, ws, &bufs.win)?; // (nW, ws*ws, C)
            blk.norm1.forward(rec, &win2, &win2)?; // (nW*ws*ws, C)
        }
        let scale = ((c / heads) as f64).powf(-0.5) as f32;
        self.window_attend(rec, &blk.attn, bufs, (heads, scale), &win2)?;
        // Crop back to the image first, then project: `proj` is per token, so projecting only the real
        // tokens gives the same values as the reference's project-then-crop. The qkv in `big` is dead.
        ops::window::window_reverse(rec, &bufs.win, ws, h, w, &bufs.rev)?; // (B, H, W, C)
        blk.attn
            .proj
            .forward_residual(rec, &bufs.rev.reshape(&[rows, c])?, Act::None, &x2, &a2)?; // (B*H*W, C) = x + proj(attn)

        // x = x + dwconv(x); x = x + ffn(norm2(x))
        Self::conv_mlp_half(
            rec, &blk.conv2, &blk.norm2, &blk.ffn, bufs, &bufs.a, rows, c,
        )
    }

    /// The windows in `bufs.win` (normalised, `win2` their rows) attend over themselves: qkv, then the
    /// attention's output back into `bufs.win`, whole or in chunks of windows.
    fn window_attend(
        &self,
        rec: &mut Recorder,
        attn: &AttnLinears,
        bufs: &StageBufs,
        (heads, scale): (usize, f32),
        win2: &Tensor,
    ) -> Result<()> {
        let ws = self.window_size;
        let c = bufs.win.dim(2);
        let wrows = win2.dim(0);
        let nw = bufs.win.dim(0);
        if bufs.win_chunk < nw && bufs.qkv_split.is_none() && !bufs.padded {
            // Chunks of whole windows: each chunk's qkv goes to the front of `big`, and its attention
            // output over the chunk's windows in `ra`, which its qkv has read.
            let t = ws * ws;
            let mut w0 = 0;
            while w0 < nw {
                let n = bufs.win_chunk.min(nw - w0);
                let off = bufs.win.offset() + (w0 * t * c * 4) as u64;
                let win = bufs.win.view_at(off, &[n, t, c], DType::F32)?;
                let qkv = f32_view(&bufs.big, &[n, t, 3 * c])?;
                attn.qkv.forward(
                    rec,
                    &win.reshape(&[n * t, c])?,
                    Act::None,
                    &qkv.reshape(&[n * t, 3 * c])?,
                )?; // (n*ws*ws, 3C)
                ops::window_attn::window_attention(rec, &qkv, heads, scale, &win)?; // (n, ws*ws, C)
                w0 += n;
            }
        } else {
            let (n, t, c3) = bufs.wqkv;
            let wqkv = f32_view(&bufs.big, &[n, t, c3])?;
            // The windows are dead once qkv has read them: they take the attention output.
            attn.qkv
                .forward(rec, win2, Act::None, &wqkv.reshape(&[wrows, 3 * c])?)?; // (nW*ws*ws, 3C)
            match &bufs.qkv_split {
                // Fused kernel straight from the qkv Linear's output.
                None => ops::window_attn::window_attention(rec, &wqkv, heads, scale, &bufs.win)?, // (nW, ws*ws, C)
                Some((q, k, v)) => {
                    ops::layout::split_qkv(rec, &wqkv, q, k, v)?; // 3 x (nW, ws*ws, C)
                    let opts = AttnOpts {
                        heads,
                        scale,
                        ..AttnOpts::default()
                    };
                    ops::attention::attention(rec, q, k, v, &opts, &bufs.win)?; // (nW, ws*ws, C)
                }
            }
        }
        Ok(())
    }

    fn channel(
        &self,
        rec: &mut Recorder,
        blk: &ChannelBlock,
        s: usize,
        bufs: &StageBufs,
        (bsz, h, w, c): (usize, usize, usize, usize),
    ) -> Result<()> {
        let rows = bsz * h * w;
        // x = x + dwconv(x)
        blk.conv1.forward_residual(rec, &bufs.a, &bufs.b)?; // (B, H, W, C)
                                                            // x = x + channel_attn(norm1(x)); `a` (dead after the conv) takes the LayerNorm output.
        let x2 = bufs.b.reshape(&[rows, c])?; // (B*H*W, C)
        let a2 = bufs.a.reshape(&[rows, c])?;
        blk.norm1.forward(rec, &x2, &a2)?; // (B*H*W, C)
        let groups = stage_param(&self.num_groups, s, "num_groups")?;
        let split = bufs
            .partials
            .as_ref()
            .and_then(|p| split_qkv(&blk.attn.qkv, c).map(|l| (l, p)));
        match split {
            Some(((qk_lin, v_lin), part)) => {
                // q|k first (2C per token in `big`), their Gram partials and the attention matrices;
                // then v into the q|k memory (dead once reduced) and the output into `a` (the
                // LayerNorm output, dead once v has read it).
                let qk = f32_view(&bufs.big, &[bsz, h * w, 2 * c])?;
                qk_lin.forward(rec, &a2, Act::None, &qk.reshape(&[rows, 2 * c])?)?; // (B*H*W, 2C)
                let logits =
                    ops::channel_attn::channel_attention_logits(rec, &qk, groups, Some(part))?;
                let v = f32_view(&bufs.big, &[bsz, h * w, c])?;
                v_lin.forward(rec, &a2, Act::None, &v.reshape(&[rows, c])?)?; // (B*H*W, C)
                logits.apply(rec, &v, &bufs.chan_out)?; // (B, N, C)
            }
            None => {
                let (b, n, c3) = bufs.cqkv;
                let cqkv = f32_view(&bufs.big, &[b, n, c3])?;
                blk.attn
                    .qkv
                    .forward(rec, &a2, Act::None, &cqkv.reshape(&[rows, 3 * c])?)?; // (B*H*W, 3C)
                                                                                    // The LayerNorm output in `a` is dead once qkv has read it: it holds the Gram
                                                                                    // partials, then (they are dead once reduced) the attention output.
                ops::channel_attn::channel_attention_with_scratch(
                    rec,
                    &cqkv,
                    groups,
                    &bufs.chan_out,
                    &bufs.a,
                )?; // (B, N, C)
            }
        }
        // The qkv (or v) in `big` is dead after the attention: the stream goes there.
        blk.attn.proj.forward_residual(
            rec,
            &bufs.chan_out.reshape(&[rows, c])?,
            Act::None,
            &x2,
            &bufs.big_stream.reshape(&[rows, c])?,
        )?; // (B*H*W, C) = x + proj(attn)

        // x = x + dwconv(x); x = x + ffn(norm2(x))
        Self::conv_mlp_half(
            rec,
            &blk.conv2,
            &blk.norm2,
            &blk.ffn,
            bufs,
            &bufs.big_stream,
            rows,
            c,
        )
    }
}
