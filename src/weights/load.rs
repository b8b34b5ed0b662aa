//! The checkpoint loader: config.json, then `model.safetensors` or the shards named by
//! `model.safetensors.index.json`, else a PyTorch `pytorch_model.bin` or its shards
//! ([`load_checkpoint`], over any [`ModelSource`]); and the ranged reader
//! of one file ([`load_source`]): a [`ByteSource`] read in bounded ranges (header first, then only the
//! tensors the model needs, `chunk_bytes` at a time).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::config::Florence2Config;
use crate::error::{Error, Result};
use crate::gpu::Device;
use crate::weights::assemble::{Assembler, LoadOptions};
use crate::weights::header::{parse_header, Header, HeaderState, MAX_HEADER_LEN};
use crate::weights::names::detect_layout;
use crate::weights::sink::{CheckpointSink, TensorSink};
use crate::weights::source::{check_relative_name, ByteSource, ModelFiles};
use crate::weights::store::Weights;

/// Where a model's files come from: what the one loader reads through.
#[allow(async_fn_in_trait)]
pub trait ModelSource {
    /// A small file read whole, at most `max` bytes (more is an error). `Ok(None)` when the file is
    /// absent and not `required`; an absent required file is an error.
    async fn read_small(&self, name: &str, required: bool, max: u64) -> Result<Option<Vec<u8>>>;
    /// Load the weights file `name` (safetensors, or a PyTorch checkpoint when it ends in `.bin`) into
    /// `asm`; `expect`: tensors an index places in it (each must be there). `Ok(false)` when the
    /// file is absent.
    async fn load_file(&self, name: &str, asm: &mut Assembler, expect: &[&str]) -> Result<bool>;
    /// The checkpoint's weights on the GPU: [`crate::weights::load_weights`] (a source may try it
    /// again, e.g. after it dropped a damaged cached copy of a file).
    async fn load_weights(
        &self,
        gpu: &Arc<Device>,
        cfg: &Florence2Config,
        opts: LoadOptions,
    ) -> Result<Weights> {
        load_weights(gpu, self, cfg, opts).await
    }
}

impl<F: ModelFiles> ModelSource for F {
    async fn read_small(&self, name: &str, required: bool, max: u64) -> Result<Option<Vec<u8>>> {
        match ModelFiles::read_small(self, name, max).await? {
            None if required => Err(Error::FileRead {
                file: name.to_owned(),
                msg: "not found".into(),
            }),
            r => Ok(r),
        }
    }

    async fn load_file(&self, name: &str, asm: &mut Assembler, expect: &[&str]) -> Result<bool> {
        load_named_file(self, name, asm, expect).await
    }
}

/// Open the weights file `name` of `files` and read it into `sink` (a PyTorch checkpoint when the name
/// ends in `.bin`, else safetensors); `expect_names`: tensors an index places in it. `Ok(false)` when the
/// file is absent.
pub async fn load_named_file<F: ModelFiles + ?Sized, K: TensorSink>(
    files: &F,
    name: &str,
    sink: &mut K,
    expect_names: &[&str],
) -> Result<bool> {
    let Some(mut src) = files.open(name).await? else {
        return Ok(false);
    };
    if crate::weights::torch_load::is_torch_file(name) {
        crate::weights::torch_load::load_torch_source(sink, &mut src, expect_names).await?;
    } else {
        load_source(sink, &mut src, expect_names).await?;
    }
    Ok(true)
}

impl<S: ModelSource + ?Sized> CheckpointSink<S> for Assembler {
    async fn load_file(&mut self, src: &S, name: &str, expect_names: &[&str]) -> Result<bool> {
        src.load_file(name, self, expect_names).await
    }
}

pub const CONFIG_FILE: &str = "config.json";
pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// A PyTorch checkpoint (zip or legacy pickle format, [`crate::weights::torch_load`]).
pub const TORCH_FILE: &str = "pytorch_model.bin";
pub const TORCH_INDEX_FILE: &str = "pytorch_model.bin.index.json";
/// Cap on the small JSON files (config, index, preprocessor/generation/processor configs), the same
/// natively and in the browser (the largest real one, a shard index, is ~100 KB).
pub const MAX_JSON_BYTES: u64 = 4 << 20;

/// A parsed, validated `model.safetensors.index.json` (or `pytorch_model.bin.index.json`: the same
/// format, naming `.bin` shards).
#[derive(Clone, Debug)]
pub struct CheckpointIndex {
    /// Tensor name -> shard file name.
    pub weight_map: BTreeMap<String, String>,
    /// Distinct shard file names, sorted.
    pub shards: Vec<String>,
}

