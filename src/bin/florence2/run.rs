//! `florence2 run`: load a model directory into a [`Pipeline`], encode the image once, run each task on
//! it, print the answers. Several images (repeated `--image`, a directory, `--images-from`) or `--jsonl`
//! make it a batch over one loaded model (`batch/`).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use florence2_wasm::cpu::qdot_int8::{set_quant_dot, QuantDot};
use florence2_wasm::estimate::DTypeRequest;
use florence2_wasm::files;
use florence2_wasm::gpu::profile::{self, ProfileEntry};
use florence2_wasm::gpu::tune::{TuneOptions, Tuning};
use florence2_wasm::gpu::Device;
use florence2_wasm::model::generate::{EarlyStopping, MAX_BEAMS};
use florence2_wasm::pipeline::tiles::Tiles;
use florence2_wasm::pipeline::{
    open, Callbacks, DeviceChoice, Image, NeverCancel, OpenOptions, Opened, Pipeline, Stopwatch,
    TaskOptions, TaskOutput,
};
use florence2_wasm::processor::image::decode_image;
use florence2_wasm::processor::prompt::parse_task_prompt;
use florence2_wasm::weights::{DTypePlan, DirFiles};

use super::annotate::Annotator;
use super::{batch, print_json, Failure};

/// Decoding settings default to the model's generation_config.json (Florence-2: 3 beams,
/// no-repeat-n-gram 3), overridable; max 1024 new tokens.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model directory (config.json, model.safetensors or index + shards or pytorch_model.bin,
    /// tokenizer.json, optional preprocessor_config.json and generation_config.json), or a hub id
    /// org/name[@revision] fetched into the Hugging Face cache
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub(super) model: PathBuf,
    /// Image (PNG, JPEG, WebP, GIF or BMP), or a directory of them; repeat for several (a batch:
    /// JSON Lines output); '-' reads one image's bytes from stdin
    #[arg(
        long = "image",
        value_name = "FILE|DIR",
        required_unless_present = "images_from"
    )]
    pub(super) images: Vec<PathBuf>,
    /// With a directory --image: its subdirectories too
    #[arg(long)]
    pub(super) recursive: bool,
    /// A file listing image paths, one a line ('-' reads the list from stdin)
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    pub(super) images_from: Option<PathBuf>,
    /// JSON Lines: one object per (image, task) as soon as it is done, with "image" the path as given
    /// (implied by a batch)
    #[arg(long, conflicts_with = "json")]
    pub(super) jsonl: bool,
    /// Write the JSON Lines to this file instead of stdout
    #[arg(long, short = 'o', value_name = "FILE")]
    pub(super) output: Option<PathBuf>,
    /// Skip the (image, task) pairs already answered in --output's file and append the rest
    #[arg(long, requires = "output")]
    pub(super) resume: bool,
    /// Run only the inputs whose 0-based position i has i % COUNT == INDEX (list order: the --image
    /// arguments in order, directories sorted by name, then --images-from)
    #[arg(long, value_name = "INDEX/COUNT", value_parser = super::batch::inputs::parse_shard)]
    pub(super) shard: Option<(usize, usize)>,
    /// In a batch: tasks decoded together (continuous batching; 1 runs one task at a time). Answers
    /// are the same either way
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(super) max_batch: u64,
    /// Task prompt, e.g. '<OD>' or '<CAPTION_TO_PHRASE_GROUNDING>two cats', or a task's name in any
    /// case (OD, od); repeat to run several tasks on one image (encoded once; --json then prints an
    /// array)
    #[arg(long = "task", value_name = "PROMPT", required = true, value_parser = super::task_arg)]
    tasks: Vec<String>,
    /// Text input appended to the task prompt; give it once per --task when repeating (may be '')
    #[arg(long = "text", value_name = "INPUT", allow_hyphen_values = true)]
    texts: Vec<String>,
    /// New tokens after the decoder start token [default: 1024]
    #[arg(long, value_name = "N")]
    max_new_tokens: Option<usize>,
    /// Beam width; 1 is greedy decoding
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=MAX_BEAMS as i64))]
    pub(super) num_beams: Option<u16>,
    /// Ban repeating n-grams of this size (0 = off)
    #[arg(long, value_name = "N")]
    no_repeat_ngram_size: Option<usize>,
    /// Beam search stopping rule
    #[arg(long, value_name = "true|false|never", value_parser = parse_early_stopping)]
    early_stopping: Option<EarlyStopping>,
    /// Exponent of the length dividing a finished beam's score
    #[arg(long, value_name = "X", allow_negative_numbers = true, value_parser = parse_finite)]
    length_penalty: Option<f32>,
    /// Resident weight format: fp32, fp16 (half the bytes, f32 arithmetic), q8 or q4 (block-quantized,
    /// 32 weights per f16 scale); any checkpoint converts on load. A format per part of the model:
    /// PART=FORMAT,.. (vision, projector, encoder, decoder, embed; text = encoder+decoder+embed), e.g.
    /// vision=fp16,text=q4. auto: the best of fp16, q8, two q4/q8 mixes and q4 whose estimated memory
    /// fits the device (printed on stderr with the reason)
    #[arg(long, value_name = "auto|fp32|fp16|q8|q4|PART=FORMAT,..", default_value = super::DEFAULT_DTYPE, value_parser = super::parse_dtype_request)]
    pub(super) dtype: DTypeRequest,
    /// Print JSON (one object; an array with several --task), with `memory`: GPU bytes counted by the
    /// engine (weights_bytes, activations_bytes, current_bytes, peak_bytes since the model loaded, ...)
    #[arg(long)]
    pub(super) json: bool,
    /// Kernel tuning after load: auto (time what the per-adapter cache lacks), off (static kernel
    /// choices), exhaustive (ignore the cache, time every candidate at full size)
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = super::tune::parse_tuning)]
    pub(super) tuning: Tuning,
    /// Device: auto (a hardware GPU, else the CPU backend, also when the only adapter is a software
    /// one), gpu (any wgpu adapter), or cpu (the CPU backend, on all cores)
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "auto", value_parser = super::parse_device)]
    pub(super) device: DeviceChoice,
    /// How the CPU backend's decode steps dot q8/q4 weights: int8 (x rounded to int8 per 32 values,
    /// integer dots: about twice as fast), exact (f32 dots of the dequantized weights, the GPU's
    /// results), or auto (int8 for q4, exact for q8: int8 stays within q4's tested tolerance, not
    /// within q8's) [default: FLORENCE2_CPU_QUANT_DOT, else auto]
    #[arg(long, value_name = "auto|int8|exact", value_parser = super::parse_cpu_dot)]
    pub(super) cpu_dot: Option<QuantDot>,
    /// Per-op times (GPU timestamp queries, or each op's wall time on the CPU backend): a table on stderr, `profile` in the JSON
    #[arg(long)]
    pub(super) profile: bool,
    /// Tile the image (OCR, OCR_WITH_REGION, OD, DENSE_REGION_CAPTION, REGION_PROPOSAL): overlapping
    /// tiles plus the whole image run as one batch, answers merged in page coordinates. auto tiles an
    /// image larger than 1.5x the model's input; RxC asks for R rows and C columns (2 to 16 tiles).
    /// Off by default: a tiled run costs up to 17 views' time, and the reference sees one view. In a
    /// batch each image's tasks run tiled, one image at a time
    #[arg(long, value_name = "auto|off|RxC", default_value = "off", value_parser = super::run_tiled::parse_tiles)]
    pub(super) tiles: Tiles,
    /// Draw each answer on its image (boxes and labels, OCR quadrilaterals and text, polygons, a
    /// caption strip for text) as a PNG: the file OUT (.png) for one image and one task, else one
    /// `<image stem>.<task>.png` per (image, task) in the folder OUT (created)
    #[arg(long, value_name = "OUT")]
    pub(super) annotate: Option<PathBuf>,
}

