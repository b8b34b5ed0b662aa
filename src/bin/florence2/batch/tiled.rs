//! A batch with `--tiles`: each image's tasks run tiled ([`Pipeline::run_tiled`]), one image
//! after another while the next images decode on other threads (a tiled run is a batch of its views
//! already); each answer line is the batch's line plus `tiles`, written in input order.

use florence2_wasm::pipeline::tiles::Tiles;
use florence2_wasm::pipeline::{Image, Pipeline, TaskOptions};
use florence2_wasm::processor::image::RgbImage;
use florence2_wasm::Error;
use serde_json::json;

use super::super::annotate::Annotator;
use super::super::run_tiled::run_to_end;
use super::output::Sink;
use super::progress::Progress;
use super::{answer_line, decode, error_line, Failure, Stamp, Stats, Work};

/// Every image of `work`, its tasks tiled with `tiles`.
pub(super) fn run_all(
    p: &Pipeline,
    work: &[Work],
    (options, tiles): (&TaskOptions, Tiles),
    stamp: &Stamp,
    (sink, mut annotator): (&mut Sink, Option<Annotator>),
) -> Result<Stats, Failure> {
    let paths: Vec<_> = work.iter().map(|w| w.path.clone()).collect();
    let mut progress = Progress::new(work.len() as u64);
    let mut stats = Stats::default();
    let result = decode::with_decoded(&paths, *p.limits(), decode::default_threads(), |decoded| {
        for w in work {
            let error = match decoded.next_image() {
                Err(e) => {
                    sink.line(&error_line(&w.shown, None, &e))?;
                    Some(e)
                }
                Ok(image) => {
                    let run = (p, (options, tiles), stamp);
                    let out = (&mut *sink, annotator.as_mut(), &mut stats.answers);
                    run_tasks(run, w, &image, out)?
                }
            };
            stats.image_done(&mut progress, &w.shown, error.as_ref(), work.len())?;
        }
        Ok(())
    });
    progress.finish();
    result.map(|()| stats)
}

/// Image `w`'s tasks run tiled on `image`, each answer's line (or error line) written and each answer
/// counted in `answers`; the image's first error.
fn run_tasks(
    (p, (options, tiles), stamp): (&Pipeline, (&TaskOptions, Tiles), &Stamp),
    w: &Work,
    image: &RgbImage,
    (sink, mut annotator, answers): (&mut Sink, Option<&mut Annotator>, &mut usize),
) -> Result<Option<Error>, Failure> {
    let mut error: Option<Error> = None;
    for prompt in &w.prompts {
        match run_to_end(p, Image::Rgb(image), prompt, options, tiles) {
            Ok(t) => {
                let mut v = answer_line(&t.output, stamp, (0.0, 0.0), &w.shown, prompt);
                v["timings_ms"]["vision"] = json!(t.output.timings.vision_ms);
                v["tiles"] = t.tiles_json();
                if let Some(an) = annotator.as_mut() {
                    let (marker, result) = (&t.output.marker, &t.output.result);
                    v["annotated"] = json!(an.write(&w.shown, marker, image, result)?);
                }
                sink.line(&v)?;
                *answers += 1;
            }
            Err(e) => {
                sink.line(&error_line(&w.shown, Some(prompt), &e))?;
                error.get_or_insert(e);
            }
        }
    }
    Ok(error)
}
