//! Comparing a model against the f32 reference, stage by stage and token by token (the resident-dtype
//! fidelity test, `tests/model/dtype_fidelity.rs`, and the q4 fidelity bench, `scripts/bench/q4_fidelity.rs`).

use std::sync::Arc;

use florence2_wasm::gpu::{readback, Device, Recorder, Tensor};
use florence2_wasm::model::florence2::Florence2;
use florence2_wasm::model::generate::GenerateOptions;
use florence2_wasm::processor::image::{
    decode_image, preprocess, ImageLimits, ImageProcessorConfig,
};
use florence2_wasm::processor::parse_task_prompt;
use florence2_wasm::processor::tokenizer::Florence2Tokenizer;
use florence2_wasm::weights::Weights;
use serde_json::Value;

use super::fixtures::{cases, fixtures};

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-300)
}

/// (max |a - b|, peak |b|).
pub fn diff_peak(a: &[f32], b: &[f32]) -> (f64, f64) {
    let mut d = 0f64;
    let mut p = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        d = d.max((x as f64 - y as f64).abs());
        p = p.max((y as f64).abs());
    }
    (d, p)
}

/// (arg-max, top-1 value, top-2 value).
pub fn top2(v: &[f32]) -> (usize, f32, f32) {
    let mut best = (0, f32::NEG_INFINITY);
    let mut second = f32::NEG_INFINITY;
    for (i, &x) in v.iter().enumerate() {
        if x > best.1 {
            second = best.1;
            best = (i, x);
        } else if x > second {
            second = x;
        }
    }
    (best.0, best.1, second)
}

/// Greedy generation options of a reference result (`kwargs` of `cases.json`), one beam.
pub fn options_of(result: &Value, max_new: usize) -> GenerateOptions {
    GenerateOptions {
        num_beams: 1,
        ..super::fixtures::options_of(result, max_new)
    }
}

/// Raw logits of every step, teacher-forced along `ids` (start token first).
pub fn forced_logits(
    g: &Arc<Device>,
    m: &Florence2,
    cross_of: &Tensor,
    ids: &[u32],
) -> Vec<Vec<f32>> {
    let dec = &m.decoder;
    let mut rec = Recorder::new(g);
    let cross = dec.cross_kv(&mut rec, cross_of).unwrap();
    rec.submit().unwrap();
    let mut state = dec.new_state(g, &cross, 1, ids.len()).unwrap();
    let mut out = Vec::new();
    for (pos, &t) in ids.iter().enumerate().take(ids.len() - 1) {
        state.write_tokens(&[t]).unwrap();
        let mut rec = Recorder::new(g);
        let logits = dec.step_planned(&mut rec, pos as u32, &mut state).unwrap();
        rec.submit().unwrap();
        out.push(readback::to_f32_blocking(g, &logits).unwrap());
    }
    out
}

/// The pixels and prompt ids of every reference case of a fixture dir.
pub fn case_inputs(g: &Arc<Device>, dir: &str) -> Vec<(Value, Tensor, Vec<u32>)> {
    let mdir = fixtures().join("models").join(dir);
    let tok =
        Florence2Tokenizer::from_json_bytes(&std::fs::read(mdir.join("tokenizer.json")).unwrap())
            .unwrap();
    let pre = ImageProcessorConfig::from_json_bytes(
        &std::fs::read(mdir.join("preprocessor_config.json")).unwrap(),
    )
    .unwrap();
    cases(dir)
        .into_iter()
        .map(|case| {
            let image = case["image"].as_str().unwrap();
            let bytes = std::fs::read(fixtures().join("images").join(image)).unwrap();
            let rgb = decode_image(&bytes, &ImageLimits::default()).unwrap();
            let px = preprocess(&rgb, &pre).unwrap();
            let pixels =
                Tensor::from_f32(g, &[1, 3, pre.height, pre.width], &px, "pixels").unwrap();
            let prompt = case["prompt"].as_str().unwrap();
            let ids = tok
                .encode_prompt(&parse_task_prompt(prompt).unwrap().encoder_text())
                .unwrap();
            (case, pixels, ids)
        })
        .collect()
}

