//! Load-time error paths (named errors) and sharded checkpoints, through the ranged loader on in-memory
//! model directories.
#![cfg(not(target_arch = "wasm32"))]

use crate::weights_util;

use florence2_wasm::Error;
use weights_util::*;

fn tiny_raw(seed: u64, dt: Dt) -> (Canon, Vec<RawTensor>) {
    let cfg = tiny_config();
    let canon = canonical_tensors(&cfg, seed);
    let raw = variant_tensors(&canon, Variant::HfNative, dt);
    (canon, raw)
}

fn load_err(files: &florence2_wasm::weights::MemFiles) -> Error {
    let e = load_mem(&gpu(), files).map(|_| ()).unwrap_err();
    assert_eq!(e.name(), "Florence2LoadError", "{e}");
    e
}

const QKV: &str = "model.vision_tower.blocks.1.0.spatial_block.window_attn.qkv.weight";

#[test]
fn truncated_and_bad_headers() {
    let (_, raw) = tiny_raw(1, Dt::F32);
    let f = write_safetensors(&raw, None);
    let cfg = tiny_config_json();
    let e = load_err(&mem_model(
        &cfg,
        &[("model.safetensors", f[..f.len() - 1].to_vec())],
    ));
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    let e = load_err(&mem_model(
        &cfg,
        &[("model.safetensors", f[..100].to_vec())],
    ));
    assert!(matches!(e, Error::SafetensorsHeader { .. }), "{e}");
    let e = load_err(&mem_model(&cfg, &[("model.safetensors", vec![1, 2, 3])]));
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    let e = load_err(&mem_model(
        &cfg,
        &[("model.safetensors", raw_file("nope", &[]))],
    ));
    assert!(matches!(e, Error::SafetensorsHeader { .. }), "{e}");
}

#[test]
fn wrong_dtype_shape_missing() {
    let cfg = tiny_config_json();
    // A needed tensor stored as I32: UnsupportedDtype naming it.
    let (_, mut raw) = tiny_raw(2, Dt::F32);
    let t = raw.iter_mut().find(|t| t.name == QKV).unwrap();
    t.dtype = "I32".into();
    match load_err(&mem_model(
        &cfg,
        &[("model.safetensors", write_safetensors(&raw, None))],
    )) {
        Error::UnsupportedDtype { name, dtype } => {
            assert_eq!((name.as_str(), dtype.as_str()), (QKV, "I32"))
        }
        e => panic!("{e}"),
    }
    // An unneeded tensor in an unsupported dtype is fine.
    let (_, mut raw) = tiny_raw(2, Dt::F32);
    raw.push(RawTensor {
        name: "position_ids".into(),
        dtype: "I64".into(),
        shape: vec![2],
        bytes: vec![0; 16],
    });
    load_mem(
        &gpu(),
        &mem_model(
            &cfg,
            &[("model.safetensors", write_safetensors(&raw, None))],
        ),
    )
    .unwrap();

    // Wrong shape (same element count, transposed).
    let (_, mut raw) = tiny_raw(3, Dt::F16);
    let t = raw.iter_mut().find(|t| t.name == QKV).unwrap();
    t.shape = vec![t.shape[1], t.shape[0]];
    match load_err(&mem_model(
        &cfg,
        &[("model.safetensors", write_safetensors(&raw, None))],
    )) {
        Error::TensorShape {
            name,
            expected,
            got,
        } => {
            assert_eq!(name, QKV);
            assert_eq!(expected, vec![36, 12]);
            assert_eq!(got, vec![12, 36]);
        }
        e => panic!("{e}"),
    }
    // Missing tensor.
    let (_, mut raw) = tiny_raw(4, Dt::BF16);
    raw.retain(|t| t.name != QKV);
    match load_err(&mem_model(
        &cfg,
        &[("model.safetensors", write_safetensors(&raw, None))],
    )) {
        Error::MissingTensor { name } => assert_eq!(name, QKV),
        e => panic!("{e}"),
    }
    // Missing shared embedding: no head to tie either.
    let (_, mut raw) = tiny_raw(4, Dt::F32);
    raw.retain(|t| !t.name.ends_with("shared.weight"));
    assert!(matches!(
        load_err(&mem_model(
            &cfg,
            &[("model.safetensors", write_safetensors(&raw, None))]
        )),
        Error::MissingTensor { .. }
    ));
}

#[test]
fn missing_files_and_bad_config() {
    let (_, raw) = tiny_raw(5, Dt::F32);
    let f = write_safetensors(&raw, None);
    let mut m = florence2_wasm::weights::MemFiles::new();
    m.insert("model.safetensors", f.clone());
    assert!(matches!(load_err(&m), Error::FileRead { .. }));
    let e = load_err(&mem_model(&tiny_config_json(), &[]));
    assert!(matches!(e, Error::FileRead { .. }), "{e}");
    let mut bad = tiny_config_json();
    bad["text_config"]["d_model"] = serde_json::json!(17);
    assert!(matches!(
        load_err(&mem_model(&bad, &[("model.safetensors", f)])),
        Error::Config(_)
    ));
}

