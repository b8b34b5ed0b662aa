//! `florence2 convert` (`weights::export`): fixtures in every source format converted to every dtype
//! load, with that dtype, into exactly the resident weights of the source (raw GPU bytes compared,
//! tensor by tensor); the files are the package's format (plain floats, or `florence2-wasm-block` rows
//! listed in config.json), sharded when asked; the tokenizer is completed or built as the loader would;
//! the CLI answers a task on a converted dir exactly as on its source, and refuses bad input with
//! usage errors.
#![cfg(not(target_arch = "wasm32"))]

use crate::weights_util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use florence2_wasm::config::Florence2Config;
use florence2_wasm::gpu::{Device, Recorder, Tensor};
use florence2_wasm::processor::tokenizer::{
    complete_tokenizer_json, tokenizer_json_from_vocab_merges, Florence2Tokenizer,
};
use florence2_wasm::weights::export::sizes::converted_bytes;
use florence2_wasm::weights::export::{convert_dir, ExportOptions};
use florence2_wasm::weights::{
    load_dir_with, parse_header, DTypePlan, HeaderState, LoadOptions, WeightDType,
};
use weights_util::*;

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(name)
}

/// A fresh (absent) output directory under the target's temp dir.
fn out_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("convert-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.parent().unwrap()).unwrap();
    d
}

/// A tensor's raw GPU bytes.
fn raw(gpu: &Arc<Device>, t: &Tensor) -> Vec<u8> {
    pollster::block_on(async {
        let mut rec = Recorder::new(gpu);
        let p = rec.read_back(t);
        rec.submit().unwrap();
        p.unwrap().bytes(gpu).await.unwrap()
    })
}

/// Every tensor of every `.safetensors` file of a dir: name -> (dtype, shape).
fn file_tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let HeaderState::Done(h) = parse_header(&bytes, "f").unwrap() else {
            panic!("{}: header", p.display())
        };
        h.check_file_len("f", bytes.len() as u64).unwrap();
        for t in &h.tensors {
            let prev = out.insert(
                t.name.clone(),
                (t.dtype.as_str().to_owned(), t.shape.clone()),
            );
            assert!(prev.is_none(), "{}: twice", t.name);
        }
    }
    out
}

/// (fixture, what it stands for, shard size of the output).
const SOURCES: [(&str, &str, Option<u64>); 6] = [
    ("tiny2", "safetensors, HF-native, f32", None),
    ("tiny2-pt", "pytorch_model.bin (zip)", Some(100_000)),
    (
        "tiny2-orig-pt-legacy",
        "pytorch_model.bin (legacy), original names",
        None,
    ),
    (
        "tiny4-f16-sharded",
        "sharded safetensors, f16",
        Some(150_000),
    ),
    (
        "tiny2-orig-q4-sharded",
        "sharded q4 (florence2-wasm-block)",
        None,
    ),
    ("tiny2-mlx-bf16", "mlx channels-last, bf16", Some(60_000)),
];

#[test]
fn converted_checkpoints_load_bit_identical_in_every_dtype() {
    let gpu = gpu();
    let mut checked = 0;
    for (src, what, shard) in SOURCES {
        for dtype in WeightDType::ALL {
            let out = out_dir(&format!("{src}-{dtype}"));
            let mut opts = ExportOptions::new(dtype);
            opts.shard_size = shard;
            // Small read chunks: tensors arrive in many pieces, split anywhere.
            opts.chunk_bytes = 4099;
            let summary = convert_dir(&model_dir(src), &out, &opts)
                .unwrap_or_else(|e| panic!("{src} ({what}) -> {dtype}: {e}"));
            assert!(summary.tensors() > 100, "{src} {dtype}");
            let lo = LoadOptions::with_dtype(dtype);
            let (cfg_a, a) = load_dir_with(&gpu, &model_dir(src), lo.clone()).unwrap();
            let (cfg_b, b) = load_dir_with(&gpu, &out, lo)
                .unwrap_or_else(|e| panic!("{src} -> {dtype}: the output does not load: {e}"));
            assert_eq!(cfg_a.text, cfg_b.text, "{src} {dtype}");
            let names_a: Vec<&str> = a.names().collect();
            let names_b: Vec<&str> = b.names().collect();
            assert_eq!(names_a, names_b, "{src} {dtype}");
            for n in names_a {
                let (ta, tb) = (a.get_any(n).unwrap(), b.get_any(n).unwrap());
                assert_eq!(ta.shape(), tb.shape(), "{src} {dtype} {n}");
                assert_eq!(ta.dtype(), tb.dtype(), "{src} {dtype} {n}");
                assert!(
                    raw(&gpu, &ta) == raw(&gpu, &tb),
                    "{src} -> {dtype}: {n} differs"
                );
                checked += 1;
            }
            check_files(src, &out, dtype, shard, &summary.files.len());
        }
    }
    eprintln!("{checked} resident tensors bit-identical");
}

