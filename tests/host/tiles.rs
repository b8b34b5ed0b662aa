//! Tiling without a model: the tile plan (grids, overlap, edges, tiny and huge images, the cap) and the
//! merge of fixed per-view answers into one page answer (a golden: duplicates, a box split across
//! tiles, whole-image answers, reading order).

use florence2_wasm::pipeline::tiles::{
    check_task, merge, plan, Decision, Grid, Rect, Tiles, ViewAnswer, MAX_TILES, OVERLAP,
};
use florence2_wasm::postprocess::{BoxesResult, OcrResult, TaskResult};
use florence2_wasm::processor::prompt::Task;
use florence2_wasm::Error;

fn grid(d: Decision) -> Grid {
    match d {
        Decision::Grid(g) => g,
        Decision::Off(why) => panic!("expected a grid, got off: {why}"),
    }
}

#[test]
fn requests_parse_and_bad_ones_are_input_errors() {
    assert_eq!("off".parse::<Tiles>().unwrap(), Tiles::Off);
    assert_eq!("AUTO".parse::<Tiles>().unwrap(), Tiles::Auto);
    assert_eq!(
        "2x3".parse::<Tiles>().unwrap(),
        Tiles::Grid { rows: 2, cols: 3 }
    );
    assert_eq!("4X4".parse::<Tiles>().unwrap().to_string(), "4x4");
    for bad in [
        "", "x", "2x", "x3", "0x4", "1x1", "5x4", "2x3x4", "-1x2", "two",
    ] {
        let e = bad.parse::<Tiles>().unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{bad:?}: {e}");
    }
}

#[test]
fn auto_leaves_images_near_the_input_size_alone() {
    for page in [(192, 192), (288, 288), (100, 288), (1, 1)] {
        match plan(Tiles::Auto, page, (192, 192)).unwrap() {
            Decision::Off(why) => assert!(why.contains("192x192"), "{why}"),
            d => panic!("{page:?}: {d:?}"),
        }
    }
    assert_eq!(
        plan(Tiles::Off, (5000, 5000), (768, 768)).unwrap(),
        Decision::Off("tiles off".into())
    );
}

#[test]
fn auto_grids_follow_the_page_size_per_axis() {
    let g = grid(plan(Tiles::Auto, (289, 289), (192, 192)).unwrap());
    assert_eq!((g.rows, g.cols, g.capped), (2, 2, false));
    let g = grid(plan(Tiles::Auto, (768, 384), (192, 192)).unwrap());
    assert_eq!((g.rows, g.cols, g.views()), (2, 4, 9));
    // A 4000x3000 photo at Florence-2's 768 px: 6 x 4 = 24 tiles, cut to 3 x 4 (the shape kept).
    let g = grid(plan(Tiles::Auto, (4000, 3000), (768, 768)).unwrap());
    assert_eq!((g.rows, g.cols, g.capped), (3, 4, true));
    // Huge: 14 x 14 shrinks to 4 x 4; a long strip keeps one row and takes the whole cap in columns.
    let g = grid(plan(Tiles::Auto, (10_000, 10_000), (768, 768)).unwrap());
    assert_eq!((g.rows, g.cols, g.capped), (4, 4, true));
    let g = grid(plan(Tiles::Auto, (20_000, 100), (768, 768)).unwrap());
    assert_eq!((g.rows, g.cols, g.capped), (1, MAX_TILES, true));
    assert_eq!(g.tiles.len(), MAX_TILES as usize);
}

/// Tiles stay on the page, cover it, share a size, sit flush with its edges and overlap their
/// neighbours by at least OVERLAP of a side (less one pixel of rounding).
fn check_cover(g: &Grid) {
    let (w, h) = g.page;
    assert_eq!(g.tiles.len(), (g.rows * g.cols) as usize);
    let t = g.tiles[0];
    for r in &g.tiles {
        assert_eq!((r.w, r.h), (t.w, t.h), "{g:?}");
        assert!(
            r.right() <= w && r.bottom() <= h,
            "{r:?} off the page {w}x{h}"
        );
    }
    for (axis, n, side, tile) in [(0, g.cols, w, t.w), (1, g.rows, h, t.h)] {
        let starts: Vec<u32> = (0..n)
            .map(|i| {
                let r = g.tiles[if axis == 0 { i } else { i * g.cols } as usize];
                if axis == 0 {
                    r.x
                } else {
                    r.y
                }
            })
            .collect();
        assert_eq!(starts[0], 0);
        assert_eq!(starts[n as usize - 1] + tile, side, "{g:?}");
        let least = (OVERLAP * f64::from(tile)).floor() as u32;
        for pair in starts.windows(2) {
            let shared = (pair[0] + tile).saturating_sub(pair[1]);
            assert!(
                shared + 1 >= least && pair[1] > pair[0],
                "{g:?}: overlap {shared} < {least}"
            );
        }
    }
}

