//! Local files, read with a byte cap (native builds: the CLI and [`crate::weights::DirFiles`]).
//!
//! Every file the native side opens goes through here: [`open_regular`] refuses anything that is not a
//! regular file (character devices such as `/dev/zero` or `/dev/urandom`, FIFOs, sockets, directories:
//! their reported length is 0 or meaningless and reading them may never end or never start), and
//! [`read_capped`] reads at most a stated number of bytes (the file's length is checked first, and the
//! read itself is bounded, so a file that grows while it is read is still capped). The wasm build has the
//! same caps on what it fetches.
//!
//! The type is checked on the path before opening (opening a FIFO for reading blocks until a writer
//! appears) and again on the opened handle (the path may have been replaced in between).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Cap for small JSON files (config, shard index, generation and preprocessor configs): 4 MiB, the same
/// as the wasm build's (the largest real one, a shard index, is ~100 KB).
pub const MAX_JSON_FILE: u64 = 4 << 20;

fn io_err(file: &str, e: std::io::Error) -> Error {
    Error::FileRead {
        file: file.to_owned(),
        msg: e.to_string(),
    }
}

fn not_regular(file: &str, meta: &std::fs::Metadata) -> Error {
    let kind = if meta.is_dir() {
        "a directory"
    } else {
        "a device, FIFO or socket"
    };
    Error::FileRead {
        file: file.to_owned(),
        msg: format!("not a regular file ({kind})"),
    }
}

/// Open `path` for reading if it is a regular file (symbolic links are followed); returns the handle and
/// its length.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| io_err(&shown, e))?;
    if !meta.is_file() {
        return Err(not_regular(&shown, &meta));
    }
    let file = File::open(path).map_err(|e| io_err(&shown, e))?;
    let meta = file.metadata().map_err(|e| io_err(&shown, e))?;
    if !meta.is_file() {
        return Err(not_regular(&shown, &meta));
    }
    Ok((file, meta.len()))
}

/// The whole of the regular file `path`, at most `max_bytes` bytes (more is an [`Error::FileRead`]
/// saying so, raised before anything is read when the length already tells).
pub fn read_capped(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let shown = path.display().to_string();
    let too_large = |n: u64| Error::FileRead {
        file: shown.clone(),
        msg: format!("{n} bytes exceeds the {max_bytes}-byte limit for this file"),
    };
    let (file, len) = open_regular(path)?;
    if len > max_bytes {
        return Err(too_large(len));
    }
    // `len <= max_bytes`, and the read stops one byte past the cap whatever the file does meanwhile.
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| io_err(&shown, e))?;
    if buf.len() as u64 > max_bytes {
        return Err(too_large(buf.len() as u64));
    }
    Ok(buf)
}

/// [`read_capped`], or `None` when nothing exists at `path` (a dangling symbolic link counts as missing).
pub fn read_capped_opt(path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_capped(path, max_bytes).map(Some),
    }
}

/// At most `max_bytes` bytes of a stream (stdin): more is an [`Error::InvalidInput`].
pub fn read_stream_capped(r: impl Read, what: &str, max_bytes: u64) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.take(max_bytes.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| io_err(what, e))?;
    if buf.len() as u64 > max_bytes {
        return Err(Error::InvalidInput(format!(
            "{what} is longer than {max_bytes} bytes"
        )));
    }
    Ok(buf)
}

/// Write `bytes` to `path` so that no reader, and no later run after a crash, ever sees part of it:
/// the bytes go to a temporary file beside it (`NAME.PID.tmp`), are flushed to the disk, and the file
/// is renamed over `path`. On any failure (a full disk, say) the temporary file is removed, `path` keeps
/// its old contents, and the error names `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let shown = path.display().to_string();
    let fail = |e: std::io::Error| Error::FileWrite {
        file: shown.clone(),
        msg: e.to_string(),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        "{}.{}.tmp",
        name.unwrap_or_default(),
        std::process::id()
    ));
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    let renamed = written.and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = renamed {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("florence2-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_without_reading() {
        let d = tmp("special");
        let fifo = d.join("fifo");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mkfifo failed");
        // /dev/zero reports length 0 and never ends; a FIFO without a writer blocks on open.
        for p in [Path::new("/dev/zero"), fifo.as_path(), d.as_path()] {
            let e = read_capped(p, 1 << 20).unwrap_err();
            assert!(
                matches!(&e, Error::FileRead { msg, .. } if msg.contains("not a regular file")),
                "{}: {e}",
                p.display()
            );
        }
        // Through a symbolic link too.
        let link = d.join("config.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_capped_opt(&link, 1 << 20).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn caps_are_exact_and_missing_files_are_none() {
        let d = tmp("cap");
        let p = d.join("f");
        std::fs::write(&p, vec![7u8; 100]).unwrap();
        assert_eq!(read_capped(&p, 100).unwrap().len(), 100);
        let e = read_capped(&p, 99).unwrap_err();
        assert!(e.to_string().contains("99-byte limit"), "{e}");
        assert!(read_capped_opt(&d.join("missing"), 10).unwrap().is_none());
        assert_eq!(
            read_stream_capped(&[1u8; 10][..], "stdin", 10)
                .unwrap()
                .len(),
            10
        );
        assert!(read_stream_capped(std::io::repeat(0), "stdin", 10).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