/// The output's files: plain floats, or `.qweight` U8 rows exactly the tensors config.json lists;
/// sharded with an index when asked and the weights passed the size.
fn check_files(src: &str, out: &Path, dtype: WeightDType, shard: Option<u64>, nfiles: &usize) {
    let tensors = file_tensors(out);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let q: Vec<String> = tensors
        .keys()
        .filter_map(|k| k.strip_suffix(".qweight").map(str::to_owned))
        .collect();
    match dtype {
        WeightDType::Q8 | WeightDType::Q4 => {
            let e = &cfg["quantization"];
            assert_eq!(e["format"], "florence2-wasm-block", "{src} {dtype}");
            assert_eq!(e["bits"], if dtype == WeightDType::Q8 { 8 } else { 4 });
            assert_eq!(e["block_size"], 32);
            assert_eq!(e["scale_dtype"], "float16");
            let listed: Vec<String> = e["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            assert_eq!(listed, q, "{src} {dtype}: listed = stored rows");
            assert!(q.len() > 20, "{src} {dtype}");
            for n in &q {
                assert_eq!(tensors[&format!("{n}.qweight")].0, "U8");
            }
        }
        _ => {
            assert!(cfg.get("quantization").is_none(), "{src} {dtype}");
            assert!(q.is_empty(), "{src} {dtype}");
            let want = if dtype == WeightDType::Fp32 {
                "F32"
            } else {
                "F16"
            };
            // Every matrix weight (rank 2, `.weight`, not a position table) is in the target format,
            // except the transposed original image projection (resident f32 always).
            for (n, (d, s)) in &tensors {
                if s.len() == 2 && n.ends_with(".weight") && !n.contains("pos") {
                    assert_eq!(d, want, "{src} {dtype} {n}");
                }
            }
        }
    }
    if dtype == WeightDType::Fp32 {
        assert!(tensors.values().all(|(d, _)| d == "F32"), "{src} fp32");
    }
    let index = out.join("model.safetensors.index.json");
    match shard {
        Some(_) => {
            assert!(
                *nfiles > 1 && index.exists(),
                "{src} {dtype}: {nfiles} files"
            );
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(index).unwrap()).unwrap();
            assert_eq!(v["weight_map"].as_object().unwrap().len(), tensors.len());
        }
        None => assert!(*nfiles == 1 && !index.exists() && out.join("model.safetensors").exists()),
    }
    for f in [
        "tokenizer.json",
        "preprocessor_config.json",
        "generation_config.json",
    ] {
        assert!(out.join(f).exists(), "{src} {dtype}: {f}");
    }
    // Nothing temporary is left inside or beside the output.
    let own = format!(".{}.", out.file_name().unwrap().to_string_lossy());
    let inside: Vec<_> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    let beside = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&own));
    let hidden: Vec<_> = inside.into_iter().chain(beside).collect();
    assert!(hidden.is_empty(), "{hidden:?}");
}

