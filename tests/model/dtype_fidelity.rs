//! Resident weight dtypes (fp16, q8, q4) against f32 weights, on every fixture model dir and every
//! reference case: the same checkpoint is loaded twice (f32 and the dtype under test), the same pixels
//! and prompt go through both, and we compare stage by stage and token by token.
//!
//! Stages: `inputs_embeds` (vision tower + projector + prompt embedding) and `hidden` (BART encoder
//! output): max |diff| / peak and cosine similarity. Decoding: teacher-forced on f32's greedy ids, the
//! raw logits of every step (max |diff|, and whether the arg-max agrees), then free-running greedy ids
//! (the case's own settings) with the first divergence position.
//!
//! ## fp16: the derived bound
//! Rounding a weight to f16 changes it by a relative |delta| <= u = 2^-11. A Linear y = W x then changes
//! by |dy_i| <= u * sum_j |W_ij x_j|, i.e. a relative error of at most u in the "absolute" norm; to first
//! order these relative errors add along the longest chain of Linears (LayerNorms rescale the activation
//! and its error alike, residual adds keep the larger relative error). With L Linears on the path from the
//! pixels to a stage, the stage's relative error is <= L u in that norm. With fp16 (and q8/q4) weights the
//! decoder also keeps its KV caches and cross-attention K/V in f16: the f32 K and V a Linear produced are
//! rounded once more when stored (on the GPU, `pack2x16float`, which WGSL lets round to either neighbour:
//! relative <= 2u). That is one more rounding after a Linear on each of the two attention branches of a
//! decoder layer (self K/V, cross K/V), so the logits' chain counts 2 x 2 = 4 more units of u per decoder
//! layer (`chain_lengths`). For a sum of d terms of random
//! sign (random-weight fixtures) sum |W x| ~ sqrt(d) |sum W x|, so against the peak of a stage:
//!     max |diff| <= L * u * sqrt(d) * peak.
//! We assert the measured difference of each stage below HALF of that bound, so a broken f16 path
//! (a packing or offset bug moves values by O(peak)) fails. For the logits of a step the same bound
//! `b` holds per logit, so the arg-max cannot change where the f32 top-1 margin exceeds 2 b: the
//! teacher-forced arg-max must agree on every such step (it can only differ inside the bound). Then,
//! free-running, greedy ids must be identical on >= 95% of the (case, setting) runs (the bar),
//! with the first divergence positions printed for the others.
//!
//! ## q8 / q4
//! Quantization noise is not a rounding of the last bit: per block the error is up to half a step
//! (max|w| / 254 for q8, max|w| / 14 for q4); on the fixtures' Gaussian weights the relative rms weight
//! error is 0.53% for q8 and 9.7% for q4. We print per-stage cosine similarity to f32 and the share of
//! teacher-forced steps whose arg-max equals f32's, and assert: q8 encoder output cosine >= 0.999 (the
//! issue's target, met), q4 >= 0.95; and per dir the teacher-forced arg-max equal to f32's on at least
//! [`Q8_MIN_FORCED_TOP1`] (97%) of the steps for q8, [`Q4_MIN_FORCED_TOP1`] (90%) for q4. Measured on
//! both backends: q8 99.0-100% (96 to 119 of 97 to 119 steps), q4 94.8-98.3%; the margins leave room
//! for two more flipped steps per dir in q8 and four in q4, while a broken path (a block's scale or
//! nibble order wrong) flips most steps (f32's top-1 among 1472 tokens). The q4 target of 0.99 is NOT met on these fixtures
//! (0.971..0.980); 0.95 leaves room for the random-weight noise, and the exactness of the quantized
//! paths is asserted by `resident_dtypes_compute_what_their_weights_hold` below (the resident load
//! against its own dequantized weights in f32: equal up to summation order).
//!
//! Where the q4 error comes from and what else would reach (`cargo bench --bench q4_fidelity`, figures in
//! `src/gpu/quant.rs` and the note): no group dominates; each Linear on the path adds a share,
//! the later ones more (on tiny2, of the encoder output's 1-cos of 0.0225 quantizing one group alone
//! gives: DaViT attention 0.0070, DaViT MLP 0.0047, BART encoder attention 0.0062 and MLP 0.0057,
//! projector 0.0024, prompt embedding 0.0006); 1-cos grows as the square of the weight error, and
//! independent draws of a q4-sized error give 0.017..0.041. Whether trained weights are easier is NOT
//! shown by these fixtures: heavier-tailed matrices of the same rms have a LARGER q4 weight error
//! (Student-t(4): 13.0-13.1%, 1% outlier input columns: 9.7-12.5%, against 9.7%) and no better
//! encoder cosine; what plausibly differs in a trained model is its decoder's top-1 margins
//! (tiny2's random decoder: a median of 0.19 logit standard deviations, so its greedy agreement is a
//! lottery) and its weights' structure, neither of which a random fixture has. Matrices whose rows are
//! not whole 32-weight blocks (tiny4's d_model 48, the 16-wide first DaViT stage) are kept f16 by the
//! loader.
//!
//! ## The CPU backend and its int8 decode dots
//! The same comparison runs on the CPU backend (fewer dirs: debug builds run its kernels unoptimised),
//! with its two dots for q8/q4 rows in the decode GEMV (`florence2_wasm::cpu::qdot_int8::QuantDot`,
//! pinned per test with `with_quant_dot`): `Exact` (f32 dots of the dequantized weights, the GPU's
//! results up to summation order) and `Int8` (x rounded to int8 per 32-block, integer dots). Both must
//! meet every threshold above. Int8 changes only the decode's GEMVs (at most 4 rows of x: the vision
//! tower, the encoder and the cross K/V run on the GEMM, so their figures are the exact path's), so the
//! int8 test also compares its teacher-forced logits with the exact dots' on the same weights. Int8
//! rounds each x to a grid of max|x| / 127 per 32-block as q8 rounds each weight to max|w| / 127 per
//! block: in every product w x the two roundings are alike in size, and int8's enter only the decoder's
//! GEMVs while q8's also enter the vision tower, the encoder and the cross K/V. So int8 moves the logits
//! from the exact dots' by no more than q8's weights move them from f32 (max |diff| / peak over the
//! dir's steps; measured 0.51-0.78 of it, for q8 and q4 runs), which the test asserts, and moves them
//! at all where the decoder's rows are whole blocks (tiny2: every step; tiny4's decoder is f16).
//! Measured: int8 gives the exact dots' teacher-forced arg-max at every step (0 moved of 97 per
//! run) and the same agreement with f32. (The CPU's default, `QuantDot::Auto`, takes int8 for q4 only:
//! on the trained demo model int8 moves q8's beam answers below that model's q8 margin; see
//! src/cpu/qdot_int8.rs.)
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::sync::Arc;

