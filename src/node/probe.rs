//! `probeGpu()`: the GPU adapter native wgpu opens here, as `device: "auto"` judges it (a hardware
//! adapter runs the model on the GPU; a software one, such as lavapipe, or none leaves it on the CPU).

use napi::Task;
use napi_derive::napi;

use crate::gpu::{Device, DeviceOptions};

/// What `probeGpu()` resolves to.
#[napi(object)]
pub struct GpuProbe {
    /// True when the adapter is a hardware GPU: `device: "auto"` runs on it.
    pub hardware: bool,
    /// The adapter's name; empty without one.
    pub adapter: String,
    /// Why `auto` takes the CPU (a software adapter, or the error that left none); empty on hardware.
    pub reason: String,
}

pub struct ProbeTask;

impl Task for ProbeTask {
    type Output = GpuProbe;
    type JsValue = GpuProbe;

    fn compute(&mut self) -> napi::Result<GpuProbe> {
        super::guarded("probeGpu", || {
            Ok(
                match pollster::block_on(Device::new(DeviceOptions::default())) {
                    Err(e) => GpuProbe {
                        hardware: false,
                        adapter: String::new(),
                        reason: format!("no GPU adapter: {e}"),
                    },
                    Ok(d) if d.caps.is_cpu => GpuProbe {
                        hardware: false,
                        adapter: d.caps.adapter_name.clone(),
                        reason: format!(
                            "the only GPU adapter is a software one ({})",
                            d.caps.adapter_name
                        ),
                    },
                    Ok(d) => GpuProbe {
                        hardware: true,
                        adapter: d.caps.adapter_name.clone(),
                        reason: String::new(),
                    },
                },
            )
        })
    }

    fn resolve(&mut self, _env: napi::Env, probe: GpuProbe) -> napi::Result<GpuProbe> {
        Ok(probe)
    }
}

/// Opens (and drops) the default GPU adapter on the thread pool.
#[napi]
pub fn probe_gpu() -> napi::bindgen_prelude::AsyncTask<ProbeTask> {
    napi::bindgen_prelude::AsyncTask::new(ProbeTask)
}
