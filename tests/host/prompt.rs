//! Task prompts: every validation rule both rejected and accepted, encoder texts against the reference's
//! `_construct_prompts` (recorded by `scripts/fixtures/make_postprocess_golden.py`), quantization round trips.
#![cfg(not(target_arch = "wasm32"))]

use florence2_wasm::processor::prompt::{
    dequantize, dequantize_box, parse_task_prompt, quantize, quantize_box, region_bins,
    region_tokens, AnswerType, InputKind, Task, MAX_INPUT_BYTES,
};
use florence2_wasm::Error;

fn err(prompt: &str) -> String {
    match parse_task_prompt(prompt) {
        Ok(p) => panic!("{prompt:?} was accepted as {p:?}"),
        Err(e) => {
            assert_eq!(e.name(), "Florence2PromptError");
            assert!(matches!(e, Error::Prompt(_)));
            e.to_string()
        }
    }
}

fn ok(prompt: &str) -> florence2_wasm::processor::TaskPrompt {
    parse_task_prompt(prompt).unwrap_or_else(|e| panic!("{prompt:?} rejected: {e}"))
}

const REGION: &str = "<loc_52><loc_100><loc_300><loc_400>";

#[test]
fn encoder_text_matches_the_reference_for_all_tasks() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/postprocess/golden.json"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let prompts = doc["prompts"].as_array().unwrap();
    let mut seen = std::collections::HashSet::new();
    for p in prompts {
        let prompt = p["prompt"].as_str().unwrap();
        let tp = ok(prompt);
        seen.insert(tp.task());
        assert_eq!(
            tp.encoder_text(),
            p["encoder_text"].as_str().unwrap(),
            "{prompt:?}"
        );
    }
    assert_eq!(
        seen.len(),
        15,
        "reference encoder texts cover {} tasks",
        seen.len()
    );
}

#[test]
fn all_fifteen_markers_round_trip() {
    assert_eq!(Task::ALL.len(), 15);
    let mut with_input = 0;
    for task in Task::ALL {
        assert_eq!(Task::from_marker(task.marker()), Some(task));
        assert_eq!(task.marker().parse::<Task>().unwrap(), task);
        let bare = &task.marker()[1..task.marker().len() - 1];
        assert_eq!(bare.parse::<Task>().unwrap(), task);
        assert_eq!(task.to_string(), task.marker());
        let prompt = match task.input_kind() {
            InputKind::None => task.marker().to_string(),
            InputKind::Text => format!("{}two cats", task.marker()),
            InputKind::Region => format!("{}{REGION}", task.marker()),
        };
        assert_eq!(ok(&prompt).task(), task);
        with_input += usize::from(task.takes_input());
    }
    assert_eq!(with_input, 7);
    let regions = Task::ALL
        .iter()
        .filter(|t| t.input_kind() == InputKind::Region)
        .count();
    assert_eq!(regions, 4);
}

#[test]
fn answer_types_are_the_references() {
    use AnswerType::*;
    // The reference's `tasks_answer_post_processing_type` (also checked per golden case).
    let expected = [
        ("<OCR>", PureText),
        ("<OCR_WITH_REGION>", Ocr),
        ("<CAPTION>", PureText),
        ("<DETAILED_CAPTION>", PureText),
        ("<MORE_DETAILED_CAPTION>", PureText),
        ("<OD>", DescriptionWithBboxes),
        ("<DENSE_REGION_CAPTION>", DescriptionWithBboxes),
        ("<CAPTION_TO_PHRASE_GROUNDING>", PhraseGrounding),
        ("<REFERRING_EXPRESSION_SEGMENTATION>", Polygons),
        ("<REGION_TO_SEGMENTATION>", Polygons),
        (
            "<OPEN_VOCABULARY_DETECTION>",
            DescriptionWithBboxesOrPolygons,
        ),
        ("<REGION_TO_CATEGORY>", PureText),
        ("<REGION_TO_DESCRIPTION>", PureText),
        ("<REGION_TO_OCR>", PureText),
        ("<REGION_PROPOSAL>", Bboxes),
    ];
    for (marker, ty) in expected {
        assert_eq!(
            Task::from_marker(marker).unwrap().answer_type(),
            ty,
            "{marker}"
        );
    }
}

