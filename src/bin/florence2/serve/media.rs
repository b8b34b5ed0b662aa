//! What the server tells about an image reference before acting on it: whether a URL is a remote
//! `http(s)` one ([`remote_scheme`]) and which format image bytes are in ([`image_kind`]). Used by the
//! request parser ([`super::api`]) and the remote fetcher ([`super::remote`]).

/// `Some("png")` or `Some("jpeg")` from the magic bytes; `None` for anything else.
pub fn image_kind(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("jpeg")
    } else {
        None
    }
}

/// `http` or `https` (lowercased) when `url` starts with one of them and a `://`.
pub fn remote_scheme(url: &str) -> Option<&'static str> {
    let (scheme, rest) = url.split_once(':')?;
    if !rest.starts_with("//") {
        return None;
    }
    match scheme.to_ascii_lowercase().as_str() {
        "http" => Some("http"),
        "https" => Some("https"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(remote_scheme("HTTP://a/b"), Some("http"));
        assert_eq!(remote_scheme("https://a"), Some("https"));
        assert_eq!(remote_scheme("file:///etc/passwd"), None);
        assert_eq!(remote_scheme("http:a"), None);
        assert_eq!(remote_scheme("ftp://a"), None);
    }

    #[test]
    fn kinds() {
        assert_eq!(image_kind(b"\x89PNG\r\n\x1a\nrest"), Some("png"));
        assert_eq!(image_kind(&[0xFF, 0xD8, 0xFF, 0xE0]), Some("jpeg"));
        assert_eq!(image_kind(b"GIF89a"), None);
    }
}