/// The original checkpoints carry the LM head as a separate copy of the shared embedding: it is
/// dropped (the loader ties it), and a head that differs is kept.
#[test]
fn tied_lm_head_is_dropped_and_an_untied_one_kept() {
    let out = out_dir("tied");
    let s = convert_dir(
        &model_dir("tiny2-orig"),
        &out,
        &ExportOptions::new(WeightDType::Fp16),
    )
    .unwrap();
    assert_eq!(s.dropped, ["language_model.lm_head.weight"]);
    assert!(!file_tensors(&out).contains_key("language_model.lm_head.weight"));

    // An untied head: the HF-native tiny config with an LM head of its own.
    let cfg = tiny_config();
    let mut raw_t: Vec<RawTensor> = canonical_tensors(&cfg, 3)
        .iter()
        .map(|(n, s, v)| RawTensor::new(n, Dt::F32, s, v))
        .collect();
    let (v, d) = (cfg.text.vocab_size, cfg.text.d_model);
    let head: Vec<f32> = (0..v * d).map(|i| (i as f32 * 0.37).sin()).collect();
    raw_t.push(RawTensor::new("lm_head.weight", Dt::F32, &[v, d], &head));
    let src = out_dir("untied-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("config.json"), tiny_config_json().to_string()).unwrap();
    std::fs::write(
        src.join("model.safetensors"),
        write_safetensors(&raw_t, None),
    )
    .unwrap();
    std::fs::copy(
        model_dir("tiny2").join("tokenizer.json"),
        src.join("tokenizer.json"),
    )
    .unwrap();
    let out = out_dir("untied");
    let s = convert_dir(&src, &out, &ExportOptions::new(WeightDType::Q8)).unwrap();
    assert!(s.dropped.is_empty());
    let t = file_tensors(&out);
    // d_model 16 is not a whole 32-weight block: the head stays f16 under q8, kept under its name.
    assert_eq!(t["lm_head.weight"].0, "F16");
    let gpu = gpu();
    let lo = LoadOptions::with_dtype(WeightDType::Q8);
    let (_, a) = load_dir_with(&gpu, &src, lo.clone()).unwrap();
    let (_, b) = load_dir_with(&gpu, &out, lo).unwrap();
    let (ha, hb) = (
        a.get_any("lm_head.weight").unwrap(),
        b.get_any("lm_head.weight").unwrap(),
    );
    assert!(raw(&gpu, &ha) == raw(&gpu, &hb));
    assert!(!b.same_buffer("lm_head.weight", "model.language_model.shared.weight"));
}

/// A failed conversion (a required tensor missing) leaves nothing at the output, and an existing
/// non-empty output is refused untouched.
#[test]
fn failures_leave_no_output() {
    let src = out_dir("broken-src");
    std::fs::create_dir_all(&src).unwrap();
    let cfg = tiny_config();
    let raw_t: Vec<RawTensor> = canonical_tensors(&cfg, 4)
        .iter()
        .filter(|(n, _, _)| !n.contains("encoder.layers.0.fc1"))
        .map(|(n, s, v)| RawTensor::new(n, Dt::F32, s, v))
        .collect();
    std::fs::write(src.join("config.json"), tiny_config_json().to_string()).unwrap();
    std::fs::write(
        src.join("model.safetensors"),
        write_safetensors(&raw_t, None),
    )
    .unwrap();
    let out = out_dir("broken");
    let e = convert_dir(&src, &out, &ExportOptions::new(WeightDType::Q4)).unwrap_err();
    assert!(e.to_string().contains("encoder.layers.0.fc1"), "{e}");
    assert!(!out.exists());
    let siblings: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".broken"))
        .collect();
    assert!(siblings.is_empty(), "{siblings:?}");

    let out = out_dir("occupied");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let e = convert_dir(
        &model_dir("tiny2"),
        &out,
        &ExportOptions::new(WeightDType::Fp16),
    )
    .unwrap_err();
    assert_eq!(e.name(), "Florence2InputError", "{e}");
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "mine"
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
}

