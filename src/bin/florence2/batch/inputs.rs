//! The images of a batch: `--image` arguments (files, or directories listed in name order, with
//! `--recursive` their subdirectories too), then the lines of `--images-from`, then the `--shard` slice.
//! Each input keeps the path as the user gave it (a directory's entries: the directory joined with their
//! names); that string is the `"image"` of its JSON Lines and the key `--resume` matches.
//! A directory's files of other types (`.avif`, `.heic`, `.txt`, ...) are counted and named on stderr;
//! an input set with no image at all is a usage error saying what was looked for.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use florence2_wasm::files;

use crate::cli::Failure;

/// File extensions listed from a directory (compared case-insensitively): what the decoder reads.
pub const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "webp", "gif", "bmp"];

/// The longest `--images-from` line, in bytes (a path).
const MAX_LINE_BYTES: usize = 64 * 1024;

/// `INDEX/COUNT` with `COUNT >= 1` and `INDEX < COUNT` (0-based, as an indexed job's completion index).
pub fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("takes INDEX/COUNT with 0 <= INDEX < COUNT, got {s:?}");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let i: usize = i.trim().parse().map_err(|_| bad())?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// The inputs whose position `i` has `i % count == index`.
pub fn shard<T>(inputs: Vec<T>, (index, count): (usize, usize)) -> Vec<T> {
    inputs
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % count == index)
        .map(|(_, x)| x)
        .collect()
}

/// Whether `p` names a file the directory listing takes.
fn has_image_extension(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// The most skipped files named on stderr (the rest are counted).
const MAX_NAMED_SKIPS: usize = 10;

/// What listing directories found: the images, and the regular files without an image extension.
#[derive(Debug, Default)]
pub struct Listing {
    pub images: Vec<PathBuf>,
    pub skipped: Vec<PathBuf>,
}

/// The image files of `dir`, sorted by name; with `recursive` also those of its subdirectories (in
/// place of the subdirectory's name). Hidden entries (`.name`) are skipped silently, other files go
/// to `skipped`, and symbolic links to directories are not followed (no cycles).
pub fn list_dir(dir: &Path, recursive: bool, out: &mut Listing) -> Result<(), Failure> {
    let fail = |e: std::io::Error| Failure::Run(format!("listing {}: {e}", dir.display()));
    let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
        .map_err(fail)?
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = e.path();
        let kind = e.file_type().map_err(fail)?;
        if kind.is_dir() {
            if recursive {
                list_dir(&path, true, out)?;
            }
        } else if kind.is_file() || path.is_file() {
            match has_image_extension(&path) {
                true => out.images.push(path),
                false => out.skipped.push(path),
            }
        }
    }
    Ok(())
}

/// One path per line of `r` (a trailing `\r` removed; empty lines skipped).
pub fn read_list(r: impl Read, what: &str) -> Result<Vec<PathBuf>, Failure> {
    let mut out = Vec::new();
    let mut reader = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| Failure::Run(format!("reading {what}: {e}")))?;
        if n == 0 {
            return Ok(out);
        }
        if line.len() > MAX_LINE_BYTES {
            return Err(Failure::Run(format!(
                "{what}: line {} is longer than {MAX_LINE_BYTES} bytes",
                out.len() + 1
            )));
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        if !line.is_empty() {
            let s = String::from_utf8(line.clone())
                .map_err(|_| Failure::Run(format!("{what}: a line is not UTF-8")))?;
            out.push(PathBuf::from(s));
        }
    }
}

/// Every input, in order, before sharding; the files a directory held that are not images are named
/// on stderr. No input at all is a usage error.
pub fn collect(
    images: &[PathBuf],
    recursive: bool,
    images_from: Option<&Path>,
) -> Result<Vec<PathBuf>, Failure> {
    let mut listing = Listing::default();
    for p in images {
        if p.as_os_str() == "-" {
            return Err(Failure::Usage(
                "--image - reads one image from stdin: give it alone (a batch reads files)".into(),
            ));
        }
        if p.is_dir() {
            list_dir(p, recursive, &mut listing)?;
        } else {
            // A missing or unreadable file is that image's error, recorded in the output.
            listing.images.push(p.clone());
        }
    }
    if let Some(note) = skipped_note(&listing.skipped) {
        eprintln!("florence2: {note}");
    }
    let mut out = listing.images;
    match images_from {
        Some(p) if p.as_os_str() == "-" => {
            out.extend(read_list(std::io::stdin().lock(), "stdin")?);
        }
        Some(p) => {
            let (file, _) = files::open_regular(p)?;
            out.extend(read_list(file, &p.display().to_string())?);
        }
        None => {}
    }
    if out.is_empty() {
        return Err(Failure::Usage(nothing_found(
            images,
            recursive,
            images_from,
        )));
    }
    Ok(out)
}

/// `skipped N file(s) without an image extension (...): a.avif, b.heic, ...`, or `None` for none.
pub fn skipped_note(skipped: &[PathBuf]) -> Option<String> {
    let n = skipped.len();
    if n == 0 {
        return None;
    }
    let mut names: Vec<String> = skipped
        .iter()
        .take(MAX_NAMED_SKIPS)
        .map(|p| shown(p))
        .collect();
    if n > MAX_NAMED_SKIPS {
        names.push(format!("and {} more", n - MAX_NAMED_SKIPS));
    }
    Some(format!(
        "skipped {n} file(s) without an image extension ({}): {}",
        extensions(),
        names.join(", ")
    ))
}

