//! Whole-tensor readback helpers (tests, debugging, stage dumps). The hot paths read back through
//! [`crate::gpu::Recorder::read_back`] inside their own submit instead, so a decode step costs one submit.

use std::sync::Arc;

use crate::error::Result;
use crate::gpu::{DType, Device, Recorder, Tensor};

/// Read a tensor back as f32 values (F16 tensors are widened, Q8/Q4 dequantized).
pub async fn to_f32(gpu: &Arc<Device>, t: &Tensor) -> Result<Vec<f32>> {
    let mut rec = Recorder::new(gpu);
    let p = rec.read_back(t);
    rec.submit()?;
    let bytes = p?.bytes(gpu).await?;
    let n = t.numel();
    Ok(match t.dtype() {
        DType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(&bytes)[..n].to_vec(),
        DType::U32 => bytemuck::pod_collect_to_vec::<u8, u32>(&bytes)[..n]
            .iter()
            .map(|&v| v as f32)
            .collect(),
        DType::F16 => bytemuck::pod_collect_to_vec::<u8, half::f16>(&bytes)[..n]
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        DType::Q8 | DType::Q4 => {
            let k = t.dim(-1);
            let fmt = t
                .dtype()
                .qformat()
                .ok_or_else(|| crate::error::Error::shape("to_f32", "not quantized"))?;
            let rows = n.checked_div(k).unwrap_or(0);
            let len = rows * fmt.row_bytes(k);
            crate::quant::dequantize_rows(fmt, k, &bytes[..len.min(bytes.len())])?
        }
    })
}

/// Read a U32 tensor back.
pub async fn to_u32(gpu: &Arc<Device>, t: &Tensor) -> Result<Vec<u32>> {
    let mut rec = Recorder::new(gpu);
    let p = rec.read_back(t);
    rec.submit()?;
    let bytes = p?.bytes(gpu).await?;
    Ok(bytemuck::pod_collect_to_vec::<u8, u32>(&bytes)[..t.numel()].to_vec())
}

/// Blocking variants for native code and tests.
#[cfg(not(target_arch = "wasm32"))]
pub fn to_f32_blocking(gpu: &Arc<Device>, t: &Tensor) -> Result<Vec<f32>> {
    pollster::block_on(to_f32(gpu, t))
}

#[cfg(not(target_arch = "wasm32"))]
pub fn to_u32_blocking(gpu: &Arc<Device>, t: &Tensor) -> Result<Vec<u32>> {
    pollster::block_on(to_u32(gpu, t))
}
