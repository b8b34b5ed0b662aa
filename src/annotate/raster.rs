//! A small deterministic rasteriser over an RGBA8 buffer (no anti-aliasing: same bytes every run).

/// A straight-alpha RGBA colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rgba(pub [u8; 4]);

/// An RGBA8 image in row-major order, `width * height * 4` bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Canvas {
    width: u32,
    height: u32,
    pixels: Vec<u8>, // (H, W, 4)
}

/// Coordinates further than this outside the canvas are clamped before stepping (keeps loops bounded).
const MARGIN: f32 = 4.0;

impl Canvas {
    /// A canvas filled with `fill`; zero-size canvases are allowed and ignore every draw.
    pub fn new(width: u32, height: u32, fill: Rgba) -> Self {
        let n = width as usize * height as usize;
        let pixels = fill.0.iter().copied().cycle().take(n * 4).collect();
        Self {
            width,
            height,
            pixels,
        }
    }

    /// A canvas holding an RGB8 image (`width * height * 3` bytes, row-major), opaque; a short buffer
    /// leaves the rest black.
    pub fn from_rgb(width: u32, height: u32, rgb: &[u8]) -> Self {
        let n = width as usize * height as usize;
        let mut pixels = vec![0u8; n * 4];
        for (dst, src) in pixels.chunks_exact_mut(4).zip(rgb.chunks_exact(3)) {
            dst[..3].copy_from_slice(src);
        }
        pixels.chunks_exact_mut(4).for_each(|p| p[3] = 255);
        Self {
            width,
            height,
            pixels,
        }
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// The RGBA8 bytes, row-major.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// The pixel at (x, y), or `None` outside the canvas.
    pub fn get(&self, x: u32, y: u32) -> Option<Rgba> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let i = (y as usize * self.width as usize + x as usize) * 4;
        let p = &self.pixels[i..i + 4];
        Some(Rgba([p[0], p[1], p[2], p[3]]))
    }

    /// Blends `c` over the pixel at integer (x, y) by its alpha; outside pixels are ignored.
    pub fn blend(&mut self, x: i64, y: i64, c: Rgba) {
        if x < 0 || y < 0 || x >= i64::from(self.width) || y >= i64::from(self.height) {
            return;
        }
        let i = (y as usize * self.width as usize + x as usize) * 4;
        let a = u32::from(c.0[3]);
        for k in 0..3 {
            let dst = u32::from(self.pixels[i + k]);
            let src = u32::from(c.0[k]);
            self.pixels[i + k] = ((src * a + dst * (255 - a) + 127) / 255) as u8;
        }
        let da = u32::from(self.pixels[i + 3]);
        self.pixels[i + 3] = (a + da * (255 - a) / 255).min(255) as u8;
    }

    /// Clamps a float coordinate into `[-MARGIN, size + MARGIN]`; NaN gives `None`.
    fn clamp(v: f32, size: u32) -> Option<f32> {
        if v.is_nan() {
            return None;
        }
        Some(v.clamp(-MARGIN, size as f32 + MARGIN))
    }

    /// A one-pixel line from (x0, y0) to (x1, y1) (pixel centres at +0.5); NaN endpoints skip it.
    pub fn line(&mut self, (x0, y0): (f32, f32), (x1, y1): (f32, f32), c: Rgba) {
        let (Some(x0), Some(y0), Some(x1), Some(y1)) = (
            Self::clamp(x0, self.width),
            Self::clamp(y0, self.height),
            Self::clamp(x1, self.width),
            Self::clamp(y1, self.height),
        ) else {
            return;
        };
        let steps = (x1 - x0).abs().max((y1 - y0).abs()).ceil().max(1.0) as u32;
        for s in 0..=steps {
            let t = s as f32 / steps as f32;
            let x = (x0 + (x1 - x0) * t).floor() as i64;
            let y = (y0 + (y1 - y0) * t).floor() as i64;
            self.blend(x, y, c);
        }
    }

    /// The outline of the box [x0, y0, x1, y1], `thickness` pixels inwards.
    pub fn rect(&mut self, b: [f32; 4], thickness: u32, c: Rgba) {
        let [x0, y0, x1, y1] = b;
        for t in 0..thickness.max(1) {
            let t = t as f32;
            let (l, r, top, bot) = (x0 + t, x1 - 1.0 - t, y0 + t, y1 - 1.0 - t);
            self.line((l, top), (r, top), c);
            self.line((l, bot), (r, bot), c);
            self.line((l, top), (l, bot), c);
            self.line((r, top), (r, bot), c);
        }
    }