fn parse_early_stopping(s: &str) -> Result<EarlyStopping, String> {
    s.parse::<EarlyStopping>().map_err(|e| e.to_string())
}

fn parse_finite(s: &str) -> Result<f32, String> {
    s.parse::<f32>()
        .ok()
        .filter(|p| p.is_finite())
        .ok_or_else(|| format!("takes a finite number, got {s:?}"))
}

impl RunArgs {
    /// The prompts: each `--task` with its `--text` (none, or one per task).
    pub(super) fn prompts(&self) -> Result<Vec<String>, Failure> {
        let texts: Vec<&str> = match self.texts.len() {
            0 => vec![""; self.tasks.len()],
            n if n == self.tasks.len() => self.texts.iter().map(String::as_str).collect(),
            n => {
                return Err(Failure::Usage(format!(
                    "--text given {n} times for {} --task; give it once per --task (or not at all)",
                    self.tasks.len()
                )))
            }
        };
        let prompts: Vec<String> = self
            .tasks
            .iter()
            .zip(texts)
            .map(|(t, x)| format!("{t}{x}"))
            .collect();
        for p in &prompts {
            // An unknown marker may be the model's own (a fine-tune's): checked once it is loaded.
            if !own_marker_candidate(p) {
                parse_task_prompt(p).map_err(|e| Failure::Usage(format!("--task {p:?}: {e}")))?;
            }
        }
        Ok(prompts)
    }

