//! The committed reference fixtures (`tests/fixtures/`, see its README) and the `florence2 run` CLI on them,
//! shared by the parity tests.

use std::path::{Path, PathBuf};

use serde_json::Value;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The reference cases of one fixture dir (`reference/<dir>/cases.json`).
pub fn cases(dir: &str) -> Vec<Value> {
    let path = fixtures().join("reference").join(dir).join("cases.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

/// A JSON array of token ids.
pub fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `florence2 run --json` on a fixture model dir and a reference case, with `extra` flags; the parsed JSON.
/// Weights are f32 (the reference precision) unless `extra` has a `--dtype`.
pub fn cli_run(dir: &str, case: &Value, extra: &[&str]) -> Value {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"));
    // The kernel tuner's cache goes under target/, not the user's cache directory.
    cmd.env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"));
    cmd.env("NODEVICE_SELECT", "1").args([
        "run",
        "--model",
        fixtures().join("models").join(dir).to_str().unwrap(),
        "--image",
        fixtures()
            .join("images")
            .join(case["image"].as_str().unwrap())
            .to_str()
            .unwrap(),
        "--task",
        case["task"].as_str().unwrap(),
        "--max-new-tokens",
        &case["max_new_tokens"].to_string(),
        "--json",
    ]);
    cmd.args(extra);
    if !extra.contains(&"--dtype") {
        cmd.args(["--dtype", "fp32"]);
    }
    let text_input = case["text_input"].as_str().unwrap();
    if !text_input.is_empty() {
        cmd.args(["--text", text_input]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{dir}: florence2 run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
