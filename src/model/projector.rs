//! The multi-modal projector (`model.multi_modal_projector.*`), following transformers'
//! `Florence2MultiModalProjector` (and the original `_encode_image`):
//! 1. tokens + learned 2-D position embedding (COLUMN half first: concat(col[x], row[y])),
//! 2. + the cosine temporal table's row 0 (sin 0, cos 0, ... = 0, 1, 0, 1: not zero),
//! 3. pooled features in `image_feature_source` order: `spatial_avg_pool` = the mean over all tokens (one
//!    token), `temporal_avg_pool` / `last_frame` = the tokens themselves (one frame). The released configs
//!    say [spatial_avg_pool, temporal_avg_pool]: the pooled token comes first, then the N tokens.
//! 4. `image_projection` (a Linear without bias, (D, C_last)), then `image_proj_norm` (LayerNorm).

use crate::config::Florence2Config;
use crate::error::{Error, Result};
use crate::gpu::{DType, Recorder, Tensor};
use crate::model::layers::{Embedding, LayerNorm, Linear};
use crate::ops;
use crate::ops::matmul::Act;
use crate::weights::WeightsView;

/// One entry of `image_feature_source`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureSource {
    /// Mean over the token grid: one token.
    SpatialAvgPool,
    /// Mean over frames (one frame: the tokens themselves).
    TemporalAvgPool,
    /// The last frame's tokens (one frame: the tokens themselves).
    LastFrame,
}

impl FeatureSource {
    /// The source an `image_feature_source` entry names.
    pub fn from_name(s: &str) -> Option<FeatureSource> {
        match s {
            "spatial_avg_pool" => Some(FeatureSource::SpatialAvgPool),
            "temporal_avg_pool" => Some(FeatureSource::TemporalAvgPool),
            "last_frame" => Some(FeatureSource::LastFrame),
            _ => None,
        }
    }

    /// Tokens this source contributes for an (h, w) token grid.
    pub fn tokens(self, grid: (usize, usize)) -> usize {
        match self {
            FeatureSource::SpatialAvgPool => 1,
            FeatureSource::TemporalAvgPool | FeatureSource::LastFrame => grid.0 * grid.1,
        }
    }
}

/// Image tokens the projector of `cfg` produces for an (h, w) token grid (as [`Projector::num_tokens`];
/// a source it does not know, which `validate` rejects, counts as the grid).
pub fn image_tokens(cfg: &Florence2Config, grid: (usize, usize)) -> usize {
    cfg.vision
        .image_feature_source
        .iter()
        .map(|s| FeatureSource::from_name(s).map_or(grid.0 * grid.1, |f| f.tokens(grid)))
        .sum()
}

/// `image_position_embed`: learned row / column tables.
#[derive(Clone, Debug)]
pub struct ImagePositionEmbed {
    pub row_embeddings: Embedding,
    pub column_embeddings: Embedding,
}

#[derive(Clone, Debug)]
pub struct Projector {
    pub image_position_embed: ImagePositionEmbed,
    /// `visual_temporal_embed.pos_idx_to_embed` (T, C_last); row 0 is used.
    pub visual_temporal_embed: Tensor,
    /// `nn.Linear(C_last, D, bias=False)`.
    pub image_projection: Linear,
    pub image_proj_norm: LayerNorm,
    pub sources: Vec<FeatureSource>,
    pub max_positions: usize,
}

impl Projector {
    /// Load the projector from `w` (the `model.multi_modal_projector` view), checking shapes against `cfg`.
    pub fn new(cfg: &Florence2Config, w: WeightsView) -> Result<Self> {
        let v = &cfg.vision;
        let c = *v
            .embed_dim
            .last()
            .ok_or_else(|| Error::Config("vision_config has no stages".into()))?;
        let d = v.projection_dim;
        let p = v.max_position_embeddings;
        let sources = v
            .image_feature_source
            .iter()
            .map(|s| {
                FeatureSource::from_name(s)
                    .ok_or_else(|| Error::Config(format!("unknown image_feature_source '{s}'")))
            })
            .collect::<Result<Vec<_>>>()?;
        if sources.is_empty() {
            return Err(Error::Config("image_feature_source is empty".into()));
        }
        let pe = w.pp("image_position_embed");
        Ok(Projector {
            image_position_embed: ImagePositionEmbed {
                row_embeddings: Embedding::new(&pe.pp("row_embeddings"), p, c / 2)?,
                column_embeddings: Embedding::new(&pe.pp("column_embeddings"), p, c - c / 2)?,
            },
            visual_temporal_embed: w.get(
                "visual_temporal_embed.pos_idx_to_embed",
                &[v.max_temporal_embeddings, c],
            )?,
            image_projection: Linear::new(&w.pp("image_projection"), c, d, false)?,
            image_proj_norm: LayerNorm::new(&w.pp("image_proj_norm"), d)?,
            sources,
            max_positions: p,
        })
    }

    /// Number of image tokens produced for an (h, w) token grid.
    pub fn num_tokens(&self, grid: (usize, usize)) -> usize {
        self.sources.iter().map(|s| s.tokens(grid)).sum()
    }

    /// Record the projector on `feats` (B, N = h*w, C_last) from the vision tower. Returns (B, T, D) with
    /// T = [`Projector::num_tokens`] (1 + N for the released configs).
    pub fn forward(
        &self,
        rec: &mut Recorder,
        feats: &Tensor,
        grid: (usize, usize),
    ) -> Result<Tensor> {
        self.forward_with_scratch(rec, feats, grid, &[])
    }

