//! Every file the CLI opens goes through the byte-capped regular-file reader (src/files.rs): character
//! devices and FIFOs are refused by name instead of read forever (or waited on forever), and the shard
//! index, configs, tokenizer and image all have caps. Also: generation_config token ids are validated
//! against the vocabulary when the model is loaded. Hangs before the fix are caught by a 300 s guard
//! (a guard against a hang, not a speed assertion).
#![cfg(all(unix, not(target_arch = "wasm32")))]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fixtures::fixtures;
use florence2_wasm::Error;

fn temp_model(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("florence2-cli-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    // Every file of the tiny2 fixture, linked.
    for e in std::fs::read_dir(fixtures().join("models/tiny2")).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path(), d.join(e.file_name())).unwrap();
    }
    d
}

fn replace_with_fifo(p: &Path) {
    std::fs::remove_file(p).unwrap();
    assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
}

/// Run `florence2 run` and return (exit code, stderr); kill it and fail if it hangs.
fn run(model: &Path, image: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args(["run", "--model"])
        .arg(model)
        .arg("--image")
        .arg(image)
        .args([
            "--task",
            "<OD>",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!(
                "florence2 run hung on {} / {}",
                model.display(),
                image.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cli_refuses_devices_and_fifos_by_name() {
    let scene = fixtures().join("images/scene.png");
    // An image that is a character device (length 0, endless).
    let (code, err) = run(&fixtures().join("models/tiny2"), Path::new("/dev/zero"));
    assert_ne!(code, Some(0));
    assert!(err.contains("not a regular file"), "{err}");
    // A tokenizer.json that is a FIFO (opening it would wait for a writer forever).
    let d = temp_model("fifo");
    replace_with_fifo(&d.join("tokenizer.json"));
    let (code, err) = run(&d, &scene);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("tokenizer.json") && err.contains("not a regular file"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn model_files_that_are_not_regular_are_refused_by_the_loader() {
    let gpu = common::gpu();
    // config.json -> /dev/zero: it reported length 0 and was read without end.
    let d = temp_model("config");
    std::fs::remove_file(d.join("config.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("config.json")).unwrap();
    match florence2_wasm::weights::load_dir(&gpu, &d) {
        Err(Error::FileRead { msg, .. }) => assert!(msg.contains("not a regular file"), "{msg}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("loaded"),
    }
    std::fs::remove_dir_all(&d).unwrap();
    // model.safetensors as a FIFO: refused by name (it used to read as "no such file").
    let d = temp_model("weights");
    replace_with_fifo(&d.join("model.safetensors"));
    match florence2_wasm::weights::load_dir(&gpu, &d) {
        Err(Error::FileRead { msg, .. }) => assert!(msg.contains("not a regular file"), "{msg}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("loaded"),
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// A forced BOS id past the vocabulary is refused when the model is loaded, naming the setting (it used
/// to be fed to the GPU as an embedding row).
#[test]
fn generation_ids_outside_the_vocabulary_fail_at_load() {
    let d = temp_model("genids");
    std::fs::remove_file(d.join("generation_config.json")).unwrap();
    std::fs::write(
        d.join("generation_config.json"),
        r#"{"num_beams": 1, "forced_bos_token_id": 4000000}"#,
    )
    .unwrap();
    let (code, err) = run(&d, &fixtures().join("images/scene.png"));
    assert_ne!(code, Some(0));
    assert!(err.contains("forced_bos_token_id"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `florence2 run` with a stdout that cannot take the answer (`/dev/full`: every write fails with
/// ENOSPC): a named error and exit status 1, not a panic (status 101), as text and as `--json`.
#[test]
fn run_to_a_full_stdout_is_a_named_error() {
    let scene = fixtures().join("images/scene.png");
    for json in [false, true] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_florence2"));
        cmd.args(["run", "--device", "cpu", "--model"])
            .arg(fixtures().join("models/tiny2"))
            .arg("--image")
            .arg(&scene)
            .args([
                "--task",
                "<OD>",
                "--num-beams",
                "1",
                "--max-new-tokens",
                "2",
            ]);
        if json {
            cmd.arg("--json");
        }
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = cmd.stdout(full).stderr(Stdio::piped()).output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "json {json}: {err}");
        assert!(
            err.contains("florence2: writing stdout: No space left on device"),
            "json {json}: {err}"
        );
    }
}
