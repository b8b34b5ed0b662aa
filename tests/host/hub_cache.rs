//! Native hub ids (`--model org/name[@revision]`) against a hub-shaped server on loopback: the files land
//! in the Hugging Face cache layout (`huggingface_hub`'s: refs, blobs named by ETag, snapshot links,
//! `.no_exist` markers), the weights layout is found in the loader's order (single file, sharded
//! safetensors, sharded pickles), a second resolution downloads nothing, offline mode and an unreachable
//! hub read the cache, the token never leaves the hub's host, and a hostile hub cannot name paths
//! outside the cache. The CLI answers on `--model org/name` exactly as on the fixture directory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use florence2_wasm::hub_cache::{
    resolve_model, DownloadProgress, HubCacheOptions, ModelId, ProgressObserver,
};
use florence2_wasm::Error;

use std::net::TcpListener;

use crate::common::hub::{fake_etag, fixture, Gate, Hub, Quirks, COMMIT};

fn tempdir(tag: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hub-cache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn assert_same_files(snapshot: &Path, fixture_dir: &Path) {
    for e in std::fs::read_dir(fixture_dir).unwrap() {
        let name = e.unwrap().file_name();
        let a = std::fs::read(snapshot.join(&name))
            .unwrap_or_else(|_| panic!("{name:?} not in the snapshot"));
        assert_eq!(
            a,
            std::fs::read(fixture_dir.join(&name)).unwrap(),
            "{name:?} differs"
        );
    }
}

#[test]
fn a_hub_id_lands_in_the_hf_cache_layout_and_a_second_resolution_downloads_nothing() {
    let hub = Hub::start(Quirks::default());
    let cache = tempdir("layout");
    let dir = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap();
    let repo = cache.join("models--acme--tiny4");
    assert_eq!(dir, repo.join("snapshots").join(COMMIT));
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    assert_same_files(&dir, &fixture("tiny4"));
    // Each snapshot file is a relative link to its blob, named by the ETag (quotes dropped).
    let w = std::fs::read(fixture("tiny4").join("model.safetensors")).unwrap();
    let link = std::fs::read_link(dir.join("model.safetensors")).unwrap();
    assert_eq!(
        link,
        PathBuf::from(format!("../../blobs/{}", fake_etag(&w, true)))
    );
    // tiny4 has no sharded or pickle weights: nothing asked after the single file is found.
    let heads: Vec<String> = hub
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.1 == "HEAD")
        .map(|r| r.2.clone())
        .collect();
    assert!(
        !heads.iter().any(|p| p.ends_with("pytorch_model.bin")),
        "{heads:?}"
    );
    // No partial download left; the weights came from the storage host, without the token.
    let blobs: Vec<String> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        blobs.iter().all(|b| !b.ends_with(".incomplete")),
        "{blobs:?}"
    );
    for (server, _, path, auth) in hub.seen.lock().unwrap().iter() {
        match *server {
            "hub" => assert_eq!(auth.as_deref(), Some("Bearer hf_secret"), "{path}"),
            _ => assert_eq!(auth, &None, "the token went to the storage host: {path}"),
        }
    }
    assert_eq!(hub.count("cdn", "GET"), 1, "one weights download");
    // Again: HEAD requests only, the same directory.
    let gets = hub.count("hub", "GET") + hub.count("cdn", "GET");
    assert_eq!(
        resolve_model("acme/tiny4", &hub.options(&cache)).unwrap(),
        dir
    );
    assert_eq!(
        hub.count("hub", "GET") + hub.count("cdn", "GET"),
        gets,
        "a cached file was downloaded again"
    );
}

#[test]
fn sharded_safetensors_and_sharded_pickles_fetch_the_index_and_every_shard() {
    let hub = Hub::start(Quirks::default());
    let cache = tempdir("sharded");
    for name in [
        "tiny4-f16-sharded",
        "tiny2-orig-pt-sharded",
        "tiny2-orig-pt-legacy",
    ] {
        let dir = resolve_model(&format!("acme/{name}@{COMMIT}"), &hub.options(&cache)).unwrap();
        assert_same_files(&dir, &fixture(name));
    }
    // A commit as the revision writes no ref.
    assert!(!cache.join("models--acme--tiny4-f16-sharded/refs").exists());
}

