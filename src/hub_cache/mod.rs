//! Native model ids: `--model org/name[@revision]` resolved to a local directory in the Hugging Face cache,
//! shared with the Python libraries (`huggingface_hub`, `transformers`).
//!
//! [`resolve_model`] turns a `--model` argument into a directory: an existing directory is used as it
//! is; a hub id is downloaded (what is missing) into the cache and its snapshot directory returned. The
//! files are the ones the loader reads, found in its order: the configs, `tokenizer.json`, then the first
//! weights layout the repository has (`model.safetensors.index.json` and its shards, `model.safetensors`,
//! `pytorch_model.bin.index.json` and its shards, `pytorch_model.bin`).
//!
//! The cache layout is `huggingface_hub`'s (see [`layout`]): `models--ORG--NAME/blobs/ETAG`,
//! `snapshots/COMMIT/FILE` (a relative link to the blob), `refs/REVISION` (the commit a branch or tag
//! pointed to), `.no_exist/COMMIT/FILE` (a file the repository lacks). Its root is `HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
//!
//! The hub is `HF_ENDPOINT` (default `https://huggingface.co`; a mirror with the same paths works) and a
//! file is `ENDPOINT/ORG/NAME/resolve/REVISION/FILE`; its commit and ETag come from the `X-Repo-Commit`
//! and `X-Linked-Etag`/`ETag` headers of a HEAD request that follows no cross-host redirect (see
//! [`http`]). `HF_TOKEN` (or the token file `HF_HOME/token`) is sent to the endpoint's host only, never to
//! the host a large file redirects to. Offline (`HF_HUB_OFFLINE=1` or [`HubCacheOptions::offline`]),
//! only the cache is read; online, a network failure falls back to the cached snapshot of the revision.

pub mod checksum;
mod download;
pub mod http;
pub mod layout;
pub mod progress;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::hub::is_hub_id;
use crate::weights::load::{
    CheckpointIndex, CONFIG_FILE, INDEX_FILE, SINGLE_FILE, TORCH_FILE, TORCH_INDEX_FILE,
};

pub use download::content_range;
pub use layout::RepoCache;
pub use progress::{DownloadProgress, ProgressObserver};

/// The files a model directory needs besides its weights (`config.json` and `tokenizer.json` required).
pub const REQUIRED_FILES: [&str; 2] = [CONFIG_FILE, "tokenizer.json"];
/// Read when present.
pub const OPTIONAL_FILES: [&str; 4] = [
    "preprocessor_config.json",
    "generation_config.json",
    "processor_config.json",
    "tokenizer_config.json",
];
/// Weights layouts in the loader's order: an index (then its shards) or a single file.
const WEIGHT_LAYOUTS: [&str; 4] = [INDEX_FILE, SINGLE_FILE, TORCH_INDEX_FILE, TORCH_FILE];

/// The hub's default endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how model ids are fetched.
#[derive(Clone, Debug)]
pub struct HubCacheOptions {
    /// The hub (no trailing slash), e.g. `https://huggingface.co` or a mirror.
    pub endpoint: String,
    /// The cache root (`.../huggingface/hub`).
    pub cache_dir: PathBuf,
    /// Only the cache is read: nothing is fetched.
    pub offline: bool,
    /// A bearer token for private or gated repositories.
    pub token: Option<String>,
    /// Print a line per downloaded file to stderr.
    pub verbose: bool,
    /// Told the bytes done of each file being downloaded.
    pub progress: Option<ProgressObserver>,
}

impl HubCacheOptions {
    /// From the environment, as `huggingface_hub` reads it: `HF_ENDPOINT`, `HF_HUB_CACHE` / `HF_HOME` /
    /// `XDG_CACHE_HOME`, `HF_HUB_OFFLINE`, `HF_TOKEN` (or `HF_TOKEN_PATH`, `HF_HOME/token`).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let xdg = var("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
                home_dir()
                    .unwrap_or_else(|| PathBuf::from("."))
                    .join(".cache")
            });
            xdg.join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_path = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("token"));
        let token = var("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(token_path)
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
        });
        HubCacheOptions {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
                .trim_end_matches('/')
                .to_owned(),
            cache_dir,
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| truthy(&v)),
            token,
            verbose: false,
            progress: None,
        }
    }
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "on" | "yes" | "true"
    )
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .map(PathBuf::from)
}

/// A parsed `org/name[@revision]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelId {
    pub repo: String,
    pub revision: String,
}

