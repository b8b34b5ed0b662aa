//! `florence2 parse`: post-process a raw generation without a model.

use clap::Args;
use florence2_wasm::files;
use florence2_wasm::postprocess::MarkedTask;
use florence2_wasm::render::render;

use super::{print_json, Failure};

#[derive(Args, Debug)]
pub struct ParseArgs {
    /// A marker (<OD>), a name in any case (OD, od) or a whole prompt ('<OPEN_VOCABULARY_DETECTION>cat'); a marker that
    /// is not built in (<MY_TASK>) is post-processed as pure text, as the reference does
    #[arg(long, value_name = "TASK", value_parser = parse_task)]
    task: MarkedTask,
    /// The original image size, W,H (or WxH), both positive
    #[arg(long, value_name = "W,H", value_parser = parse_image_size)]
    image_size: (u32, u32),
    /// The raw generation; '-' reads it from stdin
    #[arg(long, value_name = "RAW", allow_hyphen_values = true)]
    text: String,
    /// Print {"task", "result", "text"} as JSON
    #[arg(long)]
    json: bool,
}

/// As `run --task` takes it ([`super::task_arg`]: a name in any case, a marker or a prompt).
fn parse_task(s: &str) -> Result<MarkedTask, String> {
    MarkedTask::parse(&super::task_arg(s)?).map_err(|e| e.to_string())
}

/// `W,H` (or `WxH`) with both positive.
pub fn parse_image_size(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("takes W,H (positive integers), got {s:?}");
    let (w, h) = s.split_once([',', 'x']).ok_or_else(bad)?;
    let w: u32 = w.trim().parse().map_err(|_| bad())?;
    let h: u32 = h.trim().parse().map_err(|_| bad())?;
    if w == 0 || h == 0 {
        return Err(bad());
    }
    Ok((w, h))
}

pub fn parse_cmd(a: ParseArgs) -> Result<(), Failure> {
    let raw = if a.text == "-" {
        // Capped like every file the CLI reads (a generation is a few KB).
        let bytes = files::read_stream_capped(std::io::stdin(), "stdin", files::MAX_JSON_FILE)?;
        String::from_utf8(bytes).map_err(|e| Failure::Run(format!("stdin is not UTF-8: {e}")))?
    } else {
        a.text
    };
    let result = a.task.post_process(&raw, a.image_size)?;
    let text = render(&result);
    if a.json {
        print_json(&serde_json::json!({
            "task": a.task.marker,
            "result": result.to_json_keyed(&a.task.marker),
            "text": text,
        }))
    } else {
        if !text.is_empty() {
            super::out_line(&text)?;
        }
        Ok(())
    }
}