#[test]
fn offline_and_unreachable_read_the_cache_and_name_what_is_missing() {
    let hub = Hub::start(Quirks::default());
    let cache = tempdir("offline");
    let mut opts = hub.options(&cache);
    opts.offline = true;
    let e = resolve_model("acme/tiny2", &opts).unwrap_err().to_string();
    assert!(
        e.contains("acme/tiny2@main") && e.contains("offline"),
        "{e}"
    );
    assert_eq!(
        hub.seen.lock().unwrap().len(),
        0,
        "offline mode asked the hub"
    );
    opts.offline = false;
    let dir = resolve_model("acme/tiny2", &opts).unwrap();
    let asked = hub.seen.lock().unwrap().len();
    opts.offline = true;
    assert_eq!(resolve_model("acme/tiny2", &opts).unwrap(), dir);
    assert_eq!(
        hub.seen.lock().unwrap().len(),
        asked,
        "offline mode asked the hub"
    );
    // A closed port: the cached snapshot of the revision serves; an uncached model says so.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    opts.offline = false;
    opts.endpoint = format!("http://127.0.0.1:{port}");
    assert_eq!(resolve_model("acme/tiny2", &opts).unwrap(), dir);
    let e = resolve_model("acme/tiny4", &opts).unwrap_err().to_string();
    assert!(e.contains("unreachable") && e.contains("acme/tiny4"), "{e}");
}

#[test]
fn errors_name_the_cause_and_a_hostile_hub_writes_nothing_outside_the_cache() {
    let cache = tempdir("errors");
    // Private repository.
    let hub = Hub::start(Quirks {
        private: true,
        ..Default::default()
    });
    let e = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap_err();
    assert_eq!(e.name(), "Florence2LoadError");
    assert!(e.to_string().contains("HF_TOKEN"), "{e}");
    // Unknown repository / revision, and a path that is neither a directory nor an id.
    let hub = Hub::start(Quirks::default());
    let e = resolve_model("acme/no-such-model", &hub.options(&cache))
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json") && e.contains("not found"), "{e}");
    let e = resolve_model("acme/tiny4@v9", &hub.options(&cache))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not found"), "{e}");
    let e = resolve_model("./no/such/dir", &hub.options(&cache))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no such model directory"), "{e}");
    // An ETag that would climb out of the blobs directory is refused before it becomes a path.
    let hub = Hub::start(Quirks {
        etag: Some("\"../../../../escaped\"".into()),
        ..Default::default()
    });
    let e = resolve_model("acme/tiny4", &hub.options(&cache))
        .unwrap_err()
        .to_string();
    assert!(e.contains("ETag"), "{e}");
    assert!(!cache.parent().unwrap().join("escaped").exists());
    // Ids and revisions.
    assert_eq!(
        ModelId::parse("microsoft/Florence-2-base-ft@refs/pr/1"),
        Some(ModelId {
            repo: "microsoft/Florence-2-base-ft".into(),
            revision: "refs/pr/1".into()
        })
    );
    for bad in ["a/b/c", "a/b@../x", "../b", "a/b@", "a/b@x/../../y"] {
        assert_eq!(ModelId::parse(bad), None, "{bad}");
    }
}

