//! A tiled run on a pipeline: the page cut into its planned tiles, every view encoded, prepared and
//! decoded as one batch, the answers merged ([`Pipeline::run_tiled`]).

use std::borrow::Cow;

use image::RgbImage;

use crate::error::{Error, Result};
use crate::pipeline::cancel::Cancel;
use crate::pipeline::clock::Stopwatch;
use crate::pipeline::image::{EncodedImage, Image};
use crate::pipeline::observe::{Callbacks, Stage};
use crate::pipeline::options::TaskOptions;
use crate::pipeline::output::{StopReason, TaskOutput, Timings, Usage};
use crate::pipeline::run::Prepared;
use crate::pipeline::tiles::{check_task, merge, plan, report, view_task};
use crate::pipeline::tiles::{Decision, Grid, Rect, Tiles, ViewAnswer};
use crate::pipeline::{BatchEvent, DecodeBatch, Pipeline};
use crate::processor::custom_tasks::AnyTaskPrompt;
use crate::processor::image::{decode_image, rgba_to_rgb, AlphaMode, ImageLimits};
use crate::processor::prompt::{parse_task_prompt, Task};
use crate::render::render;

/// The answer of a tiled run.
#[derive(Clone, Debug)]
pub struct TiledOutput {
    /// The page's answer, in page coordinates. A tiled answer has no single generation: its
    /// `generated_text` and `token_ids` are empty, its usage and timings are the views' sums (decode:
    /// the batch's wall time).
    pub output: TaskOutput,
    /// What the plan chose (a one-view run: [`Decision::Off`] with the reason).
    pub decision: Decision,
    /// Each view's own answer, tiles row-major then the whole image (empty for one view).
    pub views: Vec<ViewAnswer>,
}

impl TiledOutput {
    /// The front ends' `tiles` field ([`super::report`]).
    pub fn tiles_json(&self) -> serde_json::Value {
        report(&self.decision)
    }
}

impl Pipeline {
    /// Run a tiled task (see [`crate::pipeline::tiles`]) on `image`. `tiles` off, or `auto` on an image
    /// close to the model's input size, runs the one view ([`Pipeline::run_prompt`]); a task that cannot
    /// be tiled is a [`Error::Prompt`] unless `tiles` is off.
    pub async fn run_tiled(
        &self,
        image: Image<'_>,
        prompt: &str,
        options: &TaskOptions,
        tiles: Tiles,
        cancel: &dyn Cancel,
        callbacks: &Callbacks<'_>,
    ) -> Result<TiledOutput> {
        let tp = self.tasks.parse(prompt)?;
        self.run_tiled_prompt(image, tp, options, tiles, cancel, callbacks)
            .await
    }

