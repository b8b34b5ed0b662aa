//! The views' answers merged into one page answer: each view's boxes or quadrilaterals moved into page
//! coordinates, duplicates across overlaps dropped, pieces of a box cut by tile edges joined, the rest
//! put in reading order ([`super::order`]).
//!
//! Which copy of an object survives, best first:
//! 0. a tile's box that no interior tile edge cuts, the one furthest from its tile's interior edges;
//! 1. the union of pieces of one object cut by the edges of two or more tiles (boxes only: OCR text of
//!    two pieces cannot be joined without repeating the overlap's characters);
//! 2. the whole-image view's box (coarse: the page shrunk to one input), so it counts only where no
//!    tile found that object whole;
//! 3. a lone cut piece.
//!
//! A candidate is dropped when a better one kept has its label (any label for OCR: a cut line reads as
//! a prefix of the whole one) and overlaps it by [`IOU_DUPLICATE`] or covers [`IOA_DUPLICATE`] of the
//! smaller of the two ([`WHOLE_VIEW_IOA`] for the whole-image view's).

use crate::pipeline::tiles::order::{plain_text, reading_order};
use crate::pipeline::tiles::plan::{Grid, Rect};
use crate::postprocess::{BoxesResult, OcrResult, TaskResult};
use crate::processor::prompt::Task;

/// Two boxes of one label are one object when their intersection over union reaches this: the model
/// places a box to within a few location bins of a tile (a few % of its side), so two sightings of one
/// object overlap far above a half, and two neighbouring objects of one kind rarely do.
pub const IOU_DUPLICATE: f64 = 0.5;

/// ... or when their intersection covers this share of the smaller box: a piece cut by a tile edge lies
/// inside the whole object's box (its IoU with it is only the piece's share of the object).
pub const IOA_DUPLICATE: f64 = 0.7;

/// A whole-image view's box is a duplicate of a tile's once this share of the smaller of the two is
/// shared: that view sees the page shrunk by the grid's factor, so where a tile found an object the
/// whole view's box for it is several bins off and its label often another reading (measured on pages
/// of demo scenes: whole-view OCR lines beside the tiles' ones read other words); an object no tile
/// found does not overlap the tiles' objects.
pub const WHOLE_VIEW_IOA: f64 = 0.1;

/// A box within this share of its tile's side from an interior tile edge (one that is not the page's
/// edge) is cut by it: 2% is 20 location bins, above the model's placement error of a few bins.
pub const EDGE_TOUCH: f64 = 0.02;

/// Two cut pieces from different tiles are one object's when they intersect and their extents across
/// the cut (the other axis) overlap by this intersection over union: the pieces of one object span the
/// same rows (or columns).
pub const PIECE_ALIGN: f64 = 0.6;

/// One view's answer in the view's own pixels (`post_process_generation` with the view's size).
#[derive(Clone, Debug, PartialEq)]
pub struct ViewAnswer {
    /// The view's place on the page.
    pub rect: Rect,
    /// Whether this is the whole-image view (else a tile).
    pub whole: bool,
    pub result: TaskResult,
}

/// A box or quadrilateral in page pixels, with where it came from.
#[derive(Clone, Debug)]
struct Item {
    /// `[x1, y1, x2, y2]`: the box, or the quadrilateral's bounds.
    bbox: [f64; 4],
    quad: Option<[f64; 8]>,
    label: String,
    view: usize,
    rank: u8,
    /// Distance to the nearest interior edge of its tile over the tile's side (0.5: none).
    margin: f64,
}