#[test]
fn unknown_marker_lists_the_valid_ones() {
    for bad in [
        "<NOT_A_TASK>",
        "<od>",
        "<OD",
        "OD",
        "",
        "   ",
        "cat <OD>",
        "<>",
        "<CAPTION >",
    ] {
        let msg = err(bad);
        assert!(
            msg.contains("<OD>") && msg.contains("<REGION_TO_OCR>"),
            "{bad:?}: {msg}"
        );
    }
    // accepted: the exact marker, with surrounding whitespace trimmed
    assert_eq!(ok("<OD>").task(), Task::Od);
    assert_eq!(ok("  <OD>\n").task(), Task::Od);
}

#[test]
fn task_without_input_rejects_input() {
    for bad in [
        "<OD>cat",
        "<CAPTION> a",
        "<OCR><loc_1>",
        "<REGION_PROPOSAL>x",
    ] {
        let msg = err(bad);
        assert!(msg.contains("takes no input"), "{bad:?}: {msg}");
    }
    let p = ok("<CAPTION>");
    assert_eq!(p.input(), None);
    assert_eq!(p.region(), None);
}

#[test]
fn task_with_input_requires_input() {
    for bad in [
        "<CAPTION_TO_PHRASE_GROUNDING>",
        "<REGION_TO_OCR>   ",
        "<OPEN_VOCABULARY_DETECTION>\t",
    ] {
        let msg = err(bad);
        assert!(msg.contains("needs"), "{bad:?}: {msg}");
    }
    assert_eq!(ok("<OPEN_VOCABULARY_DETECTION> cat ").input(), Some("cat"));
}

#[test]
fn input_length_is_bounded_in_bytes() {
    let max = "a".repeat(MAX_INPUT_BYTES);
    assert_eq!(
        ok(&format!("<CAPTION_TO_PHRASE_GROUNDING>{max}"))
            .input()
            .unwrap()
            .len(),
        2048
    );
    let multibyte = "é".repeat(MAX_INPUT_BYTES / 2); // 2048 bytes, 1024 chars
    ok(&format!("<CAPTION_TO_PHRASE_GROUNDING>{multibyte}"));
    let msg = err(&format!("<CAPTION_TO_PHRASE_GROUNDING>{max}a"));
    assert!(msg.contains("2049 bytes"), "{msg}");
    err(&format!("<CAPTION_TO_PHRASE_GROUNDING>{multibyte}é"));
    // A huge input is rejected with a short message (no echo of the input).
    let msg = err(&format!(
        "<OPEN_VOCABULARY_DETECTION>{}",
        "x".repeat(1 << 20)
    ));
    assert!(msg.len() < 200, "{} bytes of message", msg.len());
}

#[test]
fn control_characters_are_rejected() {
    for bad in [
        "a\u{0}b",
        "a\u{1b}[31mred",
        "two\tcats",
        "two\ncats",
        "a\u{7f}",
        "a\u{85}b",
        "a\u{1c}b",
    ] {
        let msg = err(&format!("<CAPTION_TO_PHRASE_GROUNDING>{bad}"));
        assert!(msg.contains("control character"), "{bad:?}: {msg}");
        assert!(
            !msg.contains('\u{1b}') && !msg.contains('\u{0}'),
            "unescaped echo: {msg:?}"
        );
    }
    // accepted: ordinary and non-ASCII text, including non-control Unicode spaces
    ok("<CAPTION_TO_PHRASE_GROUNDING>two cats");
    ok("<REFERRING_EXPRESSION_SEGMENTATION>le chat à gauche 猫\u{a0}x");
}

