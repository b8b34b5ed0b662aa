//! Quantized checkpoints on disk (`scripts/fixtures/convert_checkpoint.py --dtype q8|q4`, format documented in
//! `src/weights/quantized.rs`): the committed fixtures `tiny2-q8`, `tiny2-q4` (from `tiny2`) and
//! `tiny2-orig-q4-sharded` (from `tiny2-orig`, original names, 3 shards) were made by that script.
//!
//! - The Python quantizer makes exactly the engine's blocks (bytes compared on the host).
//! - Every quantized fixture loads into every resident dtype, each value equal to the host's conversion
//!   of the file's rows (dequantize; f16 rounding; requantize for the other format), everything else
//!   equal to the float source; loaded in its own format it equals the float source loaded in that format.
//! - Hostile variants (missing/unknown `quantization` entries, wrong dtype/shape/padding, unlisted or
//!   float-stored listed tensors, truncation) give named errors, ranged and streamed alike.
//! - The CLI: a q8/q4 file run with `--dtype q8/q4` gives the float file's token ids at that dtype; a
//!   quantized file run as fp16 works and holds more weight bytes.
#![cfg(not(target_arch = "wasm32"))]

use crate::weights_util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use florence2_wasm::gpu::{readback, DType, Device, DeviceOptions};
use florence2_wasm::quant::{self, QFormat};
use florence2_wasm::weights::names::canonical_name;
use florence2_wasm::weights::{
    detect_layout, load_dir_with, load_files, parse_header, Assembler, HeaderState, LoadOptions,
    MemFiles, StreamLoader, WeightDType,
};
use florence2_wasm::Error;
use weights_util::common::fixtures::{cases, cli_run};
use weights_util::*;

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(name)
}

/// (quantized fixture, float fixture it was converted from, format).
const QUANTIZED: [(&str, &str, QFormat); 3] = [
    ("tiny2-q8", "tiny2", QFormat::Q8),
    ("tiny2-q4", "tiny2", QFormat::Q4),
    ("tiny2-orig-q4-sharded", "tiny2-orig", QFormat::Q4),
];

/// Every tensor of every `.safetensors` file of a dir: name -> (dtype, shape, bytes).
fn file_tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
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
        for t in &h.tensors {
            let s = (h.data_start + t.start) as usize;
            let e = (h.data_start + t.end) as usize;
            out.insert(
                t.name.clone(),
                (
                    t.dtype.as_str().to_owned(),
                    t.shape.clone(),
                    bytes[s..e].to_vec(),
                ),
            );
        }
    }
    out
}

