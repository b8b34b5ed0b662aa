//! A model's own task markers in the browser: from `processor_config.json` (probed: an absent file is
//! fine), `preprocessor_config.json`, and the `tasks` load option (see
//! [`crate::processor::custom_tasks`]).

use wasm_bindgen::JsValue;

use crate::error::{Error, Result};
use crate::processor::custom_tasks::CustomTasks;
use crate::wasm::fetch::Fetcher;
use crate::wasm::js::opt_get;

/// Cap on `processor_config.json`.
const MAX_PROCESSOR_CONFIG_BYTES: u64 = 4 << 20;

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

/// Every custom task the model declares, plus `extra` (the caller's).
pub async fn load_tasks(
    f: &Fetcher,
    preprocessor_config: Option<&[u8]>,
    extra: &CustomTasks,
) -> Result<CustomTasks> {
    let mut tasks = CustomTasks::new();
    if let Some(b) = f
        .read_small("processor_config.json", false, MAX_PROCESSOR_CONFIG_BYTES)
        .await?
    {
        tasks.extend(&CustomTasks::from_processor_config(&b)?)?;
    }
    if let Some(b) = preprocessor_config {
        tasks.extend(&CustomTasks::from_processor_config(b)?)?;
    }
    tasks.extend(extra)?;
    Ok(tasks)
}
