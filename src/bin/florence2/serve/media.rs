//! What the server tells about an image reference before acting on it: whether a URL is a remote
//! `http(s)` one ([`remote_scheme`]) and which format image bytes are in ([`image_kind`], [`media_kind`]). Used by the
//! request parser ([`super::api`]) and the remote fetcher ([`super::remote`]).

/// The image formats accepted: their name (as [`image_kind`] returns it) and media types.
pub const IMAGE_TYPES: &[(&str, &[&str])] = &[
    ("png", &["image/png"]),
    ("jpeg", &["image/jpeg", "image/jpg"]),
    ("webp", &["image/webp"]),
    ("gif", &["image/gif"]),
    ("bmp", &["image/bmp", "image/x-ms-bmp", "image/x-bmp"]),
];

/// The format of image bytes from their magic bytes (`png`, `jpeg`, `webp`, `gif`, `bmp`); `None` for
/// anything else.
pub fn image_kind(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("jpeg")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("webp")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("gif")
    } else if bytes.starts_with(b"BM") {
        Some("bmp")
    } else {
        None
    }
}

/// The format a media type (lower case) names, e.g. `image/jpg` -> `jpeg`.
pub fn media_kind(media: &str) -> Option<&'static str> {
    IMAGE_TYPES
        .iter()
        .find(|(_, types)| types.contains(&media))
        .map(|(kind, _)| *kind)
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
        assert_eq!(image_kind(b"GIF89a"), Some("gif"));
        assert_eq!(image_kind(b"RIFF\0\0\0\0WEBPVP8L"), Some("webp"));
        assert_eq!(image_kind(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(image_kind(b"BM\0\0"), Some("bmp"));
        assert_eq!(image_kind(b"<html>"), None);
        assert_eq!(media_kind("image/jpg"), Some("jpeg"));
        assert_eq!(media_kind("image/avif"), None);
    }
}