fn config_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The converter's blocks are the engine's: for every matrix the config lists, the file's rows equal
/// `quant::quantize_rows` of the float source's f32 values, byte for byte; every other tensor is the
/// float source's, unchanged; the list holds exactly the matrices with whole 32-weight rows.
#[test]
fn converter_blocks_equal_the_engine_quantizer() {
    for (qname, fname, fmt) in QUANTIZED {
        let q = file_tensors(&model_dir(qname));
        let f = file_tensors(&model_dir(fname));
        let cfg = config_json(&model_dir(qname));
        let entry = &cfg["quantization"];
        assert_eq!(entry["format"], "florence2-wasm-block", "{qname}");
        assert_eq!(entry["bits"], fmt.bits(), "{qname}");
        let listed: Vec<&str> = entry["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let mut blocks = 0;
        for name in &listed {
            let (dt, shape, bytes) = &q[&format!("{name}.qweight")];
            let (fdt, fshape, fbytes) = &f[*name];
            assert_eq!((dt.as_str(), fdt.as_str()), ("U8", "F32"), "{qname} {name}");
            let (n, k) = (fshape[0], fshape[1]);
            assert_eq!(shape, &vec![n, fmt.row_bytes(k)], "{qname} {name}");
            let mut mine = Vec::new();
            quant::quantize_rows(fmt, k, &f32s(fbytes), &mut mine).unwrap();
            assert!(
                bytes == &mine,
                "{qname} {name}: the converter's rows differ from the engine's quantizer"
            );
            blocks += n * k / quant::QBLOCK;
        }
        for (name, (dt, shape, bytes)) in &q {
            if name.ends_with(".qweight") {
                continue;
            }
            let (fdt, fshape, fbytes) = &f[name];
            assert_eq!((dt, shape, bytes), (fdt, fshape, fbytes), "{qname} {name}");
            let matrix = shape.len() == 2
                && name.ends_with(".weight")
                && !name.contains("embed_positions")
                && !name.contains("image_pos");
            assert!(
                !(matrix && shape[1] % 32 == 0),
                "{qname}: {name} {shape:?} should have been quantized"
            );
        }
        assert!(listed.len() >= 40, "{qname}: {} matrices", listed.len());
        eprintln!(
            "{qname}: {} matrices, {blocks} blocks identical to the engine's",
            listed.len()
        );
    }
}

/// Edge cases of the block quantizer (exact rounding ties for q8 and q4, zero blocks, NaN/inf, scales that
/// overflow or underflow f16, subnormal scales, random rows from 1e-4 to 300), quantized by the converter's
/// Python code (`scripts/fixtures/make_quant_vectors.py`): the engine's quantizer makes the same bytes.
#[test]
fn converter_quantizer_equals_the_engine_on_edge_cases() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant");
    let t = file_tensors(&dir);
    let (_, shape, input) = &t["input"];
    let k = shape[1];
    let x = f32s(input);
    assert!(x.iter().any(|v| v.is_nan()) && x.iter().any(|v| v.is_infinite()));
    for fmt in [QFormat::Q8, QFormat::Q4] {
        let (dt, qshape, want) = &t[fmt.name()];
        assert_eq!(
            (dt.as_str(), qshape.clone()),
            ("U8", vec![shape[0], fmt.row_bytes(k)])
        );
        let mut mine = Vec::new();
        quant::quantize_rows(fmt, k, &x, &mut mine).unwrap();
        for (r, (a, b)) in mine
            .chunks(fmt.row_bytes(k))
            .zip(want.chunks(fmt.row_bytes(k)))
            .enumerate()
        {
            assert_eq!(a, b, "{fmt:?} row {r}: engine vs converter");
        }
        // The ties rows really are ties: some |w/d| is exactly n + 1/2 (rounded away from zero).
        let deq = quant::dequantize_rows(fmt, k, want).unwrap();
        let row = if fmt == QFormat::Q8 { 0 } else { 1 };
        let d = x[row * k] / if fmt == QFormat::Q8 { 127.0 } else { 7.0 };
        assert_eq!(x[row * k + 1] / d, 0.5);
        assert_eq!(deq[row * k + 1], d, "{fmt:?}: 0.5 rounds away from zero");
    }
}

