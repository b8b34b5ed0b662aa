//! The tile grid: which overlapping crops of a page the model sees ([`plan`]), from a [`Tiles`] request,
//! the page size and the model's input size.

use serde::Serialize;

use crate::error::{Error, Result};

/// Share of a tile's side that it shares with its neighbour. 15% fits a text line or a small object
/// (the demo model's text is 11-17% of a scene's side) whole inside at least one of two neighbours, and
/// costs about 1.4x the pixels of a grid without overlap at 3x3.
pub const OVERLAP: f64 = 0.15;

/// `auto` tiles a page only when its longer side (relative to the model's input side) is more than this:
/// below it the one view loses at most a third of the page's resolution, less than tiling's seams cost.
pub const AUTO_MIN_SCALE: f64 = 1.5;

/// `auto` aims at tiles of about this many input sides each (before the overlap grows them by
/// `1 / (1 - OVERLAP)` at most): a tile is then seen at close to the model's own resolution.
pub const AUTO_TILE_SCALE: f64 = 1.0;

/// Most tiles of one run (plus the whole-image view): every view is one row of a batch through the vision
/// tower, the encoder and the decoder, so this bounds a tiled run's memory and time at 17 single views.
pub const MAX_TILES: u32 = 16;

/// What a run asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tiles {
    /// One view of the whole image (the default).
    #[default]
    Off,
    /// A grid decided from the image size ([`plan`]).
    Auto,
    /// `rows` x `cols` tiles.
    Grid { rows: u32, cols: u32 },
}

impl std::str::FromStr for Tiles {
    type Err = Error;

    /// `off`, `auto` or `RxC` (e.g. `2x3`: 2 rows, 3 columns; at most [`MAX_TILES`] tiles, at least 2).
    fn from_str(s: &str) -> Result<Tiles> {
        let s = s.trim();
        match s.to_ascii_lowercase().as_str() {
            "off" => return Ok(Tiles::Off),
            "auto" => return Ok(Tiles::Auto),
            _ => {}
        }
        let bad = || {
            Error::InvalidInput(format!(
                "tiles {s:?}: expected auto, off or RxC (rows x columns, e.g. 2x3)"
            ))
        };
        let (r, c) = s.split_once(['x', 'X']).ok_or_else(bad)?;
        let rows: u32 = r.trim().parse().map_err(|_| bad())?;
        let cols: u32 = c.trim().parse().map_err(|_| bad())?;
        if rows == 0
            || cols == 0
            || rows * cols < 2
            || u64::from(rows) * u64::from(cols) > MAX_TILES.into()
        {
            return Err(Error::InvalidInput(format!(
                "tiles {s:?}: a grid has 2 to {MAX_TILES} tiles (1x1 is one view: use off)"
            )));
        }
        Ok(Tiles::Grid { rows, cols })
    }
}

impl std::fmt::Display for Tiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tiles::Off => f.write_str("off"),
            Tiles::Auto => f.write_str("auto"),
            Tiles::Grid { rows, cols } => write!(f, "{rows}x{cols}"),
        }
    }
}

/// A rectangle of the page in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

impl Rect {
    pub fn right(&self) -> u32 {
        self.x + self.w
    }

    pub fn bottom(&self) -> u32 {
        self.y + self.h
    }
}

/// A grid of overlapping tiles over a page; the whole-image view comes with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Grid {
    pub rows: u32,
    pub cols: u32,
    /// The page's (width, height).
    pub page: (u32, u32),
    /// Row-major tiles, each of one size; neighbours share at least [`OVERLAP`] of a side.
    pub tiles: Vec<Rect>,
    /// Whether `auto` cut its grid down to [`MAX_TILES`].
    pub capped: bool,
}

impl Grid {
    /// Views one run decodes: the tiles and the whole image.
    pub fn views(&self) -> usize {
        self.tiles.len() + 1
    }
}

/// What [`plan`] decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// One view of the whole image, and why.
    Off(String),
    Grid(Grid),
}

