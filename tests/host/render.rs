//! Rendering of every answer type: one decimal per coordinate, one line per instance, control characters in
//! labels escaped.
#![cfg(not(target_arch = "wasm32"))]

use florence2_wasm::postprocess::{
    post_process_generation, BoxesOrPolygonsResult, BoxesResult, OcrResult, PolygonsResult,
    TaskResult,
};
use florence2_wasm::processor::prompt::Task;
use florence2_wasm::render::render;

#[test]
fn boxes_one_line_per_instance() {
    let r = TaskResult::Boxes(BoxesResult {
        bboxes: vec![[16.96, 54.0, 318.4, 471.6], [0.32, 0.24, 639.04, 479.28]],
        labels: vec!["cat".into(), "couch".into()],
    });
    assert_eq!(
        render(&r),
        "cat: [17.0, 54.0, 318.4, 471.6]\ncouch: [0.3, 0.2, 639.0, 479.3]"
    );
}

#[test]
fn unlabelled_boxes_print_coordinates_alone() {
    let r = post_process_generation(
        "<loc_0><loc_0><loc_999><loc_999>",
        Task::RegionProposal,
        (1000, 200),
    )
    .unwrap();
    assert_eq!(render(&r), "[0.5, 0.1, 999.5, 199.9]");
}

#[test]
fn ocr_quads_and_polygons() {
    let r = TaskResult::Ocr(OcrResult {
        quad_boxes: vec![[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.25]],
        labels: vec!["CN Tower".into()],
    });
    assert_eq!(
        render(&r),
        "CN Tower: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.2]"
    );
    let r = TaskResult::Polygons(PolygonsResult {
        polygons: vec![
            vec![vec![1.0, 2.0, 3.0, 4.0], vec![]],
            vec![vec![9.96, 0.04]],
        ],
        labels: vec!["".into(), "cat".into()],
    });
    assert_eq!(render(&r), "[[1.0, 2.0, 3.0, 4.0], []]\ncat: [[10.0, 0.0]]");
}

#[test]
fn open_vocabulary_boxes_then_polygons() {
    let r = TaskResult::BoxesOrPolygons(BoxesOrPolygonsResult {
        bboxes: vec![[1.0, 2.0, 3.0, 4.0]],
        bboxes_labels: vec!["a".into()],
        polygons: vec![vec![vec![5.0, 6.0]]],
        polygons_labels: vec!["b".into()],
    });
    assert_eq!(render(&r), "a: [1.0, 2.0, 3.0, 4.0]\nb: [[5.0, 6.0]]");
}

#[test]
fn text_and_empty_answers() {
    assert_eq!(
        render(&TaskResult::Text("Two cats.\nOn a couch.".into())),
        "Two cats.\nOn a couch."
    );
    assert_eq!(
        render(&TaskResult::Text("red\u{1b}[31m".into())),
        "red\\u{1b}[31m"
    );
    for task in Task::ALL {
        let r = post_process_generation("", task, (10, 10)).unwrap();
        assert_eq!(render(&r), "", "{task}");
    }
}

#[test]
fn labels_cannot_break_lines_or_inject_escapes() {
    let r = post_process_generation(
        "ab\u{1b}[2Jc\u{85}d<poly><loc_1><loc_2></poly>",
        Task::OpenVocabularyDetection,
        (1000, 1000),
    )
    .unwrap();
    let text = render(&r);
    assert_eq!(text, "ab\\u{1b}[2Jc\\u{85}d: [[1.5, 2.5]]");
    let r = TaskResult::Ocr(OcrResult {
        quad_boxes: vec![[0.0; 8]],
        labels: vec!["a\nb\rc".into()],
    });
    assert_eq!(render(&r).lines().count(), 1);
}