#[test]
fn grids_cover_the_page_with_overlapping_tiles_of_one_size() {
    for page in [
        (400, 300),
        (384, 384),
        (1000, 37),
        (3, 2),
        (4096, 2731),
        (769, 1537),
    ] {
        for (rows, cols) in [(1, 2), (2, 1), (2, 2), (2, 3), (3, 3), (4, 4), (1, 16)] {
            match plan(Tiles::Grid { rows, cols }, page, (192, 192)) {
                Ok(d) => check_cover(&grid(d)),
                // Only a page a few pixels wide is too small for a grid.
                Err(e) => assert!(
                    matches!(e, Error::InvalidInput(_)) && page.0.min(page.1) < 40,
                    "{page:?} {rows}x{cols}: {e}"
                ),
            }
        }
        if let Decision::Grid(g) = plan(Tiles::Auto, page, (192, 192)).unwrap() {
            check_cover(&g);
        }
    }
    let e = plan(Tiles::Grid { rows: 2, cols: 1 }, (3, 2), (192, 192)).unwrap_err();
    assert!(e.to_string().contains("too small"), "{e}");
    let e = plan(Tiles::Auto, (0, 10), (192, 192)).unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
}

#[test]
fn only_located_answer_tasks_tile() {
    for t in [
        Task::Ocr,
        Task::OcrWithRegion,
        Task::Od,
        Task::DenseRegionCaption,
        Task::RegionProposal,
    ] {
        assert_eq!(check_task(Some(t), t.marker()).unwrap(), t);
    }
    let e = check_task(Some(Task::Caption), "<CAPTION>").unwrap_err();
    assert!(
        matches!(&e, Error::Prompt(m) if m.contains("<CAPTION> cannot be tiled")),
        "{e}"
    );
    assert!(matches!(check_task(None, "<MINE>"), Err(Error::Prompt(_))));
}

/// 2x2 tiles over a 400x300 page at a 192 px input: 217x163 tiles at x 0 | 183, y 0 | 137.
fn page_grid() -> Grid {
    let g = grid(plan(Tiles::Grid { rows: 2, cols: 2 }, (400, 300), (192, 192)).unwrap());
    let at: Vec<(u32, u32)> = g.tiles.iter().map(|r| (r.x, r.y)).collect();
    assert_eq!(at, [(0, 0), (183, 0), (0, 137), (183, 137)]);
    assert_eq!((g.tiles[0].w, g.tiles[0].h), (217, 163));
    g
}

/// Boxes given in page pixels, moved into the view's own pixels (as the model would answer them).
fn boxes_view(g: &Grid, view: usize, page_boxes: &[(&str, [f64; 4])]) -> ViewAnswer {
    let whole = view == g.tiles.len();
    let rect = if whole {
        Rect {
            x: 0,
            y: 0,
            w: g.page.0,
            h: g.page.1,
        }
    } else {
        g.tiles[view]
    };
    let (dx, dy) = (f64::from(rect.x), f64::from(rect.y));
    let r = BoxesResult {
        bboxes: page_boxes
            .iter()
            .map(|(_, b)| [b[0] - dx, b[1] - dy, b[2] - dx, b[3] - dy])
            .collect(),
        labels: page_boxes.iter().map(|(l, _)| l.to_string()).collect(),
    };
    ViewAnswer {
        rect,
        whole,
        result: TaskResult::Boxes(r),
    }
}

#[test]
fn merged_boxes_golden() {
    let g = page_grid();
    let views = [
        // Tile 0: a circle well inside; the square near its right edge (7 px: not cut); the left piece
        // of a star cut by its right edge (x 217).
        boxes_view(
            &g,
            0,
            &[
                ("circle", [20.0, 20.0, 60.0, 60.0]),
                ("square", [190.0, 40.0, 210.0, 60.0]),
                ("star", [150.0, 80.0, 217.0, 120.0]),
            ],
        ),
        // Tile 1: the same square further from its edge (8 px from x 183: it wins), the star's right
        // piece cut by its left edge (x 183).
        boxes_view(
            &g,
            1,
            &[
                ("square", [191.0, 41.0, 211.0, 61.0]),
                ("star", [183.0, 80.0, 260.0, 120.0]),
            ],
        ),
        boxes_view(&g, 2, &[]),
        // Tile 3: a second circle, far from the first.
        boxes_view(&g, 3, &[("circle", [250.0, 220.0, 290.0, 260.0])]),
        // The whole image: the first circle again (coarse: dropped) and a triangle no tile found (kept).
        boxes_view(
            &g,
            4,
            &[
                ("circle", [22.0, 18.0, 62.0, 61.0]),
                ("triangle", [300.0, 200.0, 380.0, 280.0]),
            ],
        ),
    ];
    let merged = merge(Task::Od, &g, &views);
    let want = BoxesResult {
        bboxes: vec![
            [20.0, 20.0, 60.0, 60.0],
            [191.0, 41.0, 211.0, 61.0],
            [150.0, 80.0, 260.0, 120.0],
            [250.0, 220.0, 290.0, 260.0],
            [300.0, 200.0, 380.0, 280.0],
        ],
        labels: ["circle", "square", "star", "circle", "triangle"]
            .map(String::from)
            .into(),
    };
    assert_eq!(merged, TaskResult::Boxes(want));
}