    /// [`Pipeline::run_tiled`] for a prompt parsed before.
    pub async fn run_tiled_prompt(
        &self,
        image: Image<'_>,
        tp: AnyTaskPrompt,
        options: &TaskOptions,
        tiles: Tiles,
        cancel: &dyn Cancel,
        callbacks: &Callbacks<'_>,
    ) -> Result<TiledOutput> {
        if tiles == Tiles::Off {
            let output = self
                .run_prompt(image.into(), tp, options, cancel, callbacks)
                .await?;
            return Ok(one_view(output, "tiles off".into()));
        }
        let builtin = match &tp {
            AnyTaskPrompt::Builtin(t) => Some(t.task()),
            AnyTaskPrompt::Custom { .. } => None,
        };
        let task = check_task(builtin, tp.marker())?;
        options.resolve(&self.generation)?;
        callbacks.stage(Stage::Preprocess);
        let t = Stopwatch::start();
        let page = page_rgb(image, &self.limits)?;
        let input = (self.processor.width as u32, self.processor.height as u32);
        let decision = plan(tiles, page.dimensions(), input)?;
        let Decision::Grid(grid) = &decision else {
            let Decision::Off(reason) = decision else {
                return Err(Error::shape(
                    "tiles",
                    "a plan that is neither off nor a grid",
                ));
            };
            let output = self
                .run_prompt(Image::Rgb(&page).into(), tp, options, cancel, callbacks)
                .await?;
            return Ok(one_view(output, reason));
        };
        let crops: Vec<RgbImage> = grid
            .tiles
            .iter()
            .map(|r| image::imageops::crop_imm(&*page, r.x, r.y, r.w, r.h).to_image())
            .collect();
        let crop_ms = t.ms();
        let mut images: Vec<Image> = crops.iter().map(Image::Rgb).collect();
        images.push(Image::Rgb(&page));
        let view_prompt = AnyTaskPrompt::Builtin(parse_task_prompt(view_task(task).marker())?);

        let encoded = self.encode_views(&images, cancel, callbacks).await?;
        drop(images);
        drop(crops);
        let image_ms: f64 = encoded.iter().map(|e| e.preprocess_ms).sum::<f64>() + crop_ms;
        let vision_ms: f64 = encoded.iter().map(|e| e.vision_ms).sum();
        check(cancel)?;
        callbacks.stage(Stage::Encoder);
        let prepared = self
            .prepare_views(&encoded, &view_prompt, options, cancel)
            .await?;
        drop(encoded);
        callbacks.stage(Stage::Decode);
        let t = Stopwatch::start();
        let outs = self.decode_views(prepared, cancel).await?;
        let decode_ms = t.ms();

        callbacks.stage(Stage::Postprocess);
        let costs = Costs {
            image_ms,
            vision_ms,
            decode_ms,
        };
        let (output, views) = self.page_output(tp, task, grid, &outs, costs);
        Ok(TiledOutput {
            output,
            decision,
            views,
        })
    }

    /// The page's answer from the views' answers (tiles row-major, then the whole image), and the
    /// views' answers placed on the page.
    fn page_output(
        &self,
        tp: AnyTaskPrompt,
        task: Task,
        grid: &Grid,
        outs: &[TaskOutput],
        costs: Costs,
    ) -> (TaskOutput, Vec<ViewAnswer>) {
        let t = Stopwatch::start();
        let (w, h) = grid.page;
        let rects = grid
            .tiles
            .iter()
            .copied()
            .chain([Rect { x: 0, y: 0, w, h }]);
        let views: Vec<ViewAnswer> = rects
            .zip(outs)
            .enumerate()
            .map(|(i, (rect, out))| ViewAnswer {
                rect,
                whole: i == grid.tiles.len(),
                result: out.result.clone(),
            })
            .collect();
        let result = merge(task, grid, &views);
        let text = render(&result);
        let sum = |f: fn(&Timings) -> f64| outs.iter().map(|o| f(&o.timings)).sum::<f64>();
        let timings = Timings {
            preprocess_ms: costs.image_ms + sum(|t| t.preprocess_ms),
            vision_ms: costs.vision_ms,
            encoder_ms: sum(|t| t.encoder_ms),
            decode_ms: costs.decode_ms,
            postprocess_ms: t.ms() + sum(|t| t.postprocess_ms),
        };
        let output = TaskOutput {
            task,
            marker: tp.marker().to_owned(),
            prompt: tp,
            result,
            text,
            generated_text: String::new(),
            token_ids: Vec::new(),
            usage: usage_sum(outs),
            image_size: (w, h),
            reused_image: false,
            timings,
            memory: self.model.gpu().memory(),
        };
        (output, views)
    }

    /// Every view through the vision tower: natively as one batch ([`Pipeline::encode_images`]), in the
    /// browser one after another (awaiting the GPU between them).
    async fn encode_views(
        &self,
        images: &[Image<'_>],
        cancel: &dyn Cancel,
        callbacks: &Callbacks<'_>,
    ) -> Result<Vec<EncodedImage>> {
        check(cancel)?;
        callbacks.stage(Stage::Vision);
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.encode_images(images).into_iter().collect()
        }
        #[cfg(target_arch = "wasm32")]
        {
            let mut out = Vec::with_capacity(images.len());
            for image in images {
                check(cancel)?;
                out.push(self.encode_image_async(*image).await?);
            }
            Ok(out)
        }
    }

