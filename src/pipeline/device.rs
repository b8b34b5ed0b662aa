//! Which device a pipeline runs on: a GPU adapter through wgpu, or the CPU backend
//! ([`Device::cpu`]). `auto` takes a hardware GPU when there is one and the CPU backend otherwise, also
//! when the only adapter is a software rasteriser (lavapipe, SwiftShader, WARP): on the same cores the
//! CPU backend's kernels are several times faster than a CPU emulating a GPU (`cargo bench --bench
//! model -- --device`, docs/models-and-formats.md).

use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::{Device, DeviceOptions};

/// The device a front end asks for (`--device`, JS `device`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// A hardware GPU when there is one, else the CPU backend.
    #[default]
    Auto,
    /// A GPU adapter (any, software ones included); an error when there is none.
    Gpu,
    /// The CPU backend.
    Cpu,
}

impl DeviceChoice {
    pub fn name(self) -> &'static str {
        match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Gpu => "gpu",
            DeviceChoice::Cpu => "cpu",
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = Error;

    /// `auto`, `gpu` (or `webgpu`) and `cpu`.
    fn from_str(s: &str) -> Result<DeviceChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "gpu" | "webgpu" => Ok(DeviceChoice::Gpu),
            "cpu" => Ok(DeviceChoice::Cpu),
            other => Err(Error::InvalidInput(format!(
                "unknown device '{other}' (expected auto, gpu/webgpu or cpu)"
            ))),
        }
    }
}

/// What a front end knows of the GPU adapter before it chooses a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdapterProbe {
    /// No adapter: WebGPU not exposed, or the request failed (the reason).
    Missing(String),
    /// A software rasteriser (lavapipe, SwiftShader, WARP, a WebGPU fallback adapter), by name.
    Software(String),
    /// A hardware GPU, by name.
    Hardware(String),
}

/// The backend a pipeline runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The GPU adapter through wgpu (WebGPU in browsers).
    Gpu,
    /// The CPU backend ([`Device::cpu`]).
    Cpu,
}

/// The device decision and its reason, for front ends to print or return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceDecision {
    pub backend: Backend,
    pub reason: String,
}

/// The one `device` rule: `cpu` and `gpu` are taken as asked (`gpu` with no adapter fails when it is
/// opened); `auto` takes a hardware adapter and the CPU backend otherwise.
pub fn decide_device(choice: DeviceChoice, probe: &AdapterProbe) -> DeviceDecision {
    let (backend, reason) = match (choice, probe) {
        (DeviceChoice::Cpu, _) => (Backend::Cpu, "device cpu asked for".to_string()),
        (DeviceChoice::Gpu, _) => (Backend::Gpu, "device gpu asked for".to_string()),
        (DeviceChoice::Auto, AdapterProbe::Hardware(name)) => {
            (Backend::Gpu, format!("a hardware GPU adapter ({name})"))
        }
        (DeviceChoice::Auto, AdapterProbe::Software(name)) => (
            Backend::Cpu,
            format!("the only GPU adapter is a software one ({name}); running on the CPU backend"),
        ),
        (DeviceChoice::Auto, AdapterProbe::Missing(why)) => (
            Backend::Cpu,
            format!("no GPU adapter ({why}); running on the CPU backend"),
        ),
    };
    DeviceDecision { backend, reason }
}

/// Open `choice` (see [`DeviceChoice`]) with the decision made and its reason.
pub async fn open_device_decided(
    choice: DeviceChoice,
    opts: DeviceOptions,
) -> Result<(Arc<Device>, DeviceDecision)> {
    if choice == DeviceChoice::Cpu {
        return Ok((
            cpu_device(),
            decide_device(choice, &AdapterProbe::Missing(String::new())),
        ));
    }
    let opened = Device::new(opts).await;
    let probe = match &opened {
        Err(e) => AdapterProbe::Missing(e.to_string()),
        Ok(g) if g.caps.is_cpu => AdapterProbe::Software(g.caps.adapter_name.clone()),
        Ok(g) => AdapterProbe::Hardware(g.caps.adapter_name.clone()),
    };
    let decision = decide_device(choice, &probe);
    let gpu = match decision.backend {
        Backend::Gpu => opened?,
        Backend::Cpu => cpu_device(),
    };
    if choice == DeviceChoice::Auto {
        log::info!("device auto: {}", decision.reason);
    }
    Ok((gpu, decision))
}

/// Open `choice` (see [`DeviceChoice`]).
pub async fn open_device(choice: DeviceChoice, opts: DeviceOptions) -> Result<Arc<Device>> {
    open_device_decided(choice, opts).await.map(|(g, _)| g)
}

/// The CPU backend on every thread the kernels may use.
pub fn cpu_device() -> Arc<Device> {
    Device::cpu(crate::cpu::par::threads())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decides_each_request_against_each_adapter() {
        let hw = AdapterProbe::Hardware("RTX".into());
        let sw = AdapterProbe::Software("llvmpipe".into());
        let none = AdapterProbe::Missing("no adapter".into());
        // (asked, adapter, backend, words the reason holds)
        let table = [
            (
                DeviceChoice::Auto,
                &hw,
                Backend::Gpu,
                "hardware GPU adapter (RTX)",
            ),
            (
                DeviceChoice::Auto,
                &sw,
                Backend::Cpu,
                "software one (llvmpipe)",
            ),
            (
                DeviceChoice::Auto,
                &none,
                Backend::Cpu,
                "no GPU adapter (no adapter)",
            ),
            (DeviceChoice::Gpu, &hw, Backend::Gpu, "device gpu asked for"),
            (DeviceChoice::Gpu, &sw, Backend::Gpu, "device gpu asked for"),
            (
                DeviceChoice::Gpu,
                &none,
                Backend::Gpu,
                "device gpu asked for",
            ),
            (DeviceChoice::Cpu, &hw, Backend::Cpu, "device cpu asked for"),
            (DeviceChoice::Cpu, &sw, Backend::Cpu, "device cpu asked for"),
            (
                DeviceChoice::Cpu,
                &none,
                Backend::Cpu,
                "device cpu asked for",
            ),
        ];
        for (asked, probe, backend, words) in table {
            let d = decide_device(asked, probe);
            assert_eq!(d.backend, backend, "{asked:?} with {probe:?}");
            assert!(
                d.reason.contains(words),
                "{asked:?} with {probe:?}: {}",
                d.reason
            );
        }
    }

    #[test]
    fn device_names_parse_back() {
        for d in [DeviceChoice::Auto, DeviceChoice::Gpu, DeviceChoice::Cpu] {
            assert_eq!(d.name().parse::<DeviceChoice>().ok(), Some(d));
        }
        assert_eq!(
            "WebGPU".parse::<DeviceChoice>().ok(),
            Some(DeviceChoice::Gpu)
        );
        assert!("tpu".parse::<DeviceChoice>().is_err());
    }
}
