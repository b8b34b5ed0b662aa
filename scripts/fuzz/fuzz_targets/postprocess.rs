//! Post-processing on arbitrary text for every task: no panic; output JSON at most 100 n + 384 KiB (the
//! bound stated in src/postprocess.rs). The first 4 bytes pick the image size. Allocation bound (peak,
//! all 15 tasks one after the other): 200 n + 4 MiB.
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::postprocess::post_process_generation;
use florence2_wasm::processor::prompt::Task;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (size, text) = data.split_at(4);
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let w = u32::from(u16::from_le_bytes([size[0], size[1]]));
    let h = u32::from(u16::from_le_bytes([size[2], size[3]]));
    let (_, peak) = common::peak_during(|| {
        for task in Task::ALL {
            if let Ok(r) = post_process_generation(text, task, (w, h)) {
                let json = serde_json::to_string(&r.to_json(task)).unwrap_or_default();
                assert!(
                    json.len() <= 100 * text.len() + 384 * 1024,
                    "{task:?}: {} bytes of JSON from {}",
                    json.len(),
                    text.len()
                );
            }
        }
    });
    common::check_bound("postprocess", data.len(), peak, 200, 4 << 20);
});
