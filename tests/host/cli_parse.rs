//! The built `florence2 parse` binary: reference-shaped JSON, the rendering, stdin, usage errors.
#![cfg(not(target_arch = "wasm32"))]

use std::io::Write;
use std::process::{Command, Stdio};

use florence2_wasm::postprocess::{post_process_generation, MarkedTask};
use florence2_wasm::processor::prompt::Task;
use florence2_wasm::render::render;

const BIN: &str = env!("CARGO_BIN_EXE_florence2");
const OD_TEXT: &str =
    "</s><s>cat<loc_26><loc_112><loc_497><loc_982>cat<loc_541><loc_53><loc_998><loc_776>\
                       remote<loc_63><loc_153><loc_274><loc_243></s>";

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn parse_prints_the_rendering() {
    let (code, stdout, stderr) = run(&[
        "parse",
        "--task",
        "<OD>",
        "--image-size",
        "640,480",
        "--text",
        OD_TEXT,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "cat: [17.0, 54.0, 318.4, 471.6]\ncat: [346.6, 25.7, 639.0, 372.7]\nremote: [40.6, 73.7, 175.7, 116.9]\n"
    );
}

#[test]
fn parse_json_is_exactly_the_library_result() {
    for task in Task::ALL {
        let (code, stdout, stderr) = run(&[
            "parse",
            "--task",
            &task.marker()[1..task.marker().len() - 1],
            "--image-size",
            "640x480",
            "--json",
            "--text",
            OD_TEXT,
        ]);
        assert_eq!(code, 0, "{stderr}");
        let got: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let expected = post_process_generation(OD_TEXT, task, (640, 480)).unwrap();
        assert_eq!(got["task"], task.marker());
        assert_eq!(got["result"], expected.to_json(task), "{task}");
        assert_eq!(got["text"], render(&expected), "{task}");
        let obj = got["result"].as_object().unwrap();
        assert_eq!(obj.len(), 1);
        assert!(obj.contains_key(task.marker()));
    }
}

#[test]
fn parse_takes_a_whole_prompt_as_task() {
    let (code, stdout, stderr) = run(&[
        "parse",
        "--task",
        "<OPEN_VOCABULARY_DETECTION>a cat",
        "--image-size",
        "1000,1000",
        "--json",
        "--text",
        "</s><s>a cat<loc_1><loc_2><loc_3><loc_4></s>",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let got: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        got["result"],
        serde_json::json!({"<OPEN_VOCABULARY_DETECTION>": {
            "bboxes": [[1.5, 2.5, 3.5, 4.5]], "bboxes_labels": ["a cat"], "polygons": [], "polygons_labels": []
        }})
    );
    // An invalid prompt is still a usage error.
    let (code, _, _) = run(&[
        "parse",
        "--task",
        "<OPEN_VOCABULARY_DETECTION>a <s>",
        "--image-size",
        "1,1",
        "--text",
        "",
    ]);
    assert_eq!(code, 2);
}

/// A marker that is not built in is pure text, keyed by the marker, as the reference's
/// `post_process_generation` answers a task it does not know; built-in tasks keep their rules.
#[test]
fn parse_treats_an_unknown_marker_as_pure_text() {
    let pure = post_process_generation(OD_TEXT, Task::Caption, (640, 480)).unwrap();
    for task in ["<NOPE>", "<MY_TASK>some input", "<od>"] {
        let (code, stdout, stderr) = run(&[
            "parse",
            "--task",
            task,
            "--image-size",
            "640,480",
            "--json",
            "--text",
            OD_TEXT,
        ]);
        assert_eq!(code, 0, "{task}: {stderr}");
        let got: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let marker = &task[..=task.find('>').unwrap()];
        assert_eq!(got["task"], marker);
        assert_eq!(got["result"], pure.to_json_keyed(marker), "{task}");
        assert_eq!(
            got["result"][marker],
            "cat<loc_26><loc_112><loc_497><loc_982>cat<loc_541><loc_53><loc_998><loc_776>\
             remote<loc_63><loc_153><loc_274><loc_243>"
        );
    }
    // the library: built-in markers, names and prompts keep their task; other markers are pure text
    let od = MarkedTask::parse("OD").unwrap();
    assert_eq!((od.marker.as_str(), od.task), ("<OD>", Task::Od));
    let ovd = MarkedTask::parse("<OPEN_VOCABULARY_DETECTION>a cat").unwrap();
    assert_eq!(ovd.task, Task::OpenVocabularyDetection);
    let mine = MarkedTask::parse("<MY_TASK>").unwrap();
    assert_eq!(
        (mine.marker.as_str(), mine.task),
        ("<MY_TASK>", Task::Caption)
    );
    assert_eq!(
        mine.post_process(OD_TEXT, (640, 480)).unwrap(),
        pure,
        "an unknown marker's answer is the pure-text answer"
    );
    // a built-in marker with a bad input, and text without a marker, stay errors
    for bad in ["<OD>cat", "NOPE", "<NO PE>", "", "<>"] {
        assert!(MarkedTask::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn parse_reads_stdin() {
    let mut child = Command::new(BIN)
        .args([
            "parse",
            "--task",
            "CAPTION",
            "--image-size",
            "1,1",
            "--text",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"</s><s>Two cats.</s>")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "Two cats.\n");
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec![
            "parse",
            "--task",
            "NOPE",
            "--image-size",
            "1,1",
            "--text",
            "x",
        ],
        vec![
            "parse",
            "--task",
            "<NO PE>",
            "--image-size",
            "1,1",
            "--text",
            "x",
        ],
        vec![
            "parse",
            "--task",
            "OD",
            "--image-size",
            "0,5",
            "--text",
            "x",
        ],
        vec!["parse", "--task", "OD", "--image-size", "12", "--text", "x"],
        vec!["parse", "--task", "OD", "--image-size", "1,1"],
        vec![
            "parse",
            "--task",
            "OD",
            "--image-size",
            "1,1",
            "--text",
            "x",
            "--bogus",
        ],
        vec!["frobnicate"],
        vec![],
    ] {
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert!(stderr.contains("usage:"), "{stderr}");
    }
}

/// `florence2 run` names its errors as the JS package does (`Florence2LoadError: ...`).
#[test]
fn run_errors_are_named() {
    let missing = std::env::temp_dir().join("florence2-no-such-model-dir");
    let (code, _stdout, stderr) = run(&[
        "run",
        "--model",
        missing.to_str().unwrap(),
        "--image",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/images/scene.png"
        ),
        "--task",
        "<CAPTION>",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("florence2: Florence2LoadError: cannot read ")
            && stderr.contains("no such model directory"),
        "{stderr}"
    );
}

/// The batch flags' usage errors (exit 2, before any model is loaded: the model directory does not
/// exist here).
#[test]
fn batch_usage_errors_exit_2() {
    let scene = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/images/scene.png"
    );
    let base = [
        "run",
        "--model",
        "/nonexistent-model",
        "--task",
        "<CAPTION>",
    ];
    for extra in [
        vec!["--image", scene, "--resume"],
        vec!["--image", scene, "--shard", "3/3"],
        vec!["--image", scene, "--shard", "x"],
        vec!["--image", scene, "--json", "--jsonl"],
        vec!["--image", scene, "--image", scene, "--json"],
        vec!["--image", scene, "--jsonl", "--profile"],
        vec!["--image", scene, "--output", "/tmp/x.jsonl"],
        vec!["--recursive"],
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stdout.is_empty(), "{extra:?}");
        assert!(stderr.contains("usage"), "{extra:?}: {stderr}");
    }
}

/// A stdout that cannot take the answer (`/dev/full`: every write fails with ENOSPC) is a named error
/// and exit status 1, not a panic (status 101), for the rendering and for `--json`.
#[test]
fn a_full_stdout_is_a_named_error() {
    for json in [false, true] {
        let mut args = vec!["parse", "--task", "<OD>", "--image-size", "640,480"];
        args.extend(["--text", OD_TEXT]);
        if json {
            args.push("--json");
        }
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = Command::new(BIN)
            .args(&args)
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "json {json}: {err}");
        assert!(
            err.contains("florence2: writing stdout: No space left on device"),
            "json {json}: {err}"
        );
    }
}
