//! Labels in an 8x8 bitmap font (printable ASCII; anything else is drawn as `?`), scaled by whole
//! pixels, on a filled background box kept inside the canvas.

use super::raster::{Canvas, Rgba};

/// Glyph cell size at scale 1, in pixels (the font is 8x8; one column and row of padding).
const CELL: u32 = 8;
/// Padding around a label's text inside its background, at scale 1.
const PAD: u32 = 2;

/// The 8 rows of a glyph, bit `x` of a row being column `x` (least significant = leftmost).
fn glyph(c: char) -> [u8; 8] {
    let i = match c {
        ' '..='~' => c as usize,
        _ => '?' as usize,
    };
    font8x8::legacy::BASIC_LEGACY[i]
}

/// The text scale for an image: 1 up to 480 px on the short side, then one more per 480 px.
pub fn scale_for(width: u32, height: u32) -> u32 {
    (width.min(height) / 480 + 1).clamp(1, 6)
}

/// Width and height in pixels of `text` on one line at `scale`, background padding included.
pub fn label_size(text: &str, scale: u32) -> (u32, u32) {
    let n = text.chars().count() as u32;
    (
        (n * CELL + 2 * PAD).saturating_mul(scale),
        (CELL + 2 * PAD) * scale,
    )
}

/// Draws `text` at (x, y) (its top-left corner) at `scale`, one glyph pixel as a scale x scale square.
pub fn draw_text(canvas: &mut Canvas, (x, y): (i64, i64), text: &str, scale: u32, colour: Rgba) {
    let s = i64::from(scale.max(1));
    let max_x = i64::from(canvas.width());
    for (k, c) in text.chars().enumerate() {
        let gx = x + k as i64 * i64::from(CELL) * s;
        if gx >= max_x {
            break; // the rest of the line is off the canvas
        }
        for (row, bits) in glyph(c).iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) == 0 {
                    continue;
                }
                let (px, py) = (gx + col * s, y + row as i64 * s);
                for dy in 0..s {
                    for dx in 0..s {
                        canvas.blend(px + dx, py + dy, colour);
                    }
                }
            }
        }
    }
}

/// A label on a `background` box whose top-left corner is as near (x, y) as the canvas allows; the text
/// is cut (ending in `..`) to the canvas width. Text colour: black or white, whichever reads on the
/// background.
pub fn draw_label(
    canvas: &mut Canvas,
    (x, y): (f32, f32),
    text: &str,
    scale: u32,
    background: Rgba,
) {
    let (w, h) = (canvas.width(), canvas.height());
    if w == 0 || h == 0 || text.is_empty() {
        return;
    }
    let text = fit(text, w, scale);
    let (lw, lh) = label_size(&text, scale);
    let clamp = |v: f32, room: u32| -> i64 {
        let v = if v.is_finite() { v.floor() as i64 } else { 0 };
        v.clamp(0, i64::from(room.saturating_sub(1)).max(0))
    };
    let x0 = clamp(x, w.saturating_sub(lw).saturating_add(1));
    let y0 = clamp(y, h.saturating_sub(lh).saturating_add(1));
    for yy in y0..y0 + i64::from(lh) {
        for xx in x0..x0 + i64::from(lw) {
            canvas.blend(xx, yy, background);
        }
    }
    let ink = if luma(background) > 140 {
        Rgba([0, 0, 0, 255])
    } else {
        Rgba([255, 255, 255, 255])
    };
    let pad = i64::from(PAD * scale);
    draw_text(canvas, (x0 + pad, y0 + pad), &text, scale, ink);
}

/// `text` cut to the characters that fit `width` at `scale`, ending in `..` when cut.
fn fit(text: &str, width: u32, scale: u32) -> String {
    let room = (width / scale.max(1)).saturating_sub(2 * PAD) / CELL;
    let n = text.chars().count() as u32;
    if n <= room {
        return text.to_owned();
    }
    let keep = room.saturating_sub(2) as usize;
    text.chars()
        .take(keep)
        .chain("..".chars())
        .take(room as usize)
        .collect()
}

/// Rec. 601 luma of a colour, 0..255.
fn luma(c: Rgba) -> u32 {
    let [r, g, b, _] = c.0;
    (299 * u32::from(r) + 587 * u32::from(g) + 114 * u32::from(b)) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHITE: Rgba = Rgba([255, 255, 255, 255]);
    const BLACK: Rgba = Rgba([0, 0, 0, 255]);

    #[test]
    fn a_glyph_lights_its_font_bits_scaled() {
        let mut c = Canvas::new(40, 20, WHITE);
        draw_text(&mut c, (0, 0), "I", 2, BLACK);
        let bits = glyph('I');
        for (row, b) in bits.iter().enumerate() {
            for col in 0..8u32 {
                let want = if b & (1 << col) != 0 { BLACK } else { WHITE };
                for d in 0..2 {
                    assert_eq!(c.get(col * 2 + d, row as u32 * 2 + d), Some(want));
                }
            }
        }
    }

    #[test]
    fn non_ascii_draws_the_replacement_glyph() {
        let draw = |t: &str| {
            let mut c = Canvas::new(20, 10, WHITE);
            draw_text(&mut c, (0, 0), t, 1, BLACK);
            c
        };
        assert_eq!(draw("é"), draw("?"));
        assert_ne!(draw("e"), draw("?"));
    }

    #[test]
    fn a_label_stays_inside_the_canvas_and_is_cut_to_its_width() {
        let mut c = Canvas::new(50, 30, WHITE);
        draw_label(&mut c, (45.0, 28.0), "a long label", 1, BLACK);
        // Cut to (50 - 4) / 8 = 5 characters: "abc.." style, background at the right edge.
        assert_eq!(fit("a long label", 50, 1), "a l..");
        assert_eq!(c.get(49, 29), Some(BLACK), "pushed in from the corner");
        draw_label(&mut c, (f32::NAN, f32::INFINITY), "x", 1, BLACK);
        draw_label(&mut Canvas::new(0, 0, WHITE), (0.0, 0.0), "x", 1, BLACK);
    }
}
