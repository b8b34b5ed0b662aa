//! `florence2 run --tiles auto|RxC`: each task run tiled on the one image ([`Pipeline::run_tiled`]),
//! the answer in page coordinates, with what the plan chose (`tiles` in the JSON, a line on stderr).

use florence2_wasm::pipeline::tiles::{check_task, Tiles};
use florence2_wasm::pipeline::{Callbacks, Image, NeverCancel, Pipeline, TaskOptions, TiledOutput};
use florence2_wasm::processor::prompt::parse_task_prompt;

use image::RgbImage;

use super::annotate::Annotator;
use super::run::{json_of, Loaded};
use super::{print_json, Failure};

/// `--tiles`: auto, off or RxC.
pub(super) fn parse_tiles(s: &str) -> Result<Tiles, String> {
    s.parse::<Tiles>().map_err(|e| e.to_string())
}

/// Every prompt may be tiled (checked before the model loads).
pub(super) fn check_prompts(prompts: &[String]) -> Result<(), Failure> {
    for p in prompts {
        let task = parse_task_prompt(p).ok().map(|tp| tp.task());
        let marker = p.trim().split_inclusive('>').next().unwrap_or(p);
        check_task(task, marker).map_err(|e| Failure::Usage(format!("--tiles: {e}")))?;
    }
    Ok(())
}

/// `prompt` run tiled on `image` to its end: the CLI neither cancels a run nor reports its progress.
pub(super) fn run_to_end(
    p: &Pipeline,
    image: Image<'_>,
    prompt: &str,
    options: &TaskOptions,
    tiles: Tiles,
) -> florence2_wasm::Result<TiledOutput> {
    pollster::block_on(p.run_tiled(
        image,
        prompt,
        options,
        tiles,
        &NeverCancel,
        &Callbacks::default(),
    ))
}

/// `--annotate`'s writer, the decoded image and the input's name.
pub(super) type Annotate<'a> = Option<(&'a mut Annotator, &'a RgbImage, &'a str)>;

/// Run every prompt tiled on the image `bytes` and print the answers as `run` does (`--json`: `json`);
/// `annotate` draws each answer on the image.
pub(super) fn run(
    loaded: &Loaded,
    prompts: &[String],
    options: &TaskOptions,
    (tiles, json): (Tiles, bool),
    bytes: &[u8],
    annotate: Annotate<'_>,
) -> Result<(), Failure> {
    let mut outputs: Vec<TiledOutput> = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let image = Image::Encoded(bytes);
        outputs.push(run_to_end(&loaded.pipeline, image, prompt, options, tiles)?);
    }
    let pictures = match annotate {
        Some((annotator, rgb, shown)) => {
            annotator.write_each(shown, rgb, outputs.iter().map(|t| &t.output))?
        }
        None => Vec::new(),
    };
    let several = outputs.len() > 1;
    if json {
        let objects: Vec<serde_json::Value> = outputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut v = json_of(&t.output, loaded.dtype, loaded.load_ms, 0.0, 0.0);
                if let Some(p) = pictures.get(i) {
                    v["annotated"] = serde_json::json!(p);
                }
                v["timings_ms"]["vision"] = serde_json::json!(t.output.timings.vision_ms);
                v["tiles"] = t.tiles_json();
                if let Some(r) = &loaded.dtype_reason {
                    v["dtype_reason"] = serde_json::json!(r);
                }
                v["device"] = serde_json::json!(if loaded.gpu.is_host() { "cpu" } else { "gpu" });
                v["adapter"] = serde_json::json!(loaded.gpu.describe());
                v
            })
            .collect();
        return match (several, objects.first()) {
            (false, Some(only)) => print_json(only),
            _ => print_json(&serde_json::Value::Array(objects)),
        };
    }
    for t in &outputs {
        if several {
            super::out_line(&t.output.marker)?;
        }
        super::out_line(&t.output.text)?;
        eprintln!("florence2: tiles: {}", t.tiles_json());
    }
    Ok(())
}
