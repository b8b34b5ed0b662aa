//! The images of a batch: `--image` arguments (files, or directories listed in name order, with
//! `--recursive` their subdirectories too), then the lines of `--images-from`, then the `--shard` slice.
//! Each input keeps the path as the user gave it (a directory's entries: the directory joined with their
//! names); that string is the `"image"` of its JSON Lines and the key `--resume` matches.

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

/// The image files of `dir`, sorted by name; with `recursive` also those of its subdirectories (in
/// place of the subdirectory's name). Hidden entries (`.name`) are skipped, and symbolic links to
/// directories are not followed (no cycles).
pub fn list_dir(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) -> Result<(), Failure> {
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
        } else if has_image_extension(&path) && (kind.is_file() || path.is_file()) {
            out.push(path);
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

/// Every input, in order, before sharding.
pub fn collect(
    images: &[PathBuf],
    recursive: bool,
    images_from: Option<&Path>,
) -> Result<Vec<PathBuf>, Failure> {
    let mut out = Vec::new();
    for p in images {
        if p.is_dir() {
            list_dir(p, recursive, &mut out)?;
        } else {
            // A missing or unreadable file is that image's error, recorded in the output.
            out.push(p.clone());
        }
    }
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
    Ok(out)
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
}
