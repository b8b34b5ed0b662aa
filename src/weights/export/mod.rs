//! Converting a checkpoint into the package's own format (`florence2 convert`): any checkpoint the
//! loader reads (safetensors single or sharded, PyTorch `pytorch_model.bin` zip/legacy or sharded;
//! HF-native, original or mlx names; f32/f16/bf16; our q8/q4 `florence2-wasm-block` files) becomes a
//! directory of safetensors in a target [`WeightDType`] (or one per part of the model, a
//! [`DTypePlan`] with at most one quantized format), read by the loader's own readers
//! ([`crate::weights::load::load_checkpoint`] into an [`Exporter`], a [`TensorSink`]) and planned by
//! its [`Planner`].
//!
//! Guarantee: loading the output with dtype D gives bit for bit the resident weights of loading the
//! source with D (each tensor is stored in the format the loader keeps it in for D, [`encode`]; for a
//! mix, in its part's format). Names
//! and layouts are kept; tensors the model does not use are left out, and an LM head equal to the
//! shared embedding (a tied copy) is dropped: the loader ties it itself.
//!
//! Streaming: one read chunk and one copy chunk at a time ([`shards`]); everything is written into a
//! hidden sibling directory that is renamed to the output only when complete.
//!
//! - [`encode`]: what each tensor becomes, and its streaming conversion.
//! - [`shards`]: the safetensors files and the shard index.
//! - [`side`]: config.json, tokenizer.json and the other small files.
//! - [`sizes`]: the checkpoint size per dtype, from a config's shapes.

pub mod encode;
pub mod shards;
pub mod side;
pub mod sizes;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::Florence2Config;
use crate::error::{Error, Result};
use crate::quant::QFormat;
use crate::weights::dtype::WeightDType;
use crate::weights::dtype_plan::DTypePlan;
use crate::weights::expected::{LM_HEAD, SHARED};
use crate::weights::header::Header;
use crate::weights::load::load_named_file;
use crate::weights::load::{load_checkpoint, CONFIG_FILE, MAX_JSON_BYTES};
use crate::weights::names::Layout;
use crate::weights::plan::{Planner, TensorPlan};
use crate::weights::quantized::QWEIGHT_SUFFIX;
use crate::weights::sink::{CheckpointSink, TensorSink};
use crate::weights::source::{DirFiles, ModelFiles};
use encode::{out_tensor, Encoder};
use shards::{write_err, ShardWriter, WrittenFile};

/// What to write.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// Target format of the matrix weights, per part of the model (at most one quantized format:
    /// config.json's `quantization` entry names one).
    pub dtype: DTypePlan,
    /// Split the weights into files of at most this many bytes (a tensor larger than that gets a file
    /// of its own); `None`: one `model.safetensors`.
    pub shard_size: Option<u64>,
    /// Largest range read from the source (and copied between files) at once.
    pub chunk_bytes: usize,
}

impl ExportOptions {
    pub fn new(dtype: impl Into<DTypePlan>) -> Self {
        ExportOptions {
            dtype: dtype.into(),
            shard_size: None,
            chunk_bytes: 8 << 20,
        }
    }
}

/// What a conversion wrote.
#[derive(Clone, Debug)]
pub struct ExportSummary {
    pub dtype: DTypePlan,
    /// The weights files, in order.
    pub files: Vec<WrittenFile>,
    /// Source tensors the model does not use (left out).
    pub ignored: Vec<String>,
    /// Tied copies of the shared embedding left out.
    pub dropped: Vec<String>,
    /// Notes on the side files (tokenizer completed, defaults written).
    pub notes: Vec<String>,
}

impl ExportSummary {
    /// Tensors written.
    pub fn tensors(&self) -> usize {
        self.files.iter().map(|f| f.tensors.len()).sum()
    }

    /// Tensor count and bytes per output format (`f32`, `f16`, `bf16`, `q8`, `q4`).
    pub fn by_format(&self) -> BTreeMap<&'static str, (usize, u64)> {
        let mut m = BTreeMap::new();
        for (_, label, b) in self.files.iter().flat_map(|f| &f.tensors) {
            let e = m.entry(*label).or_insert((0, 0));
            e.0 += 1;
            e.1 += b;
        }
        m
    }

    /// Bytes of the weights files (headers included).
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.file_bytes).sum()
    }
}

/// The [`TensorSink`] that writes converted tensors.
pub struct Exporter {
    planner: Planner,
    dtype: DTypePlan,
    /// The one quantized format of `dtype`'s parts, if any.
    quant: Option<QFormat>,
    chunk_bytes: usize,
    writer: ShardWriter,
    /// Writers open (tensors sharing a PyTorch storage are open together).
    open: usize,
    /// The shared embedding's output (id, entry), and the LM head's id: the LM head is held back until
    /// the end, then dropped if it equals the shared embedding byte for byte (a tied copy).
    shared: Option<(u64, encode::OutTensor)>,
    lm_head: Option<u64>,
    quantized: Vec<String>,
    dropped: Vec<String>,
}