/// Every quantized fixture into every resident dtype: matrices listed in the config have the resident
/// format and the host's conversion of the file's rows; other tensors equal the float source's load in
/// the same dtype. In the file's own format, everything equals the float source loaded in that format.
#[test]
fn quantized_fixtures_load_into_every_dtype() {
    // A device of its own: the memory counter is per device.
    let gpu = pollster::block_on(Device::new(DeviceOptions::default())).unwrap();
    for (qname, fname, fmt) in QUANTIZED {
        let q = file_tensors(&model_dir(qname));
        for dtype in WeightDType::ALL {
            let opts = LoadOptions::with_dtype(dtype);
            let before = gpu.memory().weights_bytes;
            let (cfg, w) = load_dir_with(&gpu, &model_dir(qname), opts.clone())
                .unwrap_or_else(|e| panic!("{qname} {dtype}: {e}"));
            assert_eq!(
                gpu.memory().weights_bytes - before,
                w.byte_size(),
                "{qname} {dtype}"
            );
            let (_, fw) = load_dir_with(&gpu, &model_dir(fname), opts).unwrap();
            let listed = &cfg.quantization.as_ref().unwrap().tensors;
            let layout = detect_layout(q.keys().map(String::as_str));
            let mut listed_canon = BTreeSet::new();
            let mut converted = 0;
            for src in listed {
                // Listed tensors the model does not use (the original DaViT's `head`) are skipped.
                let Some(canonical) = canonical_name(layout, src).filter(|c| w.has(c)) else {
                    continue;
                };
                listed_canon.insert(canonical.clone());
                let t = w.get_any(&canonical).unwrap();
                let k = t.dim(-1);
                let want_dtype = dtype.matrix_dtype(k);
                assert_eq!(t.dtype(), want_dtype, "{qname} {dtype} {canonical}");
                let deq = quant::dequantize_rows(fmt, k, &q[&format!("{src}.qweight")].2).unwrap();
                let host: Vec<f32> = match want_dtype {
                    DType::F32 => deq,
                    DType::F16 => deq
                        .iter()
                        .map(|&x| half::f16::from_f32(x).to_f32())
                        .collect(),
                    d => {
                        let other = d.qformat().unwrap();
                        if other == fmt {
                            deq
                        } else {
                            let mut b = Vec::new();
                            quant::quantize_rows(other, k, &deq, &mut b).unwrap();
                            quant::dequantize_rows(other, k, &b).unwrap()
                        }
                    }
                };
                let got = readback::to_f32_blocking(&gpu, &t).unwrap();
                assert!(got == host, "{qname} {dtype} {canonical}");
                converted += 1;
            }
            assert!(converted + 1 >= listed.len(), "{qname}: {converted}");
            // The LM head is tied to the (quantized) shared embedding.
            if listed_canon.contains("model.language_model.shared.weight") {
                listed_canon.insert("lm_head.weight".into());
            }
            let own = dtype.as_str() == fmt.name();
            let mut same = 0;
            for n in fw.names() {
                if !own && listed_canon.contains(n) {
                    continue;
                }
                let a = readback::to_f32_blocking(&gpu, &w.get_any(n).unwrap()).unwrap();
                let b = readback::to_f32_blocking(&gpu, &fw.get_any(n).unwrap()).unwrap();
                assert!(a == b, "{qname} {dtype} {n}: differs from {fname}");
                same += 1;
            }
            assert_eq!(w.names().count(), fw.names().count(), "{qname} {dtype}");
            eprintln!(
                "{qname} as {dtype}: {converted} quantized matrices equal the host's conversion, {same} tensors equal {fname}'s; {} weight bytes",
                w.byte_size()
            );
        }
    }
}

/// `tiny2-q8`'s tensors (file order) and config, to be broken.
fn q8_parts() -> (Vec<RawTensor>, serde_json::Value) {
    let dir = model_dir("tiny2-q8");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let HeaderState::Done(h) = parse_header(&bytes, "f").unwrap() else {
        panic!("header")
    };
    let tensors = h
        .tensors
        .iter()
        .map(|t| RawTensor {
            name: t.name.clone(),
            dtype: t.dtype.as_str().to_owned(),
            shape: t.shape.clone(),
            bytes: bytes[(h.data_start + t.start) as usize..(h.data_start + t.end) as usize]
                .to_vec(),
        })
        .collect();
    (tensors, config_json(&dir))
}

const VICTIM: &str = "model.language_model.encoder.layers.0.fc1.weight";

fn victim(tensors: &mut [RawTensor]) -> &mut RawTensor {
    let name = format!("{VICTIM}.qweight");
    tensors.iter_mut().find(|t| t.name == name).unwrap()
}

/// Load a broken checkpoint with the ranged loader and by streaming it in 61-byte chunks (file length
/// unknown); both must fail with the same error, which is returned.
fn load_err(gpu: &Arc<Device>, cfg: &serde_json::Value, file: Vec<u8>) -> Error {
    let files: MemFiles = mem_model(cfg, &[("model.safetensors", file.clone())]);
    let ranged = pollster::block_on(load_files(
        gpu,
        &files,
        LoadOptions::with_dtype(WeightDType::Q4),
    ))
    .map(|_| ())
    .expect_err("the ranged loader accepted a broken checkpoint");
    let streamed = (|| {
        let cfg = florence2_wasm::config::Florence2Config::from_json(cfg)?;
        let mut asm = Assembler::new(gpu, &cfg, LoadOptions::with_dtype(WeightDType::Fp16));
        let mut s = StreamLoader::new("model.safetensors", None);
        for c in file.chunks(61) {
            s.feed(&mut asm, c)?;
        }
        s.finish(&mut asm)?;
        asm.finish().map(|_| ())
    })()
    .expect_err("the streaming loader accepted a broken checkpoint");
    assert_eq!(
        std::mem::discriminant(&ranged),
        std::mem::discriminant(&streamed),
        "ranged: {ranged}\nstreamed: {streamed}"
    );
    ranged
}

