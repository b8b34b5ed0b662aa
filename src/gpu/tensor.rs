//! A tensor is a storage buffer plus a shape and an element type. Tensors are cheap to clone (the buffer
//! is reference-counted) and a reshape shares the buffer. Buffers are zero-initialised by wgpu.
//!
//! A buffer may be larger than the device's storage-binding limit (wgpu on lavapipe and many browsers
//! allow 128 MiB per binding, while Florence-2's shared embedding is 157.7 MB in f32). Such a tensor can
//! still be created (up to `max_buffer_size`) and written, but a kernel must bind it in pieces: see
//! [`Tensor::row_chunks`], which splits it into row ranges that each fit one binding at an aligned offset.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};
use crate::gpu::host::HostBuf;
use crate::gpu::Device;
use crate::quant::QFormat;

/// Element type of a tensor's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    /// IEEE half, stored packed two per `u32` (read in WGSL with `unpack2x16float`, which needs no
    /// `shader-f16` feature). The buffer is padded to a multiple of 4 bytes.
    F16,
    U32,
    /// Block-quantized matrix, 8-bit ([`QFormat::Q8`]); rows laid out as documented in
    /// [`crate::quant`]. Only for matrices whose last dimension is a multiple of 32.
    Q8,
    /// Block-quantized matrix, 4-bit ([`QFormat::Q4`]).
    Q4,
}

impl DType {
    /// Bytes per element for the element types; for the quantized formats, the bytes per row come from
    /// [`DType::row_bytes`] instead (this returns 1, a lower bound, for them).
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 => 2,
            DType::Q8 | DType::Q4 => 1,
        }
    }

    /// The quantization format, for Q8 and Q4.
    pub fn qformat(self) -> Option<QFormat> {
        match self {
            DType::Q8 => Some(QFormat::Q8),
            DType::Q4 => Some(QFormat::Q4),
            _ => None,
        }
    }

    /// Bytes of one row of `row_elems` elements (quantized rows: quants, scales and padding).
    pub fn row_bytes(self, row_elems: usize) -> usize {
        match self.qformat() {
            Some(q) => q.row_bytes(row_elems),
            None => row_elems * self.size(),
        }
    }

    /// Unpadded bytes of a tensor of this shape. Quantized tensors must have a last dimension that is a
    /// whole number of 32-weight blocks.
    pub fn bytes_for(self, shape: &[usize]) -> Result<usize> {
        let numel: usize = shape.iter().product();
        match self.qformat() {
            Some(q) => {
                let k = shape.last().copied().unwrap_or(0);
                q.check_k(&format!("{shape:?} {self:?}"), k)?;
                Ok(numel / k * q.row_bytes(k))
            }
            None => Ok(numel * self.size()),
        }
    }

    /// Bytes of the GPU buffer a tensor of this shape gets: [`DType::bytes_for`] padded to a multiple
    /// of 4 (storage bindings need it), at least 4. What [`Tensor::zeros`] allocates and the memory
    /// accounting counts, and what the memory estimate ([`crate::estimate`]) sums.
    pub fn buffer_bytes(self, shape: &[usize]) -> Result<u64> {
        Ok((self.bytes_for(shape)?.div_ceil(4) * 4).max(4) as u64)
    }
}

/// What a GPU allocation holds, for the memory accounting ([`MemCounter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Model weights (loaded once).
    Weights,
    /// Everything else: activations, caches, scratch.
    Activations,
}

/// Running totals of the GPU bytes held by live tensors, by kind, with high-water marks. Every
/// [`Tensor`] allocation adds to it and the last clone of a tensor's buffer subtracts on drop.
#[derive(Debug, Default)]
pub struct MemCounter {
    weights: AtomicU64,
    activations: AtomicU64,
    peak_total: AtomicU64,
    peak_activations: AtomicU64,
    allocations: AtomicU64,
}

/// A snapshot of [`MemCounter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemReport {
    /// Bytes of weight tensors now resident.
    pub weights_bytes: u64,
    /// Bytes of other tensors (activations, KV caches, scratch) now live.
    pub activations_bytes: u64,
    /// Weights + activations now.
    pub current_bytes: u64,
    /// Highest weights + activations since the device opened or the last [`MemCounter::reset_peak`].
    pub peak_bytes: u64,
    /// Highest activation bytes over the same span.
    pub peak_activations_bytes: u64,
    /// Tensor buffers created so far.
    pub allocations: u64,
}

