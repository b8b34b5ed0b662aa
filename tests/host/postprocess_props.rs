//! Property tests: random strings and bytes never panic the prompt parser, the post-processor or the
//! renderer, results are always well formed, and adversarial inputs finish in linear time.
#![cfg(not(target_arch = "wasm32"))]

use std::time::Instant;

use florence2_wasm::postprocess::{post_process_generation, TaskResult};
use florence2_wasm::processor::prompt::{
    parse_task_prompt, region_tokens, InputKind, Task, MAX_INPUT_BYTES,
};
use florence2_wasm::render::render;
use proptest::prelude::*;

/// Structural invariants of any answer.
fn check_well_formed(result: &TaskResult, task: Task) {
    let finite = |v: &f64| v.is_finite();
    match result {
        TaskResult::Text(_) => {}
        TaskResult::Ocr(r) => {
            assert_eq!(r.quad_boxes.len(), r.labels.len());
            assert!(r.quad_boxes.iter().flatten().all(finite));
        }
        TaskResult::Boxes(r) => {
            assert_eq!(r.bboxes.len(), r.labels.len());
            assert!(r.bboxes.iter().flatten().all(finite));
        }
        TaskResult::Polygons(r) => {
            assert_eq!(r.polygons.len(), r.labels.len());
            for p in r.polygons.iter().flatten() {
                assert_eq!(p.len() % 2, 0);
                assert!(p.iter().all(finite));
            }
        }
        TaskResult::BoxesOrPolygons(r) => {
            assert_eq!(r.bboxes.len(), r.bboxes_labels.len());
            assert_eq!(r.polygons.len(), r.polygons_labels.len());
            assert!(r.bboxes.is_empty() || r.polygons.is_empty());
            for p in r.polygons.iter().flatten() {
                assert_eq!(p.len() % 2, 0);
            }
        }
    }
    let json = result.to_json(task);
    assert!(json.get(task.marker()).is_some());
    let rendered = render(result);
    if !matches!(result, TaskResult::Text(_)) {
        assert!(
            !rendered.chars().any(|c| c.is_control() && c != '\n'),
            "{rendered:?}"
        );
    }
}

fn all_tasks(text: &str, size: (u32, u32)) {
    for task in Task::ALL {
        let r = post_process_generation(text, task, size).unwrap();
        check_well_formed(&r, task);
    }
}

/// Pieces Florence-2 generations (and malformed ones) are made of.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u32..1200).prop_map(|b| format!("<loc_{b}>")),
        Just("<sep>".to_string()),
        Just("<poly>".to_string()),
        Just("</poly>".to_string()),
        Just("<s>".to_string()),
        Just("</s>".to_string()),
        Just("<pad>".to_string()),
        Just("<od>".to_string()),
        Just("<loc_".to_string()),
        Just("<".to_string()),
        Just(">".to_string()),
        Just("\n".to_string()),
        Just(" ".to_string()),
        Just("٣".to_string()),
        "[a-z]{1,6}",
        "[0-9]{1,25}",
        "\\PC{0,4}",
    ]
}

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..60).prop_map(|v| v.concat())
}

fn size() -> impl Strategy<Value = (u32, u32)> {
    (0u32..=u32::MAX, 0u32..=u32::MAX)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_string_post_processes(text in any::<String>(), size in size()) {
        all_tasks(&text, size);
    }

    #[test]
    fn any_bytes_post_process(bytes in prop::collection::vec(any::<u8>(), 0..400), size in size()) {
        all_tasks(&String::from_utf8_lossy(&bytes), size);
    }

    #[test]
    fn token_soup_post_processes(text in soup(), size in size()) {
        all_tasks(&text, size);
    }

    #[test]
    fn any_prompt_parses_or_fails_cleanly(prompt in prop_oneof![
        any::<String>(),
        (prop::sample::select(Task::ALL.to_vec()), soup()).prop_map(|(t, s)| format!("{}{s}", t.marker())),
    ]) {
        match parse_task_prompt(&prompt) {
            Ok(p) => {
                let text = p.encoder_text();
                match (p.task().input_kind(), p.input()) {
                    (InputKind::None, None) => prop_assert_eq!(text, p.task().prompt_template()),
                    (InputKind::Text, Some(input)) => {
                        prop_assert!(input.len() <= MAX_INPUT_BYTES);
                        prop_assert!(!input.contains(['<', '>']));
                        prop_assert!(!input.chars().any(char::is_control));
                        prop_assert!(text.contains(input));
                    }
                    (InputKind::Region, Some(input)) => {
                        prop_assert_eq!(region_tokens(p.region().unwrap()), input);
                    }
                    other => prop_assert!(false, "inconsistent prompt {:?}", other),
                }
            }
            Err(e) => {
                prop_assert_eq!(e.name(), "Florence2PromptError");
                // bounded: the valid-marker list plus a short echo
                prop_assert!(e.to_string().len() < 1200, "{} bytes", e.to_string().len());
            }
        }
    }

    #[test]
    fn region_prompts_round_trip(bins in prop::array::uniform4(0u32..1000)) {
        let p = parse_task_prompt(&format!("<REGION_TO_OCR>{}", region_tokens(bins))).unwrap();
        prop_assert_eq!(p.region(), Some(bins));
    }
}