use common::fidelity::{
    case_inputs, cosine, diff_peak, forced_logits, options_of, reference_cases, score, top2,
    widened_to_f32,
};
use common::fixtures::{cases, fixtures};
use common::gpu;
use florence2_wasm::cpu::qdot_int8::{quant_dot, with_quant_dot, QuantDot};
use florence2_wasm::gpu::{readback, Device, Tensor};
use florence2_wasm::model::florence2::{EncoderOutput as Encoded, Florence2};
use florence2_wasm::model::Florence2Config;
use florence2_wasm::quant::QBLOCK;
use florence2_wasm::weights::{self, LoadOptions, WeightDType};
use serde_json::Value;

const DIRS: [&str; 7] = [
    "tiny2",
    "tiny2-mlx-bf16",
    "tiny2-orig",
    "tiny4",
    "tiny4-f16-sharded",
    "tiny4-mlx-bf16",
    "tiny4-orig",
];

/// f16 unit roundoff.
const U16: f64 = 1.0 / 2048.0;

/// Least share of teacher-forced steps (along f32's greedy ids) whose q8 arg-max is f32's token, per
/// fixture dir (see the module doc).
const Q8_MIN_FORCED_TOP1: f64 = 0.97;
/// The same for q4.
const Q4_MIN_FORCED_TOP1: f64 = 0.90;

struct Model {
    model: Florence2,
    cfg: Florence2Config,
}

