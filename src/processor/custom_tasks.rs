//! Task markers of fine-tuned models (`<GENERATE_TAGS>`, `<DocVQA>`, ...) on top of the 15 built-in ones.
//!
//! A model declares its own tasks in its processor config (`processor_config.json` or
//! `preprocessor_config.json`), with the reference processor's own attribute names:
//! `task_prompts_without_inputs` (`{marker: text}`), `task_prompts_with_input` (`{marker: template with
//! {input}}`), or a plain `tasks` list of markers; or the caller passes them (the `tasks` load option).
//!
//! A prompt whose marker is one of these is handled as the reference handles it: a declared text or
//! template replaces the marker (like `_construct_prompts`), a plain marker is passed to the encoder as
//! written (the reference leaves prompts it does not know unchanged), and the answer is post-processed as
//! pure text (`tasks_answer_post_processing_type.get(task, "pure_text")`). A marker nobody declared keeps
//! the built-in prompt error. Built-in markers cannot be redefined.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::processor::prompt::{parse_task_prompt, Task, TaskPrompt, MAX_INPUT_BYTES};

/// Most custom tasks a model may declare.
pub const MAX_CUSTOM_TASKS: usize = 256;
/// Longest custom marker or template, in bytes.
pub const MAX_TEMPLATE_BYTES: usize = 1024;

/// How a custom marker becomes encoder text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CustomPrompt {
    /// The prompt as written (marker plus any input).
    Verbatim,
    /// A fixed text; the prompt must be the marker alone.
    Text(String),
    /// A template with `{input}`; the prompt is the marker followed by a non-empty input.
    WithInput(String),
}

/// A model's own task markers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CustomTasks {
    tasks: BTreeMap<String, CustomPrompt>,
}

/// A parsed prompt: a built-in task, or a model's own one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnyTaskPrompt {
    Builtin(TaskPrompt),
    Custom {
        /// The marker, e.g. `<GENERATE_TAGS>`.
        marker: String,
        /// What the encoder sees.
        encoder_text: String,
    },
}

impl AnyTaskPrompt {
    /// The task marker (the key of the post-processed answer).
    pub fn marker(&self) -> &str {
        match self {
            AnyTaskPrompt::Builtin(tp) => tp.task().marker(),
            AnyTaskPrompt::Custom { marker, .. } => marker,
        }
    }

    /// The text the encoder sees.
    pub fn encoder_text(&self) -> String {
        match self {
            AnyTaskPrompt::Builtin(tp) => tp.encoder_text(),
            AnyTaskPrompt::Custom { encoder_text, .. } => encoder_text.clone(),
        }
    }

    /// The task whose answer type the answer is post-processed as: the built-in task, or `Caption`
    /// (pure text) for a model's own task (the parser looks at the task only for its answer type).
    pub fn answer_task(&self) -> Task {
        match self {
            AnyTaskPrompt::Builtin(tp) => tp.task(),
            AnyTaskPrompt::Custom { .. } => Task::Caption,
        }
    }
}

fn bad(msg: String) -> Error {
    Error::Config(format!("custom tasks: {msg}"))
}