    pub(super) fn options(&self) -> TaskOptions {
        TaskOptions {
            max_new_tokens: self.max_new_tokens,
            num_beams: self.num_beams.map(usize::from),
            no_repeat_ngram_size: self.no_repeat_ngram_size,
            early_stopping: self.early_stopping,
            length_penalty: self.length_penalty,
        }
    }
}

/// Whether `p` starts with a marker that is not one of the 15 built-in ones.
fn own_marker_candidate(p: &str) -> bool {
    let p = p.trim();
    p.starts_with('<')
        && p.find('>').is_some_and(|i| {
            florence2_wasm::processor::prompt::Task::from_marker(&p[..=i]).is_none()
        })
}

/// A loaded, tuned model with every prompt checked against it.
pub(super) struct Loaded {
    pub gpu: Arc<Device>,
    pub pipeline: Pipeline,
    /// Opening the GPU, loading and tuning, in ms.
    pub load_ms: f64,
    /// The resident format (`--dtype`, or what `auto` chose).
    pub dtype: DTypePlan,
    /// Why `auto` chose it (None for a fixed `--dtype`).
    pub dtype_reason: Option<String>,
}

/// Open the GPU, load `--model` with `--dtype`, tune the kernels (`--tuning`), and check `prompts`
/// against the model's tasks (its own markers included).
pub(super) fn load(a: &RunArgs, prompts: &[String]) -> Result<Loaded, Failure> {
    let t = Stopwatch::start();
    if let Some(d) = a.cpu_dot {
        set_quant_dot(d);
    }
    // A hub id is fetched here, after every usage check (a usage error never downloads a model).
    let dir = super::model_dir(&a.model)?;
    let opts = OpenOptions {
        device: a.device,
        dtype: a.dtype,
        tuning: TuneOptions::new(a.tuning),
        tune_beams: a.num_beams.map(usize::from),
        ..OpenOptions::default()
    };
    let files = DirFiles::new(&dir);
    let opened = pollster::block_on(open(&files, &files, &opts))?;
    if let Some(r) = &opened.dtype_reason {
        eprintln!("florence2: dtype auto: {r}");
    }
    // A failed tuning only costs speed: the static kernel choices run and the report says so.
    for warning in &opened.tuning.warnings {
        eprintln!("florence2: warning: {warning}");
    }
    let Opened {
        gpu,
        pipeline,
        dtype,
        dtype_reason,
        ..
    } = opened;
    let load_ms = t.ms();
    // Peak memory from here on: the weights plus the largest working set of the tasks.
    gpu.reset_peak_memory();
    for p in prompts {
        pipeline
            .tasks()
            .parse(p)
            .map_err(|e| Failure::Usage(format!("--task {p:?}: {e}")))?;
    }
    Ok(Loaded {
        gpu,
        pipeline,
        load_ms,
        dtype,
        dtype_reason,
    })
}