/// A base-vocabulary tokenizer.json gets the Florence-2 tokens at the ids the loader gives them; one
/// built from vocab.json + merges.txt encodes and decodes like the file they came from.
#[test]
fn tokenizer_is_completed_or_built_like_the_loader() {
    let base = std::fs::read(model_dir("tiny2-orig").join("tokenizer.json")).unwrap();
    let full = std::fs::read(model_dir("tiny2").join("tokenizer.json")).unwrap();
    assert_eq!(
        complete_tokenizer_json(&full).unwrap(),
        full,
        "complete: copied"
    );
    let done = complete_tokenizer_json(&base).unwrap();
    assert_ne!(done, base);
    let at_load = Florence2Tokenizer::from_json_bytes(&base).unwrap();
    let completed = Florence2Tokenizer::from_json_bytes(&done).unwrap();
    assert_eq!(
        format!("{:?}", completed.florence_tokens()),
        "Present",
        "the written file carries every Florence-2 token"
    );
    let prompts = [
        "What does the image describe?",
        "Locate the objects with category and location.",
        "<loc_52><loc_999> a cat</s>",
        "ünïcödé  spaces\tand\nnewlines",
    ];
    for p in prompts {
        let ids = at_load.encode_prompt(p).unwrap();
        assert_eq!(completed.encode_prompt(p).unwrap(), ids, "{p}");
        assert_eq!(
            completed.decode(&ids, false).unwrap(),
            at_load.decode(&ids, false).unwrap()
        );
    }

    // vocab.json + merges.txt, as the original checkpoints ship them (vocab.json lists the special
    // tokens too), from the base file.
    let v: serde_json::Value = serde_json::from_slice(&base).unwrap();
    let mut vocab = v["model"]["vocab"].as_object().unwrap().clone();
    for t in v["added_tokens"].as_array().unwrap() {
        vocab.insert(t["content"].as_str().unwrap().into(), t["id"].clone());
    }
    let vocab = serde_json::to_vec(&vocab).unwrap();
    let mut merges = String::from("#version: 0.2\n");
    for m in v["model"]["merges"].as_array().unwrap() {
        let line = match m {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(a) => {
                format!("{} {}", a[0].as_str().unwrap(), a[1].as_str().unwrap())
            }
            _ => panic!("merge {m}"),
        };
        merges.push_str(&line);
        merges.push('\n');
    }
    let built = tokenizer_json_from_vocab_merges(&vocab, merges.as_bytes()).unwrap();
    let built = Florence2Tokenizer::from_json_bytes(&built).unwrap();
    assert_eq!(built.vocab_size(), at_load.vocab_size());
    for p in prompts {
        let ids = at_load.encode_prompt(p).unwrap();
        assert_eq!(built.encode_prompt(p).unwrap(), ids, "{p}");
        assert_eq!(
            built.decode(&ids, false).unwrap(),
            at_load.decode(&ids, false).unwrap()
        );
    }
}

/// Florence-2-base's shapes (config.json sizes; the tokenizer's 51289 tokens + `<image>`).
fn base_config_json() -> serde_json::Value {
    serde_json::json!({
        "model_type": "florence2",
        "image_token_id": 51289,
        "projection_dim": 768,
        "text_config": {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
            "encoder_attention_heads": 12, "decoder_attention_heads": 12,
            "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "vocab_size": 51289,
            "max_position_embeddings": 1024},
        "vision_config": {"embed_dim": [128, 256, 512, 1024], "depths": [1, 1, 9, 1],
            "num_heads": [4, 8, 16, 32], "num_groups": [4, 8, 16, 32],
            "patch_size": [7, 3, 3, 3], "patch_stride": [4, 2, 2, 2],
            "patch_padding": [3, 1, 1, 1], "patch_prenorm": [false, true, true, true],
            "window_size": 12, "projection_dim": 768, "max_position_embeddings": 50,
            "max_temporal_embeddings": 100}
    })
}