/// The documented policy for Unicode format characters (prompt.rs): bidi controls, zero-width and every
/// other Cf character are refused by name (they passed the control-character rule); ZWNJ and ZWJ, which
/// real spelling needs, pass.
#[test]
fn format_characters_are_rejected_except_zwnj_and_zwj() {
    for bad in [
        "abc\u{202E}fed",        // right-to-left override
        "a\u{202A}b\u{202C}",    // left-to-right embedding ... pop
        "a\u{2066}b\u{2069}",    // isolates
        "a\u{200F}b",            // right-to-left mark
        "a\u{061C}b",            // Arabic letter mark
        "two\u{200B}cats",       // zero-width space
        "\u{FEFF}cat",           // BOM
        "a\u{2060}b",            // word joiner
        "a\u{00AD}b",            // soft hyphen
        "cat\u{E0041}\u{E0042}", // tag characters (hidden ASCII)
    ] {
        let msg = err(&format!("<CAPTION_TO_PHRASE_GROUNDING>{bad}"));
        assert!(msg.contains("format character"), "{bad:?}: {msg}");
        let c = bad.chars().find(|&c| !c.is_ascii()).unwrap();
        assert!(!msg.contains(c), "format character echoed raw: {msg:?}");
    }
    ok("<CAPTION_TO_PHRASE_GROUNDING>\u{0645}\u{06CC}\u{200C}\u{062E}\u{0648}\u{0627}\u{0647}\u{0645}");
    ok("<CAPTION_TO_PHRASE_GROUNDING>family \u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}");
    ok("<OPEN_VOCABULARY_DETECTION>\u{05E9}\u{05DC}\u{05D5}\u{05DD} right-to-left text itself is fine");
}

#[test]
fn region_needs_exactly_four_canonical_bins() {
    for bad in [
        "<loc_52><loc_100><loc_300>",
        "<loc_52><loc_100><loc_300><loc_400><loc_5>",
        "<loc_1000><loc_100><loc_300><loc_400>",
        "<loc_052><loc_100><loc_300><loc_400>",
        "<loc_00><loc_100><loc_300><loc_400>",
        "<loc_-1><loc_100><loc_300><loc_400>",
        "<loc_+1><loc_100><loc_300><loc_400>",
        "<loc_ 1><loc_100><loc_300><loc_400>",
        "<loc_1.5><loc_100><loc_300><loc_400>",
        "<loc_><loc_100><loc_300><loc_400>",
        "<loc_١><loc_100><loc_300><loc_400>",
        "<LOC_1><loc_100><loc_300><loc_400>",
        "<loc_52> <loc_100><loc_300><loc_400>",
        "<loc_52><loc_100><loc_300><loc_400>x",
        "x<loc_52><loc_100><loc_300><loc_400>",
        "<loc_52><loc_100><loc_300><loc_400",
        "not-a-region",
        "<loc_99999999999999999999999><loc_1><loc_2><loc_3>",
    ] {
        let msg = err(&format!("<REGION_TO_DESCRIPTION>{bad}"));
        assert!(
            msg.contains("exactly four location tokens"),
            "{bad:?}: {msg}"
        );
    }
    let p = ok(&format!("<REGION_TO_DESCRIPTION>{REGION}"));
    assert_eq!(p.region(), Some([52, 100, 300, 400]));
    assert_eq!(p.input(), Some(REGION));
    let p = ok("<REGION_TO_OCR><loc_0><loc_999><loc_0><loc_999>");
    assert_eq!(p.region(), Some([0, 999, 0, 999]));
    ok(&format!("<REGION_TO_SEGMENTATION> {REGION} "));
    ok(&format!("<REGION_TO_CATEGORY>{REGION}"));
}