/// `--tiles` takes only the tasks that tile, and no `--profile`.
fn check_tiles_args(a: &RunArgs, prompts: &[String]) -> Result<(), Failure> {
    if a.tiles != Tiles::Off {
        super::run_tiled::check_prompts(prompts)?;
        if a.profile {
            return Err(Failure::Usage("--tiles and --profile: choose one".into()));
        }
    }
    Ok(())
}

/// With `--profile`: the run's per-op profile (GPU or CPU), its table printed on stderr.
fn take_profile(a: &RunArgs, gpu: &Arc<Device>) -> Result<Option<Vec<ProfileEntry>>, Failure> {
    if !a.profile {
        return Ok(None);
    }
    let entries = pollster::block_on(gpu.profiler.take(gpu))?;
    eprint!("{}", profile::table(&entries));
    Ok(Some(entries))
}

pub fn run_cmd(a: RunArgs) -> Result<(), Failure> {
    let prompts = a.prompts()?;
    check_tiles_args(&a, &prompts)?;
    if batch::is_batch(&a) {
        return batch::run_batch(&a, &prompts);
    }
    if a.output.is_some() || a.resume {
        return Err(Failure::Usage(
            "--output and --resume write JSON Lines: add --jsonl".into(),
        ));
    }
    let options = a.options();
    // Checked before the model loads: a wrong --annotate path fails at once.
    let annotator = a
        .annotate
        .as_deref()
        .map(|out| Annotator::new(out, prompts.len() == 1))
        .transpose()?;
    let loaded = load(&a, &prompts)?;
    let (gpu, pipeline) = (&loaded.gpu, &loaded.pipeline);
    if a.profile {
        gpu.profiler.enable(gpu, true)?;
    }
    let bytes = read_image_arg(&a, pipeline.limits().max_alloc_bytes)?;
    let mut annotator = match annotator {
        Some(an) => Some((an, decode_image(&bytes, pipeline.limits())?)),
        None => None,
    };
    let shown = a.images[0].to_string_lossy();
    if a.tiles != Tiles::Off {
        let annotate = annotator.as_mut().map(|(an, rgb)| (an, &*rgb, &*shown));
        let run = (a.tiles, a.json);
        return super::run_tiled::run(&loaded, &prompts, &options, run, &bytes, annotate);
    }
    let image = pipeline.encode_image(Image::Encoded(&bytes))?;
    drop(bytes);
    let outputs = prompts
        .iter()
        .map(|prompt| {
            let input = (&image).into();
            pipeline.run_task_blocking(input, prompt, &options, &NeverCancel, &Callbacks::default())
        })
        .collect::<florence2_wasm::Result<Vec<_>>>()?;
    let pictures = match annotator.as_mut() {
        Some((annotator, rgb)) => annotator.write_each(&shown, rgb, &outputs)?,
        None => Vec::new(),
    };
    let profile = take_profile(&a, gpu)?;
    let prior = |i: usize| match i {
        0 => (image.preprocess_ms(), image.vision_ms()),
        _ => (0.0, 0.0),
    };
    if a.json {
        print_json_outputs(&outputs, &loaded, &prior, &pictures, profile)
    } else {
        print_text_outputs(&outputs, loaded.load_ms, &prior)
    }
}

/// The image file's bytes (`-`: stdin), at most `max`.
fn read_image_arg(a: &RunArgs, max: u64) -> Result<Vec<u8>, Failure> {
    Ok(if a.images[0].as_os_str() == "-" {
        files::read_stream_capped(std::io::stdin().lock(), "stdin", max)?
    } else {
        files::read_capped(&a.images[0], max)?
    })
}

