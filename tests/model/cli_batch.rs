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
    let mut child = command(tasks, args)
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

/// The `florence2 run` command of [`run`], not started.
fn command(tasks: &[&str], args: &[&str]) -> Command {
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
    cmd.args(args);
    cmd
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

/// 12 images in `d` (the 4 fixtures, 3 copies each under their own names: 24 answers for [`TASKS`])
/// and the `--images-from` list naming them; returns the list's path.
fn twelve_images(d: &Path) -> String {
    let mut paths = Vec::new();
    for copy in 0..3 {
        for name in ["scene.png", "grey.png", "scene.jpg", "rgba.png"] {
            let p = d.join(format!("{copy}-{name}"));
            std::fs::copy(image(name), &p).unwrap();
            paths.push(p.display().to_string());
        }
    }
    let list = d.join("list.txt");
    std::fs::write(&list, paths.join("\n") + "\n").unwrap();
    list.display().to_string()
}

/// `kill -9` at seeded random points of a batch (mid-line or between lines, wherever the output file
/// has grown past a seeded byte count), then `--resume`: in the end every (image, task) pair is answered
/// exactly once, every line is whole JSON, and the answers equal an uninterrupted run's.
#[test]
fn kill_9_at_random_points_then_resume_answers_each_pair_once() {
    let d = scratch("kill9");
    let out = d.join("out.jsonl");
    let out_s = out.display().to_string();
    let list_s = twelve_images(&d);
    let args = ["--images-from", list_s.as_str(), "--output", out_s.as_str()];
    let full = run(&TASKS, &args, "");
    assert!(full.status.success(), "{}", stderr(&full));
    let full_text = std::fs::read(&out).unwrap();
    let full_lines = lines(&full_text);
    assert_eq!(full_lines.len(), 24);
    let key = |v: &Value| (v["image"].to_string(), v["prompt"].to_string());

    let mut killed_mid_run = 0;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for seed in 0..4 {
        std::fs::remove_file(&out).unwrap();
        // A seeded point in (0, full size): the child is killed once the file has grown past it.
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(seed + 1);
        let at = 1 + (state >> 33) % (full_text.len() as u64 - 1);
        let mut child = command(&TASKS, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        loop {
            let len = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
            if len >= at || child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let cut = std::fs::read(&out).unwrap_or_default();
        if cut.len() < full_text.len() {
            killed_mid_run += 1;
        }
        let mut resume = args.to_vec();
        resume.push("--resume");
        let resumed = run(&TASKS, &resume, "");
        assert!(
            resumed.status.success(),
            "seed {seed}: {}",
            stderr(&resumed)
        );
        let text = std::fs::read(&out).unwrap();
        assert_eq!(text.last(), Some(&b'\n'), "seed {seed}: no torn last line");
        let after = lines(&text);
        assert_eq!(
            after.len(),
            24,
            "seed {seed} (killed at {} bytes)",
            cut.len()
        );
        let pairs: BTreeSet<_> = after.iter().map(key).collect();
        assert_eq!(pairs.len(), 24, "seed {seed}: each pair exactly once");
        for v in &after {
            let same = full_lines.iter().find(|f| key(f) == key(v)).unwrap();
            assert_same_answer(v, same, &format!("seed {seed}"));
        }
    }
    // The kills land before the end (the point is below the full size); should the child finish in
    // the moment between the file check and the kill, that seed still checks `--resume` on a whole file.
    assert!(killed_mid_run >= 1, "no kill landed mid-run");
}

/// A full disk while `--output` is written: a named error on stderr, exit status 1, the lines written
/// before it whole (a cut-off last line is what `--resume` drops), and `--resume` on a disk with room
/// completes the batch with the uninterrupted answers. The disk is an 8 KiB tmpfs mounted in a private
/// mount namespace (`unshare`; as root, else in a user namespace), so nothing outside the test sees it.
#[test]
fn a_full_disk_is_a_named_error_and_resume_completes() {
    let d = scratch("full_disk");
    let small = d.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let list_s = twelve_images(&d);
    let full_out = d.join("full.jsonl").display().to_string();
    let full = run(
        &TASKS,
        &["--images-from", &list_s, "--output", &full_out],
        "",
    );
    assert!(full.status.success(), "{}", stderr(&full));
    let full_lines = lines(&std::fs::read(&full_out).unwrap());
    assert!(
        std::fs::metadata(&full_out).unwrap().len() > 8192,
        "the batch must overflow 8 KiB"
    );

    // The same batch into an 8 KiB file system; what it wrote is copied out before the mount goes.
    let cmd = command(
        &TASKS,
        &["--images-from", &list_s, "--output", "$SMALL/out.jsonl"],
    );
    let mut script = format!(
        "mount -t tmpfs -o size=8k tmpfs \"$SMALL\" || exit 99; \"{}\"",
        env!("CARGO_BIN_EXE_florence2")
    );
    for a in cmd.get_args() {
        let a = a.to_str().unwrap();
        if a.starts_with("$SMALL") {
            script += &format!(" \"{a}\"");
        } else {
            script += &format!(" '{a}'");
        }
    }
    script += "; rc=$?; cp \"$SMALL/out.jsonl\" \"$OUT\"; exit $rc";
    let cut = d.join("cut.jsonl");
    let o = common::in_mount_namespace(&script)
        .env("SMALL", &small)
        .env("OUT", &cut)
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(99), "could not mount a tmpfs: {err}");
    assert_eq!(
        o.status.code(),
        Some(1),
        "a full disk is exit status 1: {err}"
    );
    assert!(
        err.contains("out.jsonl") && err.contains("No space left"),
        "{err}"
    );
    let text = std::fs::read(&cut).unwrap();
    assert!(
        !text.is_empty() && text.len() <= 8192,
        "{} bytes",
        text.len()
    );
    let whole = &text[..text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)];
    let kept = lines(whole);
    assert!(kept.len() < full_lines.len());

    // On a disk with room, --resume completes it: each pair once, the uninterrupted answers.
    let cut_s = cut.display().to_string();
    let resumed = run(
        &TASKS,
        &["--images-from", &list_s, "--output", &cut_s, "--resume"],
        "",
    );
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let after = lines(&std::fs::read(&cut).unwrap());
    let key = |v: &Value| (v["image"].to_string(), v["prompt"].to_string());
    assert_eq!(after.len(), full_lines.len());
    assert_eq!(
        after.iter().map(key).collect::<BTreeSet<_>>().len(),
        full_lines.len()
    );
    for v in &after {
        let same = full_lines.iter().find(|f| key(f) == key(v)).unwrap();
        assert_same_answer(v, same, "resumed after a full disk");
    }
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