fn load_weights(
    g: &Arc<Device>,
    dir: &str,
    dtype: WeightDType,
) -> (Florence2Config, weights::Weights) {
    weights::load_dir_with(
        g,
        &fixtures().join("models").join(dir),
        LoadOptions::with_dtype(dtype),
    )
    .unwrap_or_else(|e| panic!("{dir} {dtype}: {e}"))
}

fn load(g: &Arc<Device>, dir: &str, dtype: WeightDType) -> Model {
    let (cfg, w) = load_weights(g, dir, dtype);
    Model {
        model: Florence2::new(g, cfg.clone(), &w).unwrap(),
        cfg,
    }
}

/// Linears on the longest chain from the pixels to (vision + projector, encoder out, logits), in units of
/// u. Each DaViT block is a spatial and a channel block of qkv, proj, fc1, fc2; each BART encoder layer
/// chains q/k/v -> out -> fc1 -> fc2; each decoder layer self q/k/v -> out, cross q -> out, fc1 -> fc2,
/// plus its f16 self and cross K/V (2u each, see the module doc); the head.
fn chain_lengths(cfg: &Florence2Config) -> (usize, usize, usize) {
    let blocks: usize = cfg.vision.depths.iter().sum();
    let vision = 8 * blocks + 1;
    let enc = vision + 4 * cfg.text.encoder_layers;
    let logits = enc + (6 + 2 * 2) * cfg.text.decoder_layers + 1;
    (vision, enc, logits)
}

/// One resident dtype's figures against f32 over a fixture dir's cases.
struct Tally {
    steps: usize,
    agree: usize,
    runs: usize,
    identical_runs: usize,
    min_enc_cos: f64,
    min_vis_cos: f64,
    /// Largest max |diff| / peak of the teacher-forced logits against f32's.
    logits_rel_diff: f64,
    /// Teacher-forced steps whose f32 top-1 margin exceeds twice the fp16 bound (each one asserted).
    fp16_must_agree: usize,
    divergences: Vec<String>,
    /// With the CPU's int8 dots: teacher-forced steps compared with the exact dots on the same
    /// weights, those whose logits moved, those whose arg-max moved, and the largest max |diff| / peak;
    /// and the exact dots' largest max |diff| / peak against f32 (the weights' rounding alone).
    int8_steps: usize,
    int8_moved: usize,
    int8_argmax_moved: usize,
    int8_rel_diff: f64,
    exact_rel_diff: f64,
}

impl Tally {
    fn new() -> Self {
        Tally {
            steps: 0,
            agree: 0,
            runs: 0,
            identical_runs: 0,
            min_enc_cos: 1.0,
            min_vis_cos: 1.0,
            logits_rel_diff: 0.0,
            fp16_must_agree: 0,
            divergences: Vec::new(),
            int8_steps: 0,
            int8_moved: 0,
            int8_argmax_moved: 0,
            int8_rel_diff: 0.0,
            exact_rel_diff: 0.0,
        }
    }
}

/// A fixture dir's f32 load and the fp16 bound's chain lengths and sqrt(d).
struct Base {
    dir: &'static str,
    m: Model,
    chains: (usize, usize, usize),
    sqrt_d: f64,
}