/// One reference case, prepared once: its pixels and prompt ids, the reference model's encoder outputs
/// (`inputs_embeds`, encoder output), greedy ids (the case's `greedy_nrng0` settings) and the
/// teacher-forced logits along them.
pub struct RefCase {
    pub pixels: Tensor,
    pub ids: Vec<u32>,
    pub vis: Vec<f32>,
    pub enc: Vec<f32>,
    pub greedy: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

pub fn reference_cases(g: &Arc<Device>, dir: &str, m: &Florence2) -> Vec<RefCase> {
    case_inputs(g, dir)
        .into_iter()
        .map(|(case, pixels, ids)| {
            let e = m.encode(&pixels, &ids).unwrap();
            let r = &case["results"]["greedy_nrng0"];
            let opts = options_of(r, case["max_new_tokens"].as_u64().unwrap() as usize);
            let greedy =
                pollster::block_on(m.generate(&e.cross, &opts, Default::default())).unwrap();
            let logits = forced_logits(g, m, &e.hidden, &greedy);
            RefCase {
                vis: readback::to_f32_blocking(g, &e.inputs_embeds).unwrap(),
                enc: readback::to_f32_blocking(g, &e.hidden).unwrap(),
                pixels,
                ids,
                greedy,
                logits,
            }
        })
        .collect()
}

/// A model's figures against the reference cases.
pub struct Score {
    pub min_vis: f64,
    pub min_enc: f64,
    pub mean_enc: f64,
    /// Largest max |diff| / peak of the encoder output over the cases.
    pub enc_rel_diff: f64,
    /// Largest max |diff| / peak of `inputs_embeds` over the cases.
    pub vis_rel_diff: f64,
    /// Teacher-forced steps whose arg-max equals the reference's, of `steps`.
    pub agree: usize,
    pub steps: usize,
}

impl std::fmt::Display for Score {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "inputs_embeds cos min {:.5} | encoder.out cos min {:.5} mean {:.5} (1-cos {:.4}) | \
             arg-max {}/{} = {:.1}%",
            self.min_vis,
            self.min_enc,
            self.mean_enc,
            1.0 - self.mean_enc,
            self.agree,
            self.steps,
            100.0 * self.agree as f64 / self.steps.max(1) as f64
        )
    }
}

/// Encode every case with `m` and teacher-force its decoder along the reference's greedy ids.
pub fn score(g: &Arc<Device>, m: &Florence2, refs: &[RefCase]) -> Score {
    let mut s = Score {
        min_vis: 1.0,
        min_enc: 1.0,
        mean_enc: 0.0,
        enc_rel_diff: 0.0,
        vis_rel_diff: 0.0,
        agree: 0,
        steps: 0,
    };
    for r in refs {
        let e = m.encode(&r.pixels, &r.ids).unwrap();
        let vis = readback::to_f32_blocking(g, &e.inputs_embeds).unwrap();
        let enc = readback::to_f32_blocking(g, &e.hidden).unwrap();
        s.min_vis = s.min_vis.min(cosine(&vis, &r.vis));
        let c = cosine(&enc, &r.enc);
        s.min_enc = s.min_enc.min(c);
        s.mean_enc += c / refs.len() as f64;
        let (dv, pv) = diff_peak(&vis, &r.vis);
        let (de, pe) = diff_peak(&enc, &r.enc);
        s.vis_rel_diff = s.vis_rel_diff.max(dv / pv);
        s.enc_rel_diff = s.enc_rel_diff.max(de / pe);
        for (a, b) in r
            .logits
            .iter()
            .zip(forced_logits(g, m, &e.hidden, &r.greedy))
        {
            s.steps += 1;
            s.agree += usize::from(top2(a).0 == top2(&b).0);
        }
    }
    s
}

/// The same weights with every tensor read back as f32 (quantized rows dequantized, f16 widened) and
/// uploaded again as f32: the values a resident-dtype load computes with, run by the f32 kernels.
pub fn widened_to_f32(g: &Arc<Device>, w: &Weights) -> Weights {
    let mut out = Weights::new();
    for n in w.names() {
        let t = w.get_any(n).unwrap();
        let v = readback::to_f32_blocking(g, &t).unwrap();
        out.insert(n, Tensor::from_f32(g, t.shape(), &v, n).unwrap());
    }
    out
}
