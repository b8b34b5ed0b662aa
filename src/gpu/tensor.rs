//! A tensor is a storage buffer plus a shape and an element type. Tensors are cheap to clone (the buffer
//! is reference-counted) and a reshape shares the buffer. Buffers are zero-initialised by wgpu.
//!
//! A buffer may be larger than the device's storage-binding limit (wgpu on lavapipe and many browsers
//! allow 128 MiB per binding, while Florence-2's shared embedding is 157.7 MB in f32). Such a tensor can
//! still be created (up to `max_buffer_size`) and written, but a kernel must bind it in pieces: see
//! [`Tensor::row_chunks`], which splits it into row ranges that each fit one binding at an aligned offset.

use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Element type of a tensor's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    /// IEEE half, stored packed two per `u32` (read in WGSL with `unpack2x16float`, which needs no
    /// `shader-f16` feature). The buffer is padded to a multiple of 4 bytes.
    F16,
    U32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 => 2,
        }
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

#[derive(Clone, Debug)]
pub struct Tensor {
    buf: wgpu::Buffer,
    shape: Arc<[usize]>,
    dtype: DType,
}

fn padded_bytes(numel: usize, dtype: DType) -> u64 {
    // Storage bindings must be a multiple of 4 bytes; keep at least 4 so empty tensors stay valid.
    ((numel * dtype.size()).div_ceil(4) * 4).max(4) as u64
}

impl Tensor {
    /// A zero-filled tensor.
    pub fn zeros(gpu: &Gpu, shape: &[usize], dtype: DType, label: &str) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        let size = padded_bytes(numel, dtype);
        if size > gpu.caps.max_buffer {
            return Err(Error::Limit {
                what: format!("tensor '{label}' {shape:?}"),
                requested: size,
                max: gpu.caps.max_buffer,
            });
        }
        let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(Tensor {
            buf,
            shape: shape.into(),
            dtype,
        })
    }

    fn from_bytes(
        gpu: &Gpu,
        shape: &[usize],
        dtype: DType,
        bytes: &[u8],
        label: &str,
    ) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        if bytes.len() != numel * dtype.size() {
            return Err(Error::shape(
                "Tensor::from_bytes",
                format!(
                    "'{label}': {} bytes for shape {shape:?} of {dtype:?}",
                    bytes.len()
                ),
            ));
        }
        let size = padded_bytes(numel, dtype);
        if size > gpu.caps.max_buffer {
            return Err(Error::Limit {
                what: format!("tensor '{label}' {shape:?}"),
                requested: size,
                max: gpu.caps.max_buffer,
            });
        }
        let mut data = bytes.to_vec();
        data.resize(size as usize, 0);
        let buf = gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &data,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            });
        Ok(Tensor {
            buf,
            shape: shape.into(),
            dtype,
        })
    }

    pub fn from_f32(gpu: &Gpu, shape: &[usize], data: &[f32], label: &str) -> Result<Tensor> {
        Self::from_bytes(gpu, shape, DType::F32, bytemuck::cast_slice(data), label)
    }

    pub fn from_u32(gpu: &Gpu, shape: &[usize], data: &[u32], label: &str) -> Result<Tensor> {
        Self::from_bytes(gpu, shape, DType::U32, bytemuck::cast_slice(data), label)
    }

    /// Upload f32 values as packed f16.
    pub fn from_f32_as_f16(
        gpu: &Gpu,
        shape: &[usize],
        data: &[f32],
        label: &str,
    ) -> Result<Tensor> {
        let h: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
        Self::from_bytes(gpu, shape, DType::F16, bytemuck::cast_slice(&h), label)
    }

    /// Write raw bytes at a byte offset (used by the streaming loader to fill a tensor chunk by chunk).
    /// `offset` and `bytes.len()` must be multiples of 4.
    pub fn write_bytes(&self, gpu: &Gpu, offset: u64, bytes: &[u8]) -> Result<()> {
        if !offset.is_multiple_of(4) || !bytes.len().is_multiple_of(4) {
            return Err(Error::shape(
                "Tensor::write_bytes",
                "offset and length must be multiples of 4",
            ));
        }
        if offset + bytes.len() as u64 > self.buf.size() {
            return Err(Error::shape(
                "Tensor::write_bytes",
                format!(
                    "write of {} bytes at {offset} overruns a {}-byte buffer",
                    bytes.len(),
                    self.buf.size()
                ),
            ));
        }
        gpu.queue.write_buffer(&self.buf, offset, bytes);
        Ok(())
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

    pub fn byte_size(&self) -> u64 {
        self.buf.size()
    }

    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buf
    }

    /// Same buffer, new shape with the same element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if n != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!("{:?} -> {shape:?} changes the element count", self.shape),
            ));
        }
        Ok(Tensor {
            buf: self.buf.clone(),
            shape: shape.into(),
            dtype: self.dtype,
        })
    }

    /// The whole buffer as one binding. Fails with [`Error::Limit`] if it exceeds the device's
    /// storage-binding limit: such tensors must be bound through [`Tensor::row_chunks`].
    pub fn binding(&self, gpu: &Gpu) -> Result<wgpu::BindingResource<'_>> {
        if self.buf.size() > gpu.caps.max_storage_binding {
            return Err(Error::Limit {
                what: format!("binding a {:?} tensor whole", self.shape),
                requested: self.buf.size(),
                max: gpu.caps.max_storage_binding,
            });
        }
        Ok(self.buf.as_entire_binding())
    }

    /// A byte range of the buffer as a binding (offset must respect the storage offset alignment).
    pub fn binding_range(&self, offset: u64, size: u64) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buf,
            offset,
            size: std::num::NonZeroU64::new(size),
        })
    }

    /// Split the tensor, viewed as rows of `row_elems` elements, into row ranges that each fit one storage
    /// binding with an offset aligned to the device's storage offset alignment. A tensor that fits whole
    /// yields one chunk.
    pub fn row_chunks(&self, gpu: &Gpu, row_elems: usize) -> Result<Vec<RowChunk>> {
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
        let row_bytes = (row_elems * self.dtype.size()) as u64;
        let max = gpu.caps.max_storage_binding;
        let align = gpu.caps.storage_offset_alignment.max(4) as u64;
        if self.buf.size() <= max {
            return Ok(vec![RowChunk {
                row_start: 0,
                rows,
                byte_offset: 0,
                byte_size: self.buf.size(),
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
                byte_size: size.min(self.buf.size() - off),
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