/// The page answer of `task` (one of the tiled tasks) from its views' answers. `<OCR>` views are read
/// as `<OCR_WITH_REGION>` answers (see [`super::view_task`]).
pub fn merge(task: Task, grid: &Grid, views: &[ViewAnswer]) -> TaskResult {
    let ocr = matches!(task, Task::Ocr | Task::OcrWithRegion);
    let mut items: Vec<Item> = Vec::new();
    for (v, view) in views.iter().enumerate() {
        collect(v, view, grid.page, &mut items);
    }
    if !ocr {
        join_pieces(&mut items);
    }
    items.sort_by(|a, b| {
        (a.rank, b.margin, a.view)
            .partial_cmp(&(b.rank, a.margin, b.view))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut kept: Vec<Item> = Vec::new();
    for item in items {
        let least_ioa = if item.rank == 2 {
            WHOLE_VIEW_IOA
        } else {
            IOA_DUPLICATE
        };
        let dup = kept
            .iter()
            .any(|k| (ocr || k.label == item.label) && duplicate(&k.bbox, &item.bbox, least_ioa));
        if !dup {
            kept.push(item);
        }
    }
    let boxes: Vec<[f64; 4]> = kept.iter().map(|k| k.bbox).collect();
    let order = reading_order(&boxes);
    let labels: Vec<String> = order.iter().map(|&i| kept[i].label.clone()).collect();
    match task {
        Task::Ocr => {
            let boxes: Vec<[f64; 4]> = order.iter().map(|&i| kept[i].bbox).collect();
            TaskResult::Text(plain_text(&boxes, &labels))
        }
        Task::OcrWithRegion => TaskResult::Ocr(OcrResult {
            quad_boxes: order.iter().filter_map(|&i| kept[i].quad).collect(),
            labels,
        }),
        _ => TaskResult::Boxes(BoxesResult {
            bboxes: order.iter().map(|&i| kept[i].bbox).collect(),
            labels,
        }),
    }
}

/// View `v`'s boxes or quadrilaterals in page pixels, ranked (a piece cut by a tile edge: rank 3).
fn collect(v: usize, view: &ViewAnswer, page: (u32, u32), items: &mut Vec<Item>) {
    let (dx, dy) = (f64::from(view.rect.x), f64::from(view.rect.y));
    let mut push = |bbox: [f64; 4], quad: Option<[f64; 8]>, label: &String| {
        let bbox = [bbox[0] + dx, bbox[1] + dy, bbox[2] + dx, bbox[3] + dy];
        let quad = quad.map(|q| std::array::from_fn(|i| q[i] + if i % 2 == 0 { dx } else { dy }));
        let (rank, margin) = if view.whole {
            (2, 0.5)
        } else {
            let margin = edge_margin(&bbox, &view.rect, page);
            (if margin < EDGE_TOUCH { 3 } else { 0 }, margin)
        };
        items.push(Item {
            bbox,
            quad,
            label: label.clone(),
            view: v,
            rank,
            margin,
        });
    };
    match &view.result {
        TaskResult::Ocr(r) => {
            for (q, label) in r.quad_boxes.iter().zip(&r.labels) {
                push(quad_bounds(q), Some(*q), label);
            }
        }
        TaskResult::Boxes(r) => {
            for (b, label) in r.bboxes.iter().zip(&r.labels) {
                push(*b, None, label);
            }
        }
        _ => {}
    }
}

/// The least distance from `bbox` to an interior edge of `tile`, over the tile's side along that axis
/// (0.5 when the tile has no interior edge).
fn edge_margin(bbox: &[f64; 4], tile: &Rect, page: (u32, u32)) -> f64 {
    let (x0, y0) = (f64::from(tile.x), f64::from(tile.y));
    let (x1, y1) = (f64::from(tile.right()), f64::from(tile.bottom()));
    let (w, h) = (f64::from(tile.w).max(1.0), f64::from(tile.h).max(1.0));
    let mut m: f64 = 0.5;
    if tile.x > 0 {
        m = m.min((bbox[0] - x0) / w);
    }
    if tile.right() < page.0 {
        m = m.min((x1 - bbox[2]) / w);
    }
    if tile.y > 0 {
        m = m.min((bbox[1] - y0) / h);
    }
    if tile.bottom() < page.1 {
        m = m.min((y1 - bbox[3]) / h);
    }
    m.max(0.0)
}

/// Groups of cut pieces (rank 3) of one label from two or more tiles, joined into their union (rank 1).
fn join_pieces(items: &mut [Item]) {
    let cut: Vec<usize> = (0..items.len()).filter(|&i| items[i].rank == 3).collect();
    let mut group: Vec<usize> = (0..items.len()).collect();
    fn root(g: &mut [usize], mut i: usize) -> usize {
        while g[i] != i {
            g[i] = g[g[i]];
            i = g[i];
        }
        i
    }
    for (n, &a) in cut.iter().enumerate() {
        for &b in &cut[n + 1..] {
            let (p, q) = (&items[a], &items[b]);
            if p.view != q.view && p.label == q.label && pieces_of_one(&p.bbox, &q.bbox) {
                let (ra, rb) = (root(&mut group, a), root(&mut group, b));
                group[ra.max(rb)] = ra.min(rb);
            }
        }
    }
    // The head of each group becomes the union (rank 1); the other pieces stay lone candidates (rank 3),
    // which the union, ranked above them, drops as duplicates.
    for &i in &cut {
        let r = root(&mut group, i);
        if r == i {
            continue;
        }
        let b = items[i].bbox;
        let head = &mut items[r];
        head.bbox = [
            head.bbox[0].min(b[0]),
            head.bbox[1].min(b[1]),
            head.bbox[2].max(b[2]),
            head.bbox[3].max(b[3]),
        ];
        head.rank = 1;
    }
}

/// Whether two cut boxes intersect and span the same extent across the cut.
fn pieces_of_one(a: &[f64; 4], b: &[f64; 4]) -> bool {
    let along = |lo: usize, hi: usize| {
        let shared = a[hi].min(b[hi]) - a[lo].max(b[lo]);
        let all = a[hi].max(b[hi]) - a[lo].min(b[lo]);
        (shared, if all > 0.0 { shared / all } else { 0.0 })
    };
    let (sx, ix) = along(0, 2);
    let (sy, iy) = along(1, 3);
    sx > 0.0 && sy > 0.0 && (ix >= PIECE_ALIGN || iy >= PIECE_ALIGN)
}

/// Whether two boxes are one object's: [`IOU_DUPLICATE`], or `least_ioa` of the smaller covered.
fn duplicate(a: &[f64; 4], b: &[f64; 4], least_ioa: f64) -> bool {
    let area = |r: &[f64; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    if inter <= 0.0 {
        return false;
    }
    let (aa, ab) = (area(a), area(b));
    let iou = inter / (aa + ab - inter);
    let ioa = inter / aa.min(ab).max(f64::MIN_POSITIVE);
    iou >= IOU_DUPLICATE || ioa >= least_ioa
}

/// `[x1, y1, x2, y2]` around a quadrilateral's four points.
fn quad_bounds(q: &[f64; 8]) -> [f64; 4] {
    let xs = [q[0], q[2], q[4], q[6]];
    let ys = [q[1], q[3], q[5], q[7]];
    let min = |v: [f64; 4]| v.into_iter().fold(f64::INFINITY, f64::min);
    let max = |v: [f64; 4]| v.into_iter().fold(f64::NEG_INFINITY, f64::max);
    [min(xs), min(ys), max(xs), max(ys)]
}
