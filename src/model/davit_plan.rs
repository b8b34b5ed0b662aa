//! The DaViT tower's activation arena, planned from its shapes alone ([`TowerShape`]: no weights, no
//! device): the loaded tower plans its forward with it ([`TowerShape::arena_plan`], from [`crate::model::davit::DaVit::tower_shape`]) and
//! the memory estimate ([`crate::estimate`]) plans a tower that is not loaded yet with the same code.

use crate::config::VisionConfig;
use crate::error::{Error, Result};
use crate::gpu::DType;
#[cfg(doc)]
use crate::model::davit::DaVit;
use crate::ops;

/// Element counts of the activation arena one [`DaVit::forward`] allocates (f32 elements per
/// buffer), planned from the stage shapes before anything is recorded. Three large buffers (four when a
/// stage's token grid is not a whole number of windows) and a small one serve the whole tower, every
/// stage and block taking views of them in turn:
/// - `stream` (x2, `ra` and `rb`): the residual stream and the stream after a positional conv,
///   ping-ponged (each half's conv reads `ra` and writes `rb`; the LayerNorm output goes back into
///   `ra`, whose contents are dead by then, and the half's last linear writes `rb` + its output into
///   `ra` through its residual epilogue). `ra` also takes the windowed tokens (partitioned from `rb`
///   and normalised in place: LayerNorm is per token, so it commutes with the partition) and the
///   window / channel attention output (with channel attention's Gram partials before it); `rb` the
///   pre-norm copy of a stage's input and the NCHW pixels, `ra` their NHWC permutation.
/// - `windows` (`x`): the zero-padded windows and their attention output, only for stages whose
///   token grid is not a whole number of windows (padding comes after the LayerNorm there); 0 when
///   no stage pads.
/// - `big`: channel attention's q|k then v (or its qkv where the weight cannot be split at aligned
///   offsets), the window qkv, the window attention output cropped back to the image, the channel
///   half's output stream, the MLP hidden and the patch-embedding im2col scratch, never live
///   together. Neither the MLP hidden (4 x C per token) nor the window qkv (3 x C) sizes it: they
///   run in chunks of rows / whole windows that fit in what the others need ([`mlp_chunk_rows`]).
/// - `partials`: channel attention's Gram partials where q|k and v are computed apart.
/// - `split`: separate q, k, v (three buffers) for the generic attention path, 0 when the fused
///   window kernel runs in every stage.
///
/// Every view starts at byte 0 of its buffer except the MLP's row chunks and the window chunks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaPlan {
    pub stream: usize,
    pub windows: usize,
    pub big: usize,
    pub split: usize,
    /// Channel attention's Gram partials where q|k and v are computed apart (they cannot share
    /// `big` with q|k: one dispatch may not read and write one buffer).
    pub partials: usize,
}

impl ArenaPlan {
    /// GPU bytes of the arena (before the 4-byte padding of each buffer).
    pub fn bytes(&self) -> u64 {
        4 * (2 * self.stream + self.windows + self.big + 3 * self.split + self.partials) as u64
    }
}

/// The shapes of one stage that the arena is planned from.
pub(crate) struct StageShape {
    /// (B, h, w, C) tokens of the stage.
    pub(crate) dims: (usize, usize, usize, usize),
    pub(crate) hidden: usize,
    /// Rows of one MLP chunk (the stage's rows when the MLP runs whole): the hidden activation of a
    /// chunk fits in `big` as the other tensors size it ([`mlp_chunk_rows`]).
    pub(crate) mlp_rows: usize,
    pub(crate) fused: bool,
    /// f32 elements of the patch embedding's im2col scratch (chunks of rows of `kp`, at most what
    /// the rest of `big` needs).
    im2col: usize,
    pub(crate) kp: usize,
    /// Whether the token grid is not a whole number of windows (zero-padded windows in `x`).
    pub(crate) padded: bool,
    /// Windows per window-attention chunk (qkv + attention run chunk by chunk, the windows in place
    /// in `ra`, the chunk's qkv in `big`); all windows when it runs whole.
    pub(crate) win_chunk: usize,
    /// Channel attention from separate q|k and v Linears (views of the qkv weight, when they can be
    /// bound at their offsets): `big` holds q|k (2C per token) and then v, the Gram partials (f32
    /// elements `partials`) their own small buffer; else qkv (3C per token) and the partials in `ra`.
    pub(crate) channel_split: bool,
    pub(crate) partials: usize,
}