fn shards(raw: &[RawTensor]) -> (Vec<u8>, Vec<u8>, serde_json::Value) {
    let (a, b) = raw.split_at(raw.len() / 2);
    let mut wm = serde_json::Map::new();
    for t in a {
        wm.insert(t.name.clone(), "model-00001-of-00002.safetensors".into());
    }
    for t in b {
        wm.insert(t.name.clone(), "model-00002-of-00002.safetensors".into());
    }
    (
        write_safetensors(a, None),
        write_safetensors(b, None),
        serde_json::json!({"metadata": {"total_size": 0}, "weight_map": wm}),
    )
}

#[test]
fn sharded_f16_loads_exactly() {
    let (canon, raw) = tiny_raw(6, Dt::F16);
    let (a, b, idx) = shards(&raw);
    let files = mem_model(
        &tiny_config_json(),
        &[
            ("model-00001-of-00002.safetensors", a),
            ("model-00002-of-00002.safetensors", b),
            ("model.safetensors.index.json", idx.to_string().into_bytes()),
        ],
    );
    let (_, w) = load_mem(&gpu(), &files).unwrap();
    let got = readback_all(&gpu(), &w);
    for (n, _, v) in &canon {
        let want: Vec<f32> = v.iter().map(|&x| Dt::F16.round(x)).collect();
        assert_eq!(got[n], want, "{n}");
    }
}

#[test]
fn bad_index_json() {
    let (_, raw) = tiny_raw(7, Dt::F32);
    let (a, b, idx) = shards(&raw);
    let first = raw[0].name.clone();
    let base = |idx: serde_json::Value| {
        mem_model(
            &tiny_config_json(),
            &[
                ("model-00001-of-00002.safetensors", a.clone()),
                ("model-00002-of-00002.safetensors", b.clone()),
                ("model.safetensors.index.json", idx.to_string().into_bytes()),
            ],
        )
    };
    let with = |shard: &str| {
        let mut i = idx.clone();
        i["weight_map"][&first] = shard.into();
        i
    };
    for (what, i) in [
        ("traversal", with("../model-00001-of-00002.safetensors")),
        ("absolute", with("/etc/model.safetensors")),
        ("backslash", with("..\\x.safetensors")),
        ("drive", with("C:x.safetensors")),
        ("dot dir", with("./model-00001-of-00002.safetensors")),
        (
            "inner traversal",
            with("sub/../model-00001-of-00002.safetensors"),
        ),
        ("query", with("model.safetensors?x=1.safetensors")),
        ("percent", with("%2e%2e/x.safetensors")),
        ("empty component", with("sub//x.safetensors")),
        ("not safetensors", with("config.json")),
        ("no weight_map", serde_json::json!({"metadata": {}})),
        ("empty weight_map", serde_json::json!({"weight_map": {}})),
        (
            "non-string shard",
            serde_json::json!({"weight_map": {"a": 5}}),
        ),
    ] {
        match load_err(&base(i)) {
            Error::CheckpointIndex { .. } => {}
            e => panic!("{what}: {e}"),
        }
    }
    // Non-JSON.
    let mut m = base(idx.clone());
    m.insert("model.safetensors.index.json", b"{oops".to_vec());
    assert!(matches!(load_err(&m), Error::CheckpointIndex { .. }));
    // A shard that does not exist.
    let e = load_err(&base(with("model-00003-of-00002.safetensors")));
    assert!(
        matches!(e, Error::CheckpointIndex { ref msg, .. } if msg.contains("does not exist")),
        "{e}"
    );
    // A tensor the index places in the wrong shard.
    let e = load_err(&base(with("model-00002-of-00002.safetensors")));
    assert!(
        matches!(e, Error::CheckpointIndex { ref msg, .. } if msg.contains("not there")),
        "{e}"
    );
}

#[test]
fn shard_name_rules() {
    use florence2_wasm::weights::source::check_relative_name;
    for ok in [
        "model.safetensors",
        "model-00001-of-00002.safetensors",
        "sub/dir/x_1.safetensors",
    ] {
        assert!(check_relative_name(ok), "{ok}");
    }
    for bad in [
        "",
        "/abs.safetensors",
        "../x",
        "a/../../x",
        "a\\b",
        "c:x",
        "a b",
        "a#b",
        "x\0",
        "a/./b",
    ] {
        assert!(!check_relative_name(bad), "{bad}");
    }
}

#[test]
fn dir_loader_refuses_traversal_on_disk() {
    // A real directory whose index points outside it: refused before any file is opened.
    let root = std::env::temp_dir().join(format!("f2w-weights-{}-trav", std::process::id()));
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    let (_, raw) = tiny_raw(8, Dt::F32);
    std::fs::write(
        root.join("outside.safetensors"),
        write_safetensors(&raw, None),
    )
    .unwrap();
    std::fs::write(dir.join("config.json"), tiny_config_json().to_string()).unwrap();
    let mut wm = serde_json::Map::new();
    for t in &raw {
        wm.insert(t.name.clone(), "../outside.safetensors".into());
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"weight_map": wm}).to_string(),
    )
    .unwrap();
    let e = florence2_wasm::weights::load_dir(&gpu(), &dir)
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, Error::CheckpointIndex { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}