fn quant_msg(e: &Error, words: &str) {
    match e {
        Error::QuantizedTensor { msg, .. } if msg.contains(words) => {}
        e => panic!("expected a QuantizedTensor error saying '{words}', got {e:?}"),
    }
}

#[test]
fn hostile_quantized_checkpoints_give_named_errors() {
    let gpu = weights_util::common::gpu();
    let (tensors, cfg) = q8_parts();
    let file = |t: &[RawTensor]| write_safetensors(t, None);

    // The untouched parts load (the harness itself is sound).
    let files = mem_model(&cfg, &[("model.safetensors", file(&tensors))]);
    pollster::block_on(load_files(
        &gpu,
        &files,
        LoadOptions::with_dtype(WeightDType::Q8),
    ))
    .unwrap();

    // No quantization entry in config.json.
    let mut c = cfg.clone();
    c.as_object_mut().unwrap().remove("quantization");
    quant_msg(&load_err(&gpu, &c, file(&tensors)), "no quantization entry");

    // A quantized tensor the entry does not list.
    let mut c = cfg.clone();
    let list = c["quantization"]["tensors"].as_array_mut().unwrap();
    list.retain(|v| v != VICTIM);
    quant_msg(&load_err(&gpu, &c, file(&tensors)), "not listed");

    // Listed, but stored as floats.
    let mut t = tensors.clone();
    let v = victim(&mut t);
    let (n, rb) = (v.shape[0], v.shape[1]);
    let k = (32..=4096)
        .step_by(32)
        .find(|&k| QFormat::Q8.row_bytes(k) == rb)
        .unwrap();
    *v = RawTensor::new(VICTIM, Dt::F32, &[n, k], &vec![0.25; n * k]);
    quant_msg(&load_err(&gpu, &cfg, file(&t)), "lists it as quantized");

    // I8 instead of U8 (same bytes).
    let mut t = tensors.clone();
    victim(&mut t).dtype = "I8".into();
    quant_msg(&load_err(&gpu, &cfg, file(&t)), "quantized rows are U8");

    // A row short (shape and bytes agree, so the header is valid; the rows do not match (N, K)).
    let mut t = tensors.clone();
    let v = victim(&mut t);
    v.shape = vec![n - 1, rb];
    v.bytes.truncate((n - 1) * rb);
    quant_msg(&load_err(&gpu, &cfg, file(&t)), "expected [");

    // Rows of another width (q4 rows declared where the config says q8).
    let mut t = tensors.clone();
    let v = victim(&mut t);
    let rb4 = QFormat::Q4.row_bytes(k);
    v.shape = vec![n, rb4];
    v.bytes.truncate(n * rb4);
    quant_msg(&load_err(&gpu, &cfg, file(&t)), "does not hold q8 rows");

    // The config says q4 for q8 rows: every listed tensor's shape is wrong.
    let mut c = cfg.clone();
    c["quantization"]["bits"] = 4.into();
    quant_msg(&load_err(&gpu, &c, file(&tensors)), "does not hold q4 rows");

    // Non-zero padding after the scales of the last row.
    let mut t = tensors.clone();
    let v = victim(&mut t);
    let last = v.bytes.len() - 1;
    v.bytes[last] = 0x5a;
    quant_msg(&load_err(&gpu, &cfg, file(&t)), "non-zero padding");

    // A `.qweight` for a tensor that is not a matrix weight (a LayerNorm's weight).
    let mut t = tensors.clone();
    let ln = "model.language_model.encoder.layers.0.final_layer_norm.weight";
    let i = t.iter().position(|x| x.name == ln).unwrap();
    t[i] = RawTensor {
        name: format!("{ln}.qweight"),
        dtype: "U8".into(),
        shape: vec![1, 48],
        bytes: vec![0; 48],
    };
    let mut c = cfg.clone();
    c["quantization"]["tensors"]
        .as_array_mut()
        .unwrap()
        .push(ln.into());
    quant_msg(&load_err(&gpu, &c, file(&t)), "not a matrix");

    // Truncated in the middle of quantized rows.
    let mut f = file(&tensors);
    let HeaderState::Done(h) = parse_header(&f, "f").unwrap() else {
        panic!()
    };
    let info = h.get(&format!("{VICTIM}.qweight")).unwrap();
    f.truncate((h.data_start + info.start) as usize + rb + 7);
    let e = load_err(&gpu, &cfg, f);
    assert!(matches!(e, Error::Truncated { .. }), "{e:?}");

    // Entries of unknown formats, bit counts and block sizes are refused by name.
    for (key, value, word) in [
        ("format", serde_json::json!("gptq"), "unknown format 'gptq'"),
        ("bits", serde_json::json!(2), "unsupported bits 2"),
        (
            "block_size",
            serde_json::json!(128),
            "unsupported block_size 128",
        ),
    ] {
        let mut c = cfg.clone();
        c["quantization"][key] = value;
        match load_err(&gpu, &c, file(&tensors)) {
            Error::Config(m) if m.contains(word) => {}
            e => panic!("{key}: {e:?}"),
        }
    }
}