/// Every dir of `dirs` in every dtype of `dtypes` against its f32 load on the device `g`, with the
/// figures and thresholds of the module doc; returns the teacher-forced steps the fp16 bound covered.
fn against_f32(g: &Arc<Device>, dirs: &[&'static str], dtypes: &[WeightDType]) -> usize {
    let mut fp16_must_agree = 0;
    for &dir in dirs {
        // The q8 weights' own change of the logits (exact dots against f32), int8's bound.
        let mut q8_change = None;
        let inputs = case_inputs(g, dir);
        let m = load(g, dir, WeightDType::Fp32);
        let base = Base {
            dir,
            chains: chain_lengths(&m.cfg),
            sqrt_d: (m.cfg.text.d_model as f64).sqrt(),
            m,
        };
        for &dtype in dtypes {
            let m = load(g, dir, dtype);
            let mut t = Tally::new();
            for (case, pixels, ids) in &inputs {
                let (e32, ex) = check_stages(g, &base, &m, dtype, (case, pixels, ids), &mut t);
                check_decoding(g, &base, &m, dtype, case, (&e32, &ex), &mut t);
            }
            eprintln!(
                "SUMMARY {dir} {dtype}: min cos inputs_embeds {:.6}, encoder.out {:.6}; teacher-forced \
                 logits max|diff|/peak {:.2e}, arg-max agreement {}/{} = {:.1}%; greedy runs identical \
                 {}/{}; divergences: {:?}",
                t.min_vis_cos,
                t.min_enc_cos,
                t.logits_rel_diff,
                t.agree,
                t.steps,
                100.0 * t.agree as f64 / t.steps.max(1) as f64,
                t.identical_runs,
                t.runs,
                t.divergences
            );
            assert!(t.runs >= 6 && t.steps > 0, "{dir}: too few cases");
            let forced_top1 = t.agree as f64 / t.steps as f64;
            match dtype {
                WeightDType::Fp16 => assert!(
                    t.identical_runs * 100 >= 95 * t.runs,
                    "{dir} fp16: {}/{} greedy runs identical",
                    t.identical_runs,
                    t.runs
                ),
                WeightDType::Q8 => {
                    assert!(t.min_enc_cos >= 0.999, "{dir} q8: {}", t.min_enc_cos);
                    assert!(forced_top1 >= Q8_MIN_FORCED_TOP1, "{dir} q8: {forced_top1}");
                }
                WeightDType::Q4 => {
                    assert!(t.min_enc_cos >= 0.95, "{dir} q4: {}", t.min_enc_cos);
                    assert!(forced_top1 >= Q4_MIN_FORCED_TOP1, "{dir} q4: {forced_top1}");
                }
                WeightDType::Fp32 => {}
            }
            if dtype == WeightDType::Q8 {
                q8_change = Some(t.exact_rel_diff);
            }
            check_int8(&base, dtype, &t, q8_change);
            fp16_must_agree += t.fp16_must_agree;
        }
    }
    fp16_must_agree
}

/// Both loads' encodings of one case: `inputs_embeds` and the encoder output compared (cosine; fp16:
/// max |diff| within half its bound).
fn check_stages(
    g: &Arc<Device>,
    base: &Base,
    m: &Model,
    dtype: WeightDType,
    (case, pixels, ids): (&Value, &Tensor, &[u32]),
    t: &mut Tally,
) -> (Encoded, Encoded) {
    let (dir, (l_vis, l_enc, _)) = (base.dir, base.chains);
    let image = case["image"].as_str().unwrap();
    let prompt = case["prompt"].as_str().unwrap();
    let e32 = base.m.model.encode(pixels, ids).unwrap();
    let ex = m.model.encode(pixels, ids).unwrap();
    let read = |x: &Tensor| readback::to_f32_blocking(g, x).unwrap();
    let (vis32, visx) = (read(&e32.inputs_embeds), read(&ex.inputs_embeds));
    let (enc32, encx) = (read(&e32.hidden), read(&ex.hidden));
    let (dv, pv) = diff_peak(&visx, &vis32);
    let (de, pe) = diff_peak(&encx, &enc32);
    let (cv, ce) = (cosine(&visx, &vis32), cosine(&encx, &enc32));
    t.min_vis_cos = t.min_vis_cos.min(cv);
    t.min_enc_cos = t.min_enc_cos.min(ce);
    eprintln!(
        "{dir} {dtype} {image} {prompt}: inputs_embeds max|diff|/peak {:.2e} cos {cv:.6}; \
         encoder.out max|diff|/peak {:.2e} cos {ce:.6}",
        dv / pv,
        de / pe
    );
    if dtype == WeightDType::Fp16 {
        let bv = l_vis as f64 * U16 * base.sqrt_d * pv;
        let be = l_enc as f64 * U16 * base.sqrt_d * pe;
        assert!(
            dv <= bv / 2.0,
            "{dir} {image}: inputs_embeds {dv:e} > {bv:e}/2"
        );
        assert!(
            de <= be / 2.0,
            "{dir} {image}: encoder.out {de:e} > {be:e}/2"
        );
    }
    (e32, ex)
}

/// One case's decodings: free-running greedy ids of every greedy setting compared, and along f32's
/// `greedy_nrng0` ids the teacher-forced logits (fp16: within half the bound, the same arg-max where
/// f32's top-1 margin exceeds twice the bound).
fn check_decoding(
    g: &Arc<Device>,
    base: &Base,
    m: &Model,
    dtype: WeightDType,
    case: &Value,
    (e32, ex): (&Encoded, &Encoded),
    t: &mut Tally,
) {
    let (dir, (_, _, l_logits)) = (base.dir, base.chains);
    let image = case["image"].as_str().unwrap();
    let prompt = case["prompt"].as_str().unwrap();
    let max_new = case["max_new_tokens"].as_u64().unwrap() as usize;
    for (kind, r) in case["results"].as_object().unwrap() {
        if r["kwargs"]["num_beams"].as_u64() != Some(1) {
            continue;
        }
        let opts = options_of(r, max_new);
        let generate = |m: &Florence2, e: &Encoded| {
            pollster::block_on(m.generate(&e.cross, &opts, Default::default())).unwrap()
        };
        let (ids32, idsx) = (generate(&base.m.model, e32), generate(&m.model, ex));
        t.runs += 1;
        if ids32 == idsx {
            t.identical_runs += 1;
        } else {
            let first = ids32
                .iter()
                .zip(&idsx)
                .position(|(a, b)| a != b)
                .unwrap_or(ids32.len().min(idsx.len()));
            t.divergences
                .push(format!("{image} {prompt} {kind}: position {first}"));
        }
        if kind != "greedy_nrng0" {
            continue;
        }
        // Teacher-forced raw logits along f32's (no-repeat-free) greedy path.
        let l32 = forced_logits(g, &base.m.model, &e32.hidden, &ids32);
        let lx = forced_logits(g, &m.model, &ex.hidden, &ids32);
        if int8_dots(g, dtype) {
            tally_int8(g, m, ex, &ids32, (&l32, &lx), t);
        }
        for (step, (a, b)) in l32.iter().zip(&lx).enumerate() {
            let (arg32, top1, top2v) = top2(a);
            let (argx, _, _) = top2(b);
            let (dl, pl) = diff_peak(b, a);
            t.steps += 1;
            t.agree += usize::from(arg32 == argx);
            t.logits_rel_diff = t.logits_rel_diff.max(dl / pl);
            if dtype != WeightDType::Fp16 {
                continue;
            }
            let bound = l_logits as f64 * U16 * base.sqrt_d * pl;
            assert!(
                dl <= bound / 2.0,
                "{dir} {image} step {step}: logits {dl:e} > {bound:e}/2"
            );
            if (top1 - top2v) as f64 > 2.0 * bound {
                t.fp16_must_agree += 1;
                assert_eq!(
                    arg32,
                    argx,
                    "{dir} {image} {prompt} step {step}: margin {} > 2 x {bound:e}",
                    top1 - top2v
                );
            }
        }
    }
}

/// The int8 dots' teacher-forced logits `lx` (along `ids`) against the exact dots' on the same weights
/// (computed here), and the exact dots' against f32's `l32`, into `t`.
fn tally_int8(
    g: &Arc<Device>,
    m: &Model,
    ex: &Encoded,
    ids: &[u32],
    (l32, lx): (&[Vec<f32>], &[Vec<f32>]),
    t: &mut Tally,
) {
    let exact = with_quant_dot(QuantDot::Exact, || {
        forced_logits(g, &m.model, &ex.hidden, ids)
    });
    for ((a, b), f) in exact.iter().zip(lx).zip(l32) {
        let (d, p) = diff_peak(b, a);
        let (dw, pw) = diff_peak(a, f);
        t.exact_rel_diff = t.exact_rel_diff.max(dw / pw);
        t.int8_steps += 1;
        t.int8_moved += usize::from(d > 0.0);
        t.int8_argmax_moved += usize::from(top2(a).0 != top2(b).0);
        t.int8_rel_diff = t.int8_rel_diff.max(d / p);
    }
}

/// Whether `dtype`'s decode runs the CPU backend's int8 dots here (q8/q4 weights on the CPU backend,
/// [`QuantDot::Int8`] chosen for this thread).
fn int8_dots(g: &Arc<Device>, dtype: WeightDType) -> bool {
    g.is_host()
        && matches!(dtype, WeightDType::Q8 | WeightDType::Q4)
        && quant_dot() == QuantDot::Int8
}

/// With int8 dots: how far they moved the teacher-forced logits from the exact dots on the same
/// weights. Where the decoder's matrices are quantized (rows of whole 32-weight blocks, d_model % 32
/// == 0; the loader keeps other rows f16, which no int8 dot reads) they must have moved them (else this
/// test would pass on the exact path alone), by no more than q8's weights move them from f32
/// (`q8_change`, the dir's q8 run; see the module doc).
fn check_int8(base: &Base, dtype: WeightDType, t: &Tally, q8_change: Option<f64>) {
    if t.int8_steps == 0 {
        return;
    }
    eprintln!(
        "INT8 {} {dtype}: against the exact dots on the same weights, logits moved at {}/{} \
         teacher-forced steps, max |diff| / peak {:.2e} (the exact dots against f32: {:.2e}); arg-max \
         moved at {}",
        base.dir,
        t.int8_moved,
        t.int8_steps,
        t.int8_rel_diff,
        t.exact_rel_diff,
        t.int8_argmax_moved
    );
    if !base.m.cfg.text.d_model.is_multiple_of(QBLOCK) {
        return;
    }
    assert!(
        t.int8_moved > 0,
        "{} {dtype}: int8 dots never ran",
        base.dir
    );
    let bound = q8_change.expect("the q8 run comes first");
    assert!(
        t.int8_rel_diff <= bound,
        "{} {dtype}: int8 moves the logits by {:.2e} of their peak, q8's weights by {bound:.2e}",
        base.dir,
        t.int8_rel_diff
    );
}

#[test]
fn resident_dtypes_against_f32_on_every_fixture() {
    let all = [WeightDType::Fp16, WeightDType::Q8, WeightDType::Q4];
    let n = against_f32(&gpu(), &DIRS, &all);
    eprintln!("fp16: {n} teacher-forced steps had a margin above the bound (all agreed)");
}

/// The fixture dirs the CPU backend runs (debug builds run its kernels unoptimised, so fewer than the
/// GPU's: the two shapes; the layouts differ only in loading, which the GPU test and
/// tests/cpu/pipeline.rs cover).
const CPU_DIRS: [&str; 2] = ["tiny2", "tiny4"];

/// The CPU backend with the exact quantized GEMV (f32 dots of the dequantized weights): the GPU test's
/// figures and thresholds (above) for resident fp16/q8/q4 weights against f32 on the same backend.
#[test]
fn resident_dtypes_against_f32_on_the_cpu_backend() {
    let g = Device::cpu(florence2_wasm::cpu::par::threads());
    let all = [WeightDType::Fp16, WeightDType::Q8, WeightDType::Q4];
    let n = with_quant_dot(QuantDot::Exact, || against_f32(&g, &CPU_DIRS, &all));
    eprintln!("cpu fp16: {n} teacher-forced steps had a margin above the bound (all agreed)");
}

/// The CPU backend's int8 decode GEMV (`QuantDot::Int8`: x rounded to int8 per 32-block, integer dots
/// with the q8/q4 blocks) within the same thresholds, on the dirs whose decoder it runs (tiny4's
/// d_model of 48 keeps its matrices f16). fp16 weights never take it, so only q8/q4 run.
#[test]
fn resident_quantized_weights_against_f32_with_int8_dots_on_the_cpu_backend() {
    let g = Device::cpu(florence2_wasm::cpu::par::threads());
    let quantized = [WeightDType::Q8, WeightDType::Q4];
    let dirs = ["tiny2", "tiny2-orig"];
    with_quant_dot(QuantDot::Int8, || against_f32(&g, &dirs, &quantized));
}

/// `florence2 run --json --dtype D` reports the dtype and the engine's memory figures: the weight bytes
/// shrink fp32 > fp16 > q8 > q4, the peak covers the weights plus some activations, and an unknown
/// dtype is a usage error.
#[test]
fn cli_reports_dtype_and_memory() {
    let case = cases("tiny2").into_iter().next().unwrap();
    let mut last = u64::MAX;
    for d in ["fp32", "fp16", "q8", "q4"] {
        let v = common::fixtures::cli_run("tiny2", &case, &["--dtype", d]);
        assert_eq!(v["dtype"], d);
        let m = &v["memory"];
        let w = m["weights_bytes"].as_u64().unwrap();
        let peak = m["peak_bytes"].as_u64().unwrap();
        let act_peak = m["peak_activations_bytes"].as_u64().unwrap();
        eprintln!("tiny2 {d}: weights {w} B, peak {peak} B, peak activations {act_peak} B");
        assert!(w > 0 && w < last, "{d}: weights {w} not below {last}");
        assert!(peak >= w + act_peak.min(1) && act_peak > 0, "{d}: {m}");
        last = w;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args([
            "run", "--model", "x", "--image", "y", "--task", "<OD>", "--dtype", "int3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("int3"));
}

/// A resident fp16 / q8 / q4 load computes with exactly the values its weights hold: the same weights
/// widened to f32 (every tensor read back, quantized rows dequantized, and uploaded again as f32) and
/// run through the f32 kernels give the same `inputs_embeds` and encoder output up to f32 summation
/// order. This is the exactness check the cosine figures above cannot give (a q4 path that lost, say,
/// a block's scale would still score a cosine near 0.97 there), and it shows that what separates q4
/// from f32 is the format's rounding of the weights, which the q4 fidelity bench
/// (`cargo bench --bench q4_fidelity`) measures by replaying that rounding on the host.
///
/// Bound: both sides compute the same sums of the same f32 products, in a different order (other
/// kernels and tiles). Reordering a sum of K terms changes it by at most about K u32 sum|terms|
/// (u32 = 2^-24), sqrt(K) u32 sum|terms| for random-sign terms; with the same propagation as the fp16
/// bound (L Linears, sum|W x| ~ sqrt(d) |W x|) the stage differs by <= L sqrt(K) u32 sqrt(d) peak, K
/// the longest dot product (the 4x MLP's). The decoder's logits are printed, not asserted: the
/// resident dtypes may keep K/V caches in f16, which the widened copy does not.
#[test]
fn resident_dtypes_compute_what_their_weights_hold() {
    let g = gpu();
    for dir in ["tiny2", "tiny4"] {
        for dtype in [WeightDType::Fp16, WeightDType::Q8, WeightDType::Q4] {
            let (cfg, w) = load_weights(&g, dir, dtype);
            let (l_vis, l_enc, _) = chain_lengths(&cfg);
            let wide = Florence2::new(&g, cfg.clone(), &widened_to_f32(&g, &w)).unwrap();
            let refs = reference_cases(&g, dir, &wide);
            let s = score(&g, &Florence2::new(&g, cfg.clone(), &w).unwrap(), &refs);
            let d = cfg.text.d_model as f64;
            let k = (4 * cfg.vision.embed_dim.iter().max().copied().unwrap_or(1))
                .max(cfg.text.encoder_ffn_dim) as f64;
            let u32_ = f32::EPSILON as f64 / 2.0;
            let bound = |l: usize| l as f64 * k.sqrt() * u32_ * d.sqrt();
            eprintln!(
                "{dir} {dtype} vs its weights widened to f32: inputs_embeds max|diff|/peak {:.2e} \
                 (bound {:.2e}), encoder.out {:.2e} (bound {:.2e}); {s}",
                s.vis_rel_diff,
                bound(l_vis),
                s.enc_rel_diff,
                bound(l_enc)
            );
            assert!(
                s.vis_rel_diff <= bound(l_vis),
                "{dir} {dtype}: inputs_embeds"
            );
            assert!(s.enc_rel_diff <= bound(l_enc), "{dir} {dtype}: encoder.out");
        }
    }
}
