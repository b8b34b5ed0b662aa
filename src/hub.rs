//! Model addressing: a Hugging Face model id (`"microsoft/Florence-2-base-ft"`), a hub page URL or a plain
//! directory URL, turned into the base URL the model files are fetched from.
//!
//! Like transformers.js, a model id resolves to `remote_host + remote_path_template` with `{model}` and
//! `{revision}` substituted (defaults `https://huggingface.co/` and `{model}/resolve/{revision}/`), so a
//! mirror or a self-hosted copy with the same layout works by changing the host or the template. Hub page
//! URLs (`https://huggingface.co/ORG/NAME`, `.../tree/REV[/SUBDIR]`, `.../blob/REV/FILE`) become their file
//! URLs (`.../resolve/REV/`); any other string is a directory URL and is used as it is.

use crate::error::{Error, Result};

/// The hub transformers.js and the Python libraries use by default.
pub const DEFAULT_REMOTE_HOST: &str = "https://huggingface.co/";
/// Where the hub serves a file of a model at a revision.
pub const DEFAULT_REMOTE_PATH_TEMPLATE: &str = "{model}/resolve/{revision}/";
/// The branch a model id means when no revision is given.
pub const DEFAULT_REVISION: &str = "main";

/// How model ids are resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubOptions {
    /// Git revision: a branch, a tag or a commit hash (`refs/pr/1` too).
    pub revision: String,
    /// The hub's base URL (ends with `/`).
    pub remote_host: String,
    /// The path of a model's file directory below `remote_host`, with `{model}` and `{revision}`.
    pub remote_path_template: String,
}

impl Default for HubOptions {
    fn default() -> Self {
        HubOptions {
            revision: DEFAULT_REVISION.into(),
            remote_host: DEFAULT_REMOTE_HOST.into(),
            remote_path_template: DEFAULT_REMOTE_PATH_TEMPLATE.into(),
        }
    }
}

/// What a source string names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelRef {
    /// `ORG/NAME` on the hub.
    HubId(String),
    /// A directory URL (absolute or relative), files below it.
    Url(String),
}

/// A hub model id: exactly `ORG/NAME`, each part of letters, digits, `-`, `_`, `.` (not starting with
/// `.` or `-`, no `..`), at most 96 characters each (the hub's own rule). A directory URL always has a
/// scheme, starts with `/` or `.`, or ends with `/`, so it is never taken for an id.
pub fn is_hub_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && !p.starts_with(['.', '-'])
            && !p.contains("..")
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    ok(org) && ok(name)
}

/// Classify a source string.
pub fn classify(s: &str) -> ModelRef {
    let s = s.trim();
    if is_hub_id(s) {
        ModelRef::HubId(s.to_owned())
    } else {
        ModelRef::Url(s.to_owned())
    }
}

/// Whether the file at `url` may change: a hub file URL (`.../resolve/REV/FILE`) whose revision is a
/// branch or tag (`main`, `v1.0`, `refs%2Fpr%2F1`); a 40-hex commit never changes, and other URLs are
/// not checked (a cached copy of them is used as it is).
pub fn revision_may_change(url: &str) -> bool {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let mut parts = path.split('/');
    while let Some(p) = parts.next() {
        if p == "resolve" {
            return parts.next().is_some_and(|rev| {
                !(rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit()))
            });
        }
    }
    false
}

/// A file's HTTP validators: what a cache stored, or what a `HEAD` answered.
#[derive(Clone, Copy, Debug, Default)]
pub struct Validators<'a> {
    pub etag: Option<&'a str>,
    pub last_modified: Option<&'a str>,
    pub length: Option<u64>,
}

impl Validators<'_> {
    /// Whether both describe the same file: by ETag when both have one (weak or strong, quotes
    /// ignored), else by Last-Modified, else by length; `None` when nothing can be compared.
    pub fn same_file(&self, other: &Validators) -> Option<bool> {
        let norm = |e: &str| {
            let e = e.trim();
            e.strip_prefix("W/")
                .unwrap_or(e)
                .trim_matches('"')
                .to_owned()
        };
        if let (Some(a), Some(b)) = (self.etag, other.etag) {
            return Some(norm(a) == norm(b));
        }
        if let (Some(a), Some(b)) = (self.last_modified, other.last_modified) {
            return Some(a.trim() == b.trim());
        }
        match (self.length, other.length) {
            (Some(a), Some(b)) => Some(a == b),
            _ => None,
        }
    }
}