    /// Fills a polygon by the even-odd rule, sampling pixel centres; fewer than 3 finite points skip it.
    pub fn fill_polygon(&mut self, points: &[(f32, f32)], c: Rgba) {
        let pts: Vec<(f32, f32)> = points
            .iter()
            .filter_map(|&(x, y)| Some((Self::clamp(x, self.width)?, Self::clamp(y, self.height)?)))
            .collect();
        if pts.len() < 3 {
            return;
        }
        let mut xs = Vec::new();
        for row in 0..self.height {
            let yc = row as f32 + 0.5;
            xs.clear();
            for i in 0..pts.len() {
                let (a, b) = (pts[i], pts[(i + 1) % pts.len()]);
                if (a.1 <= yc) != (b.1 <= yc) {
                    xs.push(a.0 + (yc - a.1) / (b.1 - a.1) * (b.0 - a.0));
                }
            }
            xs.sort_by(f32::total_cmp);
            for span in xs.chunks_exact(2) {
                let from = (span[0] - 0.5).ceil().max(0.0) as i64;
                let to = (span[1] - 0.5).floor().min(self.width as f32 - 1.0) as i64;
                for x in from..=to {
                    self.blend(x, i64::from(row), c);
                }
            }
        }
    }

    /// The closed outline of a polygon; NaN vertices are dropped, fewer than 2 points skip it.
    pub fn polygon_outline(&mut self, points: &[(f32, f32)], c: Rgba) {
        let pts: Vec<(f32, f32)> = points
            .iter()
            .copied()
            .filter(|(x, y)| !x.is_nan() && !y.is_nan())
            .collect();
        if pts.len() < 2 {
            return;
        }
        for i in 0..pts.len() {
            self.line(pts[i], pts[(i + 1) % pts.len()], c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHITE: Rgba = Rgba([255, 255, 255, 255]);
    const RED: Rgba = Rgba([255, 0, 0, 255]);

    fn count(c: &Canvas, colour: Rgba) -> usize {
        (0..c.height())
            .flat_map(|y| (0..c.width()).map(move |x| (x, y)))
            .filter(|&(x, y)| c.get(x, y) == Some(colour))
            .count()
    }

    #[test]
    fn rect_outline_covers_exactly_its_border() {
        let mut c = Canvas::new(10, 10, WHITE);
        c.rect([2.0, 2.0, 7.0, 6.0], 1, RED);
        // A 5x4 box has 2*5 + 2*4 - 4 = 14 border pixels.
        assert_eq!(count(&c, RED), 14);
        assert_eq!(c.get(2, 2), Some(RED));
        assert_eq!(c.get(6, 5), Some(RED));
        assert_eq!(c.get(4, 4), Some(WHITE));
    }

    #[test]
    fn fill_polygon_fills_a_square_exactly() {
        let mut c = Canvas::new(8, 8, WHITE);
        c.fill_polygon(&[(1.0, 1.0), (5.0, 1.0), (5.0, 4.0), (1.0, 4.0)], RED);
        assert_eq!(count(&c, RED), 4 * 3);
    }

    #[test]
    fn half_alpha_blends_to_the_midpoint() {
        let mut c = Canvas::new(1, 1, WHITE);
        c.blend(0, 0, Rgba([0, 0, 0, 128]));
        // 255 * 127 / 255 = 127.
        assert_eq!(c.get(0, 0), Some(Rgba([127, 127, 127, 255])));
    }

    #[test]
    fn hostile_coordinates_are_clipped_or_skipped() {
        let mut c = Canvas::new(6, 6, WHITE);
        c.line((f32::NAN, 0.0), (3.0, 3.0), RED);
        c.fill_polygon(&[(0.0, 0.0), (f32::NAN, 1.0)], RED);
        c.fill_polygon(&[], RED);
        c.polygon_outline(&[(1.0, f32::NAN)], RED);
        assert_eq!(count(&c, RED), 0);
        c.line((-1e30, 2.0), (f32::INFINITY, 2.0), RED);
        assert_eq!(
            count(&c, RED),
            6,
            "an infinite line is clipped to the one row"
        );
        c.rect([f32::NEG_INFINITY, -1e38, 1e38, f32::INFINITY], 1, RED);
        c.fill_polygon(
            &[(-1e30, -1e30), (1e30, -1e30), (1e30, 1e30), (-1e30, 1e30)],
            RED,
        );
        assert_eq!(count(&c, RED), 36);
    }

    #[test]
    fn zero_size_canvas_ignores_every_draw() {
        let mut c = Canvas::new(0, 5, WHITE);
        c.rect([0.0, 0.0, 3.0, 3.0], 2, RED);
        c.fill_polygon(&[(0.0, 0.0), (3.0, 0.0), (3.0, 3.0)], RED);
        assert!(c.pixels().is_empty());
    }

    #[test]
    fn drawing_is_deterministic() {
        let draw = || {
            let mut c = Canvas::new(16, 12, WHITE);
            c.fill_polygon(
                &[(1.3, 2.7), (14.1, 3.2), (8.8, 11.4)],
                Rgba([0, 128, 255, 90]),
            );
            c.polygon_outline(&[(1.3, 2.7), (14.1, 3.2), (8.8, 11.4)], RED);
            c.pixels().to_vec()
        };
        assert_eq!(draw(), draw());
    }
}