/// The tiles for a page of `page` = (width, height) pixels and a model whose input is `input` =
/// (width, height). `auto`: no tiling when neither side exceeds [`AUTO_MIN_SCALE`] input sides, else
/// `ceil(side / (input * AUTO_TILE_SCALE))` tiles per axis, cut down to [`MAX_TILES`] in all. A grid
/// asked for explicitly must leave neighbouring tiles apart (else: too small for that grid).
pub fn plan(request: Tiles, page: (u32, u32), input: (u32, u32)) -> Result<Decision> {
    let (w, h) = page;
    if w == 0 || h == 0 || input.0 == 0 || input.1 == 0 {
        return Err(Error::InvalidInput(format!(
            "tiles: a {w}x{h} image or a {}x{} model input has no area",
            input.0, input.1
        )));
    }
    let (rows, cols, capped) = match request {
        Tiles::Off => return Ok(Decision::Off("tiles off".into())),
        Tiles::Grid { rows, cols } => (rows, cols, false),
        Tiles::Auto => {
            let scale = (f64::from(w) / f64::from(input.0)).max(f64::from(h) / f64::from(input.1));
            if scale <= AUTO_MIN_SCALE {
                return Ok(Decision::Off(format!(
                    "the {w}x{h} image is within {AUTO_MIN_SCALE}x the model's {}x{} input",
                    input.0, input.1
                )));
            }
            auto_grid(page, input)
        }
    };
    let tw = tile_side(w, cols);
    let th = tile_side(h, rows);
    // Each tile starts at least one pixel after its neighbour.
    let apart = |side: u32, tile: u32, n: u32| n == 1 || side.saturating_sub(tile) >= n - 1;
    if !apart(w, tw, cols) || !apart(h, th, rows) {
        return Err(Error::InvalidInput(format!(
            "tiles {rows}x{cols}: the image ({w}x{h}) is too small for that grid"
        )));
    }
    let mut tiles = Vec::with_capacity((rows * cols) as usize);
    for r in 0..rows {
        for c in 0..cols {
            tiles.push(Rect {
                x: offset(c, cols, w, tw),
                y: offset(r, rows, h, th),
                w: tw,
                h: th,
            });
        }
    }
    Ok(Decision::Grid(Grid {
        rows,
        cols,
        page,
        tiles,
        capped,
    }))
}

/// `auto`'s (rows, cols, capped).
fn auto_grid(page: (u32, u32), input: (u32, u32)) -> (u32, u32, bool) {
    let per_axis = |side: u32, input: u32| {
        let n = (f64::from(side) / (f64::from(input) * AUTO_TILE_SCALE)).ceil();
        (n.max(1.0) as u32).min(side)
    };
    let (mut rows, mut cols) = (per_axis(page.1, input.1), per_axis(page.0, input.0));
    let capped = rows * cols > MAX_TILES;
    if capped {
        // Both axes shrink by one factor (the tiles keep their shape); floor keeps the product under the cap.
        let f = (f64::from(MAX_TILES) / f64::from(rows * cols)).sqrt();
        rows = ((f64::from(rows) * f).floor() as u32).max(1);
        cols = ((f64::from(cols) * f).floor() as u32).max(1);
        // A long thin page keeps one row (or column) above the factor: the other axis takes the cap.
        if rows * cols > MAX_TILES {
            if cols >= rows {
                cols = MAX_TILES / rows;
            } else {
                rows = MAX_TILES / cols;
            }
        }
    }
    (rows, cols, capped)
}

/// The side of `n` tiles covering `side` pixels with [`OVERLAP`]: `n t - (n - 1) OVERLAP t = side`.
fn tile_side(side: u32, n: u32) -> u32 {
    if n <= 1 {
        return side;
    }
    let t = f64::from(side) / (f64::from(n) - f64::from(n - 1) * OVERLAP);
    (t.ceil() as u32).clamp(1, side)
}

/// Where tile `i` of `n` starts: evenly spread, the first flush with 0 and the last with the far edge.
fn offset(i: u32, n: u32, side: u32, tile: u32) -> u32 {
    if n <= 1 {
        return 0;
    }
    let span = u64::from(side - tile);
    ((u64::from(i) * span + u64::from(n - 1) / 2) / u64::from(n - 1)) as u32
}
