//! The processor: what turns user inputs into model inputs: task prompts (`prompt`), image decoding and
//! preprocessing (`image`), the BART tokenizer with the Florence-2 tokens (`tokenizer`).

pub mod custom_tasks;
pub mod image;
pub mod jpeg;
pub mod jpeg_decoder;
pub mod limits;
pub mod prompt;
pub mod tokenizer;
#[cfg(all(feature = "libjpeg-turbo", not(target_arch = "wasm32")))]
mod turbojpeg;

pub use prompt::{parse_task_prompt, AnswerType, InputKind, Task, TaskPrompt};