/// One tensor being converted.
pub struct ExportWriter {
    enc: Encoder,
    id: u64,
    /// Held back (the LM head): not counted as open in the shard.
    held: bool,
    buf: Vec<u8>,
}

impl Exporter {
    /// An exporter writing into the directory `dir` (which must exist).
    pub fn new(cfg: &Florence2Config, dir: &Path, opts: &ExportOptions) -> Result<Self> {
        Ok(Exporter {
            planner: Planner::new(cfg),
            dtype: opts.dtype,
            quant: quantized_format(opts.dtype)?,
            chunk_bytes: opts.chunk_bytes,
            writer: ShardWriter::new(dir, opts.shard_size, opts.chunk_bytes)?,
            open: 0,
            shared: None,
            lm_head: None,
            quantized: Vec::new(),
            dropped: Vec::new(),
        })
    }

    /// Close the files; fails if a required tensor never came.
    pub fn finish(mut self) -> Result<Exported> {
        if let Some(name) = self.planner.first_missing() {
            return Err(Error::MissingTensor {
                name: name.to_owned(),
            });
        }
        if let (Some((sid, st)), Some(_)) = (&self.shared, self.lm_head) {
            if self.writer.held_equals(*sid, st)? {
                if let Some(name) = self.writer.drop_held()? {
                    self.dropped.push(name);
                }
            }
        }
        if self.planner.channels_last() {
            self.writer.format = "mlx".into();
        }
        let files = self.writer.close()?;
        let quant = self.quant;
        let dropped = &self.dropped;
        self.quantized.retain(|n| {
            !dropped
                .iter()
                .any(|d| d.strip_suffix(QWEIGHT_SUFFIX) == Some(n))
        });
        self.quantized.sort();
        Ok(Exported {
            files,
            quantized: quant.map(|f| (f, self.quantized)),
            ignored: self.planner.ignored().to_vec(),
            dropped: self.dropped,
        })
    }
}

/// The quantized format of `dtype`'s parts (None when none is q8 or q4); a plan mixing q8 and q4 is
/// refused: a checkpoint's `quantization` entry names one format.
fn quantized_format(dtype: DTypePlan) -> Result<Option<QFormat>> {
    let mut found = None;
    for (_, d) in dtype.parts() {
        let q = match d {
            WeightDType::Q8 => QFormat::Q8,
            WeightDType::Q4 => QFormat::Q4,
            WeightDType::Fp32 | WeightDType::Fp16 => continue,
        };
        if found.is_some_and(|f| f != q) {
            return Err(Error::InvalidInput(format!(
                "convert --dtype {dtype}: a checkpoint holds one quantized format (config.json's \
                 quantization entry), not q8 and q4; convert to one of them and load with the mix"
            )));
        }
        found = Some(q);
    }
    Ok(found)
}

/// What an [`Exporter`] wrote and left out.
pub struct Exported {
    pub files: Vec<WrittenFile>,
    /// The output's quantization format and its quantized tensors (source names, sorted).
    pub quantized: Option<(QFormat, Vec<String>)>,
    /// Source tensors the model does not use.
    pub ignored: Vec<String>,
    /// Tied copies of the shared embedding.
    pub dropped: Vec<String>,
}

impl TensorSink for Exporter {
    type Writer = ExportWriter;

    fn plan_header(&mut self, file: &str, header: &Header) -> Result<Vec<Option<TensorPlan>>> {
        if header
            .metadata
            .get("format")
            .is_some_and(|f| f.eq_ignore_ascii_case("mlx"))
        {
            self.writer.format = "mlx".into();
        }
        let plans = self.planner.plan_header(file, header)?;
        if self.planner.channels_last() {
            self.writer.format = "mlx".into();
        }
        Ok(plans)
    }

    fn set_layout(&mut self, layout: Layout) {
        self.planner.set_layout(layout)
    }

    fn begin(&mut self, plan: TensorPlan) -> Result<ExportWriter> {
        let out = out_tensor(&plan, self.dtype.for_tensor(&plan.canonical))?;
        let enc = Encoder::new(&plan, &out)?;
        if let Some(base) = out.name.strip_suffix(QWEIGHT_SUFFIX) {
            self.quantized.push(base.to_owned());
        }
        let held = out.canonical == LM_HEAD;
        let id = if held {
            let id = self.writer.reserve_held(out)?;
            self.lm_head = Some(id);
            id
        } else {
            let shared = (out.canonical == SHARED).then(|| out.clone());
            let id = self.writer.reserve(out, self.open)?;
            self.open += 1;
            if let Some(t) = shared {
                self.shared = Some((id, t));
            }
            id
        };
        Ok(ExportWriter {
            enc,
            id,
            held,
            buf: Vec::new(),
        })
    }

