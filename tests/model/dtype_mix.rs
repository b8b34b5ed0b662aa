//! A weight format per module (`src/weights/dtype_plan.rs`): a mixed load holds, part by part, exactly
//! what the uniform load of that part's format holds, and the model built from it computes, module by
//! module, exactly what the uniform models compute.
//!
//! - Weights: every tensor of a `vision=fp16,text=q4` load (and of a five-format mix) equals the same
//!   tensor of the uniform load of its part's format in dtype, shape and buffer bytes, on checkpoints
//!   in both layouts (HF-native `tiny2`; original names `tiny2-orig`, whose image projection is
//!   transposed and whose convolutions are permuted at load) and from a quantized file (`tiny2-q4`).
//! - Outputs: the mixed model's image features equal the uniform fp16 model's bit for bit; given the
//!   same image features, its encoder output, cross K/V and decoder logits equal the uniform q4
//!   model's bit for bit, and differ from fp16's (so the comparison can fail).
//!
//! Exact equality everywhere: the loader converts each tensor alone and the kernels run per weight
//! format, so any difference is a bug.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::fixtures::fixtures;
use common::gpu;
use florence2_wasm::gpu::{DType, Device, Recorder, Tensor};
use florence2_wasm::model::florence2::Florence2;
use florence2_wasm::weights::{
    load_dir_with, part_of, DTypePlan, LoadOptions, Part, WeightDType, Weights,
};

/// A tensor as the GPU holds it: element type, shape and the whole buffer's bytes.
type Held = (DType, Vec<usize>, Vec<u8>);

fn bytes_of(g: &Arc<Device>, t: &Tensor) -> Vec<u8> {
    let mut rec = Recorder::new(g);
    let p = rec.read_back(t);
    rec.submit().unwrap();
    pollster::block_on(p.unwrap().bytes(g)).unwrap()
}

fn held(g: &Arc<Device>, w: &Weights) -> BTreeMap<String, Held> {
    w.names()
        .map(|n| {
            let t = w.get_any(n).unwrap();
            (
                n.to_owned(),
                (t.dtype(), t.shape().to_vec(), bytes_of(g, &t)),
            )
        })
        .collect()
}

fn load(g: &Arc<Device>, model: &str, dtype: impl Into<DTypePlan>) -> BTreeMap<String, Held> {
    let dir = fixtures().join("models").join(model);
    let (_, w) = load_dir_with(g, &dir, LoadOptions::with_dtype(dtype)).unwrap();
    held(g, &w)
}

/// Every tensor of the `plan` load of `model` equals the uniform load of its part's format; returns
/// the tensors per part.
fn check_mix(g: &Arc<Device>, model: &str, plan: DTypePlan) -> BTreeMap<Part, usize> {
    let mixed = load(g, model, plan);
    let mut formats: Vec<WeightDType> = plan.parts().map(|(_, d)| d).collect();
    formats.dedup();
    let formats: Vec<WeightDType> = WeightDType::ALL
        .into_iter()
        .filter(|d| formats.contains(d))
        .collect();
    let uniform: Vec<(WeightDType, BTreeMap<String, Held>)> =
        formats.iter().map(|&d| (d, load(g, model, d))).collect();
    let of = |d: WeightDType| &uniform.iter().find(|(u, _)| *u == d).unwrap().1;
    let mut per_part = BTreeMap::new();
    for (name, got) in &mixed {
        let part = part_of(name).unwrap_or_else(|| panic!("{model}: {name} has no part"));
        let want = &of(plan.get(part))[name];
        assert_eq!(
            (got.0, &got.1),
            (want.0, &want.1),
            "{model} {plan}: {name} ({part})"
        );
        assert!(
            got.2 == want.2,
            "{model} {plan}: {name} ({part}) bytes differ"
        );
        *per_part.entry(part).or_insert(0) += 1;
    }
    for (_, u) in &uniform {
        assert_eq!(u.len(), mixed.len(), "{model} {plan}: the same tensors");
    }
    per_part
}

