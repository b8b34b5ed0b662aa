//! `florence2 run` over many images: the model is loaded and tuned once, images decode on other threads
//! while it works, up to `--max-batch` tasks decode together (continuous batching, answers equal to
//! unbatched ones), and each (image, task) answer is one JSON Lines object, written in input order as
//! soon as it and the answers before it are done:
//! `{"image": PATH AS GIVEN, "prompt", "task", "result", "text", "generated_text", "token_ids",
//! "timings_ms", "dtype", "memory", "device", "adapter"}` (the `--json` object's fields, `load` time
//! aside, plus `image` and `prompt`). An image
//! that cannot be read or decoded gives `{"image", "error": {"name", "message"}}`, a task that fails
//! `{"image", "prompt", "task", "error"}`, and the batch goes on; the exit status is 1 when anything
//! failed. A lost GPU device stops the batch (nothing more could run); `--resume` continues it.
//!
//! With `--tiles` each image's tasks run tiled, one image at a time, lines with `tiles` (`tiled.rs`).
//! Inputs, sharding: `inputs.rs`; the output file and `--resume`: `output.rs`; decoding threads:
//! `decode.rs`; the progress bar: `progress.rs`.

mod decode;
pub mod inputs;
mod output;
mod progress;
mod tiled;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use florence2_wasm::pipeline::tiles::Tiles;
use florence2_wasm::pipeline::{
    BatchEvent, DecodeBatch, EncodedImage, Image, Pipeline, PrepareItem, Stopwatch, TaskOptions,
    TaskOutput,
};
use florence2_wasm::weights::DTypePlan;
use florence2_wasm::Error;
use serde_json::{json, Value};

use super::annotate::Annotator;
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
    dtype: DTypePlan,
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

impl Stats {
    /// Counts an image of the `total` done (`error`: its first error) and shows it on `progress`; a
    /// lost device stops the batch.
    fn image_done(
        &mut self,
        progress: &mut Progress,
        shown: &str,
        error: Option<&Error>,
        total: usize,
    ) -> Result<(), Failure> {
        self.images += 1;
        if let Some(e) = error {
            self.failed += 1;
            progress.note(&format!("florence2: {shown}: {}: {e}", e.name()));
            if matches!(e, Error::DeviceLost(_)) {
                return Err(Failure::Run(format!(
                    "{}: {e}; the batch stopped ({} of {total} images done; --resume continues it)",
                    e.name(),
                    self.images,
                )));
            }
        }
        progress.image_done(error.is_some());
        Ok(())
    }
}

pub fn run_batch(a: &RunArgs, prompts: &[String]) -> Result<(), Failure> {
    if a.json || a.profile {
        return Err(Failure::Usage(
            "--json and --profile take one image; a batch prints JSON Lines (--jsonl)".into(),
        ));
    }
    let annotator = a
        .annotate
        .as_deref()
        .map(|out| Annotator::new(out, false))
        .transpose()?;
    let (done, resume_from) = resume_point(a)?;
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
    let stats = if a.tiles == Tiles::Off {
        let options = (&a.options(), a.max_batch as usize);
        run_all(&pipeline, &work, options, &stamp, (&mut sink, annotator))?
    } else {
        let options = (&a.options(), a.tiles);
        tiled::run_all(&pipeline, &work, options, &stamp, (&mut sink, annotator))?
    };
    summarize(&stats, t.ms() / 1e3, load_ms)
}

/// With `--resume` and an output file: the answers it holds and its length (the batch appends after
/// them); else none.
fn resume_point(a: &RunArgs) -> Result<(output::Done, Option<u64>), Failure> {
    Ok(match &a.output {
        Some(p) if a.resume && p.exists() => {
            let (done, len) = output::read_done(p)?;
            (done, Some(len))
        }
        _ => (output::Done::new(), None),
    })
}

