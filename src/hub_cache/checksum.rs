//! What a hub ETag promises about a file's bytes, as the hub computes it: a 64-digit hex ETag is the
//! sha256 of an LFS file, a 40-digit hex one the git blob id of a small file (sha1 of
//! `blob LEN\0` + bytes). Other ETags (a mirror's own) promise nothing beyond the announced length.

use std::io::Read;
use std::path::Path;

use sha1::Digest;

use crate::error::{Error, Result};

/// The digest an ETag names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sha256,
    GitSha1,
}

/// The digest `etag` (already normalized: no quotes, no `W/`) names, if any.
pub fn kind_of(etag: &str) -> Option<Kind> {
    if !etag.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match etag.len() {
        64 => Some(Kind::Sha256),
        40 => Some(Kind::GitSha1),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The lowercase hex digest of kind `kind` of everything `r` yields (`len` bytes, needed up front for
/// the git blob header).
fn digest(kind: Kind, len: u64, r: &mut impl Read) -> std::io::Result<String> {
    fn feed<D: Digest>(mut d: D, r: &mut impl Read) -> std::io::Result<String> {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                return Ok(hex(&d.finalize()));
            }
            d.update(&buf[..n]);
        }
    }
    match kind {
        Kind::Sha256 => feed(sha2::Sha256::new(), r),
        Kind::GitSha1 => {
            let mut d = sha1::Sha1::new();
            d.update(format!("blob {len}\0").as_bytes());
            feed(d, r)
        }
    }
}

/// Check the file at `path` against `etag` (nothing to check for an ETag that names no digest).
pub fn verify(path: &Path, etag: &str, shown: &str) -> Result<()> {
    let Some(kind) = kind_of(etag) else {
        return Ok(());
    };
    let io = |e: std::io::Error| Error::FileRead {
        file: path.display().to_string(),
        msg: e.to_string(),
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let got = digest(kind, len, &mut f).map_err(io)?;
    if got.eq_ignore_ascii_case(etag) {
        return Ok(());
    }
    Err(Error::Checksum {
        file: shown.to_owned(),
        expected: etag.to_ascii_lowercase(),
        got,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_the_hub_conventions() {
        // `printf hello | sha256sum` and `printf hello | git hash-object --stdin`.
        let sha = digest(Kind::Sha256, 5, &mut &b"hello"[..]).unwrap();
        assert_eq!(
            sha,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        let git = digest(Kind::GitSha1, 5, &mut &b"hello"[..]).unwrap();
        assert_eq!(git, "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0");
        assert_eq!(kind_of(&sha), Some(Kind::Sha256));
        assert_eq!(kind_of(&git), Some(Kind::GitSha1));
        assert_eq!(kind_of("abc-123"), None);
        assert_eq!(kind_of(&"z".repeat(64)), None);
    }
}
