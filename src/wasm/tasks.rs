//! The `tasks` load option: task markers the caller declares on top of the model's own (which
//! `Pipeline::load` reads from `processor_config.json` and `preprocessor_config.json`; see
//! [`crate::processor::custom_tasks`]).

use wasm_bindgen::JsValue;

use crate::error::{Error, Result};
use crate::processor::custom_tasks::CustomTasks;
use crate::wasm::js::opt_get;

/// The tasks the `tasks` load option declares (a list of markers or `{marker: text}`).
pub fn option_tasks(options: &JsValue) -> Result<CustomTasks> {
    let mut tasks = CustomTasks::new();
    if let Some(v) = opt_get(options, "tasks") {
        let json: serde_json::Value = serde_wasm_bindgen::from_value(v).map_err(|e| {
            Error::InvalidInput(format!(
                "option tasks must be a list of markers or an object {{marker: text}}: {e}"
            ))
        })?;
        tasks.add_json(&json).map_err(|e| match e {
            Error::Config(m) => Error::InvalidInput(format!("option {m}")),
            e => e,
        })?;
    }
    Ok(tasks)
}