/// The CLI on quantized files: loaded in their own format, the answers (token ids, text) equal the float
/// source's at that dtype; a quantized file run as fp16 works and holds more weight bytes than as q8.
#[test]
fn cli_runs_quantized_checkpoints() {
    let case = &cases("tiny2")[0];
    let answer = |v: &serde_json::Value| (v["token_ids"].clone(), v["generated_text"].clone());
    for (qname, fname, fmt) in QUANTIZED {
        let dt = fmt.name();
        let q = cli_run(qname, case, &["--dtype", dt]);
        let f = cli_run(fname, case, &["--dtype", dt]);
        assert_eq!(q["dtype"], dt);
        assert!(q["token_ids"].as_array().is_some_and(|a| !a.is_empty()));
        assert_eq!(answer(&q), answer(&f), "{qname} vs {fname} at {dt}");
        // The original float checkpoint keeps its own copy of the LM head (the converter drops the tied
        // copy), so only the HF-native pairs hold the same weight bytes.
        if !fname.contains("orig") {
            assert_eq!(
                q["memory"]["weights_bytes"], f["memory"]["weights_bytes"],
                "{qname} vs {fname} at {dt}"
            );
        }
        eprintln!("{qname} --dtype {dt}: same answer as {fname} --dtype {dt}");
    }
    // Every tiny2 reference case (6 images x tasks): the q8 file as q8 answers like tiny2 as q8.
    let all = cases("tiny2");
    for c in &all[1..] {
        let q = cli_run("tiny2-q8", c, &["--dtype", "q8"]);
        let f = cli_run("tiny2", c, &["--dtype", "q8"]);
        assert_eq!(
            answer(&q),
            answer(&f),
            "tiny2-q8 vs tiny2 at q8: {}",
            c["task"]
        );
    }
    eprintln!(
        "tiny2-q8 --dtype q8: {} cases, answers equal tiny2 --dtype q8",
        all.len()
    );
    let q8 = cli_run("tiny2-q8", case, &["--dtype", "q8"]);
    let h = cli_run("tiny2-q8", case, &["--dtype", "fp16"]);
    assert_eq!(h["dtype"], "fp16");
    let bytes = |v: &serde_json::Value| v["memory"]["weights_bytes"].as_u64().unwrap();
    assert!(bytes(&h) > bytes(&q8), "{} vs {}", bytes(&h), bytes(&q8));
    assert!(h["token_ids"].as_array().is_some_and(|a| !a.is_empty()));
}