    /// Every view's prompt through the encoder: natively as one batch ([`Pipeline::prepare_batch`]),
    /// in the browser one after another.
    async fn prepare_views(
        &self,
        encoded: &[EncodedImage],
        prompt: &AnyTaskPrompt,
        options: &TaskOptions,
        cancel: &dyn Cancel,
    ) -> Result<Vec<Prepared>> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = cancel;
            let items: Vec<crate::pipeline::PrepareItem> = encoded
                .iter()
                .map(|image| crate::pipeline::PrepareItem {
                    image,
                    prompt: prompt.clone(),
                    options: options.clone(),
                })
                .collect();
            self.prepare_batch(&items).into_iter().collect()
        }
        #[cfg(target_arch = "wasm32")]
        {
            let mut out = Vec::with_capacity(encoded.len());
            for e in encoded {
                let cb = Callbacks::default();
                out.push(
                    self.prepare(e.into(), prompt.clone(), options, cancel, &cb)
                        .await?,
                );
            }
            Ok(out)
        }
    }

    /// Every view decoded in one [`DecodeBatch`]; the answers in view order. `cancel` is asked before
    /// every step; one view's failure fails the run.
    async fn decode_views(
        &self,
        prepared: Vec<Prepared>,
        cancel: &dyn Cancel,
    ) -> Result<Vec<TaskOutput>> {
        let n = prepared.len();
        let mut batch = DecodeBatch::new(self);
        for (i, p) in prepared.into_iter().enumerate() {
            batch.add(i, p)?;
        }
        let mut outs: Vec<Option<TaskOutput>> = (0..n).map(|_| None).collect();
        while !batch.is_empty() {
            check(cancel)?;
            for event in batch.step().await {
                if let BatchEvent::Done(i, out) = event {
                    if let Some(slot) = outs.get_mut(i) {
                        *slot = Some((*out)?);
                    }
                }
            }
        }
        outs.into_iter()
            .map(|o| o.ok_or_else(|| Error::shape("tiles", "a view without an answer")))
            .collect()
    }
}

/// Milliseconds of a tiled run's stages before post-processing: cutting and preprocessing the views,
/// their vision tower shares, the decode batch's wall time.
struct Costs {
    image_ms: f64,
    vision_ms: f64,
    decode_ms: f64,
}

/// A one-view run's answer, with why it was not tiled.
fn one_view(output: TaskOutput, reason: String) -> TiledOutput {
    TiledOutput {
        output,
        decision: Decision::Off(reason),
        views: Vec::new(),
    }
}

/// The page as RGB pixels (decoded under `limits`; RGBA composited onto white).
fn page_rgb<'a>(image: Image<'a>, limits: &ImageLimits) -> Result<Cow<'a, RgbImage>> {
    match image {
        Image::Encoded(bytes) => Ok(Cow::Owned(decode_image(bytes, limits)?)),
        Image::Rgb(rgb) => Ok(Cow::Borrowed(rgb)),
        Image::Rgba {
            data,
            width,
            height,
        } => {
            if u64::from(width) * u64::from(height) > limits.max_pixels {
                return Err(Error::ImageTooLarge {
                    width: u64::from(width),
                    height: u64::from(height),
                    max_pixels: limits.max_pixels,
                });
            }
            Ok(Cow::Owned(rgba_to_rgb(
                data,
                width,
                height,
                AlphaMode::CompositeOnWhite,
            )?))
        }
    }
}

/// The views' token counts summed; stopped at the token limit when any view did.
fn usage_sum(outs: &[TaskOutput]) -> Usage {
    let sum = |f: fn(&Usage) -> usize| outs.iter().map(|o| f(&o.usage)).sum();
    let capped = outs.iter().any(|o| o.usage.stop == StopReason::MaxTokens);
    Usage {
        prompt_tokens: sum(|u| u.prompt_tokens),
        encoder_tokens: sum(|u| u.encoder_tokens),
        generated_tokens: sum(|u| u.generated_tokens),
        stop: if capped {
            StopReason::MaxTokens
        } else {
            StopReason::Eos
        },
    }
}

fn check(cancel: &dyn Cancel) -> Result<()> {
    if cancel.is_cancelled() {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}