/// The summary on stderr (the batch took `s` seconds); an error when any image had one.
fn summarize(stats: &Stats, s: f64, load_ms: f64) -> Result<(), Failure> {
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

/// Every image of `work`, decoded ahead on other threads; up to `max_batch` tasks decode together
/// (continuous batching: an image's tasks join the running batch as earlier ones leave).
fn run_all(
    p: &Pipeline,
    work: &[Work],
    (options, max_batch): (&TaskOptions, usize),
    stamp: &Stamp,
    (sink, annotator): (&mut Sink, Option<Annotator>),
) -> Result<Stats, Failure> {
    let paths: Vec<PathBuf> = work.iter().map(|w| w.path.clone()).collect();
    let mut run = Runner {
        p,
        work,
        options,
        stamp,
        sink,
        annotator,
        batch: DecodeBatch::new(p),
        images: Vec::new(),
        finished: BTreeMap::new(),
        flushed: 0,
        tasks: HashMap::new(),
        next_tag: 0,
        progress: Progress::new(work.len() as u64),
        stats: Stats::default(),
    };
    let result = decode::with_decoded(&paths, *p.limits(), decode::default_threads(), |decoded| {
        let mut next = 0;
        loop {
            // Start as many images as the batch has room for, through the vision tower together.
            let room = max_batch.max(1).saturating_sub(run.batch.len());
            let take = room.min(work.len() - next);
            if take > 0 {
                let images: Vec<_> = (0..take).map(|_| decoded.next_image()).collect();
                run.start_images(next, images)?;
                next += take;
            }
            if run.batch.is_empty() {
                if next == work.len() {
                    return Ok(());
                }
                continue;
            }
            for ev in pollster::block_on(run.batch.step()) {
                if let BatchEvent::Done(tag, out) = ev {
                    run.task_done(tag, *out)?;
                }
            }
        }
    });
    run.progress.finish();
    result.map(|()| run.stats)
}

/// An image whose tasks are in flight.
struct InFlight {
    /// Tasks not answered yet.
    left: usize,
    /// Its first error.
    error: Option<Error>,
    /// Preprocess and vision ms, counted in its first task's answer.
    pre_vision: (f64, f64),
    /// Its output lines, in prompt order, as its tasks finish.
    lines: Vec<Option<Value>>,
    /// The decoded image, kept for `--annotate` only.
    rgb: Option<image::RgbImage>,
}

/// The batch loop's state: the running batch, the images in flight and what each task belongs to.
struct Runner<'a, 'p> {
    p: &'p Pipeline,
    work: &'a [Work],
    options: &'a TaskOptions,
    stamp: &'a Stamp,
    sink: &'a mut Sink,
    /// `--annotate`'s writer.
    annotator: Option<Annotator>,
    batch: DecodeBatch<'p, u64>,
    images: Vec<Option<InFlight>>,
    /// Lines of finished images not yet written (an earlier image is still running), by image index.
    finished: BTreeMap<usize, Vec<Value>>,
    /// Images whose lines are written: lines go out in input order.
    flushed: usize,
    /// Tag -> (image index, prompt index).
    tasks: HashMap<u64, (usize, usize)>,
    next_tag: u64,
    progress: Progress,
    stats: Stats,
}

impl Runner<'_, '_> {
    /// Encode images `first..` (the vision tower on them as one batch where that gives each its own
    /// bits: `Pipeline::encode_images`), prepare their tasks (prompts of one encoder length through the
    /// encoder together: `Pipeline::prepare_batch`) and add them to the batch.
    fn start_images(
        &mut self,
        first: usize,
        images: Vec<florence2_wasm::Result<image::RgbImage>>,
    ) -> Result<(), Failure> {
        let inputs: Vec<Image> = images
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(Image::Rgb)
            .collect();
        let mut encoded = self.p.encode_images(&inputs).into_iter();
        drop(inputs);
        let mut started = Vec::with_capacity(images.len());
        for (k, image) in images.into_iter().enumerate() {
            let (rgb, e) = match image {
                Ok(rgb) => (
                    self.annotator.is_some().then_some(rgb),
                    encoded
                        .next()
                        .unwrap_or_else(|| Err(Error::Image("an image was not encoded".into()))),
                ),
                Err(e) => (None, Err(e)),
            };
            if let Some(e) = self.start_image(first + k, e, rgb)? {
                started.push((first + k, e));
            }
        }
        self.start_tasks(&started)
    }

    /// Record image `i` as in flight with its tasks to come; an image that failed gets its error line
    /// and is done (`None`).
    fn start_image(
        &mut self,
        i: usize,
        encoded: florence2_wasm::Result<EncodedImage>,
        rgb: Option<image::RgbImage>,
    ) -> Result<Option<EncodedImage>, Failure> {
        let w = &self.work[i];
        self.images.resize_with(i + 1, || None);
        let encoded = match encoded {
            Ok(e) => e,
            Err(e) => {
                self.images[i] = Some(InFlight {
                    left: 0,
                    lines: vec![Some(error_line(&w.shown, None, &e))],
                    error: Some(e),
                    pre_vision: (0.0, 0.0),
                    rgb: None,
                });
                self.image_done(i)?;
                return Ok(None);
            }
        };
        self.images[i] = Some(InFlight {
            left: w.prompts.len(),
            error: None,
            pre_vision: (encoded.preprocess_ms(), encoded.vision_ms()),
            lines: vec![None; w.prompts.len()],
            rgb,
        });
        Ok(Some(encoded))
    }

    /// Prepare the tasks of the images started together and add them to the batch (error lines for
    /// what fails).
    fn start_tasks(&mut self, started: &[(usize, EncodedImage)]) -> Result<(), Failure> {
        let p = self.p;
        let mut items = Vec::new();
        let mut slots = Vec::new(); // per (image, prompt): Ok(index into items) or the prompt's error
        for (i, encoded) in started {
            for (j, prompt) in self.work[*i].prompts.iter().enumerate() {
                let slot = p.tasks().parse(prompt).map(|tp| {
                    items.push(PrepareItem {
                        image: encoded,
                        prompt: tp,
                        options: self.options.clone(),
                    });
                    items.len() - 1
                });
                slots.push((*i, j, slot));
            }
        }
        let mut prepared: Vec<Option<_>> = p.prepare_batch(&items).into_iter().map(Some).collect();
        for (i, j, slot) in slots {
            let pr = slot.and_then(|k| {
                prepared[k]
                    .take()
                    .unwrap_or_else(|| Err(Error::Image("a task was not prepared".into())))
            });
            let tag = self.next_tag;
            self.next_tag += 1;
            self.tasks.insert(tag, (i, j));
            if let Err(e) = pr.and_then(|pr| self.batch.add(tag, pr)) {
                self.task_done(tag, Err(e))?;
            }
        }
        Ok(())
    }

    /// Keep a task's line; when it was its image's last, the image is done.
    fn task_done(
        &mut self,
        tag: u64,
        out: florence2_wasm::Result<TaskOutput>,
    ) -> Result<(), Failure> {
        let Some((i, j)) = self.tasks.remove(&tag) else {
            return Ok(());
        };
        let (w, stamp) = (&self.work[i], self.stamp);
        let prompt = &w.prompts[j];
        let Some(img) = self.images.get_mut(i).and_then(Option::as_mut) else {
            return Ok(());
        };
        img.left = img.left.saturating_sub(1);
        match out {
            Ok(out) => {
                // The image's own stages are counted in its first task's answer.
                let pre_vision = if j == 0 { img.pre_vision } else { (0.0, 0.0) };
                let mut v = answer_line(&out, stamp, pre_vision, &w.shown, prompt);
                if let (Some(an), Some(rgb)) = (self.annotator.as_mut(), img.rgb.as_ref()) {
                    // A picture that cannot be written (a full disk) stops the batch, as the output
                    // file's errors do; --resume continues it.
                    v["annotated"] = json!(an.write(&w.shown, &out.marker, rgb, &out.result)?);
                }
                img.lines[j] = Some(v);
                self.stats.answers += 1;
            }
            Err(e) => {
                img.lines[j] = Some(error_line(&w.shown, Some(prompt), &e));
                img.error.get_or_insert(e);
            }
        }
        if img.left == 0 {
            self.image_done(i)?;
        }
        Ok(())
    }

    fn image_done(&mut self, i: usize) -> Result<(), Failure> {
        let Some(img) = self.images.get_mut(i).and_then(Option::take) else {
            return Ok(());
        };
        self.finished
            .insert(i, img.lines.iter().flatten().cloned().collect());
        while let Some(lines) = self.finished.remove(&self.flushed) {
            for l in &lines {
                self.sink.line(l)?;
            }
            self.flushed += 1;
        }
        let (shown, total) = (&self.work[i].shown, self.work.len());
        self.stats
            .image_done(&mut self.progress, shown, img.error.as_ref(), total)
    }
}

/// An answer's line: the `--json` object (without `timings_ms.load`) with `image`, `prompt`, `device`,
/// `adapter` (and `dtype_reason`); `pre_vision` are the image's own stages (ms).
fn answer_line(
    out: &TaskOutput,
    stamp: &Stamp,
    (pre, vision): (f64, f64),
    shown: &str,
    prompt: &str,
) -> Value {
    let mut v = json_of(out, stamp.dtype, 0.0, pre, vision);
    if let Some(r) = &stamp.dtype_reason {
        v["dtype_reason"] = json!(r);
    }
    if let Some(t) = v.get_mut("timings_ms").and_then(Value::as_object_mut) {
        t.remove("load");
    }
    v["image"] = json!(shown);
    v["prompt"] = json!(prompt);
    v["device"] = json!(stamp.device);
    v["adapter"] = json!(stamp.adapter);
    v
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
