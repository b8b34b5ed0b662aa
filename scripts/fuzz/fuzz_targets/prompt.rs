//! Task-prompt parsing on arbitrary text: no panic; an accepted prompt's input has no control or refused
//! format character, no angle bracket in free text, and builds its encoder text. Allocation bound:
//! 8 n + 64 KiB.
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::processor::prompt::{
    is_refused_format_char, parse_task_prompt, MAX_INPUT_BYTES,
};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (_, peak) = common::peak_during(|| match parse_task_prompt(text) {
        Ok(p) => {
            if let Some(input) = p.input() {
                assert!(input.len() <= MAX_INPUT_BYTES);
                assert!(!input
                    .chars()
                    .any(|c| c.is_control() || is_refused_format_char(c)));
                if p.region().is_none() {
                    assert!(!input.contains(['<', '>']), "{input:?}");
                }
            }
            let _ = p.encoder_text();
        }
        Err(e) => {
            // Messages echo a bounded amount of the input.
            assert!(
                e.to_string().len() < 4096,
                "{} bytes of message",
                e.to_string().len()
            );
        }
    });
    common::check_bound("prompt", data.len(), peak, 8, 64 << 10);
});