/// Most shards an index may name.
const MAX_SHARDS: usize = 4096;

impl CheckpointIndex {
    /// Parse `model.safetensors.index.json`.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        Self::parse_file(bytes, INDEX_FILE)
    }

    /// Parse the index `file` (`model.safetensors.index.json`: `.safetensors` shards;
    /// `pytorch_model.bin.index.json`: `.bin` shards).
    pub fn parse_file(bytes: &[u8], file: &str) -> Result<Self> {
        let ext = if file == TORCH_INDEX_FILE {
            ".bin"
        } else {
            ".safetensors"
        };
        let bad = |msg: String| Error::CheckpointIndex {
            file: file.into(),
            msg,
        };
        let v: serde_json::Value = crate::json::parse_strict_slice(bytes)
            .map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let wm = v
            .get("weight_map")
            .and_then(|w| w.as_object())
            .ok_or_else(|| bad("no weight_map object".into()))?;
        if wm.is_empty() {
            return Err(bad("weight_map is empty".into()));
        }
        let mut weight_map = BTreeMap::new();
        let mut shards = BTreeSet::new();
        for (name, shard) in wm {
            let shard = shard
                .as_str()
                .ok_or_else(|| bad(format!("weight_map['{name}'] is not a string")))?;
            if !check_relative_name(shard) {
                return Err(bad(format!(
                    "shard name '{shard}' is not a plain relative file name"
                )));
            }
            if !shard.ends_with(ext) {
                return Err(bad(format!("shard '{shard}' is not a {ext} file")));
            }
            shards.insert(shard.to_owned());
            weight_map.insert(name.clone(), shard.to_owned());
        }
        if shards.len() > MAX_SHARDS {
            return Err(bad(format!("{} shards is too many", shards.len())));
        }
        Ok(CheckpointIndex {
            weight_map,
            shards: shards.into_iter().collect(),
        })
    }

    /// Tensor names the index places in `shard`.
    pub fn names_in(&self, shard: &str) -> impl Iterator<Item = &str> {
        let shard = shard.to_owned();
        self.weight_map
            .iter()
            .filter(move |(_, s)| **s == shard)
            .map(|(n, _)| n.as_str())
    }
}

/// Read and validate a safetensors header through ranged reads: 8 bytes, then the JSON, then check the
/// header against the file length. Returns the header and the file length.
pub async fn read_header<S: ByteSource>(src: &mut S) -> Result<(Header, u64)> {
    let file = src.name().to_owned();
    let len = src.len().await?;
    if len < 8 {
        return Err(Error::Truncated {
            file,
            expected: 8,
            got: len,
        });
    }
    let first = src.read_range(0, 8).await?;
    let header = match parse_header(&first, &file)? {
        HeaderState::Done(h) => h,
        HeaderState::NeedMore(total) => {
            if total > len {
                return Err(Error::SafetensorsHeader {
                    file,
                    msg: format!(
                        "header length {} runs past the end of the {len}-byte file",
                        total - 8
                    ),
                });
            }
            if total > MAX_HEADER_LEN + 8 {
                return Err(Error::SafetensorsHeader {
                    file,
                    msg: "header too large".into(),
                });
            }
            let all = src.read_range(0, total as usize).await?;
            match parse_header(&all, &file)? {
                HeaderState::Done(h) => h,
                HeaderState::NeedMore(_) => {
                    return Err(Error::SafetensorsHeader {
                        file,
                        msg: "header incomplete".into(),
                    })
                }
            }
        }
    };
    header.check_file_len(&file, len)?;
    Ok((header, len))
}

/// Load the tensors of one safetensors source into `asm`, reading only the needed ranges.
/// `expect_names`: tensors an index places in this file (each must be in its header).
pub async fn load_source<S: ByteSource, K: TensorSink>(
    asm: &mut K,
    src: &mut S,
    expect_names: &[&str],
) -> Result<()> {
    let file = src.name().to_owned();
    let (header, _) = read_header(src).await?;
    for n in expect_names {
        if header.get(n).is_none() {
            return Err(Error::CheckpointIndex {
                file: file.clone(),
                msg: format!("index places tensor '{n}' in this shard, but it is not there"),
            });
        }
    }
    let plans = asm.plan_header(&file, &header)?;
    let chunk = asm.chunk_bytes().max(16);
    for plan in plans.into_iter().flatten() {
        let start = header.data_start + plan.src.start;
        let len = plan.src.byte_len();
        let mut w = asm.begin(plan)?;
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(chunk as u64) as usize;
            let bytes = src.read_range(start + off, n).await?;
            asm.note_held(bytes.capacity() as u64 + K::writer_held(&w));
            asm.push(&mut w, &bytes)?;
            off += n as u64;
        }
        asm.finish_tensor(w)?;
    }
    Ok(())
}

