//! The `florence2` command line.
//!
//! ```text
//! florence2 parse --task TASK --image-size W,H --text RAW [--json]
//! florence2 run --model DIR --image FILE --task PROMPT [--text INPUT] [--max-new-tokens N]
//!               [--num-beams N] [--no-repeat-ngram-size N] [--early-stopping true|false|never]
//!               [--length-penalty X] [--json]
//! ```
//!
//! `parse` post-processes a raw generation (decoded with special tokens kept) without a model, for scripting
//! and tests; `--text -` reads the text from stdin. With `--json` both subcommands print one JSON object
//! `{"task": MARKER, "result": {MARKER: value}, "text": RENDERING}` where `result` is exactly what
//! `post_process_generation` returns and `text` the human-readable rendering; `run` adds
//! `generated_text` (decoded with special tokens kept), `token_ids` (decoder start token first, as the
//! reference's `generate` returns them) and `timings_ms` {load, preprocess, vision, encoder, decode}.
//! Without it they print the rendering. Exit status: 0 success, 1 a failure while running, 2 a usage error.
//!
//! Argument parsing is hand-rolled (`--flag value` pairs and boolean `--json`) to keep the binary free of
//! dependencies.

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use florence2_wasm::files;
use florence2_wasm::gpu::{Gpu, GpuOptions, Tensor};
use florence2_wasm::model::florence2::Florence2;
use florence2_wasm::model::generate::{EarlyStopping, GenerateOptions, MAX_BEAMS};
use florence2_wasm::postprocess::{post_process_generation, TaskResult};
use florence2_wasm::processor::image::{
    decode_image, preprocess, ImageLimits, ImageProcessorConfig,
};
use florence2_wasm::processor::prompt::{parse_task_prompt, Task};
use florence2_wasm::processor::tokenizer::{Florence2Tokenizer, MAX_TOKENIZER_JSON_BYTES};
use florence2_wasm::render::render;
use florence2_wasm::weights;

/// The model card's `max_new_tokens` (generation is also bounded by max_position_embeddings).
const DEFAULT_MAX_NEW_TOKENS: usize = 1024;

const USAGE: &str = "\
usage:
  florence2 parse --task TASK --image-size W,H --text RAW [--json]
      post-process a raw generation (RAW '-' reads stdin); TASK is a marker (<OD>), a name (OD) or a
      whole prompt ('<OPEN_VOCABULARY_DETECTION>cat')
  florence2 run --model DIR --image FILE --task PROMPT [--text INPUT] [--max-new-tokens N]
                [--num-beams N] [--no-repeat-ngram-size N] [--early-stopping true|false|never]
                [--length-penalty X] [--json]
      run the model on an image (PROMPT e.g. '<OD>' or '<CAPTION_TO_PHRASE_GROUNDING>two cats';
      --text INPUT is appended to PROMPT); decoding settings from the model's generation_config.json
      (Florence-2: 3 beams, no-repeat-n-gram 3), overridable; --num-beams 1 is greedy; default max
      1024 new tokens
  florence2 help";

/// A failure: a usage error (exit 2) or a runtime error (exit 1).
enum Failure {
    Usage(String),
    Run(String),
}

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("parse") => parse_cmd(&args[1..]),
        Some("run") => run_cmd(&args[1..]),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(Failure::Usage(format!("unknown subcommand {other:?}"))),
        None => Err(Failure::Usage("missing subcommand".into())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("florence2: {msg}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            eprintln!("florence2: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Parsed `--flag value` options and boolean switches.
struct Opts {
    values: HashMap<String, String>,
    json: bool,
}

impl Opts {
    fn parse(args: &[String], value_flags: &[&str]) -> Result<Opts, Failure> {
        let mut values = HashMap::new();
        let mut json = false;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            if arg == "--json" {
                json = true;
            } else if let Some(name) = arg.strip_prefix("--").filter(|n| value_flags.contains(n)) {
                let value = it
                    .next()
                    .ok_or_else(|| Failure::Usage(format!("--{name} needs a value")))?;
                if values.insert(name.to_string(), value.clone()).is_some() {
                    return Err(Failure::Usage(format!("--{name} given twice")));
                }
            } else {
                return Err(Failure::Usage(format!("unexpected argument {arg:?}")));
            }
        }
        Ok(Opts { values, json })
    }

    fn required(&self, name: &str) -> Result<&str, Failure> {
        self.values
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Failure::Usage(format!("missing --{name}")))
    }
}

