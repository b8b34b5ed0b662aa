//! One source for the task markers: `Task::ALL` (src/processor/prompt.rs). The npm package's
//! `TaskMarker` type (src/wasm/api.d.ts, shipped in the package's typings) is a copy checked here, so
//! a task added on one side and not the other fails this test.

use std::collections::BTreeSet;

use florence2_wasm::processor::prompt::Task;

/// The string literals of `export type TaskMarker = | "<A>" | "<B>" ...;` in `dts`.
fn task_marker_type(dts: &str) -> BTreeSet<String> {
    let start = dts
        .find("export type TaskMarker =")
        .expect("api.d.ts declares TaskMarker");
    let body = &dts[start..];
    let end = body.find(';').expect("TaskMarker ends with ';'");
    body[..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_typescript_task_markers_are_the_rust_ones() {
    let dts = include_str!("../../src/wasm/api.d.ts");
    let ts = task_marker_type(dts);
    let rust: BTreeSet<String> = Task::ALL.iter().map(|t| t.marker().to_string()).collect();
    assert_eq!(rust.len(), Task::ALL.len(), "Task::ALL repeats a marker");
    assert_eq!(ts, rust, "api.d.ts TaskMarker differs from Task::ALL");
}
