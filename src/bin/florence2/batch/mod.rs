//! `florence2 run` over many images: the model is loaded and tuned once, images decode on other threads
//! while it works, and each (image, task) answer is one JSON Lines object, written as soon as it is done:
//! `{"image": PATH AS GIVEN, "prompt", "task", "result", "text", "generated_text", "token_ids",
//! "timings_ms", "dtype", "memory", "device", "adapter"}` (the `--json` object's fields, `load` time
//! aside, plus `image` and `prompt`). An image
//! that cannot be read or decoded gives `{"image", "error": {"name", "message"}}`, a task that fails
//! `{"image", "prompt", "task", "error"}`, and the batch goes on; the exit status is 1 when anything
//! failed. A lost GPU device stops the batch (nothing more could run); `--resume` continues it.
//!
//! Inputs, sharding: `inputs.rs`; the output file and `--resume`: `output.rs`; decoding threads:
//! `decode.rs`; the progress bar: `progress.rs`.

mod decode;
pub mod inputs;
mod output;
mod progress;

use std::path::PathBuf;

use florence2_wasm::pipeline::{Callbacks, Image, NeverCancel, Pipeline, Stopwatch, TaskOptions};
use florence2_wasm::weights::WeightDType;
use florence2_wasm::Error;
use serde_json::{json, Value};

use super::run::{json_of, load, Loaded, RunArgs};
use super::Failure;
use output::Sink;
use progress::Progress;

/// Whether `run` is a batch: several images, a directory, a list, a shard or `--jsonl`.
pub fn is_batch(a: &RunArgs) -> bool {
    a.jsonl
        || a.images.len() != 1
        || a.images_from.is_some()
        || a.shard.is_some()
        || a.images.first().is_some_and(|p| p.is_dir())
}

/// One image to run: its path, the string that names it in the output, and the prompts it still needs.
struct Work {
    path: PathBuf,
    shown: String,
    prompts: Vec<String>,
}

/// The selected inputs (collected, sharded) with the prompts `--resume` did not find answered.
fn plan(a: &RunArgs, prompts: &[String], done: &output::Done) -> Result<Vec<Work>, Failure> {
    let all = inputs::collect(&a.images, a.recursive, a.images_from.as_deref())?;
    let selected = match a.shard {
        Some(s) => inputs::shard(all, s),
        None => all,
    };
    Ok(selected
        .into_iter()
        .filter_map(|path| {
            let shown = inputs::shown(&path);
            let prompts: Vec<String> = prompts
                .iter()
                .filter(|p| !done.contains(&(shown.clone(), (*p).clone())))
                .cloned()
                .collect();
            (!prompts.is_empty()).then_some(Work {
                path,
                shown,
                prompts,
            })
        })
        .collect())
}

/// What every answer line says about the run: the weight format, the device and its adapter.
struct Stamp {
    dtype: WeightDType,
    /// Why `--dtype auto` chose it.
    dtype_reason: Option<String>,
    device: &'static str,
    adapter: String,
}

/// Counts for the summary and the exit status.
#[derive(Default)]
struct Stats {
    images: usize,
    answers: usize,
    failed: usize,
}

pub fn run_batch(a: &RunArgs, prompts: &[String]) -> Result<(), Failure> {
    if a.json || a.profile {
        return Err(Failure::Usage(
            "--json and --profile take one image; a batch prints JSON Lines (--jsonl)".into(),
        ));
    }
    let (done, resume_from) = match &a.output {
        Some(p) if a.resume && p.exists() => {
            let (done, len) = output::read_done(p)?;
            (done, Some(len))
        }
        _ => (output::Done::new(), None),
    };
    let work = plan(a, prompts, &done)?;
    let mut sink = Sink::open(a.output.as_deref(), resume_from)?;
    if !done.is_empty() {
        eprintln!(
            "florence2: resuming: {} answer(s) already in the output",
            done.len()
        );
    }
    if work.is_empty() {
        eprintln!("florence2: nothing to run");
        return Ok(());
    }
    let Loaded {
        gpu,
        pipeline,
        load_ms,
        dtype,
        dtype_reason,
    } = load(a, prompts)?;
    let stamp = Stamp {
        dtype,
        dtype_reason,
        device: if gpu.is_host() { "cpu" } else { "gpu" },
        adapter: gpu.describe(),
    };
    let t = Stopwatch::start();
    let stats = run_all(&pipeline, &work, &a.options(), &stamp, &mut sink)?;
    let s = t.ms() / 1e3;
    eprintln!(
        "florence2: {} image(s), {} answer(s), {} failed in {s:.2} s ({:.2} images/s; load {load_ms:.0} ms)",
        stats.images,
        stats.answers,
        stats.failed,
        stats.images as f64 / s.max(1e-9),
    );
    match stats.failed {
        0 => Ok(()),
        n => Err(Failure::Run(format!(
            "{n} of {} image(s) had errors (see their \"error\" objects)",
            stats.images
        ))),
    }
}