/// `encodeURIComponent` (a revision such as `refs/pr/1` becomes `refs%2Fpr%2F1`, as the hub expects).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn check_options(o: &HubOptions) -> Result<()> {
    if o.revision.trim().is_empty() {
        return Err(Error::InvalidInput(
            "option revision must not be empty".into(),
        ));
    }
    if !o.remote_path_template.contains("{model}") {
        return Err(Error::InvalidInput(format!(
            "option remotePathTemplate must contain {{model}}, got {:?}",
            o.remote_path_template
        )));
    }
    if o.remote_host.trim().is_empty() {
        return Err(Error::InvalidInput(
            "option remoteHost must not be empty".into(),
        ));
    }
    Ok(())
}

/// The directory URL of hub model `id` (ends with `/`).
pub fn hub_base_url(id: &str, o: &HubOptions) -> Result<String> {
    check_options(o)?;
    let mut host = o.remote_host.trim().to_owned();
    if !host.ends_with('/') {
        host.push('/');
    }
    let path = o
        .remote_path_template
        .replace("{model}", id)
        .replace("{revision}", &encode_component(o.revision.trim()));
    let mut url = format!("{host}{}", path.trim_start_matches('/'));
    if !url.ends_with('/') {
        url.push('/');
    }
    Ok(url)
}

/// A hub page URL (`{host}ORG/NAME`, `{host}ORG/NAME/tree/REV[/DIR]`, `{host}ORG/NAME/blob/REV/FILE`,
/// `{host}ORG/NAME/resolve/REV/FILE`) for `host` = huggingface.co or the configured remote host, as the
/// directory URL of its files; `None` for anything else.
pub fn normalise_page_url(url: &str, o: &HubOptions) -> Option<String> {
    let (host, parts) = hub_path(url, o)?;
    if parts.len() < 2 || !is_hub_id(&format!("{}/{}", parts[0], parts[1])) {
        return None;
    }
    let with = |rev: &str, dir: &[&str]| {
        let id = format!("{}/{}", parts[0], parts[1]);
        let mut base = hub_base_url(
            &id,
            &HubOptions {
                revision: percent_decode(rev),
                remote_host: host.clone(),
                remote_path_template: DEFAULT_REMOTE_PATH_TEMPLATE.into(),
            },
        )
        .ok()?;
        for d in dir {
            base.push_str(d);
            base.push('/');
        }
        Some(base)
    };
    match parts.get(2).copied() {
        None => with(&o.revision, &[]),
        Some("tree") if parts.len() >= 4 => with(parts[3], &parts[4..]),
        // A file's page or its download URL: the directory it is in.
        Some("blob" | "resolve") if parts.len() >= 5 => with(parts[3], &parts[4..parts.len() - 1]),
        // Already a directory URL of the files (`resolve/REV/`), or another page.
        _ => None,
    }
}

/// A hub URL's host (as [`hub_hosts`] spells it) and its path's parts, query and fragment dropped.
fn hub_path<'a>(url: &'a str, o: &HubOptions) -> Option<(String, Vec<&'a str>)> {
    let url = url.trim();
    hub_hosts(o).into_iter().find_map(|host| {
        let rest = strip_prefix_ci(url, &host)?;
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        Some((host, rest.split('/').filter(|p| !p.is_empty()).collect()))
    })
}

/// The hosts whose URLs are hub URLs: huggingface.co and the configured remote host.
fn hub_hosts(o: &HubOptions) -> Vec<String> {
    let mut hosts = vec![
        DEFAULT_REMOTE_HOST.to_owned(),
        "https://www.huggingface.co/".into(),
    ];
    let mut own = o.remote_host.trim().to_owned();
    if !own.ends_with('/') {
        own.push('/');
    }
    if own.contains("://") {
        hosts.push(own);
    }
    hosts
}