/// `.png, .jpg, ...`
fn extensions() -> String {
    let dotted: Vec<String> = IMAGE_EXTENSIONS.iter().map(|e| format!(".{e}")).collect();
    dotted.join(", ")
}

/// The usage error of an empty input set: where it looked, for which extensions, recursive or not.
fn nothing_found(images: &[PathBuf], recursive: bool, images_from: Option<&Path>) -> String {
    let mut places: Vec<String> = images.iter().map(|p| shown(p)).collect();
    if let Some(p) = images_from {
        places.push(format!("the list {}", shown(p)));
    }
    let depth = match recursive {
        true => "recursively",
        false => "not recursively (--recursive reads subdirectories)",
    };
    format!(
        "no images to run: looked in {} {depth} for files ending in {} (case-insensitive)",
        places.join(", "),
        extensions()
    )
}

/// The `"image"` string of a path: as given (lossily, for a path that is not UTF-8).
pub fn shown(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_inputs() {
        assert_eq!(parse_shard("0/1"), Ok((0, 1)));
        assert_eq!(parse_shard("2/3"), Ok((2, 3)));
        for bad in ["3/3", "0/0", "1", "-1/2", "a/b", "1/2/3"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
        let all: Vec<usize> = (0..10).collect();
        let mut seen: Vec<usize> = (0..3).flat_map(|i| shard(all.clone(), (i, 3))).collect();
        assert_eq!(shard(all.clone(), (1, 3)), [1, 4, 7]);
        seen.sort();
        assert_eq!(seen, all);
    }

    #[test]
    fn lists_are_one_path_a_line() {
        let got = read_list(&b"a.png\r\n\nb c.jpg\nlast.gif"[..], "list").unwrap();
        let want: Vec<PathBuf> = ["a.png", "b c.jpg", "last.gif"].map(PathBuf::from).into();
        assert_eq!(got, want);
        let long = vec![b'a'; MAX_LINE_BYTES + 1];
        assert!(read_list(&long[..], "list").is_err());
    }

    #[test]
    fn directories_list_images_in_name_order() {
        let d = std::env::temp_dir().join(format!("florence2-inputs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        for f in ["b.PNG", "a.jpg", "notes.txt", ".hidden.png", "sub/c.webp"] {
            std::fs::write(d.join(f), b"x").unwrap();
        }
        let mut listing = Listing::default();
        list_dir(&d, false, &mut listing).unwrap();
        assert_eq!(listing.skipped, [d.join("notes.txt")]);
        let flat = collect(std::slice::from_ref(&d), false, None).unwrap();
        assert_eq!(flat, [d.join("a.jpg"), d.join("b.PNG")]);
        let deep = collect(&[d.clone(), PathBuf::from("x.png")], true, None).unwrap();
        assert_eq!(
            deep,
            [
                d.join("a.jpg"),
                d.join("b.PNG"),
                d.join("sub/c.webp"),
                PathBuf::from("x.png")
            ]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_input_set_without_images_is_a_usage_error_naming_the_search() {
        let d = std::env::temp_dir().join(format!("florence2-noimages-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        for f in ["a.avif", "b.heic", "sub/c.png"] {
            std::fs::write(d.join(f), b"x").unwrap();
        }
        let Err(Failure::Usage(msg)) = collect(std::slice::from_ref(&d), false, None) else {
            panic!("an image-less folder is a usage error");
        };
        assert!(msg.contains(&shown(&d)), "{msg}");
        assert!(msg.contains("not recursively"), "{msg}");
        assert!(
            msg.contains(".png, .jpg, .jpeg, .webp, .gif, .bmp"),
            "{msg}"
        );
        // Recursively the subdirectory's image is found.
        let deep = collect(std::slice::from_ref(&d), true, None).unwrap();
        assert_eq!(deep, [d.join("sub/c.png")]);
        let empty = d.join("list.txt");
        std::fs::write(&empty, b"\n").unwrap();
        let Err(Failure::Usage(msg)) = collect(&[], false, Some(&empty)) else {
            panic!("an empty list is a usage error");
        };
        assert!(msg.contains("the list"), "{msg}");
        let stdin = collect(&[PathBuf::from("-")], false, None);
        assert!(matches!(stdin, Err(Failure::Usage(m)) if m.contains("--image -")));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn skipped_files_are_counted_and_the_first_named() {
        assert_eq!(skipped_note(&[]), None);
        let few = skipped_note(&[PathBuf::from("d/a.avif"), PathBuf::from("d/b.heic")]).unwrap();
        assert!(few.starts_with("skipped 2 file(s)"), "{few}");
        assert!(few.ends_with(": d/a.avif, d/b.heic"), "{few}");
        let many: Vec<PathBuf> = (0..13).map(|i| PathBuf::from(format!("{i}.txt"))).collect();
        let note = skipped_note(&many).unwrap();
        assert!(note.starts_with("skipped 13 file(s)"), "{note}");
        assert!(note.contains("9.txt, and 3 more"), "{note}");
        assert!(!note.contains("10.txt"), "{note}");
    }
}