impl MemCounter {
    fn add(&self, kind: MemKind, bytes: u64) {
        let (w, a) = match kind {
            MemKind::Weights => (self.weights.fetch_add(bytes, Ordering::Relaxed) + bytes, {
                self.activations.load(Ordering::Relaxed)
            }),
            MemKind::Activations => (
                self.weights.load(Ordering::Relaxed),
                self.activations.fetch_add(bytes, Ordering::Relaxed) + bytes,
            ),
        };
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.peak_total.fetch_max(w + a, Ordering::Relaxed);
        self.peak_activations.fetch_max(a, Ordering::Relaxed);
    }

    fn sub(&self, kind: MemKind, bytes: u64) {
        let slot = match kind {
            MemKind::Weights => &self.weights,
            MemKind::Activations => &self.activations,
        };
        // Saturating: never wraps even if a caller resets between add and sub.
        let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(bytes))
        });
    }

    /// The current figures.
    pub fn report(&self) -> MemReport {
        let w = self.weights.load(Ordering::Relaxed);
        let a = self.activations.load(Ordering::Relaxed);
        MemReport {
            weights_bytes: w,
            activations_bytes: a,
            current_bytes: w + a,
            peak_bytes: self.peak_total.load(Ordering::Relaxed).max(w + a),
            peak_activations_bytes: self.peak_activations.load(Ordering::Relaxed).max(a),
            allocations: self.allocations.load(Ordering::Relaxed),
        }
    }

    /// Start a new high-water mark from the current figures (e.g. per request).
    pub fn reset_peak(&self) {
        let w = self.weights.load(Ordering::Relaxed);
        let a = self.activations.load(Ordering::Relaxed);
        self.peak_total.store(w + a, Ordering::Relaxed);
        self.peak_activations.store(a, Ordering::Relaxed);
    }
}

/// Where a tensor's bytes live.
#[derive(Debug)]
enum Store {
    /// A wgpu buffer.
    Device(wgpu::Buffer),
    /// Host memory of the CPU backend.
    Host(HostBuf),
}

/// A buffer with its accounting: subtracts itself from the counter when the last tensor sharing it
/// is dropped.
#[derive(Debug)]
struct Alloc {
    store: Store,
    size: u64,
    kind: MemKind,
    counter: Arc<MemCounter>,
}

impl Drop for Alloc {
    fn drop(&mut self) {
        self.counter.sub(self.kind, self.size);
    }
}

/// A contiguous row range of a tensor that fits in one storage binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowChunk {
    pub row_start: usize,
    pub rows: usize,
    pub byte_offset: u64,
    pub byte_size: u64,
}

/// How every tensor's wgpu buffer is used: bound as storage, copied from and into.
const TENSOR_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

#[derive(Clone, Debug)]
pub struct Tensor {
    alloc: Arc<Alloc>,
    shape: Arc<[usize]>,
    dtype: DType,
    /// Where this tensor starts in the buffer: 0, or a multiple of 4 for a view at an offset
    /// ([`Tensor::view_at`]).
    offset: u64,
    /// Bytes this tensor covers from `offset`: the whole buffer, or less for a view
    /// ([`Tensor::view`], [`Tensor::view_at`]) of a larger arena buffer.
    bytes: u64,
}

fn padded_bytes(shape: &[usize], dtype: DType) -> Result<u64> {
    // Storage bindings must be a multiple of 4 bytes; keep at least 4 so empty tensors stay valid.
    dtype.buffer_bytes(shape)
}

impl Tensor {
    /// A zero-filled activation tensor.
    pub fn zeros(gpu: &Device, shape: &[usize], dtype: DType, label: &str) -> Result<Tensor> {
        Self::zeros_kind(gpu, shape, dtype, label, MemKind::Activations)
    }