/// Byte alignment of the MLP's row chunks in the residual-stream buffers: every chunk is bound at
/// an offset, and 256 is the largest `minStorageBufferOffsetAlignment` WebGPU (and Vulkan) allows,
/// so a multiple of it is aligned on every device.
pub(crate) const CHUNK_ALIGN: usize = 256;

/// Rows of one MLP chunk for a stage of `rows` tokens of `c` channels whose hidden is `hidden` wide,
/// when at most `cap` f32 elements of hidden activation may be live: the rows split into equal chunks
/// (the last one shorter), each starting on a [`CHUNK_ALIGN`]-byte row offset. Returns `rows` when the
/// whole hidden fits.
pub(crate) fn mlp_chunk_rows(rows: usize, c: usize, hidden: usize, cap: usize) -> usize {
    let hidden = hidden.max(1);
    let step = CHUNK_ALIGN / gcd(c.max(1) * 4, CHUNK_ALIGN); // rows per aligned offset
    let per = (cap / hidden) / step * step;
    if per >= rows {
        return rows;
    }
    let per = per.max(step);
    let chunks = rows.div_ceil(per);
    rows.div_ceil(chunks).next_multiple_of(step).min(rows)
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// One stage of the tower as its arena is planned: the patch embedding's convolution and the sizes
/// of its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageDesc {
    pub in_channels: usize,
    pub embed_dim: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    /// Element type of the patch embedding's weight as its im2col GEMM reads it (after
    /// [`ops::conv::prepare_conv2d_weight`]).
    pub conv_dtype: DType,
    /// MLP hidden width.
    pub hidden: usize,
    pub heads: usize,
    pub groups: usize,
    /// Channel attention computes q|k and v apart (every block's qkv can be split at aligned
    /// offsets: [`qkv_split_aligned`]).
    pub channel_split: bool,
}

/// The shapes of a DaViT tower that its forward's arena is planned from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TowerShape {
    pub in_channels: usize,
    pub window_size: usize,
    pub stages: Vec<StageDesc>,
    /// See [`crate::model::davit::DaVit::mlp_chunk_bytes`].
    pub mlp_chunk_bytes: u64,
    /// See [`crate::model::davit::DaVit::fused_window_attention`].
    pub fused_window_attention: bool,
}

/// Whether a channel-attention qkv weight (3C, C) of element type `w_dtype` at byte `w_offset` of its
/// buffer, with an f32 bias (3C) at `bias_offset` when it has one, can be bound as q|k and v at their
/// byte offsets (multiples of [`CHUNK_ALIGN`]).
pub fn qkv_split_aligned(
    c: usize,
    w_dtype: DType,
    w_offset: u64,
    bias_offset: Option<u64>,
) -> bool {
    let aligned = |off: u64| off.is_multiple_of(CHUNK_ALIGN as u64);
    let v_at = w_offset + (2 * w_dtype.row_bytes(c)) as u64 * c as u64;
    let bias_ok = bias_offset.is_none_or(|b| aligned(b) && aligned(b + (8 * c) as u64));
    aligned(w_offset) && aligned(v_at) && bias_ok
}

/// The number of DaViT stages, once every per-stage list of `cfg` has that many entries.
pub fn stage_count(cfg: &VisionConfig) -> Result<usize> {
    let n = cfg.embed_dim.len();
    let lens = [
        cfg.depths.len(),
        cfg.num_heads.len(),
        cfg.num_groups.len(),
        cfg.patch_size.len(),
        cfg.patch_stride.len(),
        cfg.patch_padding.len(),
        cfg.patch_prenorm.len(),
    ];
    if n == 0 || lens.iter().any(|&l| l != n) {
        return Err(Error::Config(format!(
            "vision_config lists disagree on the stage count {n}"
        )));
    }
    Ok(n)
}

