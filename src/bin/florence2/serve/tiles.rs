//! The request extension `florence2.tiles` (`"auto"`, `"off"` or `"RxC"`; see
//! [`florence2_wasm::pipeline::tiles`]): checked with the rest of the request, before it queues.

use serde_json::Value;

use florence2_wasm::pipeline::tiles::{check_task, Tiles};
use florence2_wasm::processor::custom_tasks::AnyTaskPrompt;

use super::error::ApiError;

const PARAM: &str = "florence2.tiles";

/// `florence2.tiles` of a request body (absent or null: off); set other than off, the prompt's task
/// must be one that tiles (else a 400 `invalid_prompt`).
pub fn parse_tiles(body: &Value, prompt: &AnyTaskPrompt) -> Result<Tiles, ApiError> {
    let v = match body.get("florence2") {
        None | Some(Value::Null) => return Ok(Tiles::Off),
        Some(Value::Object(o)) => o.get("tiles"),
        Some(_) => {
            return Err(ApiError::invalid(
                "florence2",
                "florence2 must be an object",
            ))
        }
    };
    let tiles = match v {
        None | Some(Value::Null) => return Ok(Tiles::Off),
        Some(Value::String(s)) => s
            .parse::<Tiles>()
            .map_err(|e| ApiError::invalid(PARAM, e.to_string()))?,
        Some(_) => {
            return Err(ApiError::invalid(
                PARAM,
                "florence2.tiles must be a string: auto, off or RxC",
            ))
        }
    };
    if tiles != Tiles::Off {
        let task = match prompt {
            AnyTaskPrompt::Builtin(tp) => Some(tp.task()),
            AnyTaskPrompt::Custom { .. } => None,
        };
        check_task(task, prompt.marker())
            .map_err(|e| ApiError::invalid_code(PARAM, "invalid_prompt", e.to_string()))?;
    }
    Ok(tiles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use florence2_wasm::processor::custom_tasks::CustomTasks;
    use serde_json::json;

    fn parse(body: Value, prompt: &str) -> Result<Tiles, ApiError> {
        parse_tiles(&body, &CustomTasks::new().parse(prompt).unwrap())
    }

    #[test]
    fn tiles_parse_and_bad_values_name_the_parameter() {
        assert_eq!(parse(json!({}), "<OD>").unwrap(), Tiles::Off);
        assert_eq!(
            parse(json!({"florence2": {}}), "<CAPTION>").unwrap(),
            Tiles::Off
        );
        assert_eq!(
            parse(json!({"florence2": {"tiles": "2x3"}}), "<OCR>").unwrap(),
            Tiles::Grid { rows: 2, cols: 3 }
        );
        assert_eq!(
            parse(json!({"florence2": {"tiles": "off"}}), "<CAPTION>").unwrap(),
            Tiles::Off
        );
        for (body, code) in [
            (json!({"florence2": {"tiles": "9x9"}}), "invalid_value"),
            (json!({"florence2": {"tiles": 4}}), "invalid_value"),
            (json!({"florence2": {"tiles": "auto"}}), "invalid_prompt"),
        ] {
            let e = parse(body.clone(), "<CAPTION>").unwrap_err();
            assert_eq!((e.param.as_deref(), e.code), (Some(PARAM), code), "{body}");
        }
        let e = parse(json!({"florence2": "auto"}), "<OD>").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("florence2"));
    }
}
