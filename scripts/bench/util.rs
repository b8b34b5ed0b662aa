//! Helpers shared by the native benches (included with `#[path = "util.rs"] mod util;`; not a bench
//! target of its own): CPU time of the process, seeded data, generation options that never stop early.
#![allow(dead_code)]

use florence2_wasm::model::generate::{EarlyStopping, GenerateOptions};

/// CPU seconds used so far by all live threads of this process (lavapipe's workers included; Linux
/// /proc/self/task/*/schedstat). On a loaded machine, wall time overstates the work; CPU time does not.
pub fn cpu_secs() -> f64 {
    let mut ns = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            ns += s
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 * 1e-9
}

/// Xorshift in [-a, a): deterministic, dependency-free.
pub struct Rng(pub u64);

impl Rng {
    pub fn fill(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
            })
            .collect()
    }
}

/// Generation options for timing decode steps: `max_new_tokens` steps of `beams` beams, never stopped by
/// an end token (none can be produced: `u32::MAX`) nor forced ones.
pub fn endless_options(max_new_tokens: usize, beams: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        no_repeat_ngram_size: 3,
        forced_bos_token_id: None,
        forced_eos_token_id: None,
        eos_token_ids: vec![u32::MAX],
        decoder_start_token_id: 2,
        num_beams: beams,
        length_penalty: 1.0,
        early_stopping: EarlyStopping::True,
    }
}
