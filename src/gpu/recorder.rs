//! Command recording. A [`Recorder`] encodes every dispatch of a stage (or of one decode step) into a
//! single command encoder and submits once: on CPU adapters a submit+wait costs ~37 us while an extra
//! dispatch in the same pass costs ~7 us, and in the browser each submit is an IPC round trip.
//!
//! Each dispatch's `Params` uniform is written into a 256-byte slot of a uniform "page". All slots of a
//! recorder are uploaded with one `queue.write_buffer` per page just before the submit. Queue writes are
//! ordered with submits on the queue timeline, so a page can be reused by the next recorder as soon as
//! this one has submitted.
//!
//! Recorded once, replayed many times: a recorder made by [`Recorder::capture`] runs the same launchers
//! but keeps what they build (kernels, bind groups, params uniforms written once, workgroup counts,
//! buffer copies) as a [`Plan`] instead of encoding it. [`Recorder::replay`] then encodes a plan into an
//! ordinary recorder: per op only `set_pipeline` / `set_bind_group` / `dispatch_workgroups` (wgpu has no
//! reusable compute command buffers, so this cheap encode is all that is left per use). Whatever changes
//! between replays must live in buffers the kernels read (the decoder's step uniform, its token ids),
//! written with `queue.write_buffer` before the submit.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::kernel::Kernel;
use crate::gpu::profile::{HostProf, MAX_QUERIES};
use crate::gpu::staging::{Pending, Staging};
use crate::gpu::timing::{
    kernel_label, pass_timestamps, read_timestamps, resolve_span, resolve_timestamps, timestamps,
    RecProf, SPAN_QUERIES,
};
use crate::gpu::{Backend, Device, Tensor};

/// Params slots per uniform page.
const PAGE_SLOTS: usize = 256;

pub struct Recorder {
    gpu: Arc<Device>,
    /// `None` on the CPU backend, where every op runs when it is recorded.
    encoder: Option<wgpu::CommandEncoder>,
    slot: u64,
    pages: Vec<(wgpu::Buffer, Vec<u8>)>,
    dispatches: usize,
    /// Timestamp bookkeeping when the device's profiler is on (see `gpu::profile`).
    prof: Option<RecProf>,
    /// Set by [`Recorder::capture`]: ops are kept for a [`Plan`] instead of being encoded.
    capture: Option<Capture>,
    /// Timestamps bracketing every pass of a [`Recorder::new_timed`] recorder (the kernel tuner's timer).
    span: Option<(wgpu::QuerySet, u32)>,
    /// Images the recorded work covers at once ([`Recorder::set_images`]).
    images: usize,
    /// On the CPU backend with the device's profiler on: the phase and shape note its ops are timed
    /// under ([`Recorder::host_op`]).
    host_prof: Option<HostProf>,
}

/// What a capturing recorder has kept so far.
struct Capture {
    ops: Vec<PlanOp>,
    /// The shape the next dispatch is labelled with (launchers note shapes while capturing, so a
    /// replayed plan profiles with the same labels as a recorded step).
    note: Option<String>,
    /// The first thing a plan cannot hold (a readback), reported by [`Recorder::into_plan`].
    refused: Option<String>,
}

/// One recorded command of a [`Plan`].
#[derive(Clone)]
enum PlanOp {
    Dispatch {
        pipeline: wgpu::ComputePipeline,
        bind_group: wgpu::BindGroup,
        grid: [u32; 3],
        entry: &'static str,
        /// (op, variant, shape) for the profiler.
        label: (String, String, String),
    },
    Copy(BufferCopy),
}

/// A recorded buffer-to-buffer copy.
#[derive(Clone)]
struct BufferCopy {
    src: wgpu::Buffer,
    src_off: u64,
    dst: wgpu::Buffer,
    dst_off: u64,
    size: u64,
}

impl BufferCopy {
    fn encode(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.copy_buffer_to_buffer(&self.src, self.src_off, &self.dst, self.dst_off, self.size);
    }
}

/// Dispatches and copies recorded once by a capturing [`Recorder`] (see the module docs), replayed
/// with [`Recorder::replay`] as often as needed. It holds its bind groups and its params pages (written
/// once when the plan was made); the buffers it binds stay alive as long as the plan does.
pub struct Plan {
    gpu: Arc<Device>,
    ops: Vec<PlanOp>,
    pages: Vec<wgpu::Buffer>,
    dispatches: usize,
}

