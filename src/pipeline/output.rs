//! Stage 7, tokens -> result: what a task returns, and the one post-processing policy.

use crate::error::Result;
use crate::gpu::MemReport;
use crate::postprocess::{post_process_generation, TaskResult};
use crate::processor::custom_tasks::AnyTaskPrompt;
use crate::processor::prompt::Task;
use crate::render::render;

/// Milliseconds per stage of one task. Natively each stage is waited for; in the browser a GPU stage's
/// figure is its recording + submit time and `decode` absorbs the rest (see `clock.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Image -> pixels (0 on an encoded image) + prompt -> ids.
    pub preprocess_ms: f64,
    /// DaViT + projector (0 on an encoded image).
    pub vision_ms: f64,
    /// Prompt embedding + encoder + cross-attention K/V.
    pub encoder_ms: f64,
    /// Generation until the last id was read back.
    pub decode_ms: f64,
    /// Ids -> text -> answer -> rendering.
    pub postprocess_ms: f64,
}

impl Timings {
    pub fn total_ms(&self) -> f64 {
        self.preprocess_ms + self.vision_ms + self.encoder_ms + self.decode_ms + self.postprocess_ms
    }
}

/// Why generation ended. (A cancelled task returns [`crate::Error::Cancelled`] instead of an answer.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// On an end-of-sequence token.
    Eos,
    /// At the new-token limit.
    MaxTokens,
}

/// Token counts of one task, and how its generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Prompt token ids (the tokenized task prompt).
    pub prompt_tokens: usize,
    /// The encoder's sequence length: image feature tokens + prompt tokens.
    pub encoder_tokens: usize,
    /// Ids generated after the decoder start token.
    pub generated_tokens: usize,
    pub stop: StopReason,
}

impl Usage {
    /// From the prompt ids, the image's feature tokens, the generated ids (start token first) and the
    /// end-of-sequence ids: generation stopped on EOS when it generated anything and its last id is one.
    pub(crate) fn of(prompt: &[u32], image_tokens: usize, ids: &[u32], eos: &[u32]) -> Usage {
        let on_eos = ids.len() > 1 && ids.last().is_some_and(|t| eos.contains(t));
        Usage {
            prompt_tokens: prompt.len(),
            encoder_tokens: image_tokens + prompt.len(),
            generated_tokens: ids.len().saturating_sub(1),
            stop: if on_eos {
                StopReason::Eos
            } else {
                StopReason::MaxTokens
            },
        }
    }
}

/// The answer to one task.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskOutput {
    /// The built-in task; for one of the model's own markers, `Caption` (whose pure-text answer type it
    /// gets, as the reference's `post_process_generation` gives unknown tasks).
    pub task: Task,
    /// The marker the answer is keyed by: `task.marker()`, or the model's own marker.
    pub marker: String,
    /// The parsed prompt: the task marker and its text input.
    pub prompt: AnyTaskPrompt,
    /// Exactly `post_process_generation`'s value for the task.
    pub result: TaskResult,
    /// A human-readable rendering of `result`.
    pub text: String,
    /// The generation decoded with special tokens kept.
    pub generated_text: String,
    /// Generated ids, decoder start token first (as the reference's `generate` returns them).
    pub token_ids: Vec<u32>,
    /// Token counts and the stop reason.
    pub usage: Usage,
    /// (width, height) of the original image (the coordinates' frame).
    pub image_size: (u32, u32),
    /// Whether the task ran on an image encoded before (DaViT and the projector skipped).
    pub reused_image: bool,
    pub timings: Timings,
    /// GPU memory when the task finished, with the peak since the last
    /// [`crate::gpu::Device::reset_peak_memory`] (front ends reset it per request or after loading).
    pub memory: MemReport,
}

impl TaskOutput {
    /// The reference's return value `{TASK: value}`.
    pub fn result_json(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        map.insert(
            self.marker.clone(),
            serde_json::to_value(&self.result).unwrap_or(serde_json::Value::Null),
        );
        serde_json::Value::Object(map)
    }
}

/// The post-processing policy, the same for every front end: parse failures the reference tolerates
/// give the task's empty answer (inside `post_process_generation`, as the reference does); any other
/// post-processing error fails the task (`run_task` returns it; no partial output), because a
/// front end cannot tell a half-made answer from a real one.
pub(crate) fn finish(
    task: Task,
    generated_text: &str,
    size: (u32, u32),
) -> Result<(TaskResult, String)> {
    let result = post_process_generation(generated_text, task, size)?;
    let text = render(&result);
    Ok((result, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparsable_located_answers_are_empty_and_text_answers_are_kept() {
        // Location tokens missing: the reference's parser yields no boxes, not an error.
        let (r, text) = finish(Task::Od, "</s><s>cat</s>", (10, 10)).unwrap();
        assert_eq!(r.to_json(Task::Od)["<OD>"]["bboxes"], serde_json::json!([]));
        assert_eq!(text, "");
        let (r, text) = finish(Task::Caption, "</s><s>a cat</s>", (10, 10)).unwrap();
        assert_eq!(r, TaskResult::Text("a cat".into()));
        assert_eq!(text, "a cat");
    }
}