impl TowerShape {
    /// The tower a config implies once its weights are loaded: dense convolutions of element type
    /// `conv_dtype(stage)` as loaded (prepared as [`ops::conv::padded_conv2d_weight`] says: padded f32
    /// on a GPU where K needs it, as they are on the CPU backend, `host`), channel-attention qkv
    /// weights of `qkv_dtype(stage)` in buffers of their own (offset 0) with an f32 bias when the config
    /// has one, the fused window kernel on and no MLP chunk cap below the binding limit (as
    /// [`crate::model::davit::DaVit::new`] sets them).
    pub fn from_config(
        cfg: &VisionConfig,
        conv_dtype: impl Fn(usize) -> DType,
        qkv_dtype: impl Fn(usize) -> DType,
        host: bool,
    ) -> Result<TowerShape> {
        let n = stage_count(cfg)?;
        let mut stages = Vec::with_capacity(n);
        let mut cin = cfg.in_channels;
        for s in 0..n {
            let (c, k) = (cfg.embed_dim[s], cfg.patch_size[s]);
            let loaded = conv_dtype(s);
            let conv_dtype = ops::conv::padded_conv2d_weight(&[c, cin, k, k], loaded, host)
                .map_or(loaded, |(_, d)| d);
            let bias = cfg.qkv_bias.then_some(0);
            stages.push(StageDesc {
                in_channels: cin,
                embed_dim: c,
                kernel: k,
                stride: cfg.patch_stride[s],
                padding: cfg.patch_padding[s],
                conv_dtype,
                hidden: crate::config::tensors::davit_mlp_hidden(c, cfg.mlp_ratio),
                heads: cfg.num_heads[s],
                groups: cfg.num_groups[s],
                channel_split: cfg.depths[s] == 0 || qkv_split_aligned(c, qkv_dtype(s), 0, bias),
            });
            cin = c;
        }
        Ok(TowerShape {
            in_channels: cfg.in_channels,
            window_size: cfg.window_size,
            stages,
            mlp_chunk_bytes: u64::MAX,
            fused_window_attention: true,
        })
    }

    /// Token grid (h, w) after every stage for an input of `h` x `w` pixels, or an error if a stage
    /// would produce no output.
    pub fn stage_grids(&self, h: usize, w: usize) -> Result<Vec<(usize, usize)>> {
        let (mut h, mut w) = (h, w);
        let mut out = Vec::with_capacity(self.stages.len());
        for (s, st) in self.stages.iter().enumerate() {
            let (k, stride, pad) = (st.kernel, st.stride, st.padding);
            match (
                ops::conv::conv_out_len(h, k, stride, pad),
                ops::conv::conv_out_len(w, k, stride, pad),
            ) {
                (Some(nh), Some(nw)) if nh > 0 && nw > 0 => {
                    h = nh;
                    w = nw;
                }
                _ => {
                    return Err(Error::shape(
                        "DaVit::forward",
                        format!("a {h}x{w} input to stage {s} gives no tokens"),
                    ))
                }
            }
            out.push((h, w));
        }
        Ok(out)
    }

    /// The stage shapes of a `bsz` x `ih` x `iw` input, as [`DaVit::forward`] runs them.
    pub(crate) fn stage_shapes(
        &self,
        max_binding: u64,
        bsz: usize,
        (ih, iw): (usize, usize),
    ) -> Result<Vec<StageShape>> {
        let grids = self.stage_grids(ih, iw)?;
        let mut out = Vec::with_capacity(grids.len());
        for (st, &(nh, nw)) in self.stages.iter().zip(&grids) {
            let (c, hidden, heads, groups) = (st.embed_dim, st.hidden, st.heads, st.groups);
            let k = st.in_channels * st.kernel * st.kernel;
            let im2col =
                ops::conv::im2col_scratch_bytes(max_binding, bsz * nh * nw, k, st.conv_dtype) / 4;
            let (nwh, nww) = ops::window::window_grid(nh, nw, self.window_size);
            let d = c / groups.max(1);
            out.push(StageShape {
                dims: (bsz, nh, nw, c),
                hidden,
                mlp_rows: 0,
                fused: self.fused_window_attention && ops::window_attn::supported(c, heads),
                im2col: im2col as usize,
                kp: ops::conv::gemm_k(k, st.conv_dtype).0,
                padded: nwh * nww * self.window_size * self.window_size != nh * nw,
                win_chunk: bsz * nwh * nww,
                channel_split: st.channel_split,
                partials: bsz * (nh * nw).div_ceil(256) * groups * d * d,
            });
        }
        // The MLP hidden (4 x C per token) would be the largest tensor of `big`: it runs in row chunks
        // that fit in `big` as the qkv (3 x C per token), the cropped attention output and the im2col
        // scratch of every stage size it, and in one storage binding.
        // Window qkv (3C per token) likewise runs in chunks of whole windows where the windows are
        // whole and the fused kernel runs.
        let others = out
            .iter()
            .map(|st| self.big_without_mlp(st))
            .max()
            .unwrap_or(0);
        let binding = (self.mlp_chunk_bytes.min(max_binding) / 4) as usize;
        let t = self.window_size * self.window_size;
        for st in &mut out {
            let (b, h, w, c) = st.dims;
            // The convolution's im2col runs in row chunks that fit too (at least one row).
            st.im2col = st.im2col.min((others / st.kp.max(1)).max(1) * st.kp);
            st.mlp_rows = mlp_chunk_rows(b * h * w, c, st.hidden, others.min(binding));
            if st.fused && !st.padded {
                // A window is t tokens of c channels: chunks start on aligned byte offsets of `ra`.
                st.win_chunk = mlp_chunk_rows(st.win_chunk, t * c, 3 * t * c, others.min(binding));
            }
        }
        Ok(out)
    }

