//! The recorder's GPU timestamps: the profiler's per-dispatch queries and a timed recorder's per-pass
//! span (the kernel tuner's timer), written into each compute pass, resolved into a mappable buffer at
//! the submit and read back into the device's profiler.

use std::sync::Arc;

use crate::gpu::kernel::Kernel;
use crate::gpu::profile::{ProfileEntry, MAX_QUERIES};
use crate::gpu::staging::{device_staging, Pending};
use crate::gpu::{Device, Wgpu};

/// Timestamp queries of a [`crate::gpu::Recorder::new_timed`] recorder (2 per pass; passes past this are untimed).
pub(crate) const SPAN_QUERIES: u32 = 1024;

/// The profiler's (op, variant) of a kernel.
pub(crate) fn kernel_label(kernel: &Kernel) -> (String, String) {
    let variant: Vec<String> = kernel
        .defines
        .iter()
        .map(|d| d.to_string())
        .chain(kernel.overrides.iter().map(|(n, v)| format!("{n}={v}")))
        .collect();
    (
        format!("{}:{}", kernel.shader.name, kernel.entry),
        variant.join(" "),
    )
}

/// A profiling recorder's queries and the labels of the dispatches they time.
pub(crate) struct RecProf {
    pub(crate) queries: wgpu::QuerySet,
    pub(crate) phase: String,
    /// The shape the next dispatch is labelled with ([`Recorder::note_shape`]).
    pub(crate) note: Option<String>,
    /// (op, variant, shape) of each timed dispatch, in query order.
    pub(crate) labels: Vec<(String, String, String)>,
}

/// The timestamp writes of a dispatch's compute pass: the profiler's (labelled with the kernel and its
/// note), else a slot of the span queries while there are free ones, else none.
pub(crate) fn pass_timestamps<'a>(
    prof: &'a mut Option<RecProf>,
    span: &'a mut Option<(wgpu::QuerySet, u32)>,
    gpu: &Device,
    kernel: &Kernel,
    grid: [u32; 3],
) -> Option<wgpu::ComputePassTimestampWrites<'a>> {
    let note = prof.as_mut().and_then(|p| p.note.take());
    let label = || {
        let (op, variant) = kernel_label(kernel);
        let note = note.unwrap_or_else(|| format!("grid={grid:?}"));
        (op, variant, note)
    };
    if let Some(t) = timestamps(prof, gpu, label) {
        return Some(t);
    }
    match span {
        Some((queries, passes)) if (*passes + 1) * 2 <= SPAN_QUERIES => {
            let i = *passes;
            *passes += 1;
            Some(wgpu::ComputePassTimestampWrites {
                query_set: queries,
                beginning_of_pass_write_index: Some(2 * i),
                end_of_pass_write_index: Some(2 * i + 1),
            })
        }
        _ => None,
    }
}

/// The timestamp writes of a recorder's next pass when it profiles (labelled by `label`), else `None`.
pub(crate) fn timestamps<'a>(
    prof: &'a mut Option<RecProf>,
    gpu: &Device,
    label: impl FnOnce() -> (String, String, String),
) -> Option<wgpu::ComputePassTimestampWrites<'a>> {
    let p = prof.as_mut()?;
    p.note = None;
    if (p.labels.len() as u32 + 1) * 2 > MAX_QUERIES {
        gpu.profiler.add_untimed(1);
        return None;
    }
    let i = p.labels.len() as u32;
    p.labels.push(label());
    Some(wgpu::ComputePassTimestampWrites {
        query_set: &p.queries,
        beginning_of_pass_write_index: Some(2 * i),
        end_of_pass_write_index: Some(2 * i + 1),
    })
}

/// Record the resolve of a recorder's timestamps into a mappable buffer.
pub(crate) fn resolve_timestamps(
    gpu: &Wgpu,
    encoder: &mut wgpu::CommandEncoder,
    p: RecProf,
) -> (wgpu::Buffer, String, Vec<(String, String, String)>) {
    let n = 2 * p.labels.len() as u32;
    let staging = resolve_queries(gpu, encoder, &p.queries, n, "profile-resolve");
    (staging, p.phase, p.labels)
}

/// Record the resolve of a timed recorder's `passes` begin/end pairs into a mappable buffer.
pub(crate) fn resolve_span(
    gpu: &Wgpu,
    encoder: &mut wgpu::CommandEncoder,
    queries: &wgpu::QuerySet,
    passes: u32,
) -> Pending {
    let n = 2 * passes;
    let staging = resolve_queries(gpu, encoder, queries, n, "tuner-resolve");
    Pending::Device {
        staging,
        bytes: n as u64 * 8,
    }
}

/// Record the resolve of the first `n` timestamps of `queries` and their copy into a mappable buffer,
/// which is returned.
fn resolve_queries(
    gpu: &Wgpu,
    encoder: &mut wgpu::CommandEncoder,
    queries: &wgpu::QuerySet,
    n: u32,
    label: &str,
) -> wgpu::Buffer {
    let bytes = n as u64 * 8;
    let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let staging = device_staging(&gpu.device, bytes);
    encoder.resolve_query_set(queries, 0..n, &resolve, 0);
    encoder.copy_buffer_to_buffer(&resolve, 0, &staging, 0, bytes);
    staging
}

/// Map the resolved timestamps back asynchronously and hand the entries to the device's profiler (the
/// callback runs at the next poll natively, on the event loop in the browser).
pub(crate) fn read_timestamps(
    gpu: &Arc<Device>,
    staging: wgpu::Buffer,
    phase: String,
    labels: Vec<(String, String, String)>,
) {
    use std::sync::atomic::Ordering;
    gpu.profiler.pending.fetch_add(1, Ordering::AcqRel);
    let Ok(hw) = gpu.wgpu() else {
        return;
    };
    let period_ns = hw.queue.get_timestamp_period() as f64;
    let g = gpu.clone();
    let buf = staging.clone();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let mut entries = Vec::new();
        if r.is_ok() {
            if let Ok(view) = buf.slice(..).get_mapped_range() {
                let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&view[..]);
                drop(view);
                for (i, (op, variant, shape)) in labels.into_iter().enumerate() {
                    let (a, b) = (ticks[2 * i], ticks[2 * i + 1]);
                    entries.push(ProfileEntry {
                        phase: phase.clone(),
                        op,
                        variant,
                        shape,
                        ms: b.saturating_sub(a) as f64 * period_ns * 1e-6,
                    });
                }
            }
            buf.unmap();
        }
        g.profiler.push(entries);
        g.profiler.pending.fetch_sub(1, Ordering::AcqRel);
    });
}