#[test]
fn the_cli_answers_on_a_hub_id_as_on_the_directory_and_offline_from_the_cache() {
    let hub = Hub::start(Quirks::default());
    let cache = tempdir("cli");
    let image = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images/scene.png");
    let run = |model: &str, extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .env("HF_ENDPOINT", &hub.endpoint)
            .env("HF_HUB_CACHE", &cache)
            .env_remove("HF_HUB_OFFLINE")
            .env_remove("HF_TOKEN")
            .args([
                "run", "--device", "cpu", "--dtype", "fp32", "--model", model, "--image",
            ])
            .arg(&image)
            .args([
                "--task",
                "<OD>",
                "--max-new-tokens",
                "12",
                "--num-beams",
                "1",
                "--json",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_object_mut().unwrap().remove("timings_ms");
        v.as_object_mut().unwrap().remove("memory");
        v
    };
    let direct = run(fixture("tiny4").to_str().unwrap(), &[]);
    assert_eq!(run("acme/tiny4", &[]), direct);
    let asked = hub.seen.lock().unwrap().len();
    assert_eq!(run("acme/tiny4", &["--offline"]), direct);
    assert_eq!(
        hub.seen.lock().unwrap().len(),
        asked,
        "--offline asked the hub"
    );
}

/// The blobs directory's file names.
fn blob_names(repo: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(repo.join("blobs"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn an_interrupted_download_resumes_from_its_incomplete_blob_with_a_range_request() {
    let hub = Hub::start(Quirks {
        cut_first_get: true,
        ..Default::default()
    });
    let cache = tempdir("resume");
    let repo = cache.join("models--acme--tiny4");
    let w = std::fs::read(fixture("tiny4").join("model.safetensors")).unwrap();
    let etag = fake_etag(&w, true);
    let e = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap_err();
    assert!(e.to_string().contains("interrupted"), "{e}");
    // Only the partial blob, under huggingface_hub's name, and no snapshot link to it.
    let part = repo.join("blobs").join(format!("{etag}.incomplete"));
    assert_eq!(
        std::fs::metadata(&part).unwrap().len(),
        (w.len() / 2) as u64
    );
    assert!(!repo.join("blobs").join(&etag).exists());
    let snap = repo.join("snapshots").join(COMMIT);
    assert!(snap.join("model.safetensors").symlink_metadata().is_err());
    // The next run asks for the rest and completes the same bytes, reporting progress from the half.
    let events: Arc<Mutex<Vec<DownloadProgress>>> = Arc::default();
    let mut opts = hub.options(&cache);
    let log = events.clone();
    opts.progress = Some(ProgressObserver::new(move |p| {
        log.lock().unwrap().push(p.clone())
    }));
    let dir = resolve_model("acme/tiny4", &opts).unwrap();
    let events = events.lock().unwrap();
    let total = Some(w.len() as u64);
    let first = events.first().unwrap();
    assert_eq!(first.file, "acme/tiny4/model.safetensors");
    assert!(first.done > (w.len() / 2) as u64 && first.total == total);
    assert!(events.windows(2).all(|p| p[0].done <= p[1].done));
    let last = events.last().unwrap();
    assert!(last.finished && last.done == w.len() as u64, "{last:?}");
    assert_eq!(events.iter().filter(|p| p.finished).count(), 1);
    assert_eq!(
        *hub.ranges.lock().unwrap(),
        vec![format!("bytes={}-", w.len() / 2)]
    );
    assert_same_files(&dir, &fixture("tiny4"));
    assert!(!part.exists());
    assert_eq!(hub.count("cdn", "GET"), 2);
}

#[test]
fn a_checksum_mismatch_or_a_hostile_length_or_range_keeps_no_blob() {
    let w = std::fs::read(fixture("tiny4").join("model.safetensors")).unwrap();
    let etag = fake_etag(&w, true);
    // Same length, one byte off: the sha256 the ETag names does not match.
    let hub = Hub::start(Quirks {
        corrupt: true,
        ..Default::default()
    });
    let cache = tempdir("checksum");
    let repo = cache.join("models--acme--tiny4");
    let e = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap_err();
    assert_eq!(e.name(), "Florence2LoadError");
    match &e {
        Error::Checksum { expected, got, .. } => {
            assert_eq!(expected, &etag);
            assert_ne!(got, &etag);
        }
        other => panic!("not a checksum error: {other}"),
    }
    // The small files verified (their git blob ids match) and stay; the weights left nothing.
    let names = blob_names(&repo);
    assert!(!names.iter().any(|n| n.starts_with(&etag)), "{names:?}");
    assert!(repo
        .join("snapshots")
        .join(COMMIT)
        .join("config.json")
        .is_file());
    // A body longer than announced: a named cause, nothing kept.
    let hub = Hub::start(Quirks {
        overlong: 1 << 20,
        ..Default::default()
    });
    let cache = tempdir("overlong");
    let e = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap_err();
    assert!(e.to_string().contains("more than"), "{e}");
    let names = blob_names(&cache.join("models--acme--tiny4"));
    assert!(!names.iter().any(|n| n.starts_with(&etag)), "{names:?}");
    // A resumed answer whose Content-Range does not continue the partial file is refused.
    let hub = Hub::start(Quirks {
        cut_first_get: true,
        bad_range: true,
        ..Default::default()
    });
    let cache = tempdir("bad-range");
    assert!(resolve_model("acme/tiny4", &hub.options(&cache)).is_err());
    let e = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap_err();
    assert!(e.to_string().contains("Content-Range"), "{e}");
    let repo = cache.join("models--acme--tiny4");
    assert!(!repo.join("blobs").join(&etag).exists());
}

/// A hostile size (2^63, u64::MAX) announced for the weights: a named error, no blob, no panic (the
/// announced length is only a cap, never an allocation); a sharded index naming a shard outside the
/// repository (`../`, an absolute path): refused before it becomes a URL or a path.
#[test]
fn a_huge_announced_size_or_an_index_naming_paths_outside_the_repository_is_refused() {
    let w = std::fs::read(fixture("tiny4").join("model.safetensors")).unwrap();
    let etag = fake_etag(&w, true);
    for size in ["9223372036854775808", "18446744073709551615"] {
        let hub = Hub::start(Quirks {
            linked_size: Some(size.into()),
            ..Default::default()
        });
        let cache = tempdir("huge-size");
        let e = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap_err();
        assert_eq!(e.name(), "Florence2LoadError");
        assert!(e.to_string().contains(size), "{e}");
        let names = blob_names(&cache.join("models--acme--tiny4"));
        assert!(!names.iter().any(|n| n == &etag), "{names:?}");
    }
    let shard = "model-00001-of-00003.safetensors";
    for hostile in ["../../../escaped.safetensors", "/tmp/escaped.safetensors"] {
        let hub = Hub::start(Quirks {
            rewrite: Some((format!("\"{shard}\""), format!("\"{hostile}\""))),
            ..Default::default()
        });
        let cache = tempdir("hostile-shard");
        let id = format!("acme/tiny2-orig-q4-sharded@{COMMIT}");
        let e = resolve_model(&id, &hub.options(&cache))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(hostile) && e.contains("not a plain relative"),
            "{e}"
        );
        assert!(!cache.parent().unwrap().join("escaped.safetensors").exists());
        // Refused at the index: no shard was asked for.
        assert_eq!(hub.count("cdn", "GET"), 0);
    }
}

/// A storage host that redirects to itself forever: a named error after the redirect limit, not a hang,
/// and no blob.
#[test]
fn a_redirect_loop_ends_in_a_named_error() {
    let hub = Hub::start(Quirks {
        redirect_loop: true,
        ..Default::default()
    });
    let cache = tempdir("redirect-loop");
    let e = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap_err();
    assert_eq!(e.name(), "Florence2LoadError");
    assert!(e.to_string().contains("redirects"), "{e}");
    // The limit (8 hops, the hub's redirect to the storage host among them) bounds the loop's requests.
    let gets = hub.count("cdn", "GET");
    assert!((2..=8).contains(&gets), "{gets} GETs");
    let w = std::fs::read(fixture("tiny4").join("model.safetensors")).unwrap();
    let names = blob_names(&cache.join("models--acme--tiny4"));
    assert!(!names.contains(&fake_etag(&w, true)), "{names:?}");
}

/// Whether a process waits on a flock of the file with inode `ino` (a `->` line of /proc/locks).
#[cfg(target_os = "linux")]
fn lock_has_waiter(ino: u64) -> bool {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let tag = format!(":{ino} ");
    locks.lines().any(|l| l.contains("->") && l.contains(&tag))
}

/// The environment variable that makes the test below a child that resolves one id and exits.
const CHILD_ENV: &str = "FLORENCE2_HUB_CACHE_CHILD";

/// Two processes resolve the same id at once: the first holds the blob's lock
/// (`.locks/models--ORG--NAME/ETAG.lock`, huggingface_hub's) while the storage host stalls its GET;
/// the second is seen waiting on that lock (or, were there no lock, sending its own GET), then the
/// stall ends. The weights are fetched once and both processes succeed.
#[cfg(target_os = "linux")]
#[test]
fn two_processes_download_a_blob_once() {
    if let Ok(v) = std::env::var(CHILD_ENV) {
        let (endpoint, cache) = v.split_once('|').unwrap();
        let opts = HubCacheOptions {
            endpoint: endpoint.into(),
            cache_dir: cache.into(),
            offline: false,
            token: None,
            verbose: false,
            progress: None,
        };
        resolve_model("acme/tiny4", &opts).unwrap();
        return;
    }
    let gate = Gate::default();
    let hub = Hub::start(Quirks {
        gate: Some(gate.clone()),
        ..Default::default()
    });
    let cache = tempdir("two-processes");
    let child = || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "hub_cache::two_processes_download_a_blob_once"])
            .args(["--test-threads=1", "--nocapture"])
            .env(CHILD_ENV, format!("{}|{}", hub.endpoint, cache.display()))
            .spawn()
            .unwrap()
    };
    let weights_gets = || {
        let seen = hub.seen.lock().unwrap();
        let n = |server| {
            seen.iter()
                .filter(|r| r.0 == server && r.1 == "GET" && r.2.ends_with("model.safetensors"))
                .count()
        };
        (n("hub"), n("cdn"))
    };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        // Events, polled; the bound only guards against a hang.
        let t = std::time::Instant::now();
        while !done() {
            assert!(t.elapsed().as_secs() < 120, "never saw: {what}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    let mut a = child();
    wait_for("the first GET", &|| weights_gets().1 == 1);
    let w = std::fs::read(fixture("tiny4").join("model.safetensors")).unwrap();
    let lock = cache
        .join(".locks/models--acme--tiny4")
        .join(format!("{}.lock", fake_etag(&w, true)));
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(&lock).unwrap().ino();
    let mut b = child();
    wait_for("the second process waiting (or fetching)", &|| {
        lock_has_waiter(ino) || weights_gets().0 > 1
    });
    gate.open();
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    assert_eq!(weights_gets(), (1, 1), "the weights were fetched twice");
    let dir = cache.join("models--acme--tiny4/snapshots").join(COMMIT);
    assert_same_files(&dir, &fixture("tiny4"));
    let names = blob_names(&cache.join("models--acme--tiny4"));
    assert!(
        names.iter().all(|n| !n.ends_with(".incomplete")),
        "{names:?}"
    );
}

/// kill -9 of a CLI process mid-download leaves only `blobs/ETAG.incomplete` (no blob under its final
/// name, no snapshot link to the weights); the next resolution resumes it and verifies the bytes.
#[cfg(unix)]
#[test]
fn a_killed_download_leaves_no_trusted_blob_and_the_next_run_resumes() {
    let stall = Gate::default();
    let hub = Hub::start(Quirks {
        stall_mid_body: Some(stall.clone()),
        ..Default::default()
    });
    let cache = tempdir("killed");
    let repo = cache.join("models--acme--tiny4");
    let w = std::fs::read(fixture("tiny4").join("model.safetensors")).unwrap();
    let etag = fake_etag(&w, true);
    let part = repo.join("blobs").join(format!("{etag}.incomplete"));
    let image = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images/scene.png");
    let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_CACHE", &cache)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_TOKEN")
        .args(["run", "--device", "cpu", "--model", "acme/tiny4", "--image"])
        .arg(&image)
        .args(["--task", "<OD>"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The event: half the weights are on disk (the storage host then holds the connection).
    let t = std::time::Instant::now();
    while std::fs::metadata(&part).map_or(0, |m| m.len()) < (w.len() / 2) as u64 {
        assert!(
            t.elapsed().as_secs() < 120,
            "the download never reached half"
        );
        assert!(cli.try_wait().unwrap().is_none(), "the CLI ended early");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    cli.kill().unwrap(); // SIGKILL
    cli.wait().unwrap();
    stall.open();
    assert!(
        !repo.join("blobs").join(&etag).exists(),
        "a half blob under its final name"
    );
    let snap = repo.join("snapshots").join(COMMIT);
    assert!(snap.join("model.safetensors").symlink_metadata().is_err());
    // Offline, the cache has no complete snapshot to offer.
    let mut offline = hub.options(&cache);
    offline.offline = true;
    let e = resolve_model("acme/tiny4", &offline).unwrap_err();
    assert!(e.to_string().contains("no complete weights"), "{e}");
    // Online again: resumed from the half, verified, linked.
    let dir = resolve_model("acme/tiny4", &hub.options(&cache)).unwrap();
    assert_eq!(
        *hub.ranges.lock().unwrap(),
        vec![format!("bytes={}-", w.len() / 2)]
    );
    assert_same_files(&dir, &fixture("tiny4"));
    assert!(!part.exists());
}
