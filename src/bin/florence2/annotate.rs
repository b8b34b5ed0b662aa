//! `run --annotate OUT`: each answer drawn on its image ([`florence2_wasm::annotate`]) and written as a
//! PNG. One image and one task write the file OUT (a `.png` path); several images or tasks write into
//! the folder OUT (created), one file per (image, task): `<image stem>.<task>.png`, e.g.
//! `scene.od.png` (`stdin.caption.png` for `--image -`). Of two inputs with one stem (`a/x.png`,
//! `b/x.png`) the later keeps apart by a hash of its path as given: `x-1f2e3d4c.od.png` (the same names
//! for the same inputs in every run).
//! Files are written atomically (a temporary file renamed), so a killed run leaves no torn image.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use florence2_wasm::annotate::{annotate, encode_png};
use florence2_wasm::files::write_atomic;
use florence2_wasm::pipeline::TaskOutput;
use florence2_wasm::postprocess::TaskResult;
use florence2_wasm::processor::image::RgbImage;

use super::Failure;

/// Where the pictures go, and the names given so far.
pub struct Annotator {
    target: Target,
    used: HashSet<String>,
}

enum Target {
    File(PathBuf),
    Folder(PathBuf),
}

impl Annotator {
    /// `out` for a run of one (image, task) pair (`single`) or more. A folder is created when needed.
    pub fn new(out: &Path, single: bool) -> Result<Self, Failure> {
        let is_png = out
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("png"));
        let target = if out.is_dir() {
            Target::Folder(out.to_owned())
        } else if single {
            if !is_png {
                return Err(Failure::Usage(format!(
                    "--annotate {}: one image and one task write one PNG file: give a path ending in \
                     .png, or an existing folder",
                    out.display()
                )));
            }
            if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Failure::Run(format!("--annotate: creating {}: {e}", dir.display()))
                })?;
            }
            Target::File(out.to_owned())
        } else if is_png || out.exists() {
            return Err(Failure::Usage(format!(
                "--annotate {}: several images or tasks write one PNG each into a folder: give a folder \
                 (created when missing)",
                out.display()
            )));
        } else {
            std::fs::create_dir_all(out).map_err(|e| {
                Failure::Run(format!("--annotate: creating {}: {e}", out.display()))
            })?;
            Target::Folder(out.to_owned())
        };
        Ok(Annotator {
            target,
            used: HashSet::new(),
        })
    }

    /// Draws each of `outputs` on `image` (the input `shown`) and writes it, naming each file on
    /// stderr; returns the files' paths in the answers' order.
    pub fn write_each<'o>(
        &mut self,
        shown: &str,
        image: &RgbImage,
        outputs: impl IntoIterator<Item = &'o TaskOutput>,
    ) -> Result<Vec<PathBuf>, Failure> {
        let mut pictures = Vec::new();
        for out in outputs {
            let path = self.write(shown, &out.marker, image, &out.result)?;
            eprintln!("florence2: annotated: {}", path.display());
            pictures.push(path);
        }
        Ok(pictures)
    }

    /// Draws `result` on `image` (the input `shown`, answered by the task `marker`) and writes it;
    /// returns the file's path.
    pub fn write(
        &mut self,
        shown: &str,
        marker: &str,
        image: &RgbImage,
        result: &TaskResult,
    ) -> Result<PathBuf, Failure> {
        let path = match &self.target {
            Target::File(p) => p.clone(),
            Target::Folder(dir) => {
                let dir = dir.clone();
                dir.join(self.name(shown, marker))
            }
        };
        let png = encode_png(&annotate(image, result))?;
        write_atomic(&path, &png)?;
        Ok(path)
    }

    /// `<stem>.<task>.png`, or `<stem>-<hash>.<task>.png` when another input took that name.
    fn name(&mut self, shown: &str, marker: &str) -> String {
        let stem = if shown == "-" {
            "stdin".to_owned()
        } else {
            let s = Path::new(shown).file_stem().map(|s| s.to_string_lossy());
            sanitize(&s.unwrap_or_default())
        };
        let task = sanitize(
            &marker
                .trim_matches(|c| c == '<' || c == '>')
                .to_ascii_lowercase(),
        );
        let plain = format!("{stem}.{task}.png");
        let name = if self.used.contains(&plain) {
            format!("{stem}-{:08x}.{task}.png", fnv1a(shown))
        } else {
            plain
        };
        self.used.insert(name.clone());
        name
    }
}

/// Letters, digits, `-`, `_` and `.` kept; anything else becomes `_` (no separators, no surprises).
fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '_',
        })
        .collect();
    if out.is_empty() || out.starts_with('.') {
        format!("image{out}")
    } else {
        out
    }
}

fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stem_and_task_and_collisions_keep_apart() {
        let dir = std::env::temp_dir().join(format!("f2-annotate-names-{}", std::process::id()));
        let mut a = Annotator::new(&dir, false).unwrap();
        assert_eq!(a.name("photos/a/x.png", "<OD>"), "x.od.png");
        assert_eq!(a.name("photos/a/x.png", "<CAPTION>"), "x.caption.png");
        let other = a.name("photos/b/x.jpg", "<OD>");
        assert_eq!(other, format!("x-{:08x}.od.png", fnv1a("photos/b/x.jpg")));
        assert_eq!(a.name("-", "<MY_TASK>"), "stdin.my_task.png");
        assert_eq!(a.name("../ev il/..hid.png", "<OD>"), "image..hid.od.png");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_pair_needs_a_png_path_and_many_need_a_folder() {
        let tmp = std::env::temp_dir();
        assert!(matches!(
            Annotator::new(&tmp.join("out.jpg"), true),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(
            Annotator::new(&tmp.join("many.png"), false),
            Err(Failure::Usage(_))
        ));
        assert!(Annotator::new(&tmp.join("one.PNG"), true).is_ok());
        assert!(Annotator::new(&tmp, true).is_ok(), "an existing folder");
    }
}