impl ModelId {
    /// `org/name` or `org/name@revision` (a branch, tag, `refs/pr/N` or commit hash).
    pub fn parse(s: &str) -> Option<ModelId> {
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (s, "main"),
        };
        (is_hub_id(repo) && layout::is_revision(revision)).then(|| ModelId {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
        })
    }
}

/// A `--model` argument as a local directory: an existing directory as it is, a hub id
/// (`org/name[@revision]`) through the cache (downloaded as needed, see the module docs).
pub fn resolve_model(arg: &str, opts: &HubCacheOptions) -> Result<PathBuf> {
    let path = Path::new(arg);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let Some(id) = ModelId::parse(arg.trim()) else {
        return Err(Error::FileRead {
            file: arg.to_owned(),
            msg: "no such model directory (and not a hub id org/name[@revision])".into(),
        });
    };
    snapshot(&id, opts)
}

/// The snapshot directory of `id` with every file the loader needs.
pub fn snapshot(id: &ModelId, opts: &HubCacheOptions) -> Result<PathBuf> {
    let cache = RepoCache::new(&opts.cache_dir, &id.repo);
    if opts.offline {
        return cached_snapshot(&cache, id, "offline mode (HF_HUB_OFFLINE)");
    }
    let client = http::Client::new(opts);
    match download_snapshot(&cache, id, &client) {
        Ok(dir) => Ok(dir),
        // The hub cannot be reached: the revision's cached snapshot, if complete, still serves.
        Err(e @ Error::FileRead { .. }) if client.unreachable() => {
            cached_snapshot(&cache, id, &format!("the hub is unreachable ({e})"))
        }
        Err(e) => Err(e),
    }
}

/// A complete snapshot from the cache alone.
fn cached_snapshot(cache: &RepoCache, id: &ModelId, why: &str) -> Result<PathBuf> {
    let missing = |what: String| Error::FileRead {
        file: format!("{}@{}", id.repo, id.revision),
        msg: format!("{what} in the cache {}; {why}", cache.root().display()),
    };
    let commit = cache
        .commit_of(&id.revision)
        .ok_or_else(|| missing("no snapshot".into()))?;
    let dir = cache.snapshot_dir(&commit);
    for f in REQUIRED_FILES {
        if !dir.join(f).is_file() {
            return Err(missing(format!("{f} is not")));
        }
    }
    if !has_cached_weights(&dir)? {
        return Err(missing("no complete weights".into()));
    }
    Ok(dir)
}

/// Whether `dir` holds one whole weights layout (an index and all its shards, or a single file).
fn has_cached_weights(dir: &Path) -> Result<bool> {
    for layout in WEIGHT_LAYOUTS {
        let p = dir.join(layout);
        if !p.is_file() {
            continue;
        }
        if layout == INDEX_FILE || layout == TORCH_INDEX_FILE {
            let idx = read_index(&p, layout)?;
            return Ok(idx.shards.iter().all(|s| dir.join(s).is_file()));
        }
        return Ok(true);
    }
    Ok(false)
}

fn read_index(path: &Path, layout: &str) -> Result<CheckpointIndex> {
    let bytes = crate::files::read_capped(path, crate::files::MAX_JSON_FILE)?;
    CheckpointIndex::parse_file(&bytes, layout)
}

/// Fetch what the snapshot lacks: the configs, then the first weights layout the repository has.
fn download_snapshot(cache: &RepoCache, id: &ModelId, client: &http::Client) -> Result<PathBuf> {
    let mut commit = None;
    for f in REQUIRED_FILES {
        client.fetch(cache, id, &mut commit, f, true)?;
    }
    for f in OPTIONAL_FILES {
        client.fetch(cache, id, &mut commit, f, false)?;
    }
    for layout in WEIGHT_LAYOUTS {
        let Some(path) = client.fetch(cache, id, &mut commit, layout, false)? else {
            continue;
        };
        if layout == INDEX_FILE || layout == TORCH_INDEX_FILE {
            for shard in read_index(&path, layout)?.shards {
                client.fetch(cache, id, &mut commit, &shard, true)?;
            }
        }
        let commit = commit.unwrap_or_default();
        return Ok(cache.snapshot_dir(&commit));
    }
    Err(Error::FileRead {
        file: format!("{}@{}", id.repo, id.revision),
        msg: format!(
            "the repository has no weights ({} nor {})",
            SINGLE_FILE, TORCH_FILE
        ),
    })
}