impl Plan {
    /// Dispatches one replay encodes.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches
    }

    /// Dispatches and buffer copies one replay encodes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // The pages go back to the recorders' pool: a later write to one is ordered after every
        // submit that used it (queue timeline), as for a recorder's own pages.
        if let Ok(mut pool) = self.gpu.uniform_pool.lock() {
            pool.extend(self.pages.drain(..));
        }
    }
}

impl Recorder {
    pub fn new(gpu: &Arc<Device>) -> Self {
        let mut r = Recorder::new_plain(gpu, "florence2-recorder");
        let hw = gpu.wgpu().ok().filter(|_| gpu.profiler.is_enabled());
        r.prof = hw.map(|hw| RecProf {
            queries: hw.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile-timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: MAX_QUERIES,
            }),
            phase: String::new(),
            note: None,
            labels: Vec::new(),
        });
        r.host_prof = (gpu.is_host() && gpu.profiler.is_enabled()).then(HostProf::default);
        r
    }

    /// A recorder that keeps what the launchers build as a [`Plan`] ([`Recorder::into_plan`]) instead
    /// of encoding it. Readbacks cannot be part of a plan (their staging buffer is mapped per use).
    pub fn capture(gpu: &Arc<Device>) -> Self {
        let mut r = Recorder::new_plain(gpu, "florence2-capture");
        r.capture = Some(Capture {
            ops: Vec::new(),
            note: None,
            refused: None,
        });
        r
    }

    fn new_plain(gpu: &Arc<Device>, label: &str) -> Self {
        let encoder = gpu.wgpu().ok().map(|hw| {
            hw.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
        });
        Recorder {
            gpu: gpu.clone(),
            encoder,
            slot: gpu.caps.uniform_offset_alignment.max(256) as u64,
            pages: Vec::new(),
            dispatches: 0,
            prof: None,
            capture: None,
            span: None,
            images: 1,
            host_prof: None,
        }
    }

    /// The recorded work runs `n` images as one batch whose calls (and row chunks) are `n` times one
    /// image's: kernels are then chosen for one image's share of a call (its rows, its windows), so that
    /// each image gets exactly the kernels, hence the bits, it gets alone (the vision tower on a batch of
    /// images, [`crate::model::florence2::Florence2::encode_pixels_batch`]).
    pub fn set_images(&mut self, n: usize) {
        self.images = n.max(1);
    }

    /// Images per call of the recorded work (1 unless [`Recorder::set_images`] said otherwise).
    pub fn images(&self) -> usize {
        self.images
    }

    /// A recorder whose submission is timed on the GPU: every pass writes a begin and an end timestamp,
    /// and [`Recorder::submit_timed`] returns the GPU time from the first pass's beginning to the last
    /// pass's end (submit and readback overhead excluded). Fails with [`Error::Gpu`] without the
    /// adapter's TIMESTAMP_QUERY feature. Such a recorder is never also profiled.
    pub fn new_timed(gpu: &Arc<Device>) -> Result<Self> {
        if !gpu.caps.timestamp_query {
            return Err(Error::Gpu(format!(
                "timing on the GPU needs the timestamp-query feature, which this adapter ({}) does not offer",
                gpu.caps.adapter_name
            )));
        }
        let mut r = Recorder::new_plain(gpu, "florence2-timed");
        r.span = Some((
            gpu.wgpu()?
                .device
                .create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("tuner-timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: SPAN_QUERIES,
                }),
            0,
        ));
        Ok(r)
    }

    /// Whether this recorder is capturing a [`Plan`].
    pub fn capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// Finish a capture: upload the params pages (once: a plan's uniforms never change) and return the
    /// plan. Errors if this recorder was not made by [`Recorder::capture`] or if a readback was recorded.
    pub fn into_plan(self) -> Result<Plan> {
        let Recorder {
            gpu,
            pages,
            capture,
            dispatches,
            ..
        } = self;
        let Some(cap) = capture else {
            return Err(Error::Gpu(
                "into_plan: this recorder was not made by Recorder::capture".into(),
            ));
        };
        if let Some(what) = cap.refused {
            return Err(Error::Gpu(format!("a recorded plan cannot hold {what}")));
        }
        gpu.check()?;
        let hw = gpu.wgpu()?;
        for (buf, data) in &pages {
            if !data.is_empty() {
                hw.queue.write_buffer(buf, 0, data);
            }
        }
        Ok(Plan {
            gpu,
            ops: cap.ops,
            pages: pages.into_iter().map(|(b, _)| b).collect(),
            dispatches,
        })
    }

    /// Replay the plan in `slot`, recording it first with `record` (into a capturing recorder) when the
    /// slot is empty: the per-request cache of a sequence of launches that repeats every step.
    pub fn replay_cached(
        &mut self,
        slot: &mut Option<Plan>,
        record: impl FnOnce(&mut Recorder) -> Result<()>,
    ) -> Result<()> {
        if self.gpu.is_host() {
            // Nothing to keep: host ops run as they are recorded.
            return record(self);
        }
        let plan = match slot {
            Some(p) => p,
            None => {
                let mut cap = Recorder::capture(&self.gpu);
                record(&mut cap)?;
                slot.insert(cap.into_plan()?)
            }
        };
        self.replay(plan)
    }

    /// Encode a recorded plan: no kernel lookup, no params, no bind group, only the passes (timed
    /// like [`Recorder::dispatch`]'s when the profiler is on). A capturing recorder appends the plan's
    /// ops to its own.
    pub fn replay(&mut self, plan: &Plan) -> Result<()> {
        if !Arc::ptr_eq(&self.gpu, &plan.gpu) {
            return Err(Error::Gpu(
                "replay: the plan was recorded on another device".into(),
            ));
        }
        if let Some(cap) = &mut self.capture {
            cap.ops.extend(plan.ops.iter().cloned());
            self.dispatches += plan.dispatches;
            return Ok(());
        }
        if self.prof.is_none() {
            return self.replay_batched(plan);
        }
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(no_encoder());
        };
        for op in &plan.ops {
            match op {
                PlanOp::Dispatch {
                    pipeline,
                    bind_group,
                    grid,
                    entry,
                    label,
                } => {
                    let timestamp_writes = timestamps(&mut self.prof, &self.gpu, || label.clone());
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(entry),
                        timestamp_writes,
                    });
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, bind_group, &[]);
                    pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
                    drop(pass);
                    self.dispatches += 1;
                }
                PlanOp::Copy(c) => c.encode(encoder),
            }
        }
        Ok(())
    }

    /// Replay without profiling: each run of consecutive dispatches goes into one compute pass (a
    /// pass's usage scope is per dispatch, so a dispatch still sees what the previous one wrote: wgpu
    /// inserts the barriers), which saves the per-pass cost on the CPU when encoding and submitting.
    fn replay_batched(&mut self, plan: &Plan) -> Result<()> {
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(no_encoder());
        };
        let mut ops = plan.ops.iter().peekable();
        while let Some(op) = ops.next() {
            match op {
                PlanOp::Copy(c) => c.encode(encoder),
                PlanOp::Dispatch { .. } => {
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("plan"),
                        timestamp_writes: None,
                    });
                    let mut next = Some(op);
                    while let Some(PlanOp::Dispatch {
                        pipeline,
                        bind_group,
                        grid,
                        ..
                    }) = next
                    {
                        pass.set_pipeline(pipeline);
                        pass.set_bind_group(0, bind_group, &[]);
                        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
                        self.dispatches += 1;
                        next = ops.next_if(|o| matches!(o, PlanOp::Dispatch { .. }));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The error of a GPU-only recorder operation on the CPU backend.
fn no_encoder() -> Error {
    Error::Gpu("the CPU backend records no GPU commands".into())
}

impl Recorder {
    /// Whether this recorder times its dispatches (the device's profiler was on when it was created), or
    /// captures a plan (whose dispatches keep their shape labels for a profiled replay).
    pub fn profiling(&self) -> bool {
        self.prof.is_some() || self.capture.is_some() || self.host_prof.is_some()
    }

    /// Name the phase (vision, encoder, decode, ...) this recorder's dispatches are profiled under.
    pub fn set_phase(&mut self, phase: &str) {
        if let Some(p) = &mut self.prof {
            p.phase = phase.to_string();
        }
        if let Some(p) = &mut self.host_prof {
            p.phase = phase.to_string();
        }
    }

    /// Run `op`'s CPU-backend twin (a launcher's [`Backend::Host`] arm). When this recorder profiles,
    /// the run is timed on the wall clock (the op runs to completion here) and added to the device's
    /// profile as `cpu:op`, labelled with the shape note or else the shapes of `operands`.
    pub fn host_op<T>(
        &mut self,
        op: &'static str,
        operands: &[&Tensor],
        run: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if let Some(p) = &mut self.host_prof {
            return crate::gpu::profile::timed_host_op(&self.gpu, p, op, operands, run);
        }
        run()
    }

    /// Label the next dispatch's shape in the profile (launchers call it only when [`Self::profiling`]).
    pub fn note_shape(&mut self, shape: String) {
        if let Some(c) = &mut self.capture {
            c.note = Some(shape);
        } else if let Some(p) = &mut self.prof {
            p.note = Some(shape);
        } else if let Some(p) = &mut self.host_prof {
            p.note = Some(shape);
        }
    }

    pub fn gpu(&self) -> &Arc<Device> {
        &self.gpu
    }

    /// Number of dispatches recorded so far.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches
    }

    /// Reserve a uniform slot holding `params`; returns (page index, byte offset).
    fn push_params(&mut self, params: &[u8]) -> Result<(usize, u64)> {
        if params.len() as u64 > self.slot {
            return Err(Error::Gpu(format!(
                "Params of {} bytes exceed the {}-byte uniform slot",
                params.len(),
                self.slot
            )));
        }
        let page_bytes = self.slot as usize * PAGE_SLOTS;
        let need_page = match self.pages.last() {
            None => true,
            Some((_, data)) => data.len() + self.slot as usize > page_bytes,
        };
        if need_page {
            let gpu = self.gpu.clone();
            let hw = gpu.wgpu()?;
            let buf = self
                .gpu
                .uniform_pool
                .lock()
                .ok()
                .and_then(|mut p| p.pop())
                .unwrap_or_else(|| {
                    hw.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("params-page"),
                        size: page_bytes as u64,
                        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                });
            self.pages.push((buf, Vec::with_capacity(page_bytes)));
        }
        let idx = self.pages.len() - 1;
        let slot = self.slot as usize;
        let data = &mut self.pages[idx].1;
        let off = data.len() as u64;
        data.extend_from_slice(params);
        data.resize(off as usize + slot, 0);
        Ok((idx, off))
    }

    /// Record one dispatch whose storage bindings are whole tensors: `params` at binding 0, `tensors`
    /// at bindings 1.. in order.
    pub fn launch<P: bytemuck::Pod>(
        &mut self,
        kernel: &Kernel,
        params: &P,
        tensors: &[&Tensor],
        grid: [u32; 3],
    ) -> Result<()> {
        let gpu = self.gpu.clone();
        let bindings = tensors
            .iter()
            .map(|t| t.binding(&gpu))
            .collect::<Result<Vec<_>>>()?;
        self.dispatch(kernel, params, &bindings, grid)
    }

    /// Record one dispatch: `params` goes to binding 0 (uniform), `bindings` to bindings 1.. in order.
    pub fn dispatch<P: bytemuck::Pod>(
        &mut self,
        kernel: &Kernel,
        params: &P,
        bindings: &[wgpu::BindingResource<'_>],
        grid: [u32; 3],
    ) -> Result<()> {
        let gpu = self.gpu.clone();
        let hw = gpu.wgpu()?;
        let max = hw.device.limits().max_compute_workgroups_per_dimension;
        if grid.iter().any(|&g| g > max) {
            return Err(Error::Limit {
                what: format!("workgroup grid {grid:?} of {}", kernel.shader.name),
                requested: *grid.iter().max().unwrap_or(&0) as u64,
                max: max as u64,
            });
        }
        if grid.contains(&0) {
            return Ok(());
        }
        let pipe = self.gpu.kernels.get(&self.gpu, kernel)?;
        let (page, off) = self.push_params(bytemuck::bytes_of(params))?;
        let params_size = std::mem::size_of::<P>().max(16) as u64;
        let bind_group =
            self.bind_group(kernel, &pipe.layout, (page, off, params_size), bindings)?;
        self.gpu.bind_groups.fetch_add(1, Ordering::Relaxed);
        if let Some(cap) = &mut self.capture {
            let (op, variant) = kernel_label(kernel);
            let shape = cap.note.take().unwrap_or_else(|| format!("grid={grid:?}"));
            cap.ops.push(PlanOp::Dispatch {
                pipeline: pipe.pipeline.clone(),
                bind_group,
                grid,
                entry: kernel.entry,
                label: (op, variant, shape),
            });
            self.dispatches += 1;
            return Ok(());
        }
        // One compute pass per dispatch: passes are cheap to open, and separate passes give the
        // driver a clear synchronisation point between dependent dispatches.
        let timestamp_writes =
            pass_timestamps(&mut self.prof, &mut self.span, &self.gpu, kernel, grid);
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(no_encoder());
        };
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(kernel.entry),
            timestamp_writes,
        });
        pass.set_pipeline(&pipe.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        drop(pass);
        self.dispatches += 1;
        Ok(())
    }

    /// The bind group of one dispatch: the params page's slice at binding 0, `bindings` from 1.
    fn bind_group(
        &self,
        kernel: &Kernel,
        layout: &wgpu::BindGroupLayout,
        (page, off, size): (usize, u64, u64),
        bindings: &[wgpu::BindingResource<'_>],
    ) -> Result<wgpu::BindGroup> {
        let hw = self.gpu.wgpu()?;
        let mut entries = Vec::with_capacity(bindings.len() + 1);
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.pages[page].0,
                offset: off,
                size: std::num::NonZeroU64::new(size),
            }),
        });
        for (i, b) in bindings.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.clone(),
            });
        }
        Ok(hw.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel.shader.name),
            layout,
            entries: &entries,
        }))
    }

    /// Record a buffer-to-buffer copy of a whole tensor (shapes must have equal byte sizes).
    pub fn copy(&mut self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.copy_range(src, 0, dst, 0, src.byte_size().min(dst.byte_size()))
    }

    /// Record a byte-range copy between tensors (offsets and size multiples of 4).
    pub fn copy_range(
        &mut self,
        src: &Tensor,
        src_off: u64,
        dst: &Tensor,
        dst_off: u64,
        size: u64,
    ) -> Result<()> {
        if !src_off.is_multiple_of(4) || !dst_off.is_multiple_of(4) || !size.is_multiple_of(4) {
            return Err(Error::shape(
                "copy",
                "offsets and size must be multiples of 4",
            ));
        }
        if src_off + size > src.byte_size() || dst_off + size > dst.byte_size() {
            return Err(Error::shape("copy", "range outside the buffers"));
        }
        // Offsets are the tensors' own: a view at an offset ([`Tensor::view_at`]) adds its start.
        let (src_off, dst_off) = (src.offset() + src_off, dst.offset() + dst_off);
        if size == 0 {
            return Ok(());
        }
        if let Backend::Host = self.backend()? {
            let w = |b: u64| (b / 4) as usize;
            return dst
                .host()?
                .copy_from(src.host()?, w(src_off), w(dst_off), w(size));
        }
        if let Some(cap) = &mut self.capture {
            cap.ops.push(PlanOp::Copy(BufferCopy {
                src: src.buffer()?.clone(),
                src_off,
                dst: dst.buffer()?.clone(),
                dst_off,
                size,
            }));
        } else if let Some(encoder) = self.encoder.as_mut() {
            encoder.copy_buffer_to_buffer(src.buffer()?, src_off, dst.buffer()?, dst_off, size);
        }
        Ok(())
    }

    /// Record a copy of `t` into a mappable staging buffer; read it after [`Recorder::submit`].
    pub fn read_back(&mut self, t: &Tensor) -> Result<Pending> {
        let bytes = t.byte_size();
        if let Some(cap) = &mut self.capture {
            cap.refused.get_or_insert_with(|| "a readback".into());
        }
        if self.gpu.is_host() {
            return Ok(Pending::Host(t.host()?.read_bytes(t.offset(), bytes)?));
        }
        let staging = self
            .gpu
            .wgpu()?
            .device
            .create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(no_encoder());
        };
        encoder.copy_buffer_to_buffer(t.buffer()?, t.offset(), &staging, 0, bytes);
        Ok(Pending::Device { staging, bytes })
    }

    /// The backend an op recorded here runs on: each launcher's one `match` ([`Backend`]). Fails on the
    /// CPU backend for a capturing recorder ([`Recorder::host_ready`]).
    pub fn backend(&self) -> Result<&Backend> {
        let backend = self.gpu.backend();
        if let Backend::Host = backend {
            self.host_ready()?;
        }
        Ok(backend)
    }

    /// On the CPU backend, fail for a capturing recorder: host ops run as they are recorded, so they
    /// cannot be kept as a [`Plan`] (callers run them directly there; see [`Recorder::replay_cached`]).
    pub fn host_ready(&self) -> Result<()> {
        if self.capture.is_some() {
            return Err(Error::Gpu(
                "the CPU backend runs ops as they are recorded; it records no plans".into(),
            ));
        }
        Ok(())
    }

    /// Like [`Recorder::read_back`] but into a caller-owned staging buffer (see [`crate::gpu::staging_buffer`]), so a
    /// loop that reads back every step (decoding) allocates nothing per step. The buffer must not be
    /// in use by an unresolved [`Pending`] and must hold `t`'s bytes.
    pub fn read_back_into(&mut self, t: &Tensor, staging: &Staging) -> Result<Pending> {
        let bytes = t.byte_size();
        if self.capture.is_some() {
            return Err(Error::Gpu("a recorded plan cannot hold a readback".into()));
        }
        let Some(staging) = &staging.0 else {
            return Ok(Pending::Host(t.host()?.read_bytes(t.offset(), bytes)?));
        };
        if staging.size() < bytes
            || !staging
                .usage()
                .contains(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST)
        {
            return Err(Error::Readback(format!(
                "staging buffer of {} bytes ({:?}) cannot receive {bytes} bytes",
                staging.size(),
                staging.usage()
            )));
        }
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(no_encoder());
        };
        encoder.copy_buffer_to_buffer(t.buffer()?, t.offset(), staging, 0, bytes);
        Ok(Pending::Device {
            staging: staging.clone(),
            bytes,
        })
    }

    /// Upload the params pages and submit everything recorded, once.
    pub fn submit(self) -> Result<()> {
        self.submit_inner().map(|_| ())
    }

    /// Submit (as [`Recorder::submit`]) a recorder made by [`Recorder::new_timed`], wait for the GPU and
    /// return the milliseconds from the first timed pass's beginning to the last one's end (0 when it
    /// recorded no dispatch).
    pub async fn submit_timed(self) -> Result<f64> {
        let (gpu, span) = self.submit_inner()?;
        let Some(pending) = span else {
            return Ok(0.0);
        };
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&pending.bytes(&gpu).await?);
        let begin = ticks.iter().step_by(2).copied().min().unwrap_or(0);
        let end = ticks.iter().skip(1).step_by(2).copied().max().unwrap_or(0);
        let period = gpu.wgpu()?.queue.get_timestamp_period() as f64;
        Ok(end.saturating_sub(begin) as f64 * period * 1e-6)
    }

    fn submit_inner(self) -> Result<(Arc<Device>, Option<Pending>)> {
        let Recorder {
            gpu,
            encoder,
            pages,
            prof,
            capture,
            span,
            ..
        } = self;
        if capture.is_some() {
            return Err(Error::Gpu(
                "a capturing recorder makes a plan (into_plan); it cannot be submitted".into(),
            ));
        }
        gpu.check()?;
        let Some(mut encoder) = encoder else {
            // CPU backend: the work is done.
            return Ok((gpu, None));
        };
        let hw = gpu.wgpu()?;
        for (buf, data) in &pages {
            if !data.is_empty() {
                hw.queue.write_buffer(buf, 0, data);
            }
        }
        let timestamps = prof
            .filter(|p| !p.labels.is_empty())
            .map(|p| resolve_timestamps(hw, &mut encoder, p));
        let span = span
            .filter(|(_, passes)| *passes > 0)
            .map(|(queries, passes)| resolve_span(hw, &mut encoder, &queries, passes));
        hw.queue.submit(Some(encoder.finish()));
        if let Some((staging, phase, labels)) = timestamps {
            read_timestamps(&gpu, staging, phase, labels);
        }
        if let Ok(mut pool) = gpu.uniform_pool.lock() {
            pool.extend(pages.into_iter().map(|(b, _)| b));
        }
        gpu.check()?;
        Ok((gpu, span))
    }
}
