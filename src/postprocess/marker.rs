//! The rules an answer is post-processed by when no model is loaded (`florence2 parse`, the wasm
//! `postProcess`): a built-in task keeps its own; any other task marker is pure text, as the reference's
//! `post_process_generation` treats a task it does not know (`tasks_answer_post_processing_type` falls back
//! to `pure_text`).

use crate::error::{Error, Result};
use crate::processor::custom_tasks::is_task_marker;
use crate::processor::prompt::{parse_task_prompt, Task};

use super::{post_process_generation, TaskResult};

/// A task as the post-processor sees it: the marker the answer is keyed by and the task whose rules parse
/// it (`Caption`, pure text, for a marker that is not built in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkedTask {
    pub marker: String,
    pub task: Task,
}

impl MarkedTask {
    /// From a marker (`<OD>`, `<MY_TASK>`), a built-in task's name (`OD`) or a whole prompt
    /// (`<OPEN_VOCABULARY_DETECTION>cat`, `<MY_TASK>some text`). A built-in marker with an invalid input
    /// keeps its error; text that starts with no marker at all is refused.
    pub fn parse(s: &str) -> Result<MarkedTask> {
        let builtin = |task: Task| MarkedTask {
            marker: task.marker().to_string(),
            task,
        };
        if let Some(task) = Task::from_name(s) {
            return Ok(builtin(task));
        }
        let err = match parse_task_prompt(s) {
            Ok(p) => return Ok(builtin(p.task())),
            Err(e) => e,
        };
        let marker = s.find('>').map_or(s, |end| &s[..=end]);
        if Task::from_marker(marker).is_some() {
            return Err(err);
        }
        if is_task_marker(marker) {
            return Ok(MarkedTask {
                marker: marker.to_string(),
                task: Task::Caption,
            });
        }
        Err(match err {
            Error::Prompt(m) => Error::Prompt(format!(
                "{m} (any other marker such as <MY_TASK> is post-processed as pure text)"
            )),
            other => other,
        })
    }

    /// `post_process_generation` by the task's rules.
    pub fn post_process(&self, text: &str, image_size: (u32, u32)) -> Result<TaskResult> {
        post_process_generation(text, self.task, image_size)
    }
}