/// Inputs that make a backtracking or naive scanner quadratic (or worse). Each (~100-300 KB) must
/// post-process, for all 15 tasks, into a well-formed answer (and the hostile prompts must be refused). No
/// wall-clock budget is asserted (timed tests flake on shared machines): the time per input is printed, so a
/// regression to quadratic scanning (minutes per input in a debug build) shows in the log, and libFuzzer's
/// per-input timeout in scripts/fuzz/ catches hangs.
#[test]
fn adversarial_inputs_give_well_formed_answers() {
    let n = 10_000;
    let inputs = [
        "a".repeat(15 * n),
        "<loc_1>".repeat(2 * n),
        "x<loc_1><loc_2><loc_3>".repeat(n),
        format!("{}a", "<loc_7>".repeat(7)).repeat(n / 3),
        "<poly>".repeat(2 * n),
        "<poly><loc_1><loc_2><loc_3>".repeat(n),
        "<loc_1><sep>".repeat(n),
        format!("<loc_{}", "9".repeat(1000)).repeat(100),
        format!("cat<loc_{}>", "1".repeat(5000)).repeat(20),
        "<".repeat(15 * n),
        "\n<loc_1>".repeat(2 * n),
        format!("{}\n", "a".repeat(999)).repeat(75),
        "<<s>/s>".repeat(2 * n),
        format!("{}<", "\u{3000}".repeat(100)).repeat(n / 10),
        format!("a{}\nb", "<loc_5>".repeat(3)).repeat(n),
    ];
    for (i, text) in inputs.iter().enumerate() {
        let start = Instant::now();
        for task in Task::ALL {
            let r = post_process_generation(text, task, (640, 480)).unwrap();
            check_well_formed(&r, task);
        }
        let took = start.elapsed();
        println!("input {i}: {} bytes, 15 tasks in {took:?}", text.len());
    }
    let start = Instant::now();
    for prompt in [
        format!("<{}", "A".repeat(1 << 20)),
        format!("<OPEN_VOCABULARY_DETECTION>{}", "<".repeat(1 << 20)),
        format!("<REGION_TO_OCR>{}", "<loc_1>".repeat(1 << 17)),
    ] {
        assert!(parse_task_prompt(&prompt).is_err());
    }
    println!("3 hostile prompts refused in {:?}", start.elapsed());
}

/// The stated output bound: the JSON of any answer is at most `100 n + 384 KiB` bytes for `n` input bytes;
/// an answer that would repeat its labels past the label budget is refused by name. The 240 KB case (a
/// 120 KB label before 4,300 boxes) used to give ~0.5 GB of JSON.
#[test]
fn output_is_bounded_by_input_size() {
    use florence2_wasm::postprocess::{LABEL_BYTES_PER_INPUT_BYTE, LABEL_BYTES_SLACK};
    // The budget the 240 KB case exceeds (its labels would be ~0.5 GB).
    const { assert!(120_000 * 4_300 > 240_000 * LABEL_BYTES_PER_INPUT_BYTE + LABEL_BYTES_SLACK) };
    use florence2_wasm::Error;
    let boxes =
        |label: &str, n: usize| format!("{label}{}", "<loc_1><loc_2><loc_3><loc_4>".repeat(n));
    let big = boxes(&"a".repeat(120_000), 4_300);
    assert!(big.len() > 240_000);
    for task in [
        Task::Od,
        Task::DenseRegionCaption,
        Task::OpenVocabularyDetection,
        Task::CaptionToPhraseGrounding,
    ] {
        match post_process_generation(&big, task, (640, 480)) {
            Err(Error::InvalidInput(m)) => assert!(m.contains("labels"), "{m}"),
            Err(e) => panic!("{task:?}: {e}"),
            Ok(r) => panic!(
                "{task:?}: {} bytes of JSON from {} bytes",
                serde_json::to_string(&r.to_json(task)).unwrap().len(),
                big.len()
            ),
        }
    }
    // Polygons repeat their phrase per instance.
    let polys = format!(
        "{}{}",
        "b".repeat(100_000),
        "<poly><loc_1><loc_2><loc_3><loc_4></poly>".repeat(3_000)
    );
    assert!(matches!(
        post_process_generation(&polys, Task::OpenVocabularyDetection, (640, 480)),
        Err(Error::InvalidInput(_))
    ));
    // Inside the budget: the same shapes, scaled down, answer normally and within the bound (labels of
    // control characters are the worst case for JSON escaping: 6 bytes per byte).
    let inputs = [
        boxes("a car", 2_000),
        boxes(&"x".repeat(1_000), 60),
        boxes(&"x".repeat(10_000), 20),
        format!(
            "{}{}",
            "\u{1}".repeat(4_000),
            "<loc_1><loc_2><loc_3><loc_4><loc_5><loc_6><loc_7><loc_8>".repeat(16)
        ),
        boxes(&"\u{1}".repeat(1_000), 16),
        format!(
            "{}{}",
            "cat",
            "<poly><loc_1><loc_2><loc_3><loc_4></poly>".repeat(500)
        ),
        "line<loc_1><loc_2><loc_3><loc_4><loc_5><loc_6><loc_7><loc_8>".repeat(500),
    ];
    for text in &inputs {
        for task in Task::ALL {
            let r = post_process_generation(text, task, (640, 480))
                .unwrap_or_else(|e| panic!("{task:?} on {} bytes: {e}", text.len()));
            let json = serde_json::to_string(&r.to_json(task)).unwrap().len();
            assert!(
                json <= 100 * text.len() + 384 * 1024,
                "{task:?}: {json} bytes of JSON from {} bytes",
                text.len()
            );
        }
    }
}
