//! PyTorch checkpoints (`tests/fixtures/models/*-pt*`, made by `scripts/fixtures/make_pickle_fixtures.py`): each
//! pickle twin (HF-native zip with tied aliases, original-layout zip shards with an index, original-layout
//! legacy stream with a tensor at a storage offset) loads to exactly its safetensors twin's GPU tensors,
//! read by ranges or streamed in random chunks, in f32 and f16; hostile and damaged files are named
//! errors, never a panic, and nothing in them runs.
#![cfg(not(target_arch = "wasm32"))]

use crate::weights_util;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use florence2_wasm::error::Error;
use florence2_wasm::gpu::Device;
use florence2_wasm::weights::{
    detect_layout, load_config, load_dir_with, load_torch_source, Assembler, DirFiles, FileSource,
    LoadOptions, MemSource, TorchStreamLoader, WeightDType, Weights,
};
use weights_util::*;

/// (pickle twin, safetensors twin).
const TWINS: [(&str, &str); 3] = [
    ("tiny2-pt", "tiny2"),
    ("tiny2-orig-pt-sharded", "tiny2-orig"),
    ("tiny2-orig-pt-legacy", "tiny2-orig"),
];

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(name)
}

/// The checkpoint's files and the tensors an index places in each (`pytorch_model.bin` alone when
/// there is no index).
fn torch_files(dir: &Path) -> Vec<(String, Vec<String>)> {
    let Ok(b) = std::fs::read(dir.join("pytorch_model.bin.index.json")) else {
        return vec![("pytorch_model.bin".into(), vec![])];
    };
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    let mut shards: Vec<(String, Vec<String>)> = Vec::new();
    for (name, shard) in v["weight_map"].as_object().unwrap() {
        let shard = shard.as_str().unwrap();
        match shards.iter_mut().find(|(s, _)| s == shard) {
            Some((_, names)) => names.push(name.clone()),
            None => shards.push((shard.to_owned(), vec![name.clone()])),
        }
    }
    shards.sort();
    shards
}

fn assembler(gpu: &Arc<Device>, dir: &Path, dtype: WeightDType) -> Assembler {
    let cfg = pollster::block_on(load_config(&DirFiles::new(dir))).unwrap();
    let mut asm = Assembler::new(gpu, &cfg, LoadOptions::with_dtype(dtype));
    let files = torch_files(dir);
    if files.len() > 1 {
        let names = files.iter().flat_map(|(_, n)| n.iter().map(String::as_str));
        asm.set_layout(detect_layout(names));
    }
    asm
}

/// Ranged reads through [`load_torch_source`].
fn load_ranged(gpu: &Arc<Device>, dir: &Path, dtype: WeightDType) -> Result<Weights, Error> {
    let mut asm = assembler(gpu, dir, dtype);
    for (file, names) in torch_files(dir) {
        let mut src = FileSource::open(&dir.join(&file))?;
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        pollster::block_on(load_torch_source(&mut asm, &mut src, &names))?;
    }
    asm.finish()
}

/// Pushed in random chunks of 1..=max bytes through [`TorchStreamLoader`].
fn load_streamed(
    gpu: &Arc<Device>,
    dir: &Path,
    dtype: WeightDType,
    seed: u64,
    max: u64,
) -> Weights {
    let mut asm = assembler(gpu, dir, dtype);
    let mut rng = Rng::new(seed);
    for (file, names) in torch_files(dir) {
        let bytes = std::fs::read(dir.join(&file)).unwrap();
        let mut s = TorchStreamLoader::new(&file, Some(bytes.len() as u64)).expect_names(names);
        let mut off = 0;
        while off < bytes.len() {
            let n = (1 + (rng.next_u64() % max) as usize).min(bytes.len() - off);
            s.feed(&mut asm, &bytes[off..off + n]).unwrap();
            off += n;
        }
        s.finish(&mut asm).unwrap();
    }
    asm.finish().unwrap()
}

#[test]
fn pickle_twins_equal_their_safetensors_twins() {
    let gpu = gpu();
    for (pt, st) in TWINS {
        for dtype in [WeightDType::Fp32, WeightDType::Fp16] {
            let (_, w) =
                load_dir_with(&gpu, &model_dir(st), LoadOptions::with_dtype(dtype)).unwrap();
            let want = readback_all(&gpu, &w);
            drop(w);
            let dir = model_dir(pt);
            let ranged = load_ranged(&gpu, &dir, dtype).unwrap_or_else(|e| panic!("{pt}: {e}"));
            let got = readback_all(&gpu, &ranged);
            drop(ranged);
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                want.keys().collect::<Vec<_>>(),
                "{pt}"
            );
            for (name, v) in &want {
                assert!(got[name] == *v, "{pt} {dtype}: {name} differs from {st}'s");
            }
            let streamed = load_streamed(&gpu, &dir, dtype, 5, 4099);
            assert!(
                readback_all(&gpu, &streamed) == want,
                "{pt} {dtype}: streamed"
            );
            eprintln!(
                "{pt} {dtype}: {} tensors equal to {st}'s (ranged and streamed)",
                want.len()
            );
        }
    }
}