/// The whole repository a hub URL names, as `(ORG/NAME, revision)`: `{host}ORG/NAME` (the revision of
/// `o`), `{host}ORG/NAME/tree/REV` or `{host}ORG/NAME/resolve/REV` (with or without the final `/`), for
/// the hosts of [`normalise_page_url`]. A subfolder or a file names no whole repository: `None`, as for
/// any other URL. Native front ends read such a URL through the Hugging Face cache.
pub fn repo_of_url(url: &str, o: &HubOptions) -> Option<(String, String)> {
    let (_, parts) = hub_path(url, o)?;
    let id = match parts.as_slice() {
        [org, name, ..] => format!("{org}/{name}"),
        _ => return None,
    };
    if !is_hub_id(&id) {
        return None;
    }
    match parts.as_slice() {
        [_, _] => Some((id, o.revision.clone())),
        [_, _, "tree" | "resolve", rev] => Some((id, percent_decode(rev))),
        _ => None,
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| s.get(prefix.len()..))
        .flatten()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory URL (ending with `/`) a source string names: a hub id through `o`, a hub page URL as
/// its file directory, any other string as it is.
pub fn resolve(source: &str, o: &HubOptions) -> Result<String> {
    let source = source.trim();
    if source.is_empty() {
        return Err(Error::InvalidInput(
            "the model source is an empty string".into(),
        ));
    }
    let mut url = match classify(source) {
        ModelRef::HubId(id) => hub_base_url(&id, o)?,
        ModelRef::Url(u) => normalise_page_url(&u, o).unwrap_or(u),
    };
    if !url.ends_with('/') {
        url.push('/');
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d() -> HubOptions {
        HubOptions::default()
    }

    #[test]
    fn hub_urls_of_whole_repositories_name_the_repository_and_revision() {
        let own = HubOptions {
            remote_host: "http://127.0.0.1:9/".into(),
            ..d()
        };
        let repo = |id: &str, rev: &str| Some((id.to_owned(), rev.to_owned()));
        for (url, o, want) in [
            (
                "https://huggingface.co/microsoft/Florence-2-base",
                &d(),
                repo("microsoft/Florence-2-base", "main"),
            ),
            ("https://HuggingFace.co/m/F/", &d(), repo("m/F", "main")),
            (
                "https://www.huggingface.co/m/F/tree/v1.0",
                &d(),
                repo("m/F", "v1.0"),
            ),
            (
                "https://huggingface.co/m/F/resolve/refs%2Fpr%2F1/",
                &d(),
                repo("m/F", "refs/pr/1"),
            ),
            (
                "http://127.0.0.1:9/m/F/resolve/main?x=1",
                &own,
                repo("m/F", "main"),
            ),
            // A subfolder, a file, another host, a bad id: no whole repository.
            ("https://huggingface.co/m/F/tree/main/sub", &d(), None),
            (
                "https://huggingface.co/m/F/resolve/main/config.json",
                &d(),
                None,
            ),
            ("https://example.com/m/F/", &d(), None),
            ("https://huggingface.co/m/../F", &d(), None),
            ("https://huggingface.co/m", &d(), None),
        ] {
            assert_eq!(repo_of_url(url, o), want, "{url}");
        }
    }

    #[test]
    fn only_branch_and_tag_revisions_of_hub_urls_may_change() {
        let commit = "0123456789abcdef0123456789abcdef01234567";
        for (url, may) in [
            (
                "https://huggingface.co/m/F/resolve/main/model.safetensors",
                true,
            ),
            ("https://huggingface.co/m/F/resolve/v1.0/config.json", true),
            (
                "https://huggingface.co/m/F/resolve/refs%2Fpr%2F1/config.json",
                true,
            ),
            (
                &format!("https://huggingface.co/m/F/resolve/{commit}/config.json"),
                false,
            ),
            (
                &format!("https://huggingface.co/m/F/resolve/{}/x", &commit[..39]),
                true,
            ),
            ("https://host/models/tiny/config.json", false),
            ("/model/config.json?resolve/main", false),
        ] {
            assert_eq!(revision_may_change(url), may, "{url}");
        }
    }

    #[test]
    fn validators_compare_by_etag_then_last_modified_then_length() {
        let v = |etag, lm, len| Validators {
            etag,
            last_modified: lm,
            length: len,
        };
        let stored = v(
            Some("\"abc\""),
            Some("Mon, 01 Jan 2024 00:00:00 GMT"),
            Some(10),
        );
        assert_eq!(
            stored.same_file(&v(Some("W/\"abc\""), None, Some(11))),
            Some(true)
        );
        assert_eq!(
            stored.same_file(&v(
                Some("abd"),
                Some("Mon, 01 Jan 2024 00:00:00 GMT"),
                Some(10)
            )),
            Some(false)
        );
        assert_eq!(
            stored.same_file(&v(None, Some("Tue, 02 Jan 2024 00:00:00 GMT"), Some(10))),
            Some(false)
        );
        assert_eq!(stored.same_file(&v(None, None, Some(10))), Some(true));
        assert_eq!(stored.same_file(&v(None, None, Some(9))), Some(false));
        assert_eq!(stored.same_file(&v(None, None, None)), None);
    }

    #[test]
    fn ids_and_urls_are_told_apart() {
        for id in [
            "microsoft/Florence-2-base-ft",
            "a/b",
            "mlx-community/Florence-2-base-ft-bf16",
            "o_1/n.x",
        ] {
            assert!(is_hub_id(id), "{id}");
        }
        for not in [
            "/model/tiny2",
            "./model/tiny2",
            "model/tiny2/",
            "https://host/a/b",
            "a/b/c",
            "a",
            "../b",
            "a/..b",
            ".a/b",
            "a/b c",
            "blob:x/y",
            "",
        ] {
            assert!(!is_hub_id(not), "{not}");
        }
    }

    #[test]
    fn hub_ids_resolve_like_transformers_js() {
        assert_eq!(
            resolve("microsoft/Florence-2-base-ft", &d()).unwrap(),
            "https://huggingface.co/microsoft/Florence-2-base-ft/resolve/main/"
        );
        let o = HubOptions {
            revision: "refs/pr/7".into(),
            ..d()
        };
        assert_eq!(
            resolve("a/b", &o).unwrap(),
            "https://huggingface.co/a/b/resolve/refs%2Fpr%2F7/"
        );
        let mirror = HubOptions {
            revision: "v1".into(),
            remote_host: "http://127.0.0.1:9/hub".into(),
            remote_path_template: "/models/{model}@{revision}".into(),
        };
        assert_eq!(
            resolve("a/b", &mirror).unwrap(),
            "http://127.0.0.1:9/hub/models/a/b@v1/"
        );
        let bad = HubOptions {
            remote_path_template: "{revision}".into(),
            ..d()
        };
        assert!(matches!(resolve("a/b", &bad), Err(Error::InvalidInput(_))));
        assert!(matches!(
            resolve(
                "a/b",
                &HubOptions {
                    revision: " ".into(),
                    ..d()
                }
            ),
            Err(Error::InvalidInput(_))
        ));
    }

    #[test]
    fn page_urls_become_file_urls() {
        let r = |s: &str| resolve(s, &d()).unwrap();
        assert_eq!(
            r("https://huggingface.co/ORG/NAME"),
            "https://huggingface.co/ORG/NAME/resolve/main/"
        );
        assert_eq!(
            r("https://huggingface.co/ORG/NAME/tree/dev/sub/dir"),
            "https://huggingface.co/ORG/NAME/resolve/dev/sub/dir/"
        );
        assert_eq!(
            r("https://huggingface.co/ORG/NAME/blob/abc123/config.json"),
            "https://huggingface.co/ORG/NAME/resolve/abc123/"
        );
        assert_eq!(
            r("https://huggingface.co/ORG/NAME/resolve/main/"),
            "https://huggingface.co/ORG/NAME/resolve/main/"
        );
        assert_eq!(
            r("https://huggingface.co/ORG/NAME/tree/refs%2Fpr%2F2"),
            "https://huggingface.co/ORG/NAME/resolve/refs%2Fpr%2F2/"
        );
        // A page URL of the configured mirror too.
        let o = HubOptions {
            remote_host: "http://127.0.0.1:8080/hub/".into(),
            ..d()
        };
        assert_eq!(
            resolve("http://127.0.0.1:8080/hub/o/n", &o).unwrap(),
            "http://127.0.0.1:8080/hub/o/n/resolve/main/"
        );
        // Other URLs are directories as given.
        assert_eq!(r("/model/tiny2"), "/model/tiny2/");
        assert_eq!(r("https://cdn.example/x/"), "https://cdn.example/x/");
        assert_eq!(
            r("https://huggingface.co/spaces"),
            "https://huggingface.co/spaces/"
        );
        assert!(resolve("  ", &d()).is_err());
    }
}
