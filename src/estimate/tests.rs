//! The estimate on Florence-2-base and -large shapes (config only, no files) against docs/performance.md's
//! measured table ("GPU memory per weight format": base-shaped checkpoints, 768x768, 3 beams,
//! `max_new_tokens` 1024, lavapipe's 128 MiB binding limit), and the chooser on mocked devices.

use super::*;
use crate::error::Error;
use crate::estimate::choose::AUTO_MIXES;

/// Florence-2-base's shapes (HF-native config, as ../shared/FLORENCE2.md lists them).
pub(crate) fn base_json() -> serde_json::Value {
    serde_json::json!({
        "model_type": "florence2",
        "image_token_id": 51289,
        "text_config": {
            "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
            "encoder_attention_heads": 12, "decoder_attention_heads": 12,
            "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "vocab_size": 51328,
            "max_position_embeddings": 1024, "activation_function": "gelu",
            "bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2,
            "forced_eos_token_id": 2, "scale_embedding": false
        },
        "vision_config": {
            "model_type": "florence_vision", "in_channels": 3, "depths": [1, 1, 9, 1],
            "embed_dim": [128, 256, 512, 1024], "num_heads": [4, 8, 16, 32],
            "num_groups": [4, 8, 16, 32], "patch_size": [7, 3, 3, 3], "patch_stride": [4, 2, 2, 2],
            "patch_padding": [3, 1, 1, 1], "patch_prenorm": [false, true, true, true],
            "window_size": 12, "mlp_ratio": 4.0, "qkv_bias": true, "projection_dim": 768,
            "max_position_embeddings": 50, "max_temporal_embeddings": 100
        }
    })
}

/// Florence-2-large's shapes: d_model 1024, 12 + 12 layers, 16 heads, ffn 4096; DaViT dims
/// 256/512/1024/2048, heads and groups 8/16/32/64.
pub(crate) fn large_json() -> serde_json::Value {
    let mut c = base_json();
    let t = &mut c["text_config"];
    t["d_model"] = 1024.into();
    t["encoder_layers"] = 12.into();
    t["decoder_layers"] = 12.into();
    t["encoder_attention_heads"] = 16.into();
    t["decoder_attention_heads"] = 16.into();
    t["encoder_ffn_dim"] = 4096.into();
    t["decoder_ffn_dim"] = 4096.into();
    let v = &mut c["vision_config"];
    v["embed_dim"] = serde_json::json!([256, 512, 1024, 2048]);
    v["num_heads"] = serde_json::json!([8, 16, 32, 64]);
    v["num_groups"] = serde_json::json!([8, 16, 32, 64]);
    v["projection_dim"] = 1024.into();
    c
}