/// An mlx-community style checkpoint (original names, channels-last convs, bf16) quantized the way the
/// converter does it (matrices from their bf16 values, everything else kept bf16), built in memory: loaded
/// as q4 it equals the bf16 fixture loaded as q4, tensor for tensor. The original layout's transposed
/// `image_projection` (permuted at load) cannot be a quantized tensor: a named error.
#[test]
fn mlx_bf16_layout_quantized_in_memory() {
    let gpu = weights_util::common::gpu();
    let dir = model_dir("tiny2-mlx-bf16");
    let src = std::fs::read(dir.join("model.safetensors")).unwrap();
    let HeaderState::Done(h) = parse_header(&src, "f").unwrap() else {
        panic!()
    };
    let mut tensors = Vec::new();
    let mut listed = Vec::new();
    for t in &h.tensors {
        let bytes =
            src[(h.data_start + t.start) as usize..(h.data_start + t.end) as usize].to_vec();
        let k = t.shape.last().copied().unwrap_or(0);
        let matrix = t.shape.len() == 2
            && t.name.ends_with(".weight")
            && !t.name.contains("embed_positions")
            && !t.name.contains("image_pos_embed")
            && k % 32 == 0;
        if matrix {
            assert_eq!(t.dtype.as_str(), "BF16");
            let vals: Vec<f32> = bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect();
            let mut rows = Vec::new();
            quant::quantize_rows(QFormat::Q4, k, &vals, &mut rows).unwrap();
            tensors.push(RawTensor {
                name: format!("{}.qweight", t.name),
                dtype: "U8".into(),
                shape: vec![t.shape[0], QFormat::Q4.row_bytes(k)],
                bytes: rows,
            });
            listed.push(t.name.clone());
        } else {
            tensors.push(RawTensor {
                name: t.name.clone(),
                dtype: t.dtype.as_str().into(),
                shape: t.shape.clone(),
                bytes,
            });
        }
    }
    assert!(listed.len() > 20, "{}", listed.len());
    let mut cfg = config_json(&dir);
    cfg["quantization"] = serde_json::json!({"format": "florence2-wasm-block", "bits": 4,
        "block_size": 32, "scale_dtype": "float16", "tensors": listed});
    let meta = Some(serde_json::json!({"format": "mlx"}));
    let files = mem_model(
        &cfg,
        &[(
            "model.safetensors",
            write_safetensors(&tensors, meta.clone()),
        )],
    );
    let (_, w) = pollster::block_on(load_files(
        &gpu,
        &files,
        LoadOptions::with_dtype(WeightDType::Q4),
    ))
    .unwrap();
    let (_, fw) = load_dir_with(&gpu, &dir, LoadOptions::with_dtype(WeightDType::Q4)).unwrap();
    let (a, b) = (readback_all(&gpu, &w), readback_all(&gpu, &fw));
    assert_eq!(a.len(), b.len());
    for (n, v) in &b {
        assert!(&a[n] == v, "{n}");
    }
    eprintln!(
        "mlx bf16 quantized in memory: {} tensors equal the fixture loaded as q4",
        a.len()
    );

    // `image_projection` (C, D), transposed on the GPU at load: not a quantizable matrix.
    let i = tensors
        .iter()
        .position(|t| t.name == "image_projection")
        .unwrap();
    let (c, d) = (tensors[i].shape[0], tensors[i].shape[1]);
    let k = d.max(32);
    tensors[i] = RawTensor {
        name: "image_projection.qweight".into(),
        dtype: "U8".into(),
        shape: vec![c, QFormat::Q4.row_bytes(k)],
        bytes: vec![0; c * QFormat::Q4.row_bytes(k)],
    };
    cfg["quantization"]["tensors"]
        .as_array_mut()
        .unwrap()
        .push("image_projection".into());
    let e = load_err(&gpu, &cfg, write_safetensors(&tensors, meta));
    quant_msg(&e, "not a matrix weight");
}