/// `W,H` (or `WxH`) with both positive.
fn parse_image_size(s: &str) -> Result<(u32, u32), Failure> {
    let bad = || {
        Failure::Usage(format!(
            "--image-size takes W,H (positive integers), got {s:?}"
        ))
    };
    let (w, h) = s.split_once([',', 'x']).ok_or_else(bad)?;
    let w: u32 = w.trim().parse().map_err(|_| bad())?;
    let h: u32 = h.trim().parse().map_err(|_| bad())?;
    if w == 0 || h == 0 {
        return Err(bad());
    }
    Ok((w, h))
}

/// Print an answer as the rendering or, with `json`, as `{"task", "result", "text"}`.
fn print_answer(task: Task, result: &TaskResult, json: bool) -> Result<(), Failure> {
    let text = render(result);
    if json {
        let out = serde_json::json!({
            "task": task.marker(),
            "result": result.to_json(task),
            "text": text,
        });
        let s = serde_json::to_string(&out).map_err(|e| Failure::Run(e.to_string()))?;
        println!("{s}");
    } else if !text.is_empty() {
        println!("{text}");
    }
    Ok(())
}

fn parse_cmd(args: &[String]) -> Result<(), Failure> {
    let opts = Opts::parse(args, &["task", "image-size", "text"])?;
    // A marker (`<OD>`), a bare name (`OD`), or a whole prompt (`<OPEN_VOCABULARY_DETECTION>cat`).
    let task_arg = opts.required("task")?;
    let task: Task = match task_arg.parse() {
        Ok(task) => task,
        Err(e) => parse_task_prompt(task_arg)
            .map(|p| p.task())
            .map_err(|_| Failure::Usage(e.to_string()))?,
    };
    let size = parse_image_size(opts.required("image-size")?)?;
    let raw = match opts.required("text")? {
        "-" => {
            // Capped like every file the CLI reads (a generation is a few KB).
            let bytes = files::read_stream_capped(std::io::stdin(), "stdin", files::MAX_JSON_FILE)
                .map_err(|e| Failure::Run(e.to_string()))?;
            String::from_utf8(bytes)
                .map_err(|e| Failure::Run(format!("stdin is not UTF-8: {e}")))?
        }
        text => text.to_string(),
    };
    let result =
        post_process_generation(&raw, task, size).map_err(|e| Failure::Run(e.to_string()))?;
    print_answer(task, &result, opts.json)
}