    fn push(&mut self, w: &mut ExportWriter, bytes: &[u8]) -> Result<()> {
        w.buf.clear();
        w.enc.push(bytes, &mut w.buf)?;
        self.writer.write(w.id, &w.buf)
    }

    fn finish_tensor(&mut self, w: ExportWriter) -> Result<()> {
        w.enc.finish()?;
        self.writer.finish(w.id)?;
        if !w.held {
            self.open = self.open.saturating_sub(1);
        }
        Ok(())
    }

    fn note_held(&mut self, _bytes: u64) {}

    fn writer_held(w: &ExportWriter) -> u64 {
        w.enc.held() + w.buf.capacity() as u64
    }

    fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }
}

impl<F: ModelFiles> CheckpointSink<F> for Exporter {
    async fn load_file(&mut self, src: &F, name: &str, expect_names: &[&str]) -> Result<bool> {
        load_named_file(src, name, self, expect_names).await
    }
}

/// The hidden sibling directory a conversion writes into before it is renamed to `out`.
fn partial_dir(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .ok_or_else(|| Error::InvalidInput(format!("{}: not a directory name", out.display())))?;
    Ok(out.with_file_name(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Convert the checkpoint in directory `src` into the new directory `out` (which must not exist, or be
/// empty). On failure nothing is left at `out`.
pub fn convert_dir(src: &Path, out: &Path, opts: &ExportOptions) -> Result<ExportSummary> {
    if !src.is_dir() {
        return Err(Error::FileRead {
            file: src.display().to_string(),
            msg: "not a directory".into(),
        });
    }
    if out.exists() {
        let empty = std::fs::read_dir(out)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if !empty {
            return Err(Error::InvalidInput(format!(
                "{} exists and is not an empty directory",
                out.display()
            )));
        }
    }
    let config = crate::files::read_capped_opt(&src.join(CONFIG_FILE), MAX_JSON_BYTES)?
        .ok_or_else(|| Error::FileRead {
            file: src.join(CONFIG_FILE).display().to_string(),
            msg: "not found".into(),
        })?;
    let text = std::str::from_utf8(&config)
        .map_err(|e| Error::Config(format!("config.json is not UTF-8: {e}")))?;
    let cfg = Florence2Config::from_json_str(text)?;
    let tmp = partial_dir(out)?;
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| write_err(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| write_err(&tmp, e))?;
    let res = convert_into(src, &tmp, &cfg, &config, opts);
    let res = res.and_then(|summary| {
        if out.exists() {
            std::fs::remove_dir(out).map_err(|e| write_err(out, e))?;
        }
        std::fs::rename(&tmp, out).map_err(|e| write_err(out, e))?;
        Ok(summary)
    });
    if res.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    res
}

fn convert_into(
    src: &Path,
    tmp: &Path,
    cfg: &Florence2Config,
    config: &[u8],
    opts: &ExportOptions,
) -> Result<ExportSummary> {
    let mut ex = Exporter::new(cfg, tmp, opts)?;
    pollster::block_on(load_checkpoint(&DirFiles::new(src), &mut ex))?;
    let done = ex.finish()?;
    side::write_config(config, done.quantized, tmp)?;
    let notes = side::write_side_files(src, tmp)?;
    Ok(ExportSummary {
        dtype: opts.dtype,
        files: done.files,
        ignored: done.ignored,
        dropped: done.dropped,
        notes,
    })
}

/// A shard size: bytes (`123456`), or a number with a unit: `KB`/`MB`/`GB` (powers of 1000),
/// `KiB`/`MiB`/`GiB` (powers of 1024), `B`; case-insensitive, a fraction allowed (`1.5GB`). Positive.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = || Error::InvalidInput(format!("not a size: {s:?} (e.g. 500MB, 100MiB, 123456)"));
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    let n = if num.contains('.') {
        let x: f64 = num.parse().map_err(|_| bad())?;
        let b = x * mult as f64;
        if !b.is_finite() || b >= u64::MAX as f64 {
            return Err(bad());
        }
        b as u64
    } else {
        num.parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(mult))
            .ok_or_else(bad)?
    };
    if n == 0 {
        return Err(Error::InvalidInput(format!(
            "the shard size must be positive, got {s:?}"
        )));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_size("100MiB").unwrap(), 100 << 20);
        assert_eq!(parse_size("123456").unwrap(), 123_456);
        assert_eq!(parse_size("1.5gb").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("64 KiB").unwrap(), 65_536);
        for bad in [
            "",
            "MB",
            "0",
            "0MB",
            "12XB",
            "-5MB",
            "1e9",
            "99999999999999999999GB",
        ] {
            assert!(
                matches!(parse_size(bad), Err(Error::InvalidInput(_))),
                "{bad}"
            );
        }
    }
}
