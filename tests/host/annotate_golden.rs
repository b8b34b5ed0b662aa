//! `florence2 run --annotate`'s drawing against golden images: fixed answers of every kind drawn on a
//! fixed synthetic image must give exactly the committed PNG's pixels (the drawing is deterministic:
//! no anti-aliasing, a bitmap font). `ANNOTATE_UPDATE_GOLDEN=1` rewrites the PNGs after a deliberate
//! change (look at them before committing). Hostile answers (NaN, infinities, huge and empty shapes,
//! ten thousand boxes, long and non-ASCII labels) draw without panicking and stay inside the image.

use std::path::PathBuf;

use florence2_wasm::annotate::{annotate, encode_png};
use florence2_wasm::postprocess::{
    BoxesOrPolygonsResult, BoxesResult, OcrResult, PolygonsResult, TaskResult,
};
use florence2_wasm::processor::image::{decode_image, ImageLimits, RgbImage};

/// A 200x150 gradient with a grid: every drawn pixel differs from what is under it.
fn base_image() -> RgbImage {
    RgbImage::from_fn(200, 150, |x, y| {
        let grid = if x % 25 == 0 || y % 25 == 0 { 40 } else { 0 };
        image::Rgb([(x + grid) as u8, (y + 60) as u8, (140 + grid) as u8])
    })
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// One answer per kind, as the post-processor gives them (float pixel coordinates).
fn cases() -> Vec<(&'static str, TaskResult)> {
    vec![
        (
            "boxes",
            TaskResult::Boxes(BoxesResult {
                bboxes: vec![[10.5, 30.0, 90.25, 110.0], [100.0, 5.0, 190.0, 60.0]],
                labels: strings(&["cat", "dog"]),
            }),
        ),
        (
            "ocr",
            TaskResult::Ocr(OcrResult {
                quad_boxes: vec![[20.0, 40.0, 150.0, 45.0, 148.0, 70.0, 18.0, 65.0]],
                labels: strings(&["HELLO 42"]),
            }),
        ),
        (
            "polygons",
            TaskResult::Polygons(PolygonsResult {
                polygons: vec![vec![vec![
                    30.0, 30.0, 170.0, 50.0, 120.0, 130.0, 40.0, 100.0,
                ]]],
                labels: strings(&["shape"]),
            }),
        ),
        (
            "boxes_or_polygons",
            TaskResult::BoxesOrPolygons(BoxesOrPolygonsResult {
                bboxes: vec![[5.0, 5.0, 60.0, 60.0]],
                bboxes_labels: strings(&["box"]),
                polygons: vec![vec![vec![100.0, 100.0, 190.0, 100.0, 145.0, 140.0]]],
                polygons_labels: strings(&["triangle"]),
            }),
        ),
        (
            "caption",
            TaskResult::Text("A black square, an orange triangle and a blue circle.".into()),
        ),
    ]
}

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/annotate")
        .join(format!("{name}.png"))
}

#[test]
fn every_kind_of_answer_draws_its_golden_image() {
    let image = base_image();
    let update = std::env::var_os("ANNOTATE_UPDATE_GOLDEN").is_some();
    for (name, result) in cases() {
        let canvas = annotate(&image, &result);
        let png = encode_png(&canvas).expect("encode");
        let path = golden_path(name);
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &png).unwrap();
        }
        let golden = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (ANNOTATE_UPDATE_GOLDEN=1 makes it)",
                path.display()
            )
        });
        let want = decode_image(&golden, &ImageLimits::default()).expect("golden decodes");
        let got = decode_image(&png, &ImageLimits::default()).expect("output decodes");
        assert_eq!(
            (got.width(), got.height()),
            (200, 150),
            "{name}: the image's own size"
        );
        assert!(
            got.as_raw() == want.as_raw(),
            "{name}: the drawing differs from {} ({} of {} bytes differ)",
            path.display(),
            got.as_raw()
                .iter()
                .zip(want.as_raw())
                .filter(|(a, b)| a != b)
                .count(),
            got.as_raw().len()
        );
        assert_ne!(got.as_raw(), image.as_raw(), "{name}: something was drawn");
    }
}

#[test]
fn boxes_change_their_edges_and_leave_far_pixels_alone() {
    let image = base_image();
    let b = [40.0, 50.0, 120.0, 100.0];
    let canvas = annotate(
        &image,
        &TaskResult::Boxes(BoxesResult {
            bboxes: vec![b],
            labels: strings(&[""]),
        }),
    );
    let px = |x: u32, y: u32| {
        let p = canvas.get(x, y).unwrap().0;
        [p[0], p[1], p[2]]
    };
    let under = |x: u32, y: u32| image.get_pixel(x, y).0;
    for x in [40, 80, 119] {
        assert_ne!(px(x, 50), under(x, 50), "top edge at x={x}");
        assert_ne!(px(x, 99), under(x, 99), "bottom edge at x={x}");
    }
    for y in [50, 75, 99] {
        assert_ne!(px(40, y), under(40, y), "left edge at y={y}");
        assert_ne!(px(119, y), under(119, y), "right edge at y={y}");
    }
    for (x, y) in [(80, 75), (5, 5), (190, 140), (150, 20)] {
        assert_eq!(px(x, y), under(x, y), "({x}, {y}) is far from the box");
    }
}

#[test]
fn hostile_answers_draw_without_panicking() {
    let image = base_image();
    let n = 10_000;
    let results = vec![
        TaskResult::Boxes(BoxesResult {
            bboxes: vec![
                [f64::NAN, 0.0, 10.0, 10.0],
                [f64::NEG_INFINITY, -1e300, f64::INFINITY, 1e300],
                [150.0, 140.0, 10.0, 5.0],
            ],
            labels: strings(&["", "\u{1F600} ünïcödé", &"x".repeat(5000)]),
        }),
        TaskResult::Boxes(BoxesResult {
            bboxes: (0..n)
                .map(|i| [(i % 200) as f64, (i % 150) as f64, 199.0, 149.0])
                .collect(),
            labels: (0..n).map(|i| format!("label {i}")).collect(),
        }),
        TaskResult::Ocr(OcrResult {
            quad_boxes: vec![[f64::NAN; 8], [1e308; 8]],
            labels: strings(&["a"]),
        }),
        TaskResult::Polygons(PolygonsResult {
            polygons: vec![vec![vec![], vec![1.0], vec![f64::NAN, 2.0, 3.0]], vec![]],
            labels: vec![],
        }),
        TaskResult::Text(String::new()),
        TaskResult::Text("w".repeat(100_000)),
    ];
    for r in &results {
        let canvas = annotate(&image, r);
        assert_eq!((canvas.width(), canvas.height()), (200, 150));
        encode_png(&canvas).expect("encodes");
    }
    let empty = RgbImage::new(0, 0);
    let canvas = annotate(&empty, &results[0]);
    assert_eq!(canvas.pixels().len(), 0);
}