/// The answers as JSON: one object, or an array when there are several; `prior(i)`: the image's
/// preprocess and vision times counted in answer `i` (the first).
fn print_json_outputs(
    outputs: &[TaskOutput],
    info: &Loaded,
    prior: &dyn Fn(usize) -> (f64, f64),
    pictures: &[PathBuf],
    profile: Option<Vec<ProfileEntry>>,
) -> Result<(), Failure> {
    let objects: Vec<serde_json::Value> = outputs
        .iter()
        .enumerate()
        .map(|(i, out)| {
            let (pre, vision) = prior(i);
            let mut v = json_of(out, info.dtype, info.load_ms, pre, vision);
            if let Some(r) = &info.dtype_reason {
                v["dtype_reason"] = serde_json::json!(r);
            }
            if let Some(p) = pictures.get(i) {
                v["annotated"] = serde_json::json!(p);
            }
            v["device"] = serde_json::json!(if info.gpu.is_host() { "cpu" } else { "gpu" });
            v["adapter"] = serde_json::json!(info.gpu.describe());
            v
        })
        .collect();
    let objects = match profile {
        // The profile covers the whole run: attached to the first object.
        Some(p) => add_profile(objects, &p)?,
        None => objects,
    };
    match (outputs.len() > 1, objects.first()) {
        (false, Some(only)) => print_json(only),
        _ => print_json(&serde_json::Value::Array(objects)),
    }
}

/// The answers as text on stdout (each after its task marker when there are several), timings on
/// stderr.
fn print_text_outputs(
    outputs: &[TaskOutput],
    load_ms: f64,
    prior: &dyn Fn(usize) -> (f64, f64),
) -> Result<(), Failure> {
    let several = outputs.len() > 1;
    for (i, out) in outputs.iter().enumerate() {
        if several {
            super::out_line(&out.marker)?;
        }
        super::out_line(&out.text)?;
        let t = &out.timings;
        let (pre, vision) = prior(i);
        eprintln!(
            "{} tokens; load {load_ms:.0} ms, preprocess {:.0} ms, vision {vision:.0} ms, \
             encoder {:.0} ms, decode {:.0} ms",
            out.token_ids.len(),
            t.preprocess_ms + pre,
            t.encoder_ms,
            t.decode_ms
        );
    }
    Ok(())
}

/// `profile`: {"entries": [{phase, op, variant, shape, ms}], "phases_ms": {phase: total}} on the first
/// object.
fn add_profile(
    mut objects: Vec<serde_json::Value>,
    entries: &[ProfileEntry],
) -> Result<Vec<serde_json::Value>, Failure> {
    let phases: serde_json::Map<String, serde_json::Value> = profile::phase_totals(entries)
        .into_iter()
        .map(|(p, ms, _)| (p, serde_json::json!(ms)))
        .collect();
    let value = serde_json::json!({
        "entries": serde_json::to_value(entries).map_err(|e| Failure::Run(e.to_string()))?,
        "phases_ms": phases,
    });
    if let Some(serde_json::Value::Object(first)) = objects.first_mut() {
        first.insert("profile".into(), value);
    }
    Ok(objects)
}

/// `{"task", "generated_text", "token_ids", "timings_ms", "result", "text", "dtype", "memory"}` of one
/// (the caller adds `device`, `adapter`)
/// task; `pre_ms` and
/// `vision_ms` are the image's own stages (counted in the first task of a run).
pub(super) fn json_of(
    out: &TaskOutput,
    dtype: DTypePlan,
    load_ms: f64,
    pre_ms: f64,
    vision_ms: f64,
) -> serde_json::Value {
    serde_json::json!({
        "task": out.marker,
        "generated_text": out.generated_text,
        "token_ids": out.token_ids,
        "timings_ms": {
            "load": load_ms,
            "preprocess": out.timings.preprocess_ms + pre_ms,
            "vision": vision_ms,
            "encoder": out.timings.encoder_ms,
            "decode": out.timings.decode_ms,
        },
        "result": out.result_json(),
        "text": out.text,
        "dtype": dtype.label(),
        "memory": out.memory,
    })
}
