//! Human-readable rendering of task answers, shared by the CLI and the browser package.
//!
//! Text answers are printed as they are; located answers print one line per instance, `label: [coords]`
//! with one decimal per coordinate, e.g. `cat: [17.0, 54.0, 318.4, 471.6]` (a box), `[x1, y1, ..., y4]` (an
//! OCR quadrilateral) or `label: [[x, y, ...], [...]]` (an instance's polygons). Instances without a label
//! (`<REGION_PROPOSAL>`) print the coordinates alone. Lines are joined by `\n` without a trailing newline;
//! an empty answer renders as the empty string.
//!
//! Model output is untrusted (a generation can contain any byte sequence): control characters in labels are
//! escaped (`\u{1b}`), so a label can neither break the one-line-per-instance layout nor send terminal
//! escape sequences. Text answers keep `\n` and `\t` and escape every other control character.

use crate::postprocess::TaskResult;

/// Render an answer for people (see the module docs for the format).
pub fn render(result: &TaskResult) -> String {
    let mut lines: Vec<String> = Vec::new();
    match result {
        TaskResult::Text(text) => return escape_text(text),
        TaskResult::Ocr(r) => {
            for (quad, label) in r.quad_boxes.iter().zip(&r.labels) {
                lines.push(line(label, &coords(quad)));
            }
        }
        TaskResult::Boxes(r) => {
            for (b, label) in r.bboxes.iter().zip(&r.labels) {
                lines.push(line(label, &coords(b)));
            }
        }
        TaskResult::Polygons(r) => {
            for (polys, label) in r.polygons.iter().zip(&r.labels) {
                lines.push(line(label, &polygons(polys)));
            }
        }
        TaskResult::BoxesOrPolygons(r) => {
            for (b, label) in r.bboxes.iter().zip(&r.bboxes_labels) {
                lines.push(line(label, &coords(b)));
            }
            for (polys, label) in r.polygons.iter().zip(&r.polygons_labels) {
                lines.push(line(label, &polygons(polys)));
            }
        }
    }
    lines.join("\n")
}

fn line(label: &str, value: &str) -> String {
    if label.is_empty() {
        value.to_string()
    } else {
        format!("{}: {value}", escape_label(label))
    }
}

/// `[a, b, ...]` with one decimal each.
fn coords(values: &[f64]) -> String {
    let parts: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
    format!("[{}]", parts.join(", "))
}

fn polygons(polys: &[Vec<f64>]) -> String {
    let parts: Vec<String> = polys.iter().map(|p| coords(p)).collect();
    format!("[{}]", parts.join(", "))
}

fn escape_label(label: &str) -> String {
    escape_controls(label, false)
}

fn escape_text(text: &str) -> String {
    escape_controls(text, true)
}

fn escape_controls(s: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && !(keep_newlines && (c == '\n' || c == '\t')) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}
