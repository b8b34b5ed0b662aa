//! The processor: what turns user inputs into model inputs (task prompts; image and tokenizer modules join
//! here).

pub mod prompt;

pub use prompt::{parse_task_prompt, AnswerType, InputKind, Task, TaskPrompt};