/// Florence-2-large: d_model 1024, 12 + 12 layers of 16 heads, FFN 4096; DaViT 256..2048.
fn large_config_json() -> serde_json::Value {
    let mut c = base_config_json();
    let t = &mut c["text_config"];
    t["d_model"] = 1024.into();
    t["encoder_layers"] = 12.into();
    t["decoder_layers"] = 12.into();
    t["encoder_attention_heads"] = 16.into();
    t["decoder_attention_heads"] = 16.into();
    t["encoder_ffn_dim"] = 4096.into();
    t["decoder_ffn_dim"] = 4096.into();
    c["projection_dim"] = 1024.into();
    let v = &mut c["vision_config"];
    v["embed_dim"] = serde_json::json!([256, 512, 1024, 2048]);
    v["num_heads"] = serde_json::json!([8, 16, 32, 64]);
    v["num_groups"] = serde_json::json!([8, 16, 32, 64]);
    v["projection_dim"] = 1024.into();
    c
}

/// The sizes docs/models-and-formats.md states, from the converter's own rule on the real shapes (MB = 10^6 bytes).
#[test]
fn converted_sizes_of_base_and_large() {
    let mb =
        |cfg: &Florence2Config, d| (converted_bytes(cfg, d).unwrap() as f64 / 1e6).round() as u64;
    let base = Florence2Config::from_json(&base_config_json()).unwrap();
    let large = Florence2Config::from_json(&large_config_json()).unwrap();
    let sizes: Vec<(u64, u64)> = WeightDType::ALL
        .iter()
        .map(|&d| (mb(&base, d), mb(&large, d)))
        .collect();
    eprintln!("fp32 fp16 q8 q4 (base, large) MB: {sizes:?}");
    // fp32 is docs/models-and-formats.md's 926 MB; the other formats keep every tensor the loader keeps
    // in f32 as f32 (norms, biases, depthwise convolutions, position tables), and q8/q4 the dense
    // convolutions as f16.
    assert_eq!(sizes, [(926, 3082), (468, 1548), (259, 852), (147, 481)]);
}

fn florence2(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .env("NODEVICE_SELECT", "1")
        .args(args)
        .output()
        .unwrap()
}