#[test]
fn mixed_loads_equal_the_uniform_loads_part_by_part() {
    let g = gpu();
    let vt = DTypePlan::vision_text(WeightDType::Fp16, WeightDType::Q4);
    let five = "vision=q8,projector=fp32,encoder=q4,decoder=fp16,embed=q8"
        .parse::<DTypePlan>()
        .unwrap();
    for model in ["tiny2", "tiny2-orig", "tiny2-q4"] {
        let parts = check_mix(&g, model, vt);
        eprintln!("{model} {vt}: tensors per part {parts:?}");
        assert_eq!(parts.len(), 5, "{model}: every part has tensors");
    }
    check_mix(&g, "tiny2", five);
    // Not vacuous: the mix holds f16 matrices in the vision tower and q4 ones in the text model.
    let mixed = load(&g, "tiny2", vt);
    let dtype = |n: &str| mixed[n].0;
    assert_eq!(
        dtype("model.vision_tower.blocks.0.0.channel_block.ffn.fc1.weight"),
        DType::F16
    );
    assert_eq!(
        dtype("model.language_model.encoder.layers.0.fc1.weight"),
        DType::Q4
    );
    assert_eq!(dtype("model.language_model.shared.weight"), DType::Q4);
}

/// The image features, and the text model's encoder output, cross K/V and decoder logits of 3 steps,
/// as bytes.
struct Outputs {
    features: Vec<u8>,
    text: Vec<Vec<u8>>,
}

fn model(g: &Arc<Device>, plan: DTypePlan) -> Florence2 {
    let dir = fixtures().join("models/tiny2");
    let (cfg, w) = load_dir_with(g, &dir, LoadOptions::with_dtype(plan)).unwrap();
    Florence2::new(g, cfg, &w).unwrap()
}

/// Run `m`'s vision tower on fixed pixels, then its text model on `features` (the same for every
/// model compared).
fn run(g: &Arc<Device>, m: &Florence2, features: Option<&Tensor>) -> (Tensor, Outputs) {
    let n = 3 * 64 * 64;
    let px: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let own = m.encode_pixels(&px, [1, 3, 64, 64]).unwrap();
    let f = features.unwrap_or(&own);
    let ids = [0u32, 9, 17, 33, 2];
    let enc = m.encode_prompt(f, &ids).unwrap();
    let mut text = vec![bytes_of(g, &enc.hidden)];
    for t in enc.cross.k.iter().chain(&enc.cross.v) {
        text.push(bytes_of(g, t));
    }
    let mut state = m.decoder.new_state(g, &enc.cross, 1, 8).unwrap();
    for (pos, tok) in [2u32, 7, 11].into_iter().enumerate() {
        state.write_tokens(&[tok]).unwrap();
        let mut rec = Recorder::new(g);
        let logits = m
            .decoder
            .step_planned(&mut rec, pos as u32, &mut state)
            .unwrap();
        rec.submit().unwrap();
        text.push(bytes_of(g, &logits));
    }
    let features = bytes_of(g, &own);
    (own, Outputs { features, text })
}

#[test]
fn a_mixed_model_computes_each_module_as_its_uniform_model() {
    let g = gpu();
    let fp16 = model(&g, DTypePlan::uniform(WeightDType::Fp16));
    let q4 = model(&g, DTypePlan::uniform(WeightDType::Q4));
    let mix = model(
        &g,
        DTypePlan::vision_text(WeightDType::Fp16, WeightDType::Q4),
    );
    let (features, f16_out) = run(&g, &fp16, None);
    let (_, q4_out) = run(&g, &q4, Some(&features));
    let (_, mix_out) = run(&g, &mix, Some(&features));
    assert!(mix_out.features == f16_out.features, "vision: mix != fp16");
    assert_ne!(q4_out.features, f16_out.features, "q4 vision differs");
    assert_eq!(mix_out.text.len(), q4_out.text.len());
    for (i, (a, b)) in mix_out.text.iter().zip(&q4_out.text).enumerate() {
        assert!(a == b, "text output {i}: mix != q4");
    }
    let last = mix_out.text.len() - 1;
    assert_ne!(mix_out.text[last], f16_out.text[last], "q4 logits differ");
    assert_eq!(mix.decoder.kv_dtype(), q4.decoder.kv_dtype());
}
