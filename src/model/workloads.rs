//! The calls Florence-2 makes for one request, as the tuner times them: each linear layer's shape and
//! each attention call, with its estimated cost in one request (the tuner's priority order). Derived
//! from the model's own geometry (DaViT's stage grids and windows, the projector's token count, BART's
//! layer counts) and the loader's format rules (`WeightDType::matrix_dtype`, `conv_dtype`).

use crate::config::tensors::davit_mlp_hidden;
use crate::config::Florence2Config;
use crate::gpu::registry::LinearShape;
use crate::gpu::tune::TuneCase;
use crate::gpu::DType;
use crate::model::projector::image_tokens;
use crate::ops::attention::AttnShape;
use crate::ops::conv::gemm_k;
use crate::ops::window::window_grid;
use crate::ops::window_attn::WindowShape;
use crate::weights::{DTypePlan, Part, WeightDType};

/// Decode steps a request is assumed to run when weighing decode shapes against encoding ones.
pub const DECODE_STEPS_ESTIMATE: f64 = 32.0;

/// Prompt tokens assumed for the encoder rows (rows are bucketed by powers of two, so nearby prompt
/// lengths share the class).
const PROMPT_TOKENS: usize = 16;

/// Distinct linear classes with their summed costs; a class keeps its largest row count.
#[derive(Default)]
struct LinearWork(Vec<(LinearShape, f64)>);

impl LinearWork {
    /// `calls` calls of x (m, k) @ w (n, k)^T with weights stored as `format`.
    fn push(&mut self, m: usize, n: usize, k: usize, calls: f64, format: DType) {
        let s = LinearShape { m, n, k, format };
        if m == 0 || n == 0 || k == 0 {
            return;
        }
        let cost = calls * s.cost();
        match self.0.iter_mut().find(|(o, _)| o.class() == s.class()) {
            Some((o, c)) => {
                o.m = o.m.max(m);
                *c += cost;
            }
            None => self.0.push((s, cost)),
        }
    }

    /// A matrix weight of a model resident in `dtype`, in the format the loader stores it.
    fn matrix(&mut self, m: usize, n: usize, k: usize, calls: f64, dtype: WeightDType) {
        self.push(m, n, k, calls, dtype.matrix_dtype(k));
    }
}

/// The linear shapes (patch-embedding convs included, as im2col GEMMs) Florence-2 runs for `cfg` on a
/// `height` x `width` image, with decode steps of `beams` rows (timed at one row: every decode row runs the
/// one-row kernel) and matrix weights resident as
/// `plan` (one format, a matrix [`DType`] or a [`WeightDType`], or a format per part: each linear in
/// its part's format), one per class, each with its estimated cost in one request
/// ([`LinearShape::cost`] times its calls: layers, blocks, and [`DECODE_STEPS_ESTIMATE`] decode steps).
/// The encoder rows are taken for a prompt of 16 tokens.
pub fn model_linear_workload(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
    plan: impl Into<DTypePlan>,
) -> Vec<(LinearShape, f64)> {
    let plan = plan.into();
    let mut work = LinearWork::default();
    let grids = cfg.vision.stage_grids(height, width);
    vision_linears(cfg, &grids, plan.get(Part::Vision), &mut work);
    let grid = grids.last().copied().unwrap_or((height, width));
    text_linears(cfg, image_tokens(cfg, grid), beams, plan, &mut work);
    work.0
}

/// DaViT's patch embeddings and blocks on the token `grids` of each stage.
fn vision_linears(
    cfg: &Florence2Config,
    grids: &[(usize, usize)],
    dtype: WeightDType,
    work: &mut LinearWork,
) {
    let v = &cfg.vision;
    let ws = v.window_size.max(1);
    for (s, &(h, w)) in grids.iter().enumerate() {
        let c = v.embed_dim[s];
        // Patch-embedding conv as im2col + GEMM: K = k*k*Cin, padded as the conv launcher pads it.
        let cin = if s == 0 {
            v.in_channels
        } else {
            v.embed_dim[s - 1]
        };
        let (kg, fg) = gemm_k(v.patch_size[s].pow(2) * cin, dtype.conv_dtype());
        work.push(h * w, c, kg, 1.0, fg);
        let hidden = davit_mlp_hidden(c, v.mlp_ratio);
        let rows = h * w;
        let (nwh, nww) = window_grid(h, w, ws);
        let wrows = nwh * nww * ws * ws;
        // Each block: a spatial (window) and a channel attention, each with an MLP.
        let blocks = v.depths.get(s).copied().unwrap_or(1).max(1) as f64;
        work.matrix(wrows, 3 * c, c, blocks, dtype); // window attention qkv
        work.matrix(rows, c, c, 2.0 * blocks, dtype); // attention out projections
        work.matrix(rows, 3 * c, c, blocks, dtype); // channel attention qkv
        work.matrix(rows, hidden, c, 2.0 * blocks, dtype); // fc1 (GELU)
        work.matrix(rows, c, hidden, 2.0 * blocks, dtype); // fc2
    }
}

