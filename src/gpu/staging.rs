//! Readbacks recorded into a [`crate::gpu::Recorder`]: a copy into a mappable staging buffer (or, on the
//! CPU backend, the bytes at once), mapped after the submit.

use futures_channel::oneshot;

use crate::error::{Error, Result};
use crate::gpu::Device;

/// A readback recorded into a [`Recorder`]; resolve it after [`Recorder::submit`].
pub enum Pending {
    /// A copy into a mappable staging buffer.
    Device { staging: wgpu::Buffer, bytes: u64 },
    /// The bytes, read at once (CPU backend).
    Host(Vec<u8>),
}

/// A caller-owned readback buffer for [`Recorder::read_back_into`] ([`staging_buffer`]); empty on the
/// CPU backend, whose readbacks copy host memory directly.
#[derive(Clone, Debug)]
pub struct Staging(pub(crate) Option<wgpu::Buffer>);

/// A mappable buffer of `bytes` bytes for [`Recorder::read_back_into`] (none on the CPU backend).
pub fn staging_buffer(gpu: &Device, bytes: u64) -> Staging {
    Staging(gpu.wgpu().ok().map(|hw| device_staging(&hw.device, bytes)))
}

pub(crate) fn device_staging(device: &wgpu::Device, bytes: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback-staging"),
        size: bytes.div_ceil(4).max(1) * 4,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

impl Pending {
    /// Map the staging buffer and return its bytes (natively this polls the device until the copy is
    /// done; in the browser it awaits the map promise).
    pub async fn bytes(self, gpu: &Device) -> Result<Vec<u8>> {
        let (staging, bytes) = match self {
            Pending::Host(b) => {
                // A readback is where a decode step ends: in the browser and Node the CPU backend
                // lets the event loop run there (an abort, a UI update), as a GPU readback's await does.
                #[cfg(target_arch = "wasm32")]
                next_task().await;
                return Ok(b);
            }
            Pending::Device { staging, bytes } => (staging, bytes),
        };
        let (tx, rx) = oneshot::channel();
        let slice = staging.slice(..);
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        #[cfg(not(target_arch = "wasm32"))]
        gpu.wgpu()?
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Readback(e.to_string()))?;
        rx.await
            .map_err(|_| Error::Readback("map callback dropped".into()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
        gpu.check()?;
        let view = slice
            .get_mapped_range()
            .map_err(|e| Error::Readback(e.to_string()))?;
        let out = view[..bytes as usize].to_vec();
        drop(view);
        staging.unmap();
        Ok(out)
    }

    pub async fn f32s(self, gpu: &Device) -> Result<Vec<f32>> {
        let b = self.bytes(gpu).await?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }

    pub async fn u32s(self, gpu: &Device) -> Result<Vec<u32>> {
        let b = self.bytes(gpu).await?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }
}

/// Yield to the event loop for one task (`setTimeout(0)`: windows, workers and Node), letting pending
/// promise callbacks and events (an abort, `device.lost`) run.
#[cfg(target_arch = "wasm32")]
pub async fn next_task() {
    use wasm_bindgen::JsCast;
    let global = js_sys::global();
    let Ok(set_timeout) = js_sys::Reflect::get(&global, &"setTimeout".into())
        .and_then(|f| f.dyn_into::<js_sys::Function>())
    else {
        return;
    };
    let p = js_sys::Promise::new(&mut |resolve, _reject| {
        let _ = set_timeout.call2(&global, &resolve, &0.into());
    });
    let _ = wasm_bindgen_futures::JsFuture::from(p).await;
}
