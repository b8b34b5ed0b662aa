//! The `florence2` command line's contract with the shell: a closed stdout ends the process quietly with
//! status 141 (128 + SIGPIPE, as for the tools that die of SIGPIPE; never a panic's 101), an input set
//! without images is a usage error (exit 2) saying what was looked for, files that are not images are
//! named on stderr, `--image -` reads one image's bytes from stdin, and a task's name (`od`) means its
//! marker (`<OD>`) for `run` as for `parse`. The tiny2 fixture, f32 weights, greedy, a few tokens.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::fixtures::fixtures;
use serde_json::Value;

/// What a shell reports for a process that ends on a closed stdout.
const EXIT_STDOUT_CLOSED: i32 = 141;

fn florence2() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_florence2"));
    cmd.env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .env("NODEVICE_SELECT", "1");
    cmd
}

/// `florence2 run` on tiny2 (f32, greedy, 6 new tokens) with `args`.
fn run_cmd(args: &[&str]) -> Command {
    let mut cmd = florence2();
    cmd.args(["run", "--model"])
        .arg(fixtures().join("models/tiny2"))
        .args([
            "--dtype",
            "fp32",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "6",
        ])
        .args(args);
    cmd
}

/// Runs `cmd` with `stdin` fed to it and stdout/stderr captured.
fn output(mut cmd: Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A process that fails before reading stdin closes it: a broken pipe here is not the test's concern.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

/// Runs `cmd` with a stdout whose reading end is already closed (so its first write finds no reader,
/// deterministically, unlike `| head -c1`).
fn closed_stdout(mut cmd: Command) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn image(name: &str) -> PathBuf {
    fixtures().join("images").join(name)
}

/// A scratch directory of its own per test.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli_contract_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn assert_quiet_close(o: &Output, what: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(EXIT_STDOUT_CLOSED), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(!err.contains("Broken pipe"), "{what}: {err}");
}

#[test]
fn a_closed_stdout_ends_quietly_with_141() {
    let mut parse = florence2();
    parse.args(["parse", "--task", "od", "--image-size", "100,100", "--json"]);
    parse.args(["--text", "</s><s>cat<loc_1><loc_2><loc_3><loc_4></s>"]);
    assert_quiet_close(&closed_stdout(parse), "parse --json");

    let mut help = florence2();
    help.args(["estimate", "--help"]);
    assert_quiet_close(&closed_stdout(help), "estimate --help");

    let mut estimate = florence2();
    estimate.args(["estimate", "--device", "cpu", "--model"]);
    estimate.arg(fixtures().join("models/tiny2"));
    assert_quiet_close(&closed_stdout(estimate), "estimate");

    let scene = image("scene.png");
    let run = run_cmd(&[
        "--task",
        "<OD>",
        "--json",
        "--image",
        scene.to_str().unwrap(),
    ]);
    assert_quiet_close(&closed_stdout(run), "run --json");

    let run = run_cmd(&[
        "--task",
        "<OD>",
        "--jsonl",
        "--image",
        scene.to_str().unwrap(),
    ]);
    assert_quiet_close(&closed_stdout(run), "run --jsonl");
}

#[test]
fn a_folder_without_images_is_a_usage_error_and_other_files_are_named() {
    let d = scratch("no_images");
    for f in ["photo.avif", "photo.heic", "notes.txt"] {
        std::fs::write(d.join(f), b"not an image").unwrap();
    }
    let o = output(
        run_cmd(&["--task", "<OD>", "--image", d.to_str().unwrap()]),
        b"",
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty());
    assert!(err.contains("no images to run"), "{err}");
    assert!(
        err.contains(".png, .jpg, .jpeg, .webp, .gif, .bmp"),
        "{err}"
    );
    assert!(err.contains("not recursively"), "{err}");
    assert!(err.contains("skipped 3 file(s)"), "{err}");
    for f in ["photo.avif", "photo.heic", "notes.txt"] {
        assert!(err.contains(f), "{f}: {err}");
    }

    // With one image among them the batch runs, and still names what it skipped.
    std::fs::copy(image("scene.png"), d.join("scene.png")).unwrap();
    let o = output(
        run_cmd(&["--task", "<OD>", "--image", d.to_str().unwrap()]),
        b"",
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1);
    assert!(
        err.contains("skipped 3 file(s)") && err.contains("photo.avif"),
        "{err}"
    );
}

#[test]
fn image_dash_reads_stdin_and_task_names_mean_their_markers() {
    let scene = image("scene.png");
    let o = output(
        run_cmd(&[
            "--task",
            "<OD>",
            "--json",
            "--image",
            scene.to_str().unwrap(),
        ]),
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let want: Value = serde_json::from_slice(&o.stdout).unwrap();

    let bytes = std::fs::read(&scene).unwrap();
    let o = output(run_cmd(&["--task", "od", "--json", "--image", "-"]), &bytes);
    assert!(o.status.success(), "{}", stderr(&o));
    let got: Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in ["task", "token_ids", "generated_text", "result", "text"] {
        assert_eq!(got[k], want[k], "{k}");
    }
    assert_eq!(got["task"], "<OD>");

    // Empty stdin is not an image: the image's error, not a panic.
    let o = output(run_cmd(&["--task", "OD", "--image", "-"]), b"");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    // A name that is no task is a usage error naming the valid markers.
    let o = output(run_cmd(&["--task", "describe", "--image", "-"]), b"");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not a task") && err.contains("<OD>"), "{err}");
}