/// The projector, the BART encoder over image + prompt tokens, and decode steps of `beams` rows, each
/// in its part's format.
fn text_linears(
    cfg: &Florence2Config,
    image_tokens: usize,
    beams: usize,
    plan: DTypePlan,
    work: &mut LinearWork,
) {
    let (v, t) = (&cfg.vision, &cfg.text);
    let c_last = v.embed_dim.last().copied().unwrap_or(0);
    let proj = plan.get(Part::Projector);
    work.matrix(image_tokens, v.projection_dim, c_last, 1.0, proj); // image_projection
    let seq = image_tokens + PROMPT_TOKENS;
    let d = t.d_model;
    let (enc, dec) = (t.encoder_layers as f64, t.decoder_layers as f64);
    let (ed, dd) = (plan.get(Part::Encoder), plan.get(Part::Decoder));
    if ed == dd {
        work.matrix(seq, d, d, 4.0 * enc + 2.0 * dec, ed); // encoder q/k/v/o, decoder cross k/v
    } else {
        work.matrix(seq, d, d, 4.0 * enc, ed); // encoder q/k/v/o
        work.matrix(seq, d, d, 2.0 * dec, dd); // decoder cross k/v
    }
    work.matrix(seq, t.encoder_ffn_dim, d, enc, ed);
    work.matrix(seq, d, t.encoder_ffn_dim, enc, ed);
    let dtype = dd;
    // Every decode row runs the kernel chosen for one row (`LinearArgs::per_row`: a batched step's
    // rows equal one-row calls), so the decoder's linears are timed at M = 1, weighted by the rows.
    let n = DECODE_STEPS_ESTIMATE * beams.max(1) as f64;
    work.matrix(1, d, d, 6.0 * dec * n, dtype); // decoder q/k/v/o, cross q/o
    work.matrix(1, t.decoder_ffn_dim, d, dec * n, dtype);
    work.matrix(1, d, t.decoder_ffn_dim, dec * n, dtype);
    work.matrix(1, t.vocab_size, d, n, plan.get(Part::Embed)); // LM head
}

/// Rows of a decode step: 1 (greedy) and `beams`.
fn decode_rows(beams: usize) -> Vec<usize> {
    if beams > 1 {
        vec![1, beams]
    } else {
        vec![1]
    }
}

/// The distinct linear shapes of [`model_linear_workload`], in its order.
pub fn model_linear_shapes(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
    format: DType,
) -> Vec<LinearShape> {
    model_linear_workload(cfg, height, width, beams, format)
        .into_iter()
        .map(|(s, _)| s)
        .collect()
}

/// The attention calls Florence-2 runs for `cfg` on a `height` x `width` image with decode steps of 1
/// and `beams` rows: DaViT window attention per stage, encoder self-attention over image + prompt
/// tokens (a prompt of 16 tokens, as in [`model_linear_shapes`]), decoder self-attention over a cache of
/// the position table's length and cross-attention over the encoder sequence (K/V shared by the rows).
pub fn model_attention_cases(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
) -> Vec<Box<dyn TuneCase>> {
    model_attention_workload(cfg, height, width, beams)
        .into_iter()
        .map(|(c, _)| c)
        .collect()
}

/// [`model_attention_cases`], each with its estimated cost in one request (FLOPs times its calls:
/// blocks, layers, [`DECODE_STEPS_ESTIMATE`] decode steps), for the tuner's priority order.
pub fn model_attention_workload(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
) -> Vec<(Box<dyn TuneCase>, f64)> {
    let mut out: Vec<(Box<dyn TuneCase>, f64)> = Vec::new();
    let mut push = |case: Box<dyn TuneCase>, calls: f64| {
        let cost = calls * case.flops();
        match out.iter_mut().find(|o| o.0.class() == case.class()) {
            Some(o) => o.1 += cost,
            None => out.push((case, cost)),
        }
    };
    let v = &cfg.vision;
    let ws = v.window_size.max(1);
    let grids = v.stage_grids(height, width);
    for (s, &(h, w)) in grids.iter().enumerate() {
        let (c, heads) = (v.embed_dim[s], v.num_heads.get(s).copied().unwrap_or(1));
        let (nwh, nww) = window_grid(h, w, ws);
        let blocks = v.depths.get(s).copied().unwrap_or(1).max(1) as f64;
        let t = ws * ws;
        let windows = nwh * nww;
        push(
            Box::new(WindowShape {
                windows,
                t,
                c,
                heads,
            }),
            blocks,
        );
    }
    let t = &cfg.text;
    let grid = grids.last().copied().unwrap_or((height, width));
    let seq = image_tokens(cfg, grid) + PROMPT_TOKENS;
    let enc = |b: usize, tq: usize, bk: usize, tk: usize, heads: usize| AttnShape {
        b,
        tq,
        bk,
        tk,
        heads,
        d: t.d_model / heads.max(1),
        causal: false,
        masked: false,
    };
    push(
        Box::new(enc(1, seq, 1, seq, t.encoder_attention_heads)),
        t.encoder_layers as f64,
    );
    let per_step = t.decoder_layers as f64 * DECODE_STEPS_ESTIMATE;
    let cache_len = t.max_position_embeddings.max(1);
    let heads = t.decoder_attention_heads;
    for b in decode_rows(beams) {
        push(Box::new(enc(b, 1, b, cache_len, heads)), per_step); // self-attention over the cache
        push(Box::new(enc(b, 1, 1, seq, heads)), per_step); // cross-attention, K/V shared (Bk = 1)
    }
    out
}