#[test]
fn free_text_rejects_angle_brackets() {
    for bad in ["a </s> cat", "<OD>", "a > b", "x<loc_1>", "<s>", "cat<"] {
        let msg = err(&format!("<CAPTION_TO_PHRASE_GROUNDING>{bad}"));
        assert!(msg.contains("'<' or '>'"), "{bad:?}: {msg}");
    }
    // accepted: braces and other punctuation; `{input}` stays literal
    let p = ok("<OPEN_VOCABULARY_DETECTION>{input} & (cats) [1] \"quoted\"");
    assert_eq!(
        p.encoder_text(),
        "Locate {input} & (cats) [1] \"quoted\" in the image."
    );
}

#[test]
fn error_messages_echo_a_short_escaped_prefix() {
    let marker = format!("<{}>", "A\u{1b}".repeat(100_000));
    let msg = err(&marker);
    assert!(msg.len() < 1000, "{} bytes", msg.len());
    assert!(!msg.contains('\u{1b}'), "control character echoed raw");
    assert!(msg.contains("\\u{1b}"), "{msg}");
    let msg = err(&format!("<REGION_TO_OCR>{}", "<loc_1>".repeat(200)));
    assert!(msg.len() < 1000, "{} bytes", msg.len());
}

#[test]
fn quantize_round_trips_every_bin() {
    for size in [1u32, 7, 333, 480, 517, 640, 768, 1000, 1920, 4000, 65535] {
        for bin in 0..1000u32 {
            let px = dequantize(bin.into(), size);
            assert_eq!(quantize(px, size), bin, "size {size} bin {bin} px {px}");
        }
    }
    let size = (640, 480);
    let bins = [26, 112, 497, 982];
    assert_eq!(quantize_box(dequantize_box(bins, size), size), bins);
}

#[test]
fn quantize_matches_the_reference_formula_and_clamps() {
    // floor(coord / (size / 1000)) clamped to 0..=999
    assert_eq!(
        quantize_box([16.96, 54.0, 318.4, 471.6], (640, 480)),
        [26, 112, 497, 982]
    );
    assert_eq!(quantize(0.0, 640), 0);
    assert_eq!(quantize(-5.0, 640), 0);
    assert_eq!(quantize(640.0, 640), 999);
    assert_eq!(quantize(1e30, 640), 999);
    assert_eq!(quantize(f32::NAN, 640), 0);
    assert_eq!(quantize(f32::INFINITY, 640), 999);
    assert_eq!(quantize(5.0, 0), 0);
    // dequantize = (bin + 0.5) * size / 1000
    assert_eq!(dequantize(26, 640), 16.96f32);
    assert_eq!(dequantize(999, 1000), 999.5);
    assert_eq!(dequantize(1000, 480), 480.24f32);
}

#[test]
fn region_tokens_feed_region_tasks() {
    let bins = quantize_box([100.0, 50.5, 300.2, 400.0], (640, 480));
    let tokens = region_tokens(bins);
    assert_eq!(
        tokens,
        format!(
            "<loc_{}><loc_{}><loc_{}><loc_{}>",
            bins[0], bins[1], bins[2], bins[3]
        )
    );
    let p = ok(&format!("<REGION_TO_DESCRIPTION>{tokens}"));
    assert_eq!(p.region(), Some(bins));
    assert_eq!(
        region_tokens([0, 999, 1000, u32::MAX]),
        "<loc_0><loc_999><loc_999><loc_999>"
    );
    // and back: tokens -> bins -> pixel box (bin centres)
    assert_eq!(region_bins(&tokens), Some(bins));
    assert_eq!(region_bins("<loc_1><loc_2><loc_3>"), None);
    let px = dequantize_box(
        region_bins("<loc_26><loc_112><loc_497><loc_982>").unwrap(),
        (640, 480),
    );
    // the reference's float32 values (golden case od_multi_instance: 471.5999755859375)
    assert_eq!(px, [16.96f32, 54.0, 318.4, 471.599_98]);
}
