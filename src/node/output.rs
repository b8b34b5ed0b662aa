//! One task run and its result object, the shape of the wasm build's `runTask` result
//! (`{task, text, result, generatedText, tokenIds, timings, memory}`).

use serde_json::{json, Value};

use std::sync::Arc;

use crate::gpu::MemReport;
use crate::pipeline::{
    Callbacks, Cancel, EncodedImage, OnToken, Pipeline, Stopwatch, TaskInput, TaskOptions, Tiles,
};
use crate::{Error, Result};

use super::image::Owned;

/// What a task runs on: an image, or an encoding of `encodeImage`.
pub enum Input {
    Image(Owned),
    Encoded(Arc<EncodedImage>),
}

/// Reads, encodes and runs the task, blocking this (pool) thread; `on_token` gets each token.
pub fn run(
    pipeline: &Pipeline,
    input: &Input,
    task: &str,
    (options, tiles): (&TaskOptions, Tiles),
    cancel: &dyn Cancel,
    on_token: Option<OnToken>,
) -> Result<Value> {
    let t = Stopwatch::start();
    let file = match input {
        Input::Image(image) => image.read(pipeline.limits().max_alloc_bytes)?,
        Input::Encoded(_) => None,
    };
    let read_ms = t.ms();
    let view = match input {
        Input::Image(image) => TaskInput::Image(image.view(file.as_deref())),
        Input::Encoded(e) => TaskInput::Encoded(e),
    };
    let callbacks = Callbacks {
        on_token,
        ..Callbacks::default()
    };
    let (out, tiles) = match (tiles, view) {
        (Tiles::Off, view) => (
            pipeline.run_task_blocking(view, task, options, cancel, &callbacks)?,
            None,
        ),
        (_, TaskInput::Encoded(_)) => {
            return Err(Error::InvalidInput(
                "option tiles needs the image itself, not an encoding".into(),
            ))
        }
        (tiles, TaskInput::Image(image)) => {
            let t = pollster::block_on(
                pipeline.run_tiled(image, task, options, tiles, cancel, &callbacks),
            )?;
            let report = t.tiles_json();
            (t.output, Some(report))
        }
    };
    let tm = &out.timings;
    let mut v = json!({
        "task": out.marker,
        "text": out.text,
        "result": out.result_json(),
        "generatedText": out.generated_text,
        "tokenIds": out.token_ids,
        "timings": {
            "preprocess": read_ms + tm.preprocess_ms,
            "encode": tm.vision_ms + tm.encoder_ms,
            "decode": tm.decode_ms,
            "total": read_ms + tm.total_ms(),
        },
        "memory": memory_json(pipeline, out.memory),
    });
    if let Some(t) = tiles {
        v["tiles"] = t;
    }
    Ok(v)
}

/// The wasm build's `memory` object; `device` is "gpu" or "cpu" (the wasm fallback says "wasm").
pub fn memory_json(pipeline: &Pipeline, m: MemReport) -> Value {
    json!({
        "dtype": pipeline.weight_dtype().label(),
        "device": if pipeline.gpu().is_host() { "cpu" } else { "gpu" },
        "weightsBytes": m.weights_bytes,
        "activationsBytes": m.activations_bytes,
        "currentBytes": m.current_bytes,
        "peakBytes": m.peak_bytes,
        "peakActivationsBytes": m.peak_activations_bytes,
        "allocations": m.allocations,
    })
}