/// Parse config.json from a model source.
pub async fn load_config<S: ModelSource + ?Sized>(src: &S) -> Result<Florence2Config> {
    let cfg = src
        .read_small(CONFIG_FILE, true, MAX_JSON_BYTES)
        .await?
        .unwrap_or_default();
    let text = std::str::from_utf8(&cfg)
        .map_err(|e| Error::Config(format!("config.json is not UTF-8: {e}")))?;
    Florence2Config::from_json_str(text)
}

/// Load config and weights from a model source: `model.safetensors.index.json` and its shards if the
/// index exists, else `model.safetensors`.
pub async fn load_files<S: ModelSource + ?Sized>(
    gpu: &Arc<Device>,
    src: &S,
    opts: LoadOptions,
) -> Result<(Florence2Config, Weights)> {
    let cfg = load_config(src).await?;
    let weights = src.load_weights(gpu, &cfg, opts).await?;
    Ok((cfg, weights))
}

/// Load the weights for a known config (see [`load_checkpoint`]).
pub async fn load_weights<S: ModelSource + ?Sized>(
    gpu: &Arc<Device>,
    src: &S,
    cfg: &Florence2Config,
    opts: LoadOptions,
) -> Result<Weights> {
    let mut asm = Assembler::new(gpu, cfg, opts);
    load_checkpoint(src, &mut asm).await?;
    asm.finish()
}

/// Every weights file of a checkpoint into `asm`, the one place that knows which files make a
/// checkpoint, tried in this order: `model.safetensors.index.json` and the shards it names,
/// `model.safetensors`, `pytorch_model.bin.index.json` and its `.bin` shards, `pytorch_model.bin` (a
/// PyTorch checkpoint, read by the restricted pickle reader: [`crate::weights::torch_load`]).
pub async fn load_checkpoint<S: ModelSource + ?Sized, K: CheckpointSink<S>>(
    src: &S,
    asm: &mut K,
) -> Result<()> {
    if load_indexed(src, asm, INDEX_FILE).await? || asm.load_file(src, SINGLE_FILE, &[]).await? {
        return Ok(());
    }
    if load_indexed(src, asm, TORCH_INDEX_FILE).await?
        || asm.load_file(src, TORCH_FILE, &[]).await?
    {
        return Ok(());
    }
    Err(Error::FileRead {
        file: SINGLE_FILE.into(),
        msg: format!(
            "none of {SINGLE_FILE}, {INDEX_FILE}, {TORCH_FILE}, {TORCH_INDEX_FILE} exists"
        ),
    })
}

/// The shards an index `file` names, if the index exists (`Ok(false)` when it does not).
async fn load_indexed<S: ModelSource + ?Sized, K: CheckpointSink<S>>(
    src: &S,
    asm: &mut K,
    file: &str,
) -> Result<bool> {
    let Some(idx) = src.read_small(file, false, MAX_JSON_BYTES).await? else {
        return Ok(false);
    };
    let index = CheckpointIndex::parse_file(&idx, file)?;
    asm.set_layout(detect_layout(index.weight_map.keys().map(String::as_str)));
    for shard in &index.shards {
        let names: Vec<&str> = index.names_in(shard).collect();
        if !asm.load_file(src, shard, &names).await? {
            return Err(Error::CheckpointIndex {
                file: file.into(),
                msg: format!("shard '{shard}' does not exist"),
            });
        }
    }
    Ok(true)
}

/// Native: load `dir/config.json` and its checkpoint onto the GPU with f32 weights (the reference
/// precision the parity tests use). See [`load_dir_with`] for the other resident dtypes.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_dir(gpu: &Arc<Device>, dir: &std::path::Path) -> Result<(Florence2Config, Weights)> {
    load_dir_with(
        gpu,
        dir,
        LoadOptions::with_dtype(crate::weights::dtype::WeightDType::Fp32),
    )
}

/// Native: load `dir/config.json` and its checkpoint onto the GPU with the given options (resident
/// dtype, chunk sizes).
#[cfg(not(target_arch = "wasm32"))]
pub fn load_dir_with(
    gpu: &Arc<Device>,
    dir: &std::path::Path,
    opts: LoadOptions,
) -> Result<(Florence2Config, Weights)> {
    let files = crate::weights::source::DirFiles::new(dir);
    pollster::block_on(load_files(gpu, &files, opts))
}
