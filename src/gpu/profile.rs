//! Per-dispatch GPU times from timestamp queries (`--profile`, `profile: true`), and on the CPU backend
//! per-op wall times ([`crate::gpu::Recorder::host_op`], ops named `cpu:NAME`, on the tuner's
//! [`WallClock`]: `Instant` natively, `performance.now()` in wasm).
//!
//! With profiling on, every [`Recorder`](crate::gpu::Recorder) asks the GPU to write a timestamp at the
//! beginning and end of each compute pass (each dispatch has its own pass), resolves them into a buffer
//! at submit and maps it back asynchronously; the map callback turns tick pairs into milliseconds and
//! appends one [`ProfileEntry`] per dispatch: phase, op (the kernel: shader and entry point), variant (its
//! override constants), shape (what the launcher noted, else the workgroup grid) and GPU time. Timestamps
//! measure the GPU's own execution, without submit or readback overhead. Needs the adapter's
//! TIMESTAMP_QUERY feature; [`Profiler::enable`] fails with a named error without it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::gpu::tune::{Clock, WallClock};
use crate::gpu::{Device, Tensor};

/// Timestamp queries per recorder (2 per dispatch). Dispatches past this are not timed (counted in
/// [`Profiler::untimed`]).
pub const MAX_QUERIES: u32 = 4096;

/// One timed dispatch.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProfileEntry {
    pub phase: String,
    /// Kernel: `shader:entry`.
    pub op: String,
    /// Override constants of the kernel (e.g. `W_F16=1 RM=8`), empty when none.
    pub variant: String,
    /// The launcher's shape note (e.g. `M=577 N=768 K=768 f16`), else `grid=[x, y, z]`.
    pub shape: String,
    pub ms: f64,
}

/// The device's profiler: off by default; entries accumulate until [`Profiler::take`].
#[derive(Default)]
pub struct Profiler {
    enabled: AtomicBool,
    /// Readbacks submitted whose callback has not run yet.
    pub(crate) pending: AtomicUsize,
    untimed: AtomicUsize,
    entries: Mutex<Vec<ProfileEntry>>,
}

impl Profiler {
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turn profiling on or off for recorders created from now on. Fails with [`Error::Limit`]-style
    /// [`Error::Gpu`] naming the missing feature when the device has no timestamp queries.
    pub fn enable(&self, gpu: &Device, on: bool) -> Result<()> {
        // The CPU backend times its ops on the wall clock (`WallClock`).
        if on && !gpu.caps.timestamp_query && !gpu.is_host() {
            return Err(Error::Gpu(format!(
                "profiling needs the timestamp-query feature, which this adapter ({}) does not offer",
                gpu.caps.adapter_name
            )));
        }
        self.enabled.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Dispatches recorded while profiling that were not timed (recorder over [`MAX_QUERIES`]).
    pub fn untimed(&self) -> usize {
        self.untimed.load(Ordering::Relaxed)
    }

    pub(crate) fn add_untimed(&self, n: usize) {
        self.untimed.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn push(&self, e: Vec<ProfileEntry>) {
        if let Ok(mut v) = self.entries.lock() {
            v.extend(e);
        }
    }

    /// Wait for the outstanding timestamp readbacks, then return and clear the entries.
    pub async fn take(&self, gpu: &Device) -> Result<Vec<ProfileEntry>> {
        // Each round lets the map callbacks run: natively a blocking poll, in the browser a turn of the
        // event loop after the queue's work is done.
        for _ in 0..1000 {
            if self.pending.load(Ordering::Acquire) == 0 {
                break;
            }
            #[cfg(not(target_arch = "wasm32"))]
            gpu.wgpu()?
                .device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(e.to_string()))?;
            #[cfg(target_arch = "wasm32")]
            {
                let (tx, rx) = futures_channel::oneshot::channel();
                gpu.wgpu()?.queue.on_submitted_work_done(move || {
                    let _ = tx.send(());
                });
                let _ = rx.await;
            }
        }
        gpu.check()?;
        Ok(self
            .entries
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default())
    }
}

/// Total milliseconds per phase, in first-seen order.
pub fn phase_totals(entries: &[ProfileEntry]) -> Vec<(String, f64, usize)> {
    let mut out: Vec<(String, f64, usize)> = Vec::new();
    for e in entries {
        match out.iter_mut().find(|p| p.0 == e.phase) {
            Some(p) => {
                p.1 += e.ms;
                p.2 += 1;
            }
            None => out.push((e.phase.clone(), e.ms, 1)),
        }
    }
    out
}

/// The profile as a table: per phase its total, then its (op, variant, shape) groups by total time
/// (calls, total ms, share of the phase).
pub fn table(entries: &[ProfileEntry]) -> String {
    let mut s = String::new();
    for (phase, total, n) in phase_totals(entries) {
        s.push_str(&format!("phase {phase}: {total:.3} ms over {n} ops\n"));
        let mut groups: BTreeMap<(&str, &str, &str), (usize, f64)> = BTreeMap::new();
        for e in entries.iter().filter(|e| e.phase == phase) {
            let g = groups
                .entry((e.op.as_str(), e.variant.as_str(), e.shape.as_str()))
                .or_insert((0, 0.0));
            g.0 += 1;
            g.1 += e.ms;
        }
        let mut rows: Vec<_> = groups.into_iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        for ((op, variant, shape), (calls, ms)) in rows {
            s.push_str(&format!(
                "  {ms:>10.3} ms {:>5.1}%  {calls:>5}x  {op} [{variant}] {shape}\n",
                100.0 * ms / total.max(1e-12)
            ));
        }
    }
    s
}

/// A profiling host recorder's labels: its ops run as they are recorded, each timed on the wall clock.
#[derive(Default)]
pub(crate) struct HostProf {
    pub(crate) phase: String,
    pub(crate) note: Option<String>,
}

/// [`Recorder::host_op`] timed: the run's wall time added to `gpu`'s profile under `p`'s labels.
pub(crate) fn timed_host_op<T>(
    gpu: &Device,
    p: &mut HostProf,
    op: &'static str,
    operands: &[&Tensor],
    run: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let t0 = WallClock.now_ms();
    let out = run()?;
    let ms = WallClock.now_ms() - t0;
    let shape = p.note.take().unwrap_or_else(|| operand_shapes(operands));
    gpu.profiler.push(vec![ProfileEntry {
        phase: p.phase.clone(),
        op: format!("cpu:{op}"),
        variant: String::new(),
        shape,
        ms,
    }]);
    Ok(out)
}

/// `[590, 768] [768, 768] F16`: each operand's shape, its dtype when not f32.
fn operand_shapes(operands: &[&Tensor]) -> String {
    let one = |t: &&Tensor| match t.dtype() {
        crate::gpu::DType::F32 => format!("{:?}", t.shape()),
        d => format!("{:?} {d:?}", t.shape()),
    };
    operands.iter().map(one).collect::<Vec<_>>().join(" ")
}
