//! `florence2 run` over many images (src/bin/florence2/batch/): one JSON Lines object per (image, task),
//! answers identical to one-image runs, a bad image recorded as an error while the batch goes on (exit
//! status 1), `--resume` after a cut-off run, `--shard` slices that partition a directory, and
//! `--images-from` (a file or stdin). The tiny2 fixture, f32 weights, greedy, a few tokens.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::fixtures::fixtures;
use serde_json::Value;

const TASKS: [&str; 2] = ["<CAPTION>", "<OD>"];

fn image(name: &str) -> String {
    fixtures().join("images").join(name).display().to_string()
}

/// A scratch directory of its own per test.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli_batch_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `florence2 run` on tiny2 (f32, greedy, 6 new tokens) with the given tasks and `args`; `stdin` is fed
/// to it.
fn run(tasks: &[&str], args: &[&str], stdin: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_florence2"));
    cmd.env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .env("NODEVICE_SELECT", "1")
        .args(["run", "--model"])
        .arg(fixtures().join("models/tiny2"))
        .args([
            "--dtype",
            "fp32",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "6",
        ]);
    for t in tasks {
        cmd.args(["--task", t]);
    }
    let mut child = cmd
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn lines(text: &[u8]) -> Vec<Value> {
    std::str::from_utf8(text)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The one-image `--json` answers of `path` for [`TASKS`], in order.
fn single(path: &str) -> Vec<Value> {
    let o = run(&TASKS, &["--image", path, "--json"], "");
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice::<Value>(&o.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn assert_same_answer(got: &Value, want: &Value, what: &str) {
    for k in ["task", "token_ids", "generated_text", "result", "text"] {
        assert_eq!(got[k], want[k], "{what}: {k}");
    }
}

#[test]
fn a_batch_answers_like_single_runs_and_records_bad_images() {
    let d = scratch("errors");
    let not_image = d.join("notes.png");
    std::fs::write(&not_image, b"this is text, not a PNG").unwrap();
    let (scene, grey, jpg) = (image("scene.png"), image("grey.png"), image("scene.jpg"));
    let missing = d.join("missing.png").display().to_string();
    let not_image = not_image.display().to_string();
    let inputs = [&scene, &missing, &grey, &not_image, &jpg];
    let mut args = Vec::new();
    for i in inputs {
        args.extend(["--image", i.as_str()]);
    }
    let o = run(&TASKS, &args, "");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("2 of 5 image(s) had errors"),
        "{}",
        stderr(&o)
    );
    assert!(
        !stderr(&o).contains("ETA"),
        "no progress bar when stderr is not a terminal"
    );

    let got = lines(&o.stdout);
    let images: Vec<&str> = got.iter().map(|v| v["image"].as_str().unwrap()).collect();
    assert_eq!(
        images,
        [&scene, &scene, &missing, &grey, &grey, &not_image, &jpg, &jpg].map(String::as_str),
        "one line per (image, task) in input order; one error line per bad image"
    );
    assert_eq!(got[2]["error"]["name"], "Florence2LoadError", "{}", got[2]);
    assert_eq!(got[5]["error"]["name"], "Florence2ImageError", "{}", got[5]);
    assert!(got[5]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("image"));
    for (i, path) in [(0, &scene), (3, &grey), (6, &jpg)] {
        let want = single(path);
        for t in 0..2 {
            let v = &got[i + t];
            assert_eq!(v["prompt"], TASKS[t]);
            assert!(v.get("error").is_none());
            assert_same_answer(v, &want[t], path);
        }
        assert!(got[i + 1]["timings_ms"]["vision"].as_f64().unwrap() == 0.0);
    }
}

/// A run cut off mid-line (the last line half written) continues with `--resume`: each pair is
/// answered once in the end, the answers equal an uninterrupted run's, and a complete file makes
/// `--resume` do nothing.
#[test]
fn resume_continues_a_cut_off_run() {
    let d = scratch("resume");
    let out = d.join("out.jsonl");
    let out_s = out.display().to_string();
    let list = d.join("list.txt");
    let names = ["scene.png", "grey.png", "scene.jpg", "rgba.png"];
    let paths: Vec<String> = names.iter().map(|n| image(n)).collect();
    std::fs::write(&list, paths.join("\n") + "\n").unwrap();
    let list_s = list.display().to_string();
    let full = run(&TASKS, &["--images-from", &list_s, "--output", &out_s], "");
    assert!(full.status.success(), "{}", stderr(&full));
    assert!(full.stdout.is_empty(), "--output takes the lines");
    let text = std::fs::read_to_string(&out).unwrap();
    let full_lines = lines(text.as_bytes());
    assert_eq!(full_lines.len(), 8);

    // Keep 3 complete lines and half of the 4th.
    let cut: Vec<&str> = text.lines().collect();
    let kept = format!(
        "{}\n{}\n{}\n{}",
        cut[0],
        cut[1],
        cut[2],
        &cut[3][..cut[3].len() / 2]
    );
    std::fs::write(&out, kept).unwrap();
    let resumed = run(
        &TASKS,
        &["--images-from", &list_s, "--output", &out_s, "--resume"],
        "",
    );
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(
        stderr(&resumed).contains("3 answer(s) already"),
        "{}",
        stderr(&resumed)
    );
    assert!(
        stderr(&resumed).contains("3 image(s), 5 answer(s)"),
        "{}",
        stderr(&resumed)
    );
    let after = lines(std::fs::read_to_string(&out).unwrap().as_bytes());
    assert_eq!(after.len(), 8, "each pair once");
    let key = |v: &Value| (v["image"].to_string(), v["prompt"].to_string());
    let pairs: BTreeSet<_> = after.iter().map(key).collect();
    assert_eq!(pairs.len(), 8);
    for v in &after {
        let same = full_lines.iter().find(|f| key(f) == key(v)).unwrap();
        assert_same_answer(v, same, "resumed");
    }
    // Nothing left: no model load, nothing appended.
    let again = run(
        &TASKS,
        &["--images-from", &list_s, "--output", &out_s, "--resume"],
        "",
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("nothing to run"),
        "{}",
        stderr(&again)
    );
    assert_eq!(
        lines(std::fs::read_to_string(&out).unwrap().as_bytes()).len(),
        8
    );
}

/// `--shard i/3` over a directory (recursive) gives disjoint slices whose union is the whole listing, in
/// listing order; the same list from stdin (`--images-from -`) shards identically.
#[test]
fn shards_partition_a_directory() {
    let d = scratch("shards");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    let names = ["a.png", "b.jpg", "c.png", "sub/d.png", "e.png"];
    let sources = [
        "scene.png",
        "scene.jpg",
        "grey.png",
        "rgba.png",
        "scene.png",
    ];
    for (n, s) in names.iter().zip(sources) {
        std::fs::copy(fixtures().join("images").join(s), d.join(n)).unwrap();
    }
    std::fs::write(d.join("readme.txt"), b"not listed").unwrap();
    let dir = d.display().to_string();
    let listing: Vec<String> = ["a.png", "b.jpg", "c.png", "e.png", "sub/d.png"]
        .iter()
        .map(|n| Path::new(&dir).join(n).display().to_string())
        .collect();
    let flat = run(&["<CAPTION>"], &["--image", &dir], "");
    assert!(flat.status.success(), "{}", stderr(&flat));
    let flat: Vec<Value> = lines(&flat.stdout);
    assert_eq!(flat.len(), 4, "not recursive: sub/ is skipped");

    let mut union = Vec::new();
    for i in 0..3 {
        let shard = format!("{i}/3");
        let o = run(
            &["<CAPTION>"],
            &["--image", &dir, "--recursive", "--shard", &shard],
            "",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let got: Vec<String> = lines(&o.stdout)
            .iter()
            .map(|v| v["image"].as_str().unwrap().to_string())
            .collect();
        let want: Vec<String> = listing.iter().skip(i).step_by(3).cloned().collect();
        assert_eq!(got, want, "shard {shard}");
        union.extend(got);
        if i == 1 {
            let from_stdin = run(
                &["<CAPTION>"],
                &["--images-from", "-", "--shard", &shard],
                &(listing.join("\n") + "\n"),
            );
            assert!(from_stdin.status.success(), "{}", stderr(&from_stdin));
            let answers = |out: &[u8]| -> Vec<(Value, Value)> {
                lines(out)
                    .into_iter()
                    .map(|v| (v["image"].clone(), v["token_ids"].clone()))
                    .collect()
            };
            assert_eq!(
                answers(&from_stdin.stdout),
                answers(&o.stdout),
                "stdin list, same shard"
            );
        }
    }
    union.sort();
    let mut all = listing.clone();
    all.sort();
    assert_eq!(union, all);
}