/// Whether `m` is shaped like a task marker: `<` + 1 to 64 letters, digits, `_` or `-` + `>`.
pub fn is_task_marker(m: &str) -> bool {
    m.strip_prefix('<')
        .and_then(|s| s.strip_suffix('>'))
        .filter(|s| !s.is_empty() && s.len() <= 64)
        .is_some_and(|s| {
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// A marker: `<` + letters, digits, `_`, `-` + `>`, not a built-in one.
fn check_marker(m: &str) -> Result<()> {
    if !is_task_marker(m) {
        return Err(bad(format!(
            "{m:?} is not a task marker like <MY_TASK> (letters, digits, _ and - between < and >)"
        )));
    }
    Ok(())
}

fn check_template(m: &str, t: &str) -> Result<()> {
    if t.len() > MAX_TEMPLATE_BYTES || t.chars().any(char::is_control) {
        return Err(bad(format!(
            "the text of {m} is longer than {MAX_TEMPLATE_BYTES} bytes or has control characters"
        )));
    }
    Ok(())
}

impl CustomTasks {
    /// No custom tasks.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The declared markers, sorted.
    pub fn markers(&self) -> Vec<&str> {
        self.tasks.keys().map(String::as_str).collect()
    }

    /// Declare `marker` (built-in markers are skipped: they keep their own handling).
    pub fn add(&mut self, marker: &str, prompt: CustomPrompt) -> Result<()> {
        let marker = marker.trim();
        check_marker(marker)?;
        if Task::from_marker(marker).is_some() {
            return Ok(());
        }
        match &prompt {
            CustomPrompt::Verbatim => {}
            CustomPrompt::Text(t) => check_template(marker, t)?,
            CustomPrompt::WithInput(t) => {
                check_template(marker, t)?;
                if !t.contains("{input}") {
                    return Err(bad(format!("the template of {marker} has no {{input}}")));
                }
            }
        }
        if self.tasks.len() >= MAX_CUSTOM_TASKS && !self.tasks.contains_key(marker) {
            return Err(bad(format!("more than {MAX_CUSTOM_TASKS} tasks")));
        }
        self.tasks.insert(marker.to_owned(), prompt);
        Ok(())
    }

    /// Add the tasks a JSON value declares: a list of markers, or `{marker: text}` where a text with
    /// `{input}` takes an input (the shape of the `tasks` load option).
    pub fn add_json(&mut self, v: &Value) -> Result<()> {
        match v {
            Value::Array(a) => {
                for m in a {
                    let m = m
                        .as_str()
                        .ok_or_else(|| bad("a task list holds marker strings".into()))?;
                    self.add(m, CustomPrompt::Verbatim)?;
                }
                Ok(())
            }
            Value::Object(o) => {
                for (m, t) in o {
                    let t = t
                        .as_str()
                        .ok_or_else(|| bad(format!("the text of {m} must be a string")))?;
                    let p = if t.contains("{input}") {
                        CustomPrompt::WithInput(t.to_owned())
                    } else if t.is_empty() {
                        CustomPrompt::Verbatim
                    } else {
                        CustomPrompt::Text(t.to_owned())
                    };
                    self.add(m, p)?;
                }
                Ok(())
            }
            _ => Err(bad(
                "tasks must be a list of markers or an object {marker: text}".into(),
            )),
        }
    }

    /// The tasks a processor config declares (`task_prompts_without_inputs`, `task_prompts_with_input`,
    /// `tasks`, at the top level). A config
    /// that declares none gives none.
    pub fn from_processor_config(bytes: &[u8]) -> Result<CustomTasks> {
        let v: Value = crate::json::parse_strict_slice(bytes)
            .map_err(|e| Error::Config(format!("processor config is not valid JSON: {e}")))?;
        let mut out = CustomTasks::new();
        if let Some(o) = v
            .get("task_prompts_without_inputs")
            .and_then(Value::as_object)
        {
            for (m, t) in o {
                let t = t
                    .as_str()
                    .ok_or_else(|| bad(format!("the text of {m} must be a string")))?;
                out.add(m, CustomPrompt::Text(t.to_owned()))?;
            }
        }
        if let Some(o) = v.get("task_prompts_with_input").and_then(Value::as_object) {
            for (m, t) in o {
                let t = t
                    .as_str()
                    .ok_or_else(|| bad(format!("the template of {m} must be a string")))?;
                out.add(m, CustomPrompt::WithInput(t.to_owned()))?;
            }
        }
        if let Some(t) = v.get("tasks") {
            out.add_json(t)?;
        }
        Ok(out)
    }

    /// Everything `other` declares, added to these.
    pub fn extend(&mut self, other: &CustomTasks) -> Result<()> {
        for (m, p) in &other.tasks {
            self.add(m, p.clone())?;
        }
        Ok(())
    }

    /// Parse a prompt: a built-in task as [`parse_task_prompt`] does; otherwise, a declared marker. An
    /// undeclared marker keeps the built-in error (which then also lists the model's own markers).
    pub fn parse(&self, prompt: &str) -> Result<AnyTaskPrompt> {
        let builtin_err = match parse_task_prompt(prompt) {
            Ok(tp) => return Ok(AnyTaskPrompt::Builtin(tp)),
            Err(e) => e,
        };
        let trimmed = prompt.trim();
        let custom = trimmed
            .find('>')
            .map(|i| trimmed.split_at(i + 1))
            .and_then(|(m, rest)| self.tasks.get(m).map(|p| (m, rest.trim(), p)));
        let Some((marker, input, p)) = custom else {
            if self.tasks.is_empty() {
                return Err(builtin_err);
            }
            return Err(Error::Prompt(format!(
                "{}; this model's own markers: {}",
                builtin_err
                    .to_string()
                    .trim_start_matches("invalid task prompt: "),
                self.markers().join(", ")
            )));
        };
        if input.len() > MAX_INPUT_BYTES {
            return Err(Error::Prompt(format!(
                "{marker} input is {} bytes; at most {MAX_INPUT_BYTES} bytes are accepted",
                input.len()
            )));
        }
        if input
            .chars()
            .any(|c| c.is_control() || c == '<' || c == '>')
        {
            return Err(Error::Prompt(format!(
                "{marker} input must not contain control characters, '<' or '>'"
            )));
        }
        let encoder_text = match p {
            CustomPrompt::Verbatim if input.is_empty() => marker.to_owned(),
            CustomPrompt::Verbatim => format!("{marker}{input}"),
            CustomPrompt::Text(t) => {
                if !input.is_empty() {
                    return Err(Error::Prompt(format!(
                        "{marker} takes no input; the prompt must be {marker} alone"
                    )));
                }
                t.clone()
            }
            CustomPrompt::WithInput(t) => {
                if input.is_empty() {
                    return Err(Error::Prompt(format!(
                        "{marker} needs an input after the marker"
                    )));
                }
                match t.split_once("{input}") {
                    Some((a, b)) => format!("{a}{input}{b}"),
                    None => t.clone(),
                }
            }
        };
        Ok(AnyTaskPrompt::Custom {
            marker: marker.to_owned(),
            encoder_text,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_prompts_are_unchanged() {
        let t = CustomTasks::from_processor_config(br#"{"tasks": ["<GENERATE_TAGS>"]}"#).unwrap();
        let p = t.parse("<OD>").unwrap();
        assert_eq!(
            p,
            AnyTaskPrompt::Builtin(parse_task_prompt("<OD>").unwrap())
        );
        assert_eq!(
            p.encoder_text(),
            "Locate the objects with category name in the image."
        );
    }

    #[test]
    fn declared_markers_extend_the_builtins() {
        let cfg = br#"{
            "task_prompts_without_inputs": {"<MIXED_CAPTION>": "Describe everything.", "<OD>": "ignored"},
            "task_prompts_with_input": {"<DocVQA>": "Answer: {input}"},
            "tasks": ["<GENERATE_TAGS>"]
        }"#;
        let t = CustomTasks::from_processor_config(cfg).unwrap();
        assert_eq!(
            t.markers(),
            ["<DocVQA>", "<GENERATE_TAGS>", "<MIXED_CAPTION>"]
        );
        let p = t.parse(" <GENERATE_TAGS> ").unwrap();
        assert_eq!(p.marker(), "<GENERATE_TAGS>");
        assert_eq!(p.encoder_text(), "<GENERATE_TAGS>");
        assert_eq!(
            t.parse("<MIXED_CAPTION>").unwrap().encoder_text(),
            "Describe everything."
        );
        assert_eq!(
            t.parse("<DocVQA>what is the date?").unwrap().encoder_text(),
            "Answer: what is the date?"
        );
        assert!(matches!(t.parse("<DocVQA>"), Err(Error::Prompt(_))));
        assert!(matches!(t.parse("<MIXED_CAPTION>x"), Err(Error::Prompt(_))));
        assert!(matches!(
            t.parse("<GENERATE_TAGS><s>"),
            Err(Error::Prompt(_))
        ));
        // <OD> keeps its built-in meaning.
        assert_eq!(
            t.parse("<OD>").unwrap().encoder_text(),
            "Locate the objects with category name in the image."
        );
    }

    #[test]
    fn undeclared_markers_keep_the_builtin_error() {
        let none = CustomTasks::new();
        let want = parse_task_prompt("<GENERATE_TAGS>")
            .unwrap_err()
            .to_string();
        assert_eq!(none.parse("<GENERATE_TAGS>").unwrap_err().to_string(), want);
        let some = CustomTasks::from_processor_config(br#"{"tasks": ["<X>"]}"#).unwrap();
        let e = some.parse("<GENERATE_TAGS>").unwrap_err();
        assert!(matches!(e, Error::Prompt(_)));
        assert!(
            e.to_string().contains("this model's own markers: <X>"),
            "{e}"
        );
    }

    #[test]
    fn bad_declarations_are_named_errors() {
        for cfg in [
            &br#"{"tasks": ["GENERATE_TAGS"]}"#[..],
            br#"{"tasks": ["<a b>"]}"#,
            br#"{"tasks": [1]}"#,
            br#"{"task_prompts_with_input": {"<Q>": "no placeholder"}}"#,
            br#"{"tasks": 5}"#,
            b"not json",
        ] {
            assert!(
                matches!(
                    CustomTasks::from_processor_config(cfg),
                    Err(Error::Config(_))
                ),
                "{}",
                String::from_utf8_lossy(cfg)
            );
        }
        assert!(CustomTasks::from_processor_config(b"{}")
            .unwrap()
            .is_empty());
    }
}