    /// A zero-filled tensor counted as `kind` by the memory accounting.
    pub fn zeros_kind(
        gpu: &Device,
        shape: &[usize],
        dtype: DType,
        label: &str,
        kind: MemKind,
    ) -> Result<Tensor> {
        let size = buffer_size(gpu, shape, dtype, label)?;
        if gpu.is_host() {
            return Ok(Self::wrap(
                gpu,
                Store::Host(HostBuf::zeros(size)?),
                size,
                shape,
                dtype,
                kind,
            ));
        }
        let buf = gpu.wgpu()?.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: TENSOR_USAGE,
            mapped_at_creation: false,
        });
        let store = Store::Device(buf);
        Ok(Self::wrap(gpu, store, size, shape, dtype, kind))
    }

    // wgpu's handles are Send + Sync natively, not on wasm32 (one thread there): Arc serves both.
    #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
    fn wrap(
        gpu: &Device,
        store: Store,
        size: u64,
        shape: &[usize],
        dtype: DType,
        kind: MemKind,
    ) -> Tensor {
        gpu.mem.add(kind, size);
        let bytes = size;
        Tensor {
            alloc: Arc::new(Alloc {
                store,
                size,
                kind,
                counter: gpu.mem.clone(),
            }),
            shape: shape.into(),
            dtype,
            offset: 0,
            bytes,
        }
    }

    /// What the memory accounting counts this tensor as.
    pub fn mem_kind(&self) -> MemKind {
        self.alloc.kind
    }

    fn from_bytes(
        gpu: &Device,
        shape: &[usize],
        dtype: DType,
        bytes: &[u8],
        label: &str,
    ) -> Result<Tensor> {
        Self::from_bytes_kind(gpu, shape, dtype, bytes, label, MemKind::Activations)
    }

    /// Upload raw bytes in `dtype`'s storage layout (quantized: whole rows as in [`crate::quant`]).
    pub fn from_bytes_kind(
        gpu: &Device,
        shape: &[usize],
        dtype: DType,
        bytes: &[u8],
        label: &str,
        kind: MemKind,
    ) -> Result<Tensor> {
        if bytes.len() != dtype.bytes_for(shape)? {
            return Err(Error::shape(
                "Tensor::from_bytes",
                format!(
                    "'{label}': {} bytes for shape {shape:?} of {dtype:?}",
                    bytes.len()
                ),
            ));
        }
        let size = buffer_size(gpu, shape, dtype, label)?;
        if gpu.is_host() {
            let buf = HostBuf::zeros(size)?;
            let whole = bytes.len() / 4 * 4;
            buf.write_bytes(0, &bytes[..whole])?;
            if whole < bytes.len() {
                let mut tail = [0u8; 4];
                tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
                buf.write_bytes(whole as u64, &tail)?;
            }
            return Ok(Self::wrap(gpu, Store::Host(buf), size, shape, dtype, kind));
        }
        let mut data = bytes.to_vec();
        data.resize(size as usize, 0);
        let buf = gpu
            .wgpu()?
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &data,
                usage: TENSOR_USAGE,
            });
        let store = Store::Device(buf);
        Ok(Self::wrap(gpu, store, size, shape, dtype, kind))
    }

    pub fn from_f32(gpu: &Device, shape: &[usize], data: &[f32], label: &str) -> Result<Tensor> {
        Self::from_bytes(gpu, shape, DType::F32, bytemuck::cast_slice(data), label)
    }

    pub fn from_u32(gpu: &Device, shape: &[usize], data: &[u32], label: &str) -> Result<Tensor> {
        Self::from_bytes(gpu, shape, DType::U32, bytemuck::cast_slice(data), label)
    }

    /// Upload f32 values as packed f16.
    pub fn from_f32_as_f16(
        gpu: &Device,
        shape: &[usize],
        data: &[f32],
        label: &str,
    ) -> Result<Tensor> {
        let h: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
        Self::from_bytes(gpu, shape, DType::F16, bytemuck::cast_slice(&h), label)
    }

    /// Quantize f32 rows (last dimension a multiple of 32) into a Q8 or Q4 tensor.
    pub fn from_f32_quantized(
        gpu: &Device,
        shape: &[usize],
        data: &[f32],
        fmt: QFormat,
        label: &str,
    ) -> Result<Tensor> {
        let k = shape.last().copied().unwrap_or(0);
        let mut bytes = Vec::new();
        crate::quant::quantize_rows(fmt, k, data, &mut bytes)?;
        let dtype = match fmt {
            QFormat::Q8 => DType::Q8,
            QFormat::Q4 => DType::Q4,
        };
        Self::from_bytes(gpu, shape, dtype, &bytes, label)
    }

    /// Write raw bytes at a byte offset (used by the streaming loader to fill a tensor chunk by chunk).
    /// `offset` and `bytes.len()` must be multiples of 4.
    pub fn write_bytes(&self, gpu: &Device, offset: u64, bytes: &[u8]) -> Result<()> {
        if !offset.is_multiple_of(4) || !bytes.len().is_multiple_of(4) {
            return Err(Error::shape(
                "Tensor::write_bytes",
                "offset and length must be multiples of 4",
            ));
        }
        if offset + bytes.len() as u64 > self.bytes {
            return Err(Error::shape(
                "Tensor::write_bytes",
                format!(
                    "write of {} bytes at {offset} overruns a {}-byte buffer",
                    bytes.len(),
                    self.bytes
                ),
            ));
        }
        match &self.alloc.store {
            Store::Host(h) => h.write_bytes(self.offset + offset, bytes),
            Store::Device(buf) => {
                gpu.wgpu()?
                    .queue
                    .write_buffer(buf, self.offset + offset, bytes);
                Ok(())
            }
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Size of dimension `i`, counting from the end when negative (-1 is the last).
    pub fn dim(&self, i: isize) -> usize {
        let r = self.shape.len() as isize;
        let idx = if i < 0 { r + i } else { i };
        if idx < 0 || idx >= r {
            return 0;
        }
        self.shape[idx as usize]
    }

    /// Bytes this tensor covers (its buffer's size, or the view's extent for a [`Tensor::view`]).
    pub fn byte_size(&self) -> u64 {
        self.bytes
    }

    /// Bytes of the whole underlying buffer (what the memory accounting counts once for all views).
    pub fn capacity(&self) -> u64 {
        self.alloc.size
    }

    /// Where this tensor starts in its buffer, in bytes (0 except for [`Tensor::view_at`]).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// A view of the first bytes of this tensor's buffer as a tensor of `shape` and `dtype`: no
    /// allocation, the buffer is shared. This is how the activation arenas
    /// ([`crate::model::davit`]) reuse one buffer for tensors of different shapes in turn. Every
    /// binding of the view covers only its own bytes. Fails if the buffer is too small.
    pub fn view(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.view_at(0, shape, dtype)
    }

    /// A view of this tensor's buffer from byte `offset` (of the buffer, not of this tensor) as a
    /// tensor of `shape` and `dtype`, e.g. a range of rows that a kernel reads or writes in place (the
    /// DaViT MLP's row chunks). `offset` must be a multiple of 4; a kernel can bind the view only when
    /// it is also a multiple of the device's storage offset alignment ([`Tensor::binding`] checks),
    /// copies need only the 4. Fails if the view does not fit in the buffer.
    pub fn view_at(&self, offset: u64, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let bytes = padded_bytes(shape, dtype)?;
        if !offset.is_multiple_of(4) || offset + bytes > self.alloc.size {
            return Err(Error::shape(
                "Tensor::view",
                format!(
                    "{shape:?} {dtype:?} needs {bytes} bytes at offset {offset}; the buffer has {}",
                    self.alloc.size
                ),
            ));
        }
        Ok(Tensor {
            alloc: self.alloc.clone(),
            shape: shape.into(),
            dtype,
            offset,
            bytes,
        })
    }

    /// The wgpu buffer ([`Error::Gpu`] for a host tensor of the CPU backend).
    pub fn buffer(&self) -> Result<&wgpu::Buffer> {
        match &self.alloc.store {
            Store::Device(b) => Ok(b),
            Store::Host(_) => Err(Error::Gpu(
                "a host tensor of the CPU backend has no GPU buffer".into(),
            )),
        }
    }

    /// The host buffer of a CPU-backend tensor ([`Error::Gpu`] for a GPU tensor).
    pub fn host(&self) -> Result<&HostBuf> {
        match &self.alloc.store {
            Store::Host(h) => Ok(h),
            Store::Device(_) => Err(Error::Gpu("a GPU tensor reached a CPU-backend op".into())),
        }
    }

    /// Whether this tensor lives in host memory (the CPU backend).
    pub fn is_host(&self) -> bool {
        matches!(self.alloc.store, Store::Host(_))
    }

    /// Whether `self` and `other` share one underlying buffer.
    pub fn same_buffer(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.alloc, &other.alloc)
    }

    /// Same buffer, new shape with the same element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if self.dtype.qformat().is_some() && shape.last() != self.shape.last() {
            return Err(Error::shape(
                "reshape",
                format!(
                    "{:?} -> {shape:?} changes the row length of a {:?} tensor",
                    self.shape, self.dtype
                ),
            ));
        }
        if n != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!("{:?} -> {shape:?} changes the element count", self.shape),
            ));
        }
        Ok(Tensor {
            alloc: self.alloc.clone(),
            shape: shape.into(),
            dtype: self.dtype,
            offset: self.offset,
            bytes: self.bytes,
        })
    }

    /// The whole buffer as one binding. Fails with [`Error::Limit`] if it exceeds the device's
    /// storage-binding limit: such tensors must be bound through [`Tensor::row_chunks`].
    pub fn binding(&self, gpu: &Device) -> Result<wgpu::BindingResource<'_>> {
        if self.bytes > gpu.caps.max_storage_binding {
            return Err(Error::Limit {
                what: format!("binding a {:?} tensor whole", self.shape),
                requested: self.bytes,
                max: gpu.caps.max_storage_binding,
            });
        }
        let buf = self.buffer()?;
        if self.offset == 0 && self.bytes == self.alloc.size {
            return Ok(buf.as_entire_binding());
        }
        let align = gpu.caps.storage_offset_alignment.max(4) as u64;
        if !self.offset.is_multiple_of(align) {
            return Err(Error::shape(
                "Tensor::binding",
                format!(
                    "a view of {:?} at byte {} is not on the device's {align}-byte storage offset \
                     alignment",
                    self.shape, self.offset
                ),
            ));
        }
        self.binding_range(0, self.bytes)
    }

    /// A byte range of this tensor (from its own start) as a binding; the buffer offset
    /// (`offset()` + `offset`) must respect the storage offset alignment.
    pub fn binding_range(&self, offset: u64, size: u64) -> Result<wgpu::BindingResource<'_>> {
        Ok(wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: self.buffer()?,
            offset: self.offset + offset,
            size: std::num::NonZeroU64::new(size),
        }))
    }

    /// Split the tensor, viewed as rows of `row_elems` elements, into row ranges that each fit one storage
    /// binding with an offset aligned to the device's storage offset alignment. A tensor that fits whole
    /// yields one chunk.
    pub fn row_chunks(&self, gpu: &Device, row_elems: usize) -> Result<Vec<RowChunk>> {
        let numel = self.numel();
        if row_elems == 0 || !numel.is_multiple_of(row_elems) {
            return Err(Error::shape(
                "row_chunks",
                format!(
                    "{:?} is not a whole number of {row_elems}-element rows",
                    self.shape
                ),
            ));
        }
        let rows = numel / row_elems;
        let row_bytes = self.dtype.row_bytes(row_elems) as u64;
        let max = gpu.caps.max_storage_binding;
        let align = gpu.caps.storage_offset_alignment.max(4) as u64;
        if !self.offset.is_multiple_of(align) {
            return Err(Error::shape(
                "row_chunks",
                format!("a view at byte {} is not {align}-byte aligned", self.offset),
            ));
        }
        if self.bytes <= max {
            return Ok(vec![RowChunk {
                row_start: 0,
                rows,
                byte_offset: 0,
                byte_size: self.bytes,
            }]);
        }
        // Rows per chunk: as many as fit, rounded down so that every chunk starts aligned.
        let step = {
            let g = gcd(row_bytes, align);
            align / g // rows per alignment period
        } as usize;
        let fit = (max / row_bytes) as usize;
        let per = fit / step * step;
        if per == 0 {
            return Err(Error::Limit {
                what: format!("one aligned row group of a {:?} tensor", self.shape),
                requested: row_bytes * step as u64,
                max,
            });
        }
        let mut out = Vec::new();
        let mut r = 0;
        while r < rows {
            let n = per.min(rows - r);
            let off = r as u64 * row_bytes;
            let size = (n as u64 * row_bytes).div_ceil(4) * 4;
            out.push(RowChunk {
                row_start: r,
                rows: n,
                byte_offset: off,
                byte_size: size.min(self.bytes - off),
            });
            r += n;
        }
        Ok(out)
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

/// The buffer bytes of a `shape` tensor of `dtype` (padded to whole 4-byte words), within the
/// device's largest buffer.
fn buffer_size(gpu: &Device, shape: &[usize], dtype: DType, label: &str) -> Result<u64> {
    let size = padded_bytes(shape, dtype)?;
    if size > gpu.caps.max_buffer {
        return Err(Error::Limit {
            what: format!("tensor '{label}' {shape:?}"),
            requested: size,
            max: gpu.caps.max_buffer,
        });
    }
    Ok(size)
}
