//! The `tiles` option of `runTask`: `"auto"`, `"off"` (the default) or `"RxC"` (see
//! [`crate::pipeline::tiles`]), checked before the call queues.

use wasm_bindgen::JsValue;

use crate::error::{Error, Result};
use crate::pipeline::tiles::{check_task, Tiles};
use crate::processor::custom_tasks::AnyTaskPrompt;

/// The option, and whether the task and the input allow it: tiling needs the image itself (an
/// `EncodedImage` is one view already) and a task with located answers.
pub fn opt_tiles(options: &JsValue, prompt: &AnyTaskPrompt, encoded: bool) -> Result<Tiles> {
    let Some(v) = super::js::opt_get(options, "tiles") else {
        return Ok(Tiles::Off);
    };
    let s = v.as_string().ok_or_else(|| {
        Error::InvalidInput("option tiles must be a string: auto, off or RxC".into())
    })?;
    let tiles: Tiles = s.parse()?;
    if tiles == Tiles::Off {
        return Ok(tiles);
    }
    if encoded {
        return Err(Error::InvalidInput(
            "option tiles needs the image itself, not an EncodedImage".into(),
        ));
    }
    let task = match prompt {
        AnyTaskPrompt::Builtin(tp) => Some(tp.task()),
        AnyTaskPrompt::Custom { .. } => None,
    };
    check_task(task, prompt.marker())?;
    Ok(tiles)
}