/// `florence2 run`: load `--model DIR` (config, weights, tokenizer, preprocessor and generation configs),
/// read and preprocess `--image FILE`, build the prompt from `--task` (+ `--text`), encode, generate (the
/// settings of `generation_config.json`, then config.json, then Florence-2's defaults: beam search with 3
/// beams; `--max-new-tokens`, `--num-beams`, `--no-repeat-ngram-size`, `--early-stopping`,
/// `--length-penalty` overriding), decode the ids
/// with special tokens kept and post-process them with the original image size.
fn run_cmd(args: &[String]) -> Result<(), Failure> {
    let opts = Opts::parse(
        args,
        &[
            "model",
            "image",
            "task",
            "text",
            "max-new-tokens",
            "num-beams",
            "no-repeat-ngram-size",
            "early-stopping",
            "length-penalty",
        ],
    )?;
    let dir = Path::new(opts.required("model")?).to_path_buf();
    let image_path = opts.required("image")?.to_string();
    let mut prompt = opts.required("task")?.to_string();
    if let Some(text) = opts.values.get("text") {
        prompt.push_str(text);
    }
    let tp = parse_task_prompt(&prompt).map_err(|e| Failure::Usage(e.to_string()))?;
    let max_new = match opts.values.get("max-new-tokens") {
        Some(v) => v.parse::<usize>().map_err(|_| {
            Failure::Usage(format!(
                "--max-new-tokens takes a non-negative integer, got {v:?}"
            ))
        })?,
        None => DEFAULT_MAX_NEW_TOKENS,
    };
    let run = |e: florence2_wasm::Error| Failure::Run(e.to_string());
    // Every file is read through the byte-capped reader (regular files only).
    let read = |name: &str, cap: u64| files::read_capped(&dir.join(name), cap).map_err(run);

    // Load.
    let t0 = Instant::now();
    let gpu = pollster::block_on(Gpu::new(GpuOptions::default())).map_err(run)?;
    let (cfg, weights) = weights::load_dir(&gpu, &dir).map_err(run)?;
    let tok = Florence2Tokenizer::from_json_bytes(&read(
        "tokenizer.json",
        MAX_TOKENIZER_JSON_BYTES as u64,
    )?)
    .map_err(run)?;
    let pre = if dir.join("preprocessor_config.json").exists() {
        ImageProcessorConfig::from_json_bytes(&read(
            "preprocessor_config.json",
            files::MAX_JSON_FILE,
        )?)
        .map_err(run)?
    } else {
        ImageProcessorConfig::default()
    };
    let mut gen = GenerateOptions::from_config(&cfg, max_new);
    if dir.join("generation_config.json").exists() {
        gen = gen
            .with_generation_config(&read("generation_config.json", files::MAX_JSON_FILE)?)
            .map_err(run)?;
    }
    gen.check_ids(cfg.text.vocab_size).map_err(run)?;
    gen.max_new_tokens = max_new;
    if let Some(v) = opts.values.get("num-beams") {
        gen.num_beams = v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_BEAMS).contains(n))
            .ok_or_else(|| {
                Failure::Usage(format!("--num-beams takes 1..={MAX_BEAMS}, got {v:?}"))
            })?;
    }
    if let Some(v) = opts.values.get("no-repeat-ngram-size") {
        gen.no_repeat_ngram_size = v.parse::<usize>().map_err(|_| {
            Failure::Usage(format!(
                "--no-repeat-ngram-size takes a non-negative integer (0 = off), got {v:?}"
            ))
        })?;
    }
    if let Some(v) = opts.values.get("early-stopping") {
        gen.early_stopping = v
            .parse::<EarlyStopping>()
            .map_err(|e| Failure::Usage(format!("--early-stopping: {e}")))?;
    }
    if let Some(v) = opts.values.get("length-penalty") {
        gen.length_penalty = v
            .parse::<f32>()
            .ok()
            .filter(|p| p.is_finite())
            .ok_or_else(|| {
                Failure::Usage(format!("--length-penalty takes a finite number, got {v:?}"))
            })?;
    }
    let model = Florence2::new(&gpu, cfg, &weights).map_err(run)?;
    drop(weights);
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Failure::Run(e.to_string()))?;
    let load_ms = ms(t0);

    // Preprocess.
    let t1 = Instant::now();
    let limits = ImageLimits::default();
    let bytes = files::read_capped(Path::new(&image_path), limits.max_alloc_bytes).map_err(run)?;
    let rgb = decode_image(&bytes, &limits).map_err(run)?;
    let image_size = (rgb.width(), rgb.height());
    let px = preprocess(&rgb, &pre).map_err(run)?;
    let pixels =
        Tensor::from_f32(&gpu, &[1, 3, pre.height, pre.width], &px, "pixels").map_err(run)?;
    let ids = tok.encode_prompt(&tp.encoder_text()).map_err(run)?;
    let preprocess_ms = ms(t1);

    // Model.
    let enc = model.encode(&pixels, &ids).map_err(run)?;
    let t2 = Instant::now();
    let token_ids = model.generate(&enc, &gen, &|| false).map_err(run)?;
    let decode_ms = ms(t2);
    let generated_text = tok.decode(&token_ids, false).map_err(run)?;

    let task = tp.task();
    let result = post_process_generation(&generated_text, task, image_size);
    if opts.json {
        let mut out = serde_json::json!({
            "task": task.marker(),
            "generated_text": generated_text,
            "token_ids": token_ids,
            "timings_ms": {
                "load": load_ms,
                "preprocess": preprocess_ms,
                "vision": enc.vision_ms,
                "encoder": enc.encoder_ms,
                "decode": decode_ms,
            },
        });
        match &result {
            Ok(r) => {
                out["result"] = r.to_json(task);
                out["text"] = serde_json::Value::String(render(r));
            }
            Err(e) => out["postprocess_error"] = serde_json::Value::String(e.to_string()),
        }
        let s = serde_json::to_string(&out).map_err(|e| Failure::Run(e.to_string()))?;
        println!("{s}");
    } else {
        match &result {
            Ok(r) => println!("{}", render(r)),
            Err(e) => {
                println!("{generated_text}");
                eprintln!("florence2: post-processing failed: {e}");
            }
        }
        eprintln!(
            "{} tokens; load {load_ms:.0} ms, preprocess {preprocess_ms:.0} ms, vision {:.0} ms, \
             encoder {:.0} ms, decode {decode_ms:.0} ms",
            token_ids.len(),
            enc.vision_ms,
            enc.encoder_ms
        );
    }
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