/// Every call the tuner times for one request (see [`model_linear_workload`] and
/// [`model_attention_workload`]): the linear shapes, then the attention calls, each with its cost.
/// `plan` as for [`model_linear_workload`].
pub fn model_workload(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
    plan: impl Into<DTypePlan>,
) -> Vec<(Box<dyn TuneCase>, f64)> {
    let linear = model_linear_workload(cfg, height, width, beams, plan);
    let linear = linear
        .into_iter()
        .map(|(s, c)| (Box::new(s) as Box<dyn TuneCase>, c));
    linear
        .chain(model_attention_workload(cfg, height, width, beams))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_weighs_layers_and_decode_steps() {
        let cfg = Florence2Config::from_json_str(include_str!(
            "../../tests/fixtures/models/tiny4/config.json"
        ))
        .unwrap();
        let w = model_linear_workload(&cfg, 64, 64, 3, DType::F32);
        let shapes = model_linear_shapes(&cfg, 64, 64, 3, DType::F32);
        assert_eq!(w.len(), shapes.len());
        let d = cfg.text.d_model;
        let cost_of = |m: usize, n: usize| {
            w.iter()
                .find(|(s, _)| s.m == m && s.n == n && s.k == d)
                .map(|x| x.1)
                .unwrap()
        };
        // The decoder's d x d class runs 6 times per layer per step and row (3 beams, each row the
        // one-row kernel), the LM head once per step and row.
        let dd = LinearShape {
            m: 1,
            n: d,
            k: d,
            format: DType::F32,
        };
        let want = 6.0 * cfg.text.decoder_layers as f64 * DECODE_STEPS_ESTIMATE * 3.0 * dd.cost();
        assert!((cost_of(1, d) - want).abs() < 1e-6 * want);
        let head = LinearShape {
            n: cfg.text.vocab_size,
            ..dd
        };
        let want = DECODE_STEPS_ESTIMATE * 3.0 * head.cost();
        assert!((cost_of(1, cfg.text.vocab_size) - want).abs() < 1e-6 * want);
        assert!(w.iter().all(|(_, c)| *c > 0.0));
    }

    #[test]
    fn a_mix_times_each_linear_in_its_parts_format() {
        // vision=fp16,text=q4: the vision tower's classes are fp16's, the text model's q4's.
        let cfg = Florence2Config::from_json_str(include_str!(
            "../../tests/fixtures/models/tiny2/config.json"
        ))
        .unwrap();
        let plan = DTypePlan::vision_text(WeightDType::Fp16, WeightDType::Q4);
        let mix = model_linear_workload(&cfg, 64, 64, 3, plan);
        let of = |d: WeightDType| model_linear_workload(&cfg, 64, 64, 3, DTypePlan::uniform(d));
        let (fp16, q4) = (of(WeightDType::Fp16), of(WeightDType::Q4));
        // Classes merge differently (a class keeps its largest row count): compare (N, K, format).
        let has = |w: &[(LinearShape, f64)], s: &LinearShape| {
            w.iter()
                .any(|(x, _)| (x.n, x.k, x.format) == (s.n, s.k, s.format))
        };
        assert!(mix.iter().all(|(s, _)| has(&fp16, s) || has(&q4, s)));
        let formats: Vec<DType> = mix.iter().map(|(s, _)| s.format).collect();
        assert!(
            formats.contains(&DType::F16) && formats.contains(&DType::Q4),
            "{formats:?}"
        );
        // The LM head (embed part) in q4, as the uniform q4 model runs it.
        let head = |w: &[(LinearShape, f64)]| {
            w.iter()
                .find(|(s, _)| s.n == cfg.text.vocab_size)
                .map(|(s, _)| s.format)
        };
        assert_eq!(head(&mix), head(&q4));
    }
}