/// Every image of `work`, decoded ahead on other threads.
fn run_all(
    p: &Pipeline,
    work: &[Work],
    options: &TaskOptions,
    stamp: &Stamp,
    sink: &mut Sink,
) -> Result<Stats, Failure> {
    let paths: Vec<PathBuf> = work.iter().map(|w| w.path.clone()).collect();
    let mut progress = Progress::new(work.len() as u64);
    let mut stats = Stats::default();
    let result = decode::with_decoded(&paths, *p.limits(), decode::default_threads(), |decoded| {
        for w in work {
            let image = decoded.next_image();
            let r = run_image(p, w, image, options, stamp, sink)?;
            stats.images += 1;
            stats.answers += r.answers;
            if let Some(e) = &r.error {
                stats.failed += 1;
                progress.note(&format!("florence2: {}: {}: {e}", w.shown, e.name()));
                if matches!(e, Error::DeviceLost(_)) {
                    return Err(Failure::Run(format!(
                        "{}: {e}; the batch stopped ({} of {} images done; --resume continues it)",
                        e.name(),
                        stats.images,
                        work.len()
                    )));
                }
            }
            progress.image_done(r.error.is_some());
        }
        Ok(())
    });
    progress.finish();
    result.map(|()| stats)
}

/// How one image went: answers written, and its first error.
struct ImageResult {
    answers: usize,
    error: Option<Error>,
}

/// Encode one image and run its prompts, writing a line for each (or one error line for the image).
fn run_image(
    p: &Pipeline,
    w: &Work,
    image: florence2_wasm::Result<image::RgbImage>,
    options: &TaskOptions,
    stamp: &Stamp,
    sink: &mut Sink,
) -> Result<ImageResult, Failure> {
    let encoded = image.and_then(|rgb| p.encode_image(Image::Rgb(&rgb)));
    let encoded = match encoded {
        Ok(e) => e,
        Err(e) => {
            sink.line(&error_line(&w.shown, None, &e))?;
            return Ok(ImageResult {
                answers: 0,
                error: Some(e),
            });
        }
    };
    let mut r = ImageResult {
        answers: 0,
        error: None,
    };
    for (i, prompt) in w.prompts.iter().enumerate() {
        let out = p.run_task_blocking(
            (&encoded).into(),
            prompt,
            options,
            &NeverCancel,
            &Callbacks::default(),
        );
        match out {
            Ok(out) => {
                // The image's own stages are counted in its first answer.
                let (pre, vision) = if i == 0 {
                    (encoded.preprocess_ms(), encoded.vision_ms())
                } else {
                    (0.0, 0.0)
                };
                let mut v = json_of(&out, stamp.dtype, 0.0, pre, vision);
                if let Some(r) = &stamp.dtype_reason {
                    v["dtype_reason"] = json!(r);
                }
                if let Some(t) = v.get_mut("timings_ms").and_then(Value::as_object_mut) {
                    t.remove("load");
                }
                v["image"] = json!(w.shown);
                v["prompt"] = json!(prompt);
                v["device"] = json!(stamp.device);
                v["adapter"] = json!(stamp.adapter);
                sink.line(&v)?;
                r.answers += 1;
            }
            Err(e) => {
                sink.line(&error_line(&w.shown, Some(prompt), &e))?;
                let fatal = matches!(e, Error::DeviceLost(_));
                r.error.get_or_insert(e);
                if fatal {
                    break;
                }
            }
        }
    }
    Ok(r)
}

/// `{"image", "error": {"name", "message"}}`, with `prompt` and `task` for a task's failure.
fn error_line(image: &str, prompt: Option<&str>, e: &Error) -> Value {
    let mut v = json!({
        "image": image,
        "error": {"name": e.name(), "message": e.to_string()},
    });
    if let Some(p) = prompt {
        v["prompt"] = json!(p);
        let marker = p.trim_start().split_inclusive('>').next().unwrap_or(p);
        v["task"] = json!(marker);
    }
    v
}