/// `florence2 run --json` of the first reference case of `cases_of` on the model dir `dir`: token ids.
fn run_ids(dir: &Path, cases_of: &str, dtype: &str) -> serde_json::Value {
    let case = &weights_util::common::fixtures::cases(cases_of)[1];
    let image = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/images")
        .join(case["image"].as_str().unwrap());
    let out = florence2(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--image",
        image.to_str().unwrap(),
        "--task",
        case["task"].as_str().unwrap(),
        "--max-new-tokens",
        &case["max_new_tokens"].to_string(),
        "--dtype",
        dtype,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "run {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["token_ids"].clone()
}

/// The subcommand: converts a pickle checkpoint to q4 in shards and prints the summary; the converted
/// dir answers a task exactly as the source does at that dtype; bad input is a usage error (exit 2)
/// and an occupied output a run error (exit 1), with nothing written.
#[test]
fn cli_convert_answers_like_the_source_and_refuses_bad_input() {
    let src = model_dir("tiny2-orig-pt-legacy");
    let out = out_dir("cli-q4");
    let o = florence2(&[
        "convert",
        "--model",
        src.to_str().unwrap(),
        "--dtype",
        "q4",
        "--shard-size",
        "100KiB",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for want in [
        "q4:",
        "f32:",
        "tensors (q4)",
        "model-00001-of-",
        "tied copies dropped",
    ] {
        assert!(stdout.contains(want), "summary lacks {want:?}:\n{stdout}");
    }
    assert!(out.join("model.safetensors.index.json").exists());
    let a = run_ids(&src, "tiny2-orig", "q4");
    assert!(a.as_array().is_some_and(|v| v.len() > 2), "{a}");
    assert_eq!(run_ids(&out, "tiny2-orig", "q4"), a);
    // The q4 file loaded as fp16 holds q4's rounding: not the source's fp16 answer in general, but a
    // fp16 conversion gives exactly that.
    let out16 = out_dir("cli-fp16");
    let o = florence2(&[
        "convert",
        "--model",
        src.to_str().unwrap(),
        "--dtype",
        "fp16",
        "--out",
        out16.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out16.join("model.safetensors").exists());
    assert_eq!(
        run_ids(&out16, "tiny2-orig", "fp16"),
        run_ids(&src, "tiny2-orig", "fp16")
    );

    let tiny2 = model_dir("tiny2");
    let fresh = out_dir("cli-bad");
    let fresh_s = fresh.to_str().unwrap();
    let usage: [&[&str]; 5] = [
        &[
            "convert",
            "--model",
            "/nonexistent/model",
            "--dtype",
            "fp16",
            "--out",
            fresh_s,
        ],
        &[
            "convert",
            "--model",
            tiny2.to_str().unwrap(),
            "--dtype",
            "q3",
            "--out",
            fresh_s,
        ],
        &[
            "convert",
            "--model",
            tiny2.to_str().unwrap(),
            "--dtype",
            "fp16",
            "--shard-size",
            "12XB",
            "--out",
            fresh_s,
        ],
        &[
            "convert",
            "--model",
            tiny2.to_str().unwrap(),
            "--out",
            fresh_s,
        ],
        &[
            "convert",
            "--model",
            tiny2.to_str().unwrap(),
            "--dtype",
            "fp16",
        ],
    ];
    for args in usage {
        let o = florence2(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("usage"), "{args:?}: {err}");
        assert!(!fresh.exists(), "{args:?}");
    }
    // The q4 output exists: converting into it again is refused, and it is left as it was.
    let before = file_tensors(&out);
    let o = florence2(&[
        "convert",
        "--model",
        tiny2.to_str().unwrap(),
        "--dtype",
        "fp32",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not an empty directory"));
    assert_eq!(file_tensors(&out), before);
}

/// A format per part (`convert --dtype vision=fp16,text=q4`): the output loaded with the mix holds the
/// source's mixed load bit for bit, its vision tower as f16 floats and its text model as q4 rows
/// (listed in config.json); a mix of q8 and q4 is refused (one `quantization` format per checkpoint).
#[test]
fn a_mix_converts_and_loads_bit_identical() {
    let gpu = gpu();
    let mix: DTypePlan = "vision=fp16,text=q4".parse().unwrap();
    let out = out_dir("tiny2-mix");
    let summary = convert_dir(&model_dir("tiny2"), &out, &ExportOptions::new(mix)).unwrap();
    assert_eq!(summary.dtype, mix);
    let lo = LoadOptions::with_dtype(mix);
    let (_, a) = load_dir_with(&gpu, &model_dir("tiny2"), lo.clone()).unwrap();
    let (_, b) = load_dir_with(&gpu, &out, lo).unwrap();
    let names: Vec<&str> = a.names().collect();
    assert_eq!(names, b.names().collect::<Vec<_>>());
    for n in names {
        let (ta, tb) = (a.get_any(n).unwrap(), b.get_any(n).unwrap());
        assert_eq!((ta.shape(), ta.dtype()), (tb.shape(), tb.dtype()), "{n}");
        assert!(raw(&gpu, &ta) == raw(&gpu, &tb), "{n} differs");
    }
    let files = file_tensors(&out);
    let fc1 = "model.vision_tower.blocks.0.0.channel_block.ffn.fc1.weight";
    assert_eq!(files[fc1].0, "F16");
    let enc = "model.language_model.encoder.layers.0.fc1.weight.qweight";
    assert_eq!(files[enc].0, "U8");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["quantization"]["bits"], 4);
    let listed = cfg["quantization"]["tensors"].as_array().unwrap();
    assert!(listed
        .iter()
        .all(|t| t.as_str().unwrap().starts_with("model.language_model.")));
    let both: DTypePlan = "vision=q8,text=q4".parse().unwrap();
    let bad = out_dir("tiny2-q8q4");
    let e = convert_dir(&model_dir("tiny2"), &bad, &ExportOptions::new(both)).unwrap_err();
    assert_eq!(e.name(), "Florence2InputError");
    assert!(e.to_string().contains("not q8 and q4"), "{e}");
    assert!(!bad.exists());
}
