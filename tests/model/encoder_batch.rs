//! Tasks prepared together (`Pipeline::prepare_batch`): prompts of one encoder length run the BART
//! encoder and the cross-attention projections as one batch, and each task's cross-attention K/V equal,
//! bit for bit, what `Pipeline::prepare` gives it alone, on lavapipe (fp32, fp16) and on the CPU
//! backend; a task that cannot be prepared fails alone. On lavapipe the kernel registry is set against
//! it: every linear class of the encoder at a group's row count (B x one prompt's rows) gets the scalar
//! kernel and its attention class the tiled kernel, which one prompt alone never uses here; a batch
//! keyed by its own rows instead of one request's would take them and differ. Exact equality: any
//! difference is a bug.
#![cfg(not(target_arch = "wasm32"))]

use crate::common::fixtures;
use std::sync::Arc;

use florence2_wasm::gpu::registry::ShapeClass;
use florence2_wasm::gpu::{readback, Device, DeviceOptions, Tensor};
use florence2_wasm::ops::attention::AttnVariant;
use florence2_wasm::ops::matmul::LinearVariant;
use florence2_wasm::pipeline::{
    cpu_device, Callbacks, EncodedImage, Image, NeverCancel, Pipeline, PrepareItem, TaskInput,
    TaskOptions,
};

fn images(p: &Pipeline) -> Vec<EncodedImage> {
    let bytes = fixtures::demo_samples(3);
    let inputs: Vec<Image> = bytes.iter().map(|b| Image::Encoded(b)).collect();
    p.encode_images(&inputs)
        .into_iter()
        .map(|e| e.unwrap())
        .collect()
}

/// (image, prompt, beams): three captions (one length), two detections (another), one grounding
/// (alone), and one with 0 beams, which cannot be prepared.
const TASKS: [(usize, &str, usize); 7] = [
    (0, "<CAPTION>", 3),
    (1, "<OD>", 1),
    (1, "<CAPTION>", 1),
    (2, "<CAPTION_TO_PHRASE_GROUNDING>a red circle", 3),
    (2, "<CAPTION>", 2),
    (0, "<OD>", 0),
    (2, "<OD>", 3),
];

/// On a GPU adapter: the scalar linear kernel and the tiled attention kernel for every class the
/// encoder's calls have at `b` prompts of `s` tokens.
fn set_against_batches(g: &Device, p: &Pipeline, s: usize, b: usize) {
    let t = &p.model().config.text;
    let (d, f, fmt) = (t.d_model, t.encoder_ffn_dim, p.model().shared.dtype());
    let rows = s * b;
    for (n, k) in [(d, d), (f, d), (d, f)] {
        if LinearVariant::Scalar.supports(&g.caps, rows, k, fmt) {
            g.choices.set(
                ShapeClass::linear(rows, n, k, fmt),
                LinearVariant::Scalar.name(),
            );
        }
    }
    let heads = t.encoder_attention_heads;
    let class = ShapeClass::attention(rows, s, d / heads, heads, false, false);
    g.choices.set(class, AttnVariant::Tiled.name());
}

fn check_on(g: &Arc<Device>, dtype: florence2_wasm::weights::WeightDType) {
    let opts = florence2_wasm::weights::LoadOptions::with_dtype(dtype);
    let p = Pipeline::load_dir_with(g, &fixtures::demo_model(), opts).unwrap();
    let what = format!("{} {dtype:?}", g.describe());
    let encoded = images(&p);
    let items: Vec<PrepareItem> = TASKS
        .iter()
        .map(|&(i, prompt, beams)| PrepareItem {
            image: &encoded[i],
            prompt: p.tasks().parse(prompt).unwrap(),
            options: TaskOptions {
                num_beams: Some(beams),
                max_new_tokens: Some(20),
                ..TaskOptions::default()
            },
        })
        .collect();
    if !g.is_host() {
        let n_img = encoded[0].tokens();
        for prompt in ["<CAPTION>", "<OD>"] {
            let ids = p
                .tokenizer()
                .encode_prompt(&p.tasks().parse(prompt).unwrap().encoder_text());
            let s = p.model().encoder_len(n_img, &ids.unwrap());
            set_against_batches(g, &p, s, if prompt == "<OD>" { 2 } else { 3 });
        }
    }
    // The batch runs as one (prepare_batch would fall back to one task at a time on an error).
    let captions: Vec<(&Tensor, Vec<u32>)> = [0, 2, 4]
        .iter()
        .map(|&k| {
            let ids = p.tokenizer().encode_prompt(&items[k].prompt.encoder_text());
            (items[k].image.features(), ids.unwrap())
        })
        .collect();
    let pairs: Vec<(&Tensor, &[u32])> = captions.iter().map(|(f, ids)| (*f, &ids[..])).collect();
    assert_eq!(p.model().encode_prompts(&pairs).unwrap().len(), 3, "{what}");
    let got = p.prepare_batch(&items);
    assert_eq!(got.len(), items.len());
    for (k, (r, item)) in got.iter().zip(&items).enumerate() {
        let alone = pollster::block_on(p.prepare(
            TaskInput::Encoded(item.image),
            item.prompt.clone(),
            &item.options,
            &NeverCancel,
            &Callbacks::default(),
        ));
        if TASKS[k].2 == 0 {
            assert!(r.is_err() && alone.is_err(), "{what}: task {k} fails alone");
            continue;
        }
        let (batched, alone) = (r.as_ref().unwrap(), alone.unwrap());
        assert_eq!(batched.generation(), alone.generation(), "{what}: task {k}");
        let (x, y) = (batched.cross(), alone.cross());
        assert_eq!(x.len, y.len, "{what}: task {k}");
        let pairs = x.k.iter().zip(&y.k).chain(x.v.iter().zip(&y.v));
        for (l, (a, b)) in pairs.enumerate() {
            assert!(
                same_bits(g, a, b),
                "{what}: task {k}, cross K/V {l} differ from prepare alone"
            );
        }
    }
}

/// Same shape, type and values to the bit (f16 values widen to f32 exactly).
fn same_bits(g: &Arc<Device>, a: &Tensor, b: &Tensor) -> bool {
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = readback::to_f32_blocking(g, t).unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    };
    a.shape() == b.shape() && a.dtype() == b.dtype() && bits(a) == bits(b)
}

#[test]
fn prompts_prepared_together_equal_each_alone() {
    use florence2_wasm::weights::WeightDType;
    // A device of its own: the registry entries set here must not reach other tests.
    let g = pollster::block_on(Device::new(DeviceOptions::default())).unwrap();
    check_on(&g, WeightDType::Fp32);
    check_on(&g, WeightDType::Fp16);
    check_on(&cpu_device(), WeightDType::Fp32);
}