#[test]
fn a_tile_box_beats_cut_pieces_and_labels_keep_objects_apart() {
    let g = page_grid();
    let views = [
        // A hexagon cut by tile 0's bottom edge (y 163) and whole in tile 2; a square at the same place
        // as the hexagon's piece is another object (another label).
        boxes_view(
            &g,
            0,
            &[
                ("hexagon", [30.0, 145.0, 70.0, 163.0]),
                ("square", [30.0, 145.0, 70.0, 163.0]),
            ],
        ),
        boxes_view(&g, 1, &[]),
        boxes_view(&g, 2, &[("hexagon", [30.0, 145.0, 70.0, 185.0])]),
        boxes_view(&g, 3, &[]),
        boxes_view(&g, 4, &[("hexagon", [28.0, 146.0, 71.0, 183.0])]),
    ];
    let TaskResult::Boxes(b) = merge(Task::Od, &g, &views) else {
        panic!("boxes expected")
    };
    assert_eq!(b.labels, ["hexagon", "square"]);
    assert_eq!(
        b.bboxes,
        [[30.0, 145.0, 70.0, 185.0], [30.0, 145.0, 70.0, 163.0]]
    );
}

fn quad(b: [f64; 4]) -> [f64; 8] {
    [b[0], b[1], b[2], b[1], b[2], b[3], b[0], b[3]]
}

fn ocr_view(g: &Grid, view: usize, lines: &[(&str, [f64; 4])]) -> ViewAnswer {
    let mut v = boxes_view(g, view, lines);
    let TaskResult::Boxes(b) = v.result else {
        unreachable!()
    };
    v.result = TaskResult::Ocr(OcrResult {
        quad_boxes: b.bboxes.into_iter().map(quad).collect(),
        labels: b.labels,
    });
    v
}

fn ocr_views(g: &Grid) -> Vec<ViewAnswer> {
    vec![
        // A line whole in tile 0 (7 px from its right edge), read cut by tile 1's left edge.
        ocr_view(g, 0, &[("HELLO WORLD", [120.0, 30.0, 210.0, 50.0])]),
        ocr_view(g, 1, &[("RLD", [183.0, 30.0, 210.0, 50.0])]),
        ocr_view(g, 2, &[("EXIT", [20.0, 200.0, 60.0, 215.0])]),
        ocr_view(g, 3, &[("CAFE", [300.0, 198.0, 340.0, 214.0])]),
        // The whole image: CAFE again (dropped), HOTEL a misreading beside EXIT (a sixth of EXIT under
        // it: dropped), TAXI no tile read (kept).
        ocr_view(
            g,
            4,
            &[
                ("CAFE", [298.0, 197.0, 341.0, 215.0]),
                ("HOTEL", [50.0, 205.0, 110.0, 225.0]),
                ("TAXI", [100.0, 260.0, 140.0, 280.0]),
            ],
        ),
    ]
}

#[test]
fn merged_ocr_lines_golden() {
    let g = page_grid();
    let merged = merge(Task::OcrWithRegion, &g, &ocr_views(&g));
    let want = OcrResult {
        quad_boxes: vec![
            quad([120.0, 30.0, 210.0, 50.0]),
            quad([20.0, 200.0, 60.0, 215.0]),
            quad([300.0, 198.0, 340.0, 214.0]),
            quad([100.0, 260.0, 140.0, 280.0]),
        ],
        labels: ["HELLO WORLD", "EXIT", "CAFE", "TAXI"]
            .map(String::from)
            .into(),
    };
    assert_eq!(merged, TaskResult::Ocr(want));
    // <OCR>: the same lines as text, a row's lines joined by a space, rows by a line break.
    assert_eq!(
        merge(Task::Ocr, &g, &ocr_views(&g)),
        TaskResult::Text("HELLO WORLD\nEXIT CAFE\nTAXI".into())
    );
}

/// `florence2 run --tiles`: bad values and tasks that cannot tile are usage errors (exit 2) before any
/// model is loaded.
#[test]
fn cli_refuses_tiles_it_cannot_honour_before_loading() {
    let bin = env!("CARGO_BIN_EXE_florence2");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            "/nonexistent/model",
            "--image",
            "/nonexistent.png",
        ];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(bin)
            .args(&args)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stderr).unwrap())
    };
    let (code, err) = run(&["--task", "<CAPTION>", "--tiles", "auto"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("<CAPTION> cannot be tiled"), "{err}");
    let (code, err) = run(&["--task", "<OD>", "--tiles", "5x5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("2 to 16 tiles"), "{err}");
    let (code, err) = run(&["--task", "<OD>", "--tiles", "auto", "--profile"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tiles and --profile"), "{err}");
}