    /// [`Projector::forward`] with its intermediates in views of `scratch` (the vision tower's arena
    /// buffers, [`crate::model::davit::VisionOut`]) where they are large enough, fresh buffers
    /// otherwise: the position-added tokens in `scratch[0]`, the pooled token list in `scratch[1]`,
    /// the mean and then the projection in `scratch[2]`, which may be `feats`' buffer (read only by the
    /// position embedding, before). Only the output is allocated. Same values either way.
    pub fn forward_with_scratch(
        &self,
        rec: &mut Recorder,
        feats: &Tensor,
        grid: (usize, usize),
        scratch: &[Tensor],
    ) -> Result<Tensor> {
        let c = self.image_projection.in_features();
        let d = self.image_projection.out_features();
        self.check_input(feats, grid)?;
        let bsz = feats.dim(0);
        let n = grid.0 * grid.1;
        let gpu = rec.gpu().clone();
        let pe = &self.image_position_embed;
        // x = feats + pos2d + temporal[0]
        let x = scratch_or_zeros(&gpu, scratch.first(), &[bsz, n, c], "projector.pos")?;
        ops::pos_embed::pos2d_temporal_add(
            rec,
            feats,
            &pe.column_embeddings.weight,
            &pe.row_embeddings.weight,
            &self.visual_temporal_embed,
            grid,
            &x,
        )?; // (B, N, C)

        // Pooled features, concatenated along tokens in config order.
        let t = self.num_tokens(grid);
        let tokens = scratch_or_zeros(&gpu, scratch.get(1), &[bsz, t, c], "projector.tokens")?;
        let pooled = if self.sources.contains(&FeatureSource::SpatialAvgPool) {
            // Dead once copied into `tokens`, before the projection takes the same buffer.
            let m = scratch_or_zeros(&gpu, scratch.get(2), &[bsz, c], "projector.mean")?;
            ops::reduce::mean_rows(rec, &x, &m)?; // (B, C)
            Some(m)
        } else {
            None
        };
        self.gather_tokens(rec, &x, pooled.as_ref(), &tokens)?; // (B, T, C)
                                                                // image_projection (no bias), then image_proj_norm.
        let rows = bsz * t;
        let proj = scratch_or_zeros(&gpu, scratch.get(2), &[rows, d], "projector.proj")?;
        self.image_projection
            .forward(rec, &tokens.reshape(&[rows, c])?, Act::None, &proj)?; // (B*T, D)
        let out = Tensor::zeros(&gpu, &[bsz, t, d], DType::F32, "projector.out")?;
        self.image_proj_norm
            .forward(rec, &proj, &out.reshape(&[rows, d])?)?; // (B*T, D)
        Ok(out)
    }
    /// Checks `feats` (B, h*w, C) against the grid and the learned positions.
    fn check_input(&self, feats: &Tensor, (h, w): (usize, usize)) -> Result<()> {
        const OP: &str = "Projector::forward";
        let c = self.image_projection.in_features();
        if feats.rank() != 3 || feats.dim(1) != h * w || feats.dim(2) != c || h * w == 0 {
            return Err(Error::shape(
                OP,
                format!("feats {:?} must be (B, {h}*{w}, {c})", feats.shape()),
            ));
        }
        if h > self.max_positions || w > self.max_positions {
            return Err(Error::shape(
                OP,
                format!(
                    "a {h}x{w} token grid exceeds the {} learned positions",
                    self.max_positions
                ),
            ));
        }
        Ok(())
    }

    /// Each batch row's tokens (B, T, C) from the sources in config order: the mean row `pooled` (B, C)
    /// for the spatial average pool, else all of `x`'s (B, N, C) rows.
    fn gather_tokens(
        &self,
        rec: &mut Recorder,
        x: &Tensor,
        pooled: Option<&Tensor>,
        tokens: &Tensor,
    ) -> Result<()> {
        let (bsz, n, c) = (x.dim(0), x.dim(1), x.dim(2));
        let t = tokens.dim(1);
        let row_bytes = (c * 4) as u64;
        for b in 0..bsz as u64 {
            let mut at = 0u64; // token index inside this batch row
            let dst0 = b * t as u64 * row_bytes;
            for src in &self.sources {
                match (src, pooled) {
                    (FeatureSource::SpatialAvgPool, Some(m)) => {
                        rec.copy_range(m, b * row_bytes, tokens, dst0 + at * row_bytes, row_bytes)?;
                        at += 1;
                    }
                    _ => {
                        let bytes = n as u64 * row_bytes;
                        rec.copy_range(x, b * bytes, tokens, dst0 + at * row_bytes, bytes)?;
                        at += n as u64;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A prefix view of `scratch` as an f32 `shape` when it holds one, else a fresh zeroed tensor.
fn scratch_or_zeros(
    gpu: &crate::gpu::Device,
    scratch: Option<&Tensor>,
    shape: &[usize],
    label: &str,
) -> Result<Tensor> {
    let bytes = (shape.iter().product::<usize>() * 4) as u64;
    match scratch {
        Some(t) if t.capacity() >= bytes.max(4) => t.view(shape, DType::F32),
        _ => Tensor::zeros(gpu, shape, DType::F32, label),
    }
}