pub(crate) fn facts(json: &serde_json::Value) -> ModelFacts {
    let cfg = Florence2Config::from_json(json).unwrap();
    ModelFacts::from_config(cfg).unwrap()
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

#[test]
fn base_and_large_match_the_readme_memory_table() {
    // (model, dtype, resident MB, peak <OD> MB) from docs/performance.md's table.
    let table = [
        ("base", WeightDType::Fp32, 926.2, 1064.7),
        ("base", WeightDType::Fp16, 467.7, 547.3),
        ("base", WeightDType::Q8, 258.6, 338.2),
        ("base", WeightDType::Q4, 147.1, 226.7),
        ("large", WeightDType::Fp16, 1548.1, 1732.0),
    ];
    for (model, dtype, weights, peak) in table {
        let f = facts(&if model == "base" {
            base_json()
        } else {
            large_json()
        });
        let e = f.estimate(dtype, &EstimateOptions::default()).unwrap();
        eprintln!(
            "{model} {dtype}: weights {:.1} MB (README {weights}), peak {:.1} MB (README {peak}), \
             vision {:.1}, encoder {:.1}, decode {:.1}, largest buffer {:.1} MB",
            mb(e.weights_bytes),
            mb(e.peak_bytes),
            mb(e.vision_bytes),
            mb(e.encoder_bytes),
            mb(e.decode_bytes),
            mb(e.largest_buffer_bytes)
        );
        // The README rounds to 0.1 MB.
        assert!(
            (mb(e.weights_bytes) - weights).abs() <= 0.05,
            "{model} {dtype}"
        );
        // At or above the measured peak, by at most the features kept through decoding and the
        // prompt's room (2 MB) plus that table's rounding.
        let over = mb(e.peak_bytes) - peak;
        assert!(
            (-0.05..=2.05).contains(&over),
            "{model} {dtype}: {over:+.2} MB"
        );
    }
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn device(class: DeviceClass, max_buffer: u64, max_binding: u64) -> DeviceLimits {
    DeviceLimits {
        class,
        budget: class.budget(),
        max_buffer,
        max_binding,
    }
}

fn choose(json: &serde_json::Value, limits: &DeviceLimits) -> Result<Choice> {
    let all = facts(json)
        .estimate_all(&EstimateOptions::default())
        .unwrap();
    choose_dtype(&all, limits)
}

fn u(d: WeightDType) -> DTypePlan {
    DTypePlan::uniform(d)
}

#[test]
fn auto_picks_the_best_format_that_fits_each_device() {
    // (device, base, large): iPhone-like (1 GB buffers, 1 GB budget), integrated, discrete, CPU.
    let cases = [
        // Large q8 peaks at 1037.4 MB, over the phone's 1.0 GB budget; q4 with the text model in q8
        // peaks at 868.8 MB (q4 at 666.4 MB).
        (
            device(DeviceClass::Mobile, GIB, GIB),
            u(WeightDType::Fp16),
            AUTO_MIXES[0],
        ),
        (
            device(DeviceClass::Integrated, 2 * GIB, GIB),
            u(WeightDType::Fp16),
            u(WeightDType::Fp16),
        ),
        (
            device(DeviceClass::Discrete, 4 * GIB, 2 * GIB),
            u(WeightDType::Fp16),
            u(WeightDType::Fp16),
        ),
        (
            device(DeviceClass::Cpu, u64::MAX, u64::MAX),
            u(WeightDType::Fp16),
            u(WeightDType::Fp16),
        ),
        // Android-like: 256 MB buffers, WebGPU's default 128 MiB bindings: every fp16 buffer of base
        // and large fits (the largest, large's shared embedding, is 105.1 MB); the budget decides.
        (
            device(DeviceClass::Mobile, 256 * MIB, 128 * MIB),
            u(WeightDType::Fp16),
            AUTO_MIXES[0],
        ),
    ];
    for (limits, base, large) in cases {
        let b = choose(&base_json(), &limits).unwrap();
        let l = choose(&large_json(), &limits).unwrap();
        eprintln!(
            "{limits:?}: base {} ({}), large {} ({})",
            b.dtype, b.reason, l.dtype, l.reason
        );
        assert_eq!((b.dtype, l.dtype), (base, large), "{limits:?}");
        assert!(b.reason.contains(limits.class.as_str()), "{}", b.reason);
    }
}

#[test]
fn small_buffer_limits_force_the_quantized_formats() {
    // Base: fp16's largest buffer is the 78.8 MB shared embedding, q8's 41.9 MB, q4's the vision
    // arena's 37.7 MB buffer. Large: fp16's 105.1 MB embedding.
    let at = |mb: u64| device(DeviceClass::Discrete, mb * 1_000_000, GIB);
    assert_eq!(
        choose(&base_json(), &at(64)).unwrap().dtype,
        WeightDType::Q8
    );
    assert_eq!(
        choose(&base_json(), &at(40)).unwrap().dtype,
        WeightDType::Q4
    );
    assert_eq!(
        choose(&large_json(), &at(100)).unwrap().dtype,
        WeightDType::Q8
    );
    let q8 = choose(&base_json(), &at(64)).unwrap();
    assert!(q8.reason.contains("not fp16"), "{}", q8.reason);
}

#[test]
fn nothing_fits_names_the_closest_format_and_the_shortfall() {
    // 30 MB buffers: even q4's 37.7 MB arena buffer is over, by 7.7 MB.
    let limits = device(DeviceClass::Mobile, 30_000_000, GIB);
    let e = choose(&base_json(), &limits).unwrap_err();
    assert!(matches!(e, Error::NoFittingDType(_)), "{e}");
    assert_eq!(e.name(), "Florence2LoadError");
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(msg.contains("q4 came closest"), "{msg}");
    assert!(
        msg.contains("its largest buffer 37.7 MB is 7.7 MB over"),
        "{msg}"
    );
}

#[test]
fn fp32_is_never_chosen_and_device_classes_come_from_the_adapter() {
    let all = facts(&base_json())
        .estimate_all(&EstimateOptions::default())
        .unwrap();
    let only_fp32: Vec<Estimate> = all
        .into_iter()
        .filter(|e| e.dtype == WeightDType::Fp32)
        .collect();
    let limits = device(DeviceClass::Discrete, 4 * GIB, 4 * GIB);
    assert!(choose_dtype(&only_fp32, &limits).is_err());
    // (adapter type, software adapter, mobile, class)
    for (kind, software, mobile, class) in [
        ("DiscreteGpu", false, false, DeviceClass::Discrete),
        ("IntegratedGpu", false, false, DeviceClass::Integrated),
        ("", false, true, DeviceClass::Mobile),
        ("Cpu", false, false, DeviceClass::Cpu),
        ("DiscreteGpu", true, false, DeviceClass::Cpu),
        ("", false, false, DeviceClass::Integrated),
    ] {
        assert_eq!(
            DeviceClass::of_adapter(kind, software, mobile),
            class,
            "{kind:?} software={software} mobile={mobile}"
        );
    }
}

#[test]
fn the_smaller_formats_change_the_weights_only() {
    // fp16, q8 and q4 share the f16 KV caches and every activation: their peaks differ by their
    // weights alone; fp32's f32 caches make its decode phase larger.
    for json in [base_json(), large_json()] {
        let all = facts(&json)
            .estimate_all(&EstimateOptions::default())
            .unwrap();
        for e in &all {
            eprintln!(
                "{} {}: weights {:.1} MB, peak {:.1} MB, largest buffer {:.1} MB",
                json["text_config"]["d_model"],
                e.dtype,
                mb(e.weights_bytes),
                mb(e.peak_bytes),
                mb(e.largest_buffer_bytes)
            );
        }
        let act = |d: WeightDType| {
            let e = all.iter().find(|e| e.dtype == d).unwrap();
            (e.peak_bytes - e.weights_bytes, e.weights_bytes)
        };
        let (fp16, q8, q4, fp32) = (
            act(WeightDType::Fp16),
            act(WeightDType::Q8),
            act(WeightDType::Q4),
            act(WeightDType::Fp32),
        );
        assert_eq!((fp16.0, q8.0), (q4.0, q4.0));
        assert!(fp32.0 > fp16.0);
        assert!(fp32.1 > fp16.1 && fp16.1 > q8.1 && q8.1 > q4.1);
    }
}

#[test]
fn mixes_split_their_bytes_by_part_like_the_uniform_formats() {
    // Each part of a mix holds what the uniform format of that part holds; the parts add up to the
    // total; the mixes auto considers sit between q8 and q4 (smaller than q8, larger than q4).
    for json in [base_json(), large_json()] {
        let f = facts(&json);
        let o = EstimateOptions::default();
        let one = |d: WeightDType| f.estimate(d, &o).unwrap().part_bytes;
        let mix = DTypePlan::vision_text(WeightDType::Fp16, WeightDType::Q4);
        let e = f.estimate(mix, &o).unwrap();
        let (fp16, q4) = (one(WeightDType::Fp16), one(WeightDType::Q4));
        let p = e.part_bytes;
        assert_eq!((p.vision, p.projector), (fp16.vision, fp16.projector));
        assert_eq!(
            (p.encoder, p.decoder, p.embed),
            (q4.encoder, q4.decoder, q4.embed)
        );
        assert_eq!(p.sum(), e.weights_bytes);
        assert!(fp16.vision > q4.vision && fp16.embed > q4.embed);
        let all = f.estimate_all(&o).unwrap();
        let weights = |d: DTypePlan| all.iter().find(|e| e.dtype == d).unwrap().weights_bytes;
        for m in AUTO_MIXES {
            eprintln!(
                "{} {m}: {:.1} MB",
                json["text_config"]["d_model"],
                mb(weights(m))
            );
            assert!(weights(m) < weights(u(WeightDType::Q8)), "{m}");
            assert!(weights(m) > weights(u(WeightDType::Q4)), "{m}");
        }
        assert!(weights(AUTO_MIXES[1]) < weights(AUTO_MIXES[0]));
        // The quality table's rows (docs/models-and-formats.md), for the record.
        for m in [
            "vision=fp16,text=q8",
            "vision=fp16,text=q4",
            "vision=q8,text=q4",
            "vision=q4,text=q8",
            "q4,embed=q8",
            "q8",
            "q4",
        ] {
            let e = f.estimate(m.parse::<DTypePlan>().unwrap(), &o).unwrap();
            eprintln!(
                "{} {m}: weights {:.1} MB, peak {:.1} MB",
                json["text_config"]["d_model"],
                mb(e.weights_bytes),
                mb(e.peak_bytes)
            );
        }
        assert_eq!(all.len(), 4 + AUTO_MIXES.len());
    }
}

#[test]
fn auto_takes_a_mix_where_q8_does_not_fit_and_the_mix_does() {
    // A budget between each mix's peak and the next larger format's: auto takes the mix.
    let f = facts(&large_json());
    let all = f.estimate_all(&EstimateOptions::default()).unwrap();
    let peak = |d: DTypePlan| all.iter().find(|e| e.dtype == d).unwrap().peak_bytes;
    let order = [
        u(WeightDType::Q8),
        AUTO_MIXES[0],
        AUTO_MIXES[1],
        u(WeightDType::Q4),
    ];
    for w in order.windows(2) {
        let mut limits = device(DeviceClass::Mobile, GIB, GIB);
        limits.budget = peak(w[1]);
        let c = choose_dtype(&all, &limits).unwrap();
        assert_eq!(c.dtype, w[1], "{}", c.reason);
        assert!(c.reason.contains(&format!("not {}", w[0])), "{}", c.reason);
    }
}

#[test]
fn auto_passes_over_a_mix_that_holds_q4s_bytes() {
    // A model whose embedding rows are not whole blocks keeps them f16 in q8 and q4 alike: its
    // q8-embed mix holds q4's bytes, and auto takes q4 rather than a mix that only renames it.
    let mut all = facts(&base_json())
        .estimate_all(&EstimateOptions::default())
        .unwrap();
    let q4 = all
        .iter()
        .find(|e| e.dtype == u(WeightDType::Q4))
        .unwrap()
        .clone();
    for e in all.iter_mut().filter(|e| e.dtype == AUTO_MIXES[1]) {
        *e = Estimate {
            dtype: e.dtype,
            ..q4.clone()
        };
    }
    let peak = |d: DTypePlan| all.iter().find(|e| e.dtype == d).unwrap().peak_bytes;
    let mut limits = device(DeviceClass::Mobile, GIB, GIB);
    limits.budget = peak(AUTO_MIXES[0]) - 1;
    let c = choose_dtype(&all, &limits).unwrap();
    assert_eq!(c.dtype, u(WeightDType::Q4), "{}", c.reason);
    // Nothing fitting names q4 as the closest, not the mix holding its bytes.
    limits.budget = q4.peak_bytes - 1;
    let e = choose_dtype(&all, &limits).unwrap_err().to_string();
    assert!(e.contains(": q4 came closest"), "{e}");
}
