//! Which device a pipeline runs on: a GPU adapter through wgpu, or the CPU backend
//! ([`Gpu::cpu`]). `auto` takes a hardware GPU when there is one and the CPU backend otherwise, also
//! when the only adapter is a software rasteriser (lavapipe, SwiftShader, WARP): on the same cores the
//! CPU backend's kernels are several times faster than a CPU emulating a GPU (`cargo bench --bench
//! model -- --device`, README).

use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuOptions};

/// The device a front end asks for (`--device`, JS `device`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// A hardware GPU when there is one, else the CPU backend.
    #[default]
    Auto,
    /// A GPU adapter (any, software ones included); an error when there is none.
    Gpu,
    /// The CPU backend.
    Cpu,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Auto => "auto",
            Device::Gpu => "gpu",
            Device::Cpu => "cpu",
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    /// `auto`, `gpu` (or `webgpu`) and `cpu`.
    fn from_str(s: &str) -> Result<Device> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Device::Auto),
            "gpu" | "webgpu" => Ok(Device::Gpu),
            "cpu" => Ok(Device::Cpu),
            other => Err(Error::InvalidInput(format!(
                "unknown device '{other}' (expected auto, gpu/webgpu or cpu)"
            ))),
        }
    }
}

/// Open `choice` (see [`Device`]).
pub async fn open_device(choice: Device, opts: GpuOptions) -> Result<Arc<Gpu>> {
    match choice {
        Device::Cpu => Ok(cpu_device()),
        Device::Gpu => Gpu::new(opts).await,
        Device::Auto => match Gpu::new(opts).await {
            Ok(g) if !g.caps.is_cpu => Ok(g),
            Ok(g) => {
                log::info!(
                    "the only GPU adapter is a software one ({}); running on the CPU backend",
                    g.caps.adapter_name
                );
                Ok(cpu_device())
            }
            Err(e) => {
                log::info!("no GPU adapter ({e}); running on the CPU backend");
                Ok(cpu_device())
            }
        },
    }
}

/// The CPU backend on every thread the kernels may use.
pub fn cpu_device() -> Arc<Gpu> {
    Gpu::cpu(crate::cpu::par::threads())
}
