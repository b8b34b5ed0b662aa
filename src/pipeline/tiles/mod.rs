//! Tiling: pages, not thumbnails. The model sees every image at its input size (768x768 for Florence-2,
//! 192x192 for the demo model), so a page's small text and objects shrink past reading. A tiled run
//! covers the image with overlapping tiles ([`plan`]), runs every tile and the whole-image view as one
//! batch through the vision tower, the encoder and the decoder, and merges the views' answers in page
//! coordinates ([`merge`]): duplicates across overlaps dropped, pieces cut by tile edges joined, lines
//! in reading order ([`order`]).
//!
//! Tasks: `<OCR>`, `<OCR_WITH_REGION>`, `<OD>`, `<DENSE_REGION_CAPTION>`, `<REGION_PROPOSAL>` (the ones
//! whose answer is a set of located things). Any other task with tiles asked for is a
//! [`crate::Error::Prompt`].

pub mod merge;
pub mod order;
pub mod plan;
mod run;

pub use merge::{merge, ViewAnswer};
pub use plan::{plan, Decision, Grid, Rect, Tiles, MAX_TILES, OVERLAP};
pub use run::TiledOutput;

use crate::error::{Error, Result};
use crate::processor::prompt::Task;

/// The tasks a run may tile.
pub const TILED_TASKS: [Task; 5] = [
    Task::Ocr,
    Task::OcrWithRegion,
    Task::Od,
    Task::DenseRegionCaption,
    Task::RegionProposal,
];

/// `task`, when it may be tiled; else a prompt error naming the tasks that may.
pub fn check_task(task: Option<Task>, marker: &str) -> Result<Task> {
    task.filter(|t| TILED_TASKS.contains(t)).ok_or_else(|| {
        let names: Vec<&str> = TILED_TASKS.iter().map(|t| t.marker()).collect();
        Error::Prompt(format!(
            "{marker} cannot be tiled (tiles is for {}); set tiles to off",
            names.join(", ")
        ))
    })
}

/// The task each view runs for a tiled `task`. `<OCR>` runs `<OCR_WITH_REGION>` per view: its lines
/// carry their places, so the lines that two tiles share are found and kept once and the page's text is
/// assembled in reading order; plain `<OCR>` text per tile, joined in tile order, would repeat the
/// overlaps' text and interleave the lines of neighbouring tiles.
pub fn view_task(task: Task) -> Task {
    match task {
        Task::Ocr => Task::OcrWithRegion,
        t => t,
    }
}

/// What a tiled run chose, for the `tiles` field of the front ends' output: `{"rows", "cols", "overlap",
/// "views", "tile": [w, h], "capped"}`, or `{"off": reason}`.
pub fn report(decision: &Decision) -> serde_json::Value {
    match decision {
        Decision::Off(reason) => serde_json::json!({ "off": reason }),
        Decision::Grid(g) => serde_json::json!({
            "rows": g.rows,
            "cols": g.cols,
            "overlap": OVERLAP,
            "views": g.views(),
            "tile": g.tiles.first().map(|t| [t.w, t.h]),
            "capped": g.capped,
        }),
    }
}
