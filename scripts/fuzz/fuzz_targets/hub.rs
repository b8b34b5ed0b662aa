//! What a hub server sends that becomes a name or a number, on arbitrary text: ETag headers (a blob's
//! file name), `Content-Range` of a resumed download, `org/name@revision` ids (a ref's path) and the
//! sharded index JSON as the hub path reads it (`model.safetensors.index.json` and
//! `pytorch_model.bin.index.json`). No panic; an accepted ETag is a plain key (no `/`, `.` or quote);
//! an accepted range starts inside its total; an accepted id's repository and revision are plain
//! relative names; an accepted index names plain relative shards of the layout's extension.
//! Allocation bound: 64 n + 1 MiB.
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::hub_cache::layout::{is_key, is_revision, normalize_etag};
use florence2_wasm::hub_cache::{checksum, content_range, ModelId};
use florence2_wasm::weights::source::check_relative_name;
use florence2_wasm::weights::CheckpointIndex;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

/// The header and id parsers on one line of text.
fn headers(text: &str) {
    if let Some(k) = normalize_etag(text) {
        assert!(is_key(&k) && !k.contains(['/', '.', '"', '\\']), "{k:?}");
        let _ = checksum::kind_of(&k);
    }
    if let Some((start, total)) = content_range(text) {
        assert!(total.is_none_or(|t| start < t), "{text:?}");
    }
    if let Some(id) = ModelId::parse(text) {
        assert!(is_revision(&id.revision), "{id:?}");
        assert_eq!(id.repo.matches('/').count(), 1, "{id:?}");
        assert!(check_relative_name(&id.repo), "{id:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let (_, peak) = common::peak_during(|| {
        if let Ok(text) = std::str::from_utf8(data) {
            headers(text);
        }
        for (file, ext) in [
            ("model.safetensors.index.json", ".safetensors"),
            ("pytorch_model.bin.index.json", ".bin"),
        ] {
            if let Ok(idx) = CheckpointIndex::parse_file(data, file) {
                for s in &idx.shards {
                    assert!(check_relative_name(s) && s.ends_with(ext), "{s:?}");
                }
            }
        }
    });
    common::check_bound("hub", data.len(), peak, 64, 1 << 20);
});