/// A checkpoint's first file with `from` replaced by `to` in its bytes.
fn patched(pt: &str, from: &[u8], to: &[u8]) -> Vec<u8> {
    let dir = model_dir(pt);
    let (file, _) = torch_files(&dir).remove(0);
    let b = std::fs::read(dir.join(file)).unwrap();
    let at = b
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern");
    [&b[..at], to, &b[at + from.len()..]].concat()
}

fn load_bytes(gpu: &Arc<Device>, pt: &str, bytes: Vec<u8>) -> Result<(), Error> {
    let dir = model_dir(pt);
    let mut asm = assembler(gpu, &dir, WeightDType::Fp32);
    let mut src = MemSource::new("pytorch_model.bin", bytes);
    pollster::block_on(load_torch_source(&mut asm, &mut src, &[]))
}

#[test]
fn hostile_pickles_are_refused_by_name_without_running() {
    let gpu = gpu();
    let marker = std::env::temp_dir().join(format!("florence2-pickle-ran-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let rebuild = b"ctorch._utils\n_rebuild_tensor_v2\n";
    for pt in ["tiny2-pt", "tiny2-orig-pt-legacy"] {
        for (global, name) in [
            (&b"cos\nsystem\n"[..], "os.system"),
            (b"cposix\nsystem\n", "posix.system"),
            (b"cbuiltins\neval\n", "builtins.eval"),
            (b"c__builtin__\nexec\n", "__builtin__.exec"),
        ] {
            match load_bytes(&gpu, pt, patched(pt, rebuild, global)) {
                Err(Error::PickleGlobal { name: n, .. }) => assert_eq!(n, name, "{pt}"),
                r => panic!("{pt} {name}: {r:?}"),
            }
        }
        // `__reduce__` of a foreign callable with a shell command: refused at its name.
        let cmd = format!("touch {}", marker.display());
        let mut evil = b"cos\nsystem\nX".to_vec();
        evil.extend((cmd.len() as u32).to_le_bytes());
        evil.extend(cmd.as_bytes());
        evil.extend(b"\x85R0");
        evil.extend(rebuild);
        let e = load_bytes(&gpu, pt, patched(pt, rebuild, &evil)).unwrap_err();
        assert!(matches!(e, Error::PickleGlobal { .. }), "{e}");
        // Instantiating opcodes: INST of a foreign class.
        let e = load_bytes(&gpu, pt, patched(pt, rebuild, b"(ios\nsystem\n")).unwrap_err();
        assert!(matches!(e, Error::PickleRefused { .. }), "{e}");
    }
    assert!(!marker.exists(), "the pickle ran a command");
}

#[test]
fn damaged_checkpoints_are_named_errors() {
    let gpu = gpu();
    for (pt, _) in TWINS {
        let dir = model_dir(pt);
        let (file, _) = torch_files(&dir).remove(0);
        let b = std::fs::read(dir.join(file)).unwrap();
        let mut rng = Rng::new(3);
        for i in 0..24 {
            let mut d = b.clone();
            let kind = if i % 2 == 0 { "cut" } else { "garbled" };
            if i % 2 == 0 {
                d.truncate((rng.next_u64() % b.len() as u64) as usize);
            } else {
                for _ in 0..4 {
                    let at = (rng.next_u64() % 2048.min(b.len() as u64)) as usize;
                    d[at] ^= 1 + (rng.next_u64() % 255) as u8;
                }
            }
            // Damage inside storage data changes values but stays loadable; anywhere else it is a
            // named load error, never a panic.
            if let Err(e) = load_bytes(&gpu, pt, d) {
                assert_eq!(e.name(), "Florence2LoadError", "{pt} {kind}: {e}");
            } else {
                assert_eq!(kind, "garbled", "{pt}: a truncated file loaded");
            }
        }
    }
}

/// `florence2 run --model DIR` on a directory holding only a PyTorch checkpoint (found after
/// `model.safetensors` and its index: `pytorch_model.bin`, else `pytorch_model.bin.index.json`): the
/// twin's reference greedy ids and text.
#[test]
fn cli_runs_pickle_checkpoints_with_the_twins_greedy_answers() {
    use common::fixtures::{cases, cli_run, ids_of};
    for (pt, st) in TWINS {
        for case in cases(st).iter().take(2) {
            let r = &case["results"]["greedy"];
            let j = cli_run(pt, case, &["--num-beams", "1"]);
            let what = format!("{pt} {} {}", case["image"], case["prompt"]);
            assert_eq!(ids_of(&j["token_ids"]), ids_of(&r["token_ids"]), "{what}");
            assert_eq!(j["generated_text"], r["text"], "{what}");
            eprintln!("{what}: the twin's greedy answer");
        }
    }
}
