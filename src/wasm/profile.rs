//! `runTask(image, prompt, {profile: true})`: the GPU time of every dispatch of that one call, from
//! timestamp queries ([`crate::gpu::profile`]), or on the CPU backend the wall time of every op
//! (`performance.now()`), with totals per phase. Where the adapter has no timestamp queries the answer
//! says so (`{available: false, reason}`) instead of failing the call.

use std::sync::Arc;

use serde::Serialize;

use crate::gpu::profile::{phase_totals, ProfileEntry};
use crate::gpu::Device;

#[wasm_bindgen::prelude::wasm_bindgen(typescript_custom_section)]
const TS_PROFILE: &'static str = r#"
/** One timed dispatch of a `runTask` call with `profile: true`. */
export interface ProfileEntry {
  /** "vision", "encoder" or "decode". */
  phase: string;
  /** The kernel: shader and entry point, e.g. "matmul:linear_tiled"; on the CPU backend "cpu:NAME". */
  op: string;
  /** Its specialisation (override constants, defines), e.g. "RM=4 W_F16=1". */
  variant: string;
  /** The shape the launcher noted (e.g. "M=577 N=768 K=768 f16 tiled64"), else the workgroup grid. */
  shape: string;
  /** GPU time of the dispatch, milliseconds. */
  ms: number;
}

/** GPU time of one phase. */
export interface PhaseTime {
  phase: string;
  ms: number;
  dispatches: number;
}

/** What `profile: true` adds to a `runTask` result. GPU times need the adapter's "timestamp-query"
 * feature: without it `available` is false, `reason` says why and the lists are empty. Browsers may round
 * timestamps (Chromium: to 0.1 ms unless its WebGPU developer features are on). On the CPU backend each
 * entry is one op's wall time from `performance.now()` (op "cpu:NAME"). */
export interface RunProfile {
  available: boolean;
  /** Why there are no times (only when `available` is false). */
  reason?: string;
  entries: ProfileEntry[];
  /** Totals per phase, in the order the phases ran. */
  phases: PhaseTime[];
  /** Sum of all entries, milliseconds. */
  totalMs: number;
  /** Dispatches that ran but were not timed (more than a recorder's query set holds). */
  untimed: number;
}
"#;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTime {
    phase: String,
    ms: f64,
    dispatches: usize,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunProfile {
    available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    entries: Vec<ProfileEntry>,
    phases: Vec<PhaseTime>,
    total_ms: f64,
    untimed: usize,
}

impl RunProfile {
    fn unavailable(reason: String) -> RunProfile {
        RunProfile {
            available: false,
            reason: Some(reason),
            entries: Vec::new(),
            phases: Vec::new(),
            total_ms: 0.0,
            untimed: 0,
        }
    }
}

/// A profiling request in progress.
pub enum Session {
    /// Not asked for.
    Off,
    /// Asked for, not possible here.
    Unavailable(String),
    /// Profiling on; `untimed` is the device's untimed count before the call.
    On { untimed: usize },
}

/// Turn profiling on for one call when `wanted` (entries left from an earlier, failed call are dropped).
pub async fn start(gpu: &Arc<Device>, wanted: bool) -> Session {
    if !wanted {
        return Session::Off;
    }
    if let Err(e) = gpu.profiler.enable(gpu, true) {
        return Session::Unavailable(e.to_string());
    }
    let _ = gpu.profiler.take(gpu).await;
    Session::On {
        untimed: gpu.profiler.untimed(),
    }
}

/// Collect the call's entries and turn profiling off again (also after a failed call, whose entries are
/// dropped: `ok` false).
pub async fn finish(gpu: &Arc<Device>, session: Session, ok: bool) -> Option<RunProfile> {
    let untimed0 = match session {
        Session::Off => return None,
        Session::Unavailable(reason) => return Some(RunProfile::unavailable(reason)),
        Session::On { untimed } => untimed,
    };
    let entries = gpu.profiler.take(gpu).await;
    let _ = gpu.profiler.enable(gpu, false);
    let entries = match entries {
        Ok(e) if ok => e,
        Ok(_) => return None,
        Err(e) => {
            return Some(RunProfile::unavailable(format!(
                "the GPU times could not be read back: {e}"
            )))
        }
    };
    let phases: Vec<PhaseTime> = phase_totals(&entries)
        .into_iter()
        .map(|(phase, ms, dispatches)| PhaseTime {
            phase,
            ms,
            dispatches,
        })
        .collect();
    Some(RunProfile {
        available: true,
        reason: None,
        total_ms: entries.iter().map(|e| e.ms).sum(),
        untimed: gpu.profiler.untimed().saturating_sub(untimed0),
        entries,
        phases,
    })
}