    /// f32 elements of `big` a stage needs besides what runs in chunks (its MLP hidden, its im2col and,
    /// where it is chunked, its window qkv): channel attention's q|k (or its qkv, 3 x tokens), the
    /// cropped attention output and the channel half's stream (tokens), and the window qkv (3 x the
    /// zero-padded windows) where it runs whole.
    fn big_without_mlp(&self, st: &StageShape) -> usize {
        let (b, h, w, c) = st.dims;
        let rows = b * h * w;
        let (nwh, nww) = ops::window::window_grid(h, w, self.window_size);
        let win = b * nwh * nww * self.window_size * self.window_size * c;
        let channel = if st.channel_split {
            2 * rows * c
        } else {
            3 * rows * c
        };
        let window = if st.fused && !st.padded { 0 } else { 3 * win };
        channel.max(window).max(rows * c)
    }

    /// The activation arena [`DaVit::forward`] allocates for a `bsz` x `ih` x `iw` input on a device
    /// whose storage bindings hold at most `max_binding` bytes.
    pub fn arena_plan(
        &self,
        max_binding: u64,
        bsz: usize,
        (ih, iw): (usize, usize),
    ) -> Result<ArenaPlan> {
        let shapes = self.stage_shapes(max_binding, bsz, (ih, iw))?;
        let pixels = bsz * ih * iw * self.in_channels;
        let mut plan = ArenaPlan {
            stream: pixels,
            windows: 0,
            big: 0,
            split: 0,
            partials: 0,
        };
        for st in &shapes {
            let (b, h, w, c) = st.dims;
            let rows = b * h * w;
            let (nwh, nww) = ops::window::window_grid(h, w, self.window_size);
            let win = b * nwh * nww * self.window_size * self.window_size * c;
            plan.stream = plan.stream.max(rows * c);
            if win != rows * c {
                plan.windows = plan.windows.max(win);
            }
            plan.big = plan
                .big
                .max(self.big_without_mlp(st))
                .max(st.im2col)
                .max(st.mlp_rows.min(rows) * st.hidden)
                .max(st.win_chunk * self.window_size * self.window_size * 3 * c);
            if !st.fused {
                plan.split = plan.split.max(win);
            }
            if st.channel_split {
                plan.partials = plan.partials.max(st.partials);
            }
        }
        Ok(plan)
    }

    /// Whether `bsz` images of `ih` x `iw` run as one batch split exactly as one image is, scaled: in
    /// every stage the MLP row chunks, the window-attention chunks and the im2col row chunks hold
    /// `bsz` times one image's (a whole call stays whole). Each call's share per image is then one
    /// image's call, so kernels chosen for one image's share ([`crate::gpu::Recorder::set_images`])
    /// are the kernels one image gets alone: the batch's bits are each image's.
    pub fn batches_per_image(
        &self,
        max_binding: u64,
        bsz: usize,
        (ih, iw): (usize, usize),
    ) -> Result<bool> {
        let one = self.stage_shapes(max_binding, 1, (ih, iw))?;
        let many = self.stage_shapes(max_binding, bsz, (ih, iw))?;
        Ok(one.iter().zip(&many).all(|(a, b)| {
            let rows = |s: &StageShape| s.im2col / s.kp.max(1);
            b.mlp_rows == bsz * a.mlp_rows
                && b.win_chunk == bsz * a.win_chunk
                && rows(b) == bsz * rows(a)
        }))
    }

    /// Rows per MLP chunk in each stage for a `bsz` x `ih` x `iw` input (a stage's token count when
    /// its MLP runs whole), as [`DaVit::forward`](crate::model::davit::DaVit::forward) runs them.
    pub fn mlp_chunk_rows(
        &self,
        max_binding: u64,
        bsz: usize,
        (ih, iw): (usize, usize),
    ) -> Result<Vec<usize>> {
        Ok(self
            .stage_shapes(max_binding, bsz, (ih, iw))?
            .iter()
            .map(|st| st.mlp_rows)
            .collect())
    }
}
