//! One drawing per kind of answer, in the image's own pixel coordinates (the float coordinates the
//! answer's JSON has): boxes with labels, OCR quadrilaterals with their text, polygons outlined over a
//! translucent fill, and a caption strip for answers that are only text.

use super::raster::{Canvas, Rgba};
use super::text::{draw_label, draw_text, label_size, scale_for};
use crate::postprocess::{OcrResult, PolygonsResult, TaskResult};

/// Distinct, saturated colours; a label always gets the same one ([`colour_of`]).
const PALETTE: [[u8; 3]; 12] = [
    [230, 25, 75],
    [60, 180, 75],
    [0, 130, 200],
    [245, 130, 48],
    [145, 30, 180],
    [70, 240, 240],
    [240, 50, 230],
    [210, 245, 60],
    [0, 128, 128],
    [170, 110, 40],
    [128, 0, 0],
    [0, 0, 128],
];
/// Polygon fill opacity (of 255): the image stays visible under it.
const FILL_ALPHA: u8 = 96;
/// Caption strip: at most this share of the image height.
const CAPTION_SHARE: u32 = 3;

/// The colour of a label: FNV-1a of its bytes into [`PALETTE`] (stable across runs and platforms).
pub fn colour_of(label: &str) -> Rgba {
    let h = label.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let [r, g, b] = PALETTE[h as usize % PALETTE.len()];
    Rgba([r, g, b, 255])
}

/// Draws `result` on `canvas` (the image it answers, at its own size).
pub fn draw_result(canvas: &mut Canvas, result: &TaskResult) {
    let scale = scale_for(canvas.width(), canvas.height());
    match result {
        TaskResult::Text(text) => caption(canvas, text, scale),
        TaskResult::Ocr(r) => ocr(canvas, r, scale),
        TaskResult::Boxes(r) => boxes(canvas, &r.bboxes, &r.labels, scale),
        TaskResult::Polygons(r) => polygons(canvas, r, scale),
        TaskResult::BoxesOrPolygons(r) => {
            boxes(canvas, &r.bboxes, &r.bboxes_labels, scale);
            let p = PolygonsResult {
                polygons: r.polygons.clone(),
                labels: r.polygons_labels.clone(),
            };
            polygons(canvas, &p, scale);
        }
    }
}

/// Box outlines first, then every label (so no outline crosses a label).
fn boxes(canvas: &mut Canvas, bboxes: &[[f64; 4]], labels: &[String], scale: u32) {
    let thickness = 2 * scale;
    for (i, b) in bboxes.iter().enumerate() {
        let label = labels.get(i).map_or("", String::as_str);
        canvas.rect(b.map(|v| v as f32), thickness, colour_of(label));
    }
    for (i, b) in bboxes.iter().enumerate() {
        let label = labels.get(i).map_or("", String::as_str);
        let (_, lh) = label_size(label, scale);
        // Above the box when there is room, inside its top edge otherwise.
        let y = b[1] as f32 - lh as f32;
        let y = if y >= 0.0 { y } else { b[1] as f32 };
        draw_label(canvas, (b[0] as f32, y), label, scale, colour_of(label));
    }
}

/// Each text line's quadrilateral and its text at the quadrilateral's first corner.
fn ocr(canvas: &mut Canvas, r: &OcrResult, scale: u32) {
    for (i, q) in r.quad_boxes.iter().enumerate() {
        let label = r.labels.get(i).map_or("", String::as_str);
        let pts: Vec<(f32, f32)> = q
            .chunks_exact(2)
            .map(|p| (p[0] as f32, p[1] as f32))
            .collect();
        let c = colour_of(label);
        canvas.polygon_outline(&pts, c);
        let (_, lh) = label_size(label, scale);
        draw_label(canvas, (pts[0].0, pts[0].1 - lh as f32), label, scale, c);
    }
}

/// Per instance: each polygon filled translucently and outlined, the label at the instance's first
/// vertex.
fn polygons(canvas: &mut Canvas, r: &PolygonsResult, scale: u32) {
    for (i, instance) in r.polygons.iter().enumerate() {
        let label = r.labels.get(i).map_or("", String::as_str);
        let c = colour_of(label);
        let mut fill = c;
        fill.0[3] = FILL_ALPHA;
        let mut anchor = None;
        for poly in instance {
            let pts: Vec<(f32, f32)> = poly
                .chunks_exact(2)
                .map(|p| (p[0] as f32, p[1] as f32))
                .collect();
            canvas.fill_polygon(&pts, fill);
            canvas.polygon_outline(&pts, c);
            anchor = anchor.or(pts.first().copied());
        }
        if let Some(a) = anchor {
            draw_label(canvas, a, label, scale, c);
        }
    }
}

/// A text answer as a strip along the bottom of the image: dark, translucent, the words wrapped to the
/// width, at most a third of the height (the last line cut with `..` when the text is longer).
fn caption(canvas: &mut Canvas, text: &str, scale: u32) {
    let (w, h) = (canvas.width(), canvas.height());
    let (_, line_h) = label_size("", scale);
    let per_line = ((w / scale.max(1)).saturating_sub(4) / 8) as usize;
    let max_lines = (h / CAPTION_SHARE / line_h.max(1)) as usize;
    if per_line == 0 || max_lines == 0 || text.trim().is_empty() {
        return;
    }
    let mut lines = wrap(text, per_line);
    if lines.len() > max_lines {
        lines.truncate(max_lines);
        if let Some(last) = lines.last_mut() {
            let keep: String = last.chars().take(per_line.saturating_sub(2)).collect();
            *last = keep + "..";
        }
    }
    let top = i64::from(h) - (lines.len() as i64) * i64::from(line_h);
    for y in top.max(0)..i64::from(h) {
        for x in 0..i64::from(w) {
            canvas.blend(x, y, Rgba([0, 0, 0, 160]));
        }
    }
    let pad = i64::from(2 * scale);
    for (k, line) in lines.iter().enumerate() {
        let y = top + k as i64 * i64::from(line_h) + pad;
        draw_text(canvas, (pad, y), line, scale, Rgba([255, 255, 255, 255]));
    }
}

/// Greedy word wrap to `width` characters; a word longer than a line is split.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        while word.len() > width {
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
            }
            lines.push(word.drain(..width).collect());
        }
        let n = line.chars().count();
        if n > 0 && n + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.extend(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_wrap_to_the_width_and_long_words_split() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("abcdefgh ij", 3), ["abc", "def", "gh", "ij"]);
        assert!(wrap("   ", 4).is_empty());
    }

    #[test]
    fn a_label_keeps_its_colour() {
        assert_eq!(colour_of("cat"), colour_of("cat"));
        let distinct: std::collections::HashSet<[u8; 4]> = ["cat", "dog", "car", "person", "tree"]
            .iter()
            .map(|l| colour_of(l).0)
            .collect();
        assert!(distinct.len() >= 3, "labels spread over the palette");
    }
}
