//! `post_process_generation` against golden cases produced by the reference post-processor
//! (`scripts/fixtures/make_postprocess_golden.py`: transformers' `Florence2Processor.post_process_generation` with the
//! final `.int()` of `dequantize` removed).
//!
//! Tolerance: coordinates must be the same f32 as the reference's (both sides compute
//! `(f32(bin) + 0.5) * f32(size / 1000)` in f32; ours is widened through its shortest decimal form, which
//! parses back to the same f32), and within 1e-3 px (or one f32 ulp for the absurd coordinates of bins near
//! 2^63, where 1e-3 px is below f32 resolution). Labels and text exactly equal, key sets and
//! list lengths exactly equal. Where the reference raises, the expected value is the empty answer.
#![cfg(not(target_arch = "wasm32"))]

use florence2_wasm::postprocess::{post_process_generation, BANNED_GROUNDING_PHRASES};
use florence2_wasm::processor::prompt::Task;
use serde_json::Value;

fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/postprocess/golden.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Structural comparison; returns the first difference. Tracks the max abs coordinate difference.
fn compare(path: &str, ours: &Value, reference: &Value, max_diff: &mut f64) -> Result<(), String> {
    match (ours, reference) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            let diff = (a - b).abs();
            // The shortest decimal of an f32 is within half an f32 ulp of it: below 1e-3 px for any
            // coordinate under 8192 px, larger only for absurd bins (`<loc_9223372036854775807>`).
            let ulp = f64::from(f32::from_bits((b as f32).to_bits() + 1) - b as f32);
            if b.abs() < 8192.0 {
                *max_diff = max_diff.max(diff);
            }
            if (a as f32) != (b as f32) || diff > 1e-3f64.max(ulp) {
                return Err(format!("{path}: {a} vs reference {b} (diff {diff})"));
            }
            Ok(())
        }
        (Value::String(a), Value::String(b)) if a == b => Ok(()),
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return Err(format!(
                    "{path}: length {} vs reference {}",
                    a.len(),
                    b.len()
                ));
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                compare(&format!("{path}[{i}]"), x, y, max_diff)?;
            }
            Ok(())
        }
        (Value::Object(a), Value::Object(b)) => {
            let ka: Vec<_> = a.keys().collect();
            let kb: Vec<_> = b.keys().collect();
            if ka != kb {
                return Err(format!("{path}: keys {ka:?} vs reference {kb:?}"));
            }
            for (k, v) in a {
                compare(&format!("{path}.{k}"), v, &b[k], max_diff)?;
            }
            Ok(())
        }
        _ => Err(format!("{path}: {ours} vs reference {reference}")),
    }
}

#[test]
fn every_golden_case_matches_the_reference() {
    let doc = golden();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 60, "only {} golden cases", cases.len());
    let mut failures = Vec::new();
    let mut max_diff = 0.0f64;
    let mut coords = 0usize;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let task = Task::from_marker(case["task"].as_str().unwrap()).unwrap();
        assert_eq!(
            task.answer_type().as_str(),
            case["answer_type"].as_str().unwrap(),
            "{name}"
        );
        let size = case["image_size"].as_array().unwrap();
        let size = (
            size[0].as_u64().unwrap() as u32,
            size[1].as_u64().unwrap() as u32,
        );
        let text = case["text"].as_str().unwrap();
        let ours = post_process_generation(text, task, size)
            .unwrap()
            .to_json(task);
        coords += count_numbers(&ours);
        if let Err(e) = compare(name, &ours, &case["expected"], &mut max_diff) {
            failures.push(e);
        }
    }
    println!(
        "{} golden cases, {coords} coordinates, max abs diff (coordinates < 8192 px) {max_diff:e} px",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn count_numbers(v: &Value) -> usize {
    match v {
        Value::Number(_) => 1,
        Value::Array(a) => a.iter().map(count_numbers).sum(),
        Value::Object(o) => o.values().map(count_numbers).sum(),
        _ => 0,
    }
}

#[test]
fn golden_cases_cover_every_task() {
    let doc = golden();
    for task in Task::ALL {
        assert!(
            doc["cases"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["task"] == task.marker()),
            "no golden case for {task}"
        );
    }
}

#[test]
fn banned_phrases_are_the_references() {
    let doc = golden();
    let mut reference: Vec<&str> = doc["banned_grounding_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let mut ours = BANNED_GROUNDING_PHRASES.to_vec();
    reference.sort_unstable();
    ours.sort_unstable();
    assert_eq!(ours, reference);
}
