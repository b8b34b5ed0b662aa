//! Fine-tuned models' own task markers, natively: a copy of the tiny2 fixture whose
//! `processor_config.json` declares `<MY_CAPTION>` with `<CAPTION>`'s encoder text and a plain marker
//! `<GENERATE_TAGS>`. `<MY_CAPTION>` must generate exactly `<CAPTION>`'s ids (same encoder input) with the
//! answer keyed by the new marker and post-processed as pure text; `<GENERATE_TAGS>` runs with the prompt
//! passed as written and a pure-text answer; on the unmodified model the same markers keep the built-in
//! prompt error; `florence2 run --task <MY_CAPTION>` works on the copy.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::path::PathBuf;

use common::fixtures::fixtures;
use common::gpu;
use florence2_wasm::pipeline::{Callbacks, Image, NeverCancel, Pipeline, TaskOptions};
use florence2_wasm::postprocess::{post_process_generation, TaskResult};
use florence2_wasm::processor::custom_tasks::CustomTasks;
use florence2_wasm::Error;

/// tiny2 with a processor config that declares two own tasks (a fresh directory under target/).
/// A copy of tiny2 with a model-specific task marker, in a directory of its own per call: the tests of
/// this file run in parallel threads, and a shared directory was removed under another test's CLI run.
fn tuned_copy() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let src = fixtures().join("models/tiny2");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("custom_tasks_tiny2_{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("processor_config.json")).unwrap()).unwrap();
    cfg["task_prompts_without_inputs"] =
        serde_json::json!({"<MY_CAPTION>": "What does the image describe?"});
    cfg["tasks"] = serde_json::json!(["<GENERATE_TAGS>"]);
    std::fs::write(dir.join("processor_config.json"), cfg.to_string()).unwrap();
    dir
}

fn greedy() -> TaskOptions {
    TaskOptions {
        max_new_tokens: Some(12),
        num_beams: Some(1),
        ..Default::default()
    }
}

#[test]
fn own_markers_run_with_pure_text_answers() {
    let g = gpu();
    let p = Pipeline::load_dir(&g, &tuned_copy()).unwrap();
    assert_eq!(p.tasks().markers(), ["<GENERATE_TAGS>", "<MY_CAPTION>"]);
    let bytes = std::fs::read(fixtures().join("images/scene.png")).unwrap();
    let img = p.encode_image(Image::Encoded(&bytes)).unwrap();
    let run = |prompt: &str| {
        p.run_task_blocking(
            (&img).into(),
            prompt,
            &greedy(),
            &NeverCancel,
            &Callbacks::default(),
        )
    };
    let cap = run("<CAPTION>").unwrap();
    let mine = run("<MY_CAPTION>").unwrap();
    assert_eq!(mine.token_ids, cap.token_ids, "same encoder text, same ids");
    assert_eq!(mine.marker, "<MY_CAPTION>");
    assert_eq!(mine.result, cap.result);
    assert_eq!(
        mine.result_json(),
        serde_json::json!({"<MY_CAPTION>": cap.result_json()["<CAPTION>"]})
    );

    let tags = run("<GENERATE_TAGS>").unwrap();
    assert_eq!(tags.marker, "<GENERATE_TAGS>");
    let want = tags
        .generated_text
        .replace("<s>", "")
        .replace("</s>", "")
        .trim()
        .to_owned();
    assert_eq!(
        tags.result,
        TaskResult::Text(want),
        "pure text, as the reference"
    );

    assert!(matches!(run("<MY_CAPTION>extra"), Err(Error::Prompt(_))));
    assert!(matches!(run("<OTHER>"), Err(Error::Prompt(_))));
}

#[test]
fn undeclared_markers_keep_the_builtin_error() {
    let p = Pipeline::load_dir(&gpu(), &fixtures().join("models/tiny2")).unwrap();
    assert!(p.tasks().is_empty());
    let bytes = std::fs::read(fixtures().join("images/scene.png")).unwrap();
    let e = p
        .run_task_blocking(
            Image::Encoded(&bytes).into(),
            "<MY_CAPTION>",
            &greedy(),
            &NeverCancel,
            &Callbacks::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Prompt(_)), "{e}");
    assert!(
        e.to_string().contains("unknown Florence-2 task marker"),
        "{e}"
    );
}

#[test]
fn cli_runs_a_models_own_marker() {
    let dir = tuned_copy();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args(["run", "--model"])
        .arg(&dir)
        .args(["--image"])
        .arg(fixtures().join("images/scene.png"))
        .args([
            "--task",
            "<MY_CAPTION>",
            "--max-new-tokens",
            "12",
            "--num-beams",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["task"], "<MY_CAPTION>");
    assert!(v["result"]["<MY_CAPTION>"].is_string(), "{v}");
    // Without the declaration the CLI refuses the marker.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args(["run", "--model"])
        .arg(fixtures().join("models/tiny2"))
        .args(["--image"])
        .arg(fixtures().join("images/scene.png"))
        .args(["--task", "<MY_CAPTION>", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown Florence-2 task marker"));
}

#[test]
fn custom_answers_are_pure_text() {
    let t = CustomTasks::from_processor_config(br#"{"tasks": ["<GENERATE_TAGS>"]}"#).unwrap();
    let p = t.parse("<GENERATE_TAGS>").unwrap();
    let r = post_process_generation(
        "</s><s> cat, dog<loc_5></s><pad>",
        p.answer_task(),
        (10, 10),
    )
    .unwrap();
    // As the reference's pure_text: <s> and </s> removed, stripped; other tokens stay.
    assert_eq!(r, TaskResult::Text("cat, dog<loc_5><pad>".into()));
}
