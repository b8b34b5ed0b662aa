//! Adapter and device creation. We ask the adapter for its own limits (not WebGPU's conservative
//! defaults): Florence-2 needs large storage bindings (the 51328x768 shared embedding is 157.7 MB) and
//! as many invocations per workgroup as the device allows. Optional features (subgroups, timestamp
//! queries) are requested only when the adapter has them; kernels pick a variant from [`Caps`]. f16
//! weights need no feature: the kernels unpack them from u32 words (`unpack2x16float`, core WGSL).

use std::future::Future;
use std::sync::{Arc, Mutex};

use super::registry::Choices;
use crate::error::{Error, Result};
use crate::gpu::kernel::KernelCache;
use crate::gpu::profile::Profiler;
use crate::gpu::tensor::{MemCounter, MemReport};

/// Largest host tensor of the CPU backend (bytes): far above any Florence-2 tensor, and below what
/// a 32-bit address space could hold at all.
const HOST_MAX_TENSOR: u64 = if usize::BITS == 32 { 1 << 31 } else { 1 << 40 };

/// What the caller may tune when opening the device.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Lower the storage-binding limit below the adapter's (tests use this to exercise split bindings
    /// cheaply). `None` keeps the adapter's limit.
    pub max_storage_binding_size: Option<u64>,
    /// Never request SUBGROUP even if available.
    pub disable_subgroups: bool,
}

/// The capabilities kernels choose their variant from.
#[derive(Clone, Debug)]
pub struct Caps {
    pub subgroups: bool,
    pub timestamp_query: bool,
    /// Smallest subgroup size the adapter may run (0 when subgroups are off).
    pub subgroup_min_size: u32,
    pub max_storage_binding: u64,
    pub max_buffer: u64,
    pub max_invocations: u32,
    pub max_workgroup_storage: u32,
    pub max_storage_buffers_per_stage: u32,
    /// Byte alignment of a storage binding's offset.
    pub storage_offset_alignment: u32,
    /// Byte alignment of a uniform binding's offset.
    pub uniform_offset_alignment: u32,
    /// Adapter description, for logs and benchmark tables.
    pub adapter_name: String,
    pub backend: String,
    /// True for CPU adapters (lavapipe, SwiftShader, WARP).
    pub is_cpu: bool,
    /// The adapter's type as wgpu names it ("DiscreteGpu", "IntegratedGpu", "VirtualGpu", "Cpu",
    /// "Other"; the browser does not say, and wgpu reports "Other" there); "Cpu" on the CPU backend.
    pub device_type: String,
    /// Everything that identifies this adapter for a cached kernel choice: vendor, device, architecture
    /// (the device id), driver and its description, backend, the features in use and the limits.
    pub adapter_key: String,
}

/// Which backend runs a device's ops: the one place the backends are named. Every op launcher
/// (`crate::ops`) dispatches on it in one `match` ([`crate::gpu::Recorder::backend`]): the `Wgpu` arm
/// records the op's WGSL kernel, the `Host` arm runs its `crate::cpu::host` twin at once. A third
/// backend is a third variant here, its arm in each launcher, and its own folder; the model above the
/// launchers does not change.
pub enum Backend {
    /// A wgpu adapter (a GPU, or a software one such as lavapipe): tensors are wgpu buffers.
    Wgpu(Wgpu),
    /// The host CPU ([`Device::cpu`]): tensors live in host memory (`crate::gpu::host`).
    Host,
}

impl Backend {
    /// Whether ops recorded here can be kept as a [`crate::gpu::Plan`] and replayed (the decoder's step
    /// plan); the host runs each op as it is recorded.
    pub fn records_plans(&self) -> bool {
        matches!(self, Backend::Wgpu(_))
    }

    /// Whether ops have several kernels to choose among ([`crate::gpu::tune`]); the host has one each.
    pub fn has_kernel_choices(&self) -> bool {
        matches!(self, Backend::Wgpu(_))
    }
}

/// A wgpu device and its queue.
pub struct Wgpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
}

/// The device the model runs on: a wgpu adapter (GPU, or a software one) or the host CPU
/// ([`Device::cpu`]: tensors live in host memory and every op runs its `crate::cpu` kernel at once),
/// with the kernel cache, the memory accounting and the error slots that turn wgpu's asynchronous
/// errors into `Result`s instead of panics.
pub struct Device {
    /// The backend running this device's ops.
    backend: Backend,
    pub caps: Caps,
    pub kernels: KernelCache,
    /// First uncaptured wgpu error since the last [`Device::check`].
    pub(crate) error: Arc<Mutex<Option<Fault>>>,
    /// Set once the device is lost; every later operation fails with [`Error::DeviceLost`].
    pub(crate) lost: Arc<Mutex<Option<String>>>,
    /// Uniform pages returned by finished recorders, reused by the next ones.
    pub(crate) uniform_pool: Mutex<Vec<wgpu::Buffer>>,
    /// Bind groups created so far by recorders (see [`Device::bind_groups_created`]).
    pub(crate) bind_groups: std::sync::atomic::AtomicU64,
    /// Kernel variant chosen per (op, weight format, shape class) by the tuner; empty = static choices.
    pub choices: Choices,
    /// Per-dispatch GPU times (off unless enabled; see `gpu::profile`).
    pub profiler: Profiler,
    /// GPU bytes held by live tensors (weights vs activations, current and peak).
    pub mem: Arc<MemCounter>,
}

/// An uncaptured wgpu error, kept until [`Device::check`] reports it.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    out_of_memory: bool,
    msg: String,
}

impl Fault {
    fn from_wgpu(e: &wgpu::Error) -> Fault {
        Fault {
            out_of_memory: matches!(e, wgpu::Error::OutOfMemory { .. }),
            msg: e.to_string(),
        }
    }

    fn into_error(self) -> Error {
        if self.out_of_memory {
            Error::OutOfMemory(self.msg)
        } else {
            Error::Gpu(self.msg)
        }
    }
}

/// Whether an adapter description names a software (CPU) rasteriser: lavapipe/llvmpipe, SwiftShader,
/// WARP ("Microsoft Basic Render Driver"). wgpu reports `DeviceType::Cpu` for them natively and, in the browser, when
/// `GPUAdapterInfo.isFallbackAdapter` is set; browsers that do not set it still name the architecture.
pub fn is_software_adapter(description: &str) -> bool {
    let d = description.to_ascii_lowercase();
    [
        "llvmpipe",
        "lavapipe",
        "swiftshader",
        "microsoft basic render",
    ]
    .iter()
    .any(|n| d.contains(n))
}

/// `vendor=... architecture=... device=... description=...` of the adapter the page's
/// `navigator.gpu.requestAdapter({powerPreference: "high-performance"})` gives (the request wgpu makes),
/// empty when unavailable.
#[cfg(target_arch = "wasm32")]
async fn web_adapter_info() -> String {
    use wasm_bindgen::JsCast;
    let get = |v: &wasm_bindgen::JsValue, k: &str| {
        js_sys::Reflect::get(v, &k.into()).unwrap_or(wasm_bindgen::JsValue::UNDEFINED)
    };
    let gpu = get(&get(&js_sys::global(), "navigator"), "gpu");
    let Ok(request) = get(&gpu, "requestAdapter").dyn_into::<js_sys::Function>() else {
        return String::new();
    };
    let opts = js_sys::Object::new();
    let _ = js_sys::Reflect::set(&opts, &"powerPreference".into(), &"high-performance".into());
    let Some(promise) = request
        .call1(&gpu, &opts)
        .ok()
        .and_then(|p| p.dyn_into::<js_sys::Promise>().ok())
    else {
        return String::new();
    };
    let Ok(adapter) = wasm_bindgen_futures::JsFuture::from(promise).await else {
        return String::new();
    };
    let info = get(&adapter, "info");
    if info.is_undefined() || info.is_null() {
        return String::new();
    }
    ["vendor", "architecture", "device", "description"]
        .iter()
        .map(|k| format!("{k}={}", get(&info, k).as_string().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Device {
    /// The CPU backend: no adapter; tensors are host memory and every op runs its `crate::cpu` kernel
    /// when it is recorded (natively on `rayon`'s `threads` threads, in wasm on one thread).
    // wgpu's handles are Send + Sync natively, not on wasm32 (one thread there): Arc serves both.
    #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
    pub fn cpu(threads: usize) -> Arc<Device> {
        let caps = Caps {
            subgroups: false,
            timestamp_query: false,
            subgroup_min_size: 0,
            max_storage_binding: u64::MAX,
            max_buffer: HOST_MAX_TENSOR,
            max_invocations: 1,
            max_workgroup_storage: 0,
            max_storage_buffers_per_stage: u32::MAX,
            storage_offset_alignment: 4,
            uniform_offset_alignment: 4,
            adapter_name: format!("CPU ({threads} threads)"),
            backend: "cpu".into(),
            is_cpu: true,
            device_type: "Cpu".into(),
            adapter_key: format!("cpu threads={threads}"),
        };
        Arc::new(Device {
            backend: Backend::Host,
            caps,
            kernels: KernelCache::default(),
            error: Arc::new(Mutex::new(None)),
            lost: Arc::new(Mutex::new(None)),
            uniform_pool: Mutex::new(Vec::new()),
            bind_groups: Default::default(),
            choices: Choices::default(),
            profiler: Profiler::default(),
            mem: Arc::new(MemCounter::default()),
        })
    }

    /// Whether this is the CPU backend ([`Device::cpu`]): no wgpu device, host tensors.
    pub fn is_host(&self) -> bool {
        matches!(self.backend, Backend::Host)
    }

    /// The backend running this device's ops.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The wgpu device and queue ([`Error::Gpu`] on the CPU backend, which has none).
    pub fn wgpu(&self) -> Result<&Wgpu> {
        match &self.backend {
            Backend::Wgpu(hw) => Ok(hw),
            Backend::Host => Err(Error::Gpu("the CPU backend has no GPU device".into())),
        }
    }

    /// Open the default adapter (high-performance preference) with its own limits.
    pub async fn new(opts: DeviceOptions) -> Result<Arc<Device>> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|e| Error::NoAdapter(e.to_string()))?;
        Self::from_adapter(adapter, opts).await
    }

    /// Open a device on a given adapter.
    // wgpu's handles are Send + Sync natively, not on wasm32 (one thread there): Arc serves both.
    #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
    pub async fn from_adapter(adapter: wgpu::Adapter, opts: DeviceOptions) -> Result<Arc<Device>> {
        let info = adapter.get_info();
        let alimits = adapter.limits();
        let afeatures = adapter.features();

        let mut features = wgpu::Features::empty();
        if !opts.disable_subgroups && afeatures.contains(wgpu::Features::SUBGROUP) {
            features |= wgpu::Features::SUBGROUP;
        }
        if afeatures.contains(wgpu::Features::TIMESTAMP_QUERY) {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }

        let mut limits = alimits.clone();
        if let Some(cap) = opts.max_storage_binding_size {
            limits.max_storage_buffer_binding_size =
                limits.max_storage_buffer_binding_size.min(cap);
        }

        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("florence2"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::Device(e.to_string()))?;

        let (error, lost) = watch_faults(&device);

        // In the browser wgpu reports no vendor/device ids; GPUAdapterInfo's strings identify the adapter.
        #[cfg(target_arch = "wasm32")]
        let web = web_adapter_info().await;
        #[cfg(not(target_arch = "wasm32"))]
        let web = String::new();
        let caps = caps_of(&adapter, &info, features, &limits, &web);

        Ok(Arc::new(Device {
            backend: Backend::Wgpu(Wgpu { device, queue }),
            caps,
            kernels: KernelCache::default(),
            error,
            lost,
            uniform_pool: Mutex::new(Vec::new()),
            bind_groups: Default::default(),
            choices: Choices::default(),
            profiler: Profiler::default(),
            mem: Arc::new(MemCounter::default()),
        }))
    }

    /// Destroy the wgpu device (its buffers become invalid, its lost callback runs); nothing on the
    /// CPU backend.
    pub fn destroy(&self) {
        if let Backend::Wgpu(hw) = &self.backend {
            hw.device.destroy();
        }
    }

    /// Whether the device was lost (its lost callback has run).
    pub fn is_lost(&self) -> bool {
        self.lost.lock().map(|s| s.is_some()).unwrap_or(true)
    }

    /// Run `work` inside a validation and an out-of-memory error scope, and report what they caught:
    /// an allocation that failed anywhere in `work` becomes [`Error::OutOfMemory`] (also when `work`
    /// then failed on the invalid buffer), a validation error [`Error::Gpu`], a lost device
    /// [`Error::DeviceLost`]; otherwise `work`'s own result. Because every error `work` caused is
    /// captured by the scopes, none is left behind for the next request: after an allocation failure
    /// of one request's activations the model keeps working once those are dropped.
    ///
    /// Error scopes are a stack per device (and thread): the caller must not run two `scoped` calls on
    /// one device concurrently (the browser facade serialises requests with a queue).
    pub async fn scoped<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        let Backend::Wgpu(hw) = &self.backend else {
            return work.await;
        };
        let validation = hw.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = hw.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let result = work.await;
        // Popped in reverse order of pushing; each resolves once the device has processed everything
        // issued before it.
        let oom = oom.pop().await;
        let validation = validation.pop().await;
        if let (Err(_), Some(msg)) = (&result, self.lost_message()) {
            return Err(Error::DeviceLost(msg));
        }
        if let Some(e) = oom {
            return Err(Error::OutOfMemory(e.to_string()));
        }
        match (result, validation) {
            // A GPU-side failure whose root cause is the captured validation error.
            (Err(Error::Gpu(_) | Error::Readback(_)), Some(e)) | (Ok(_), Some(e)) => {
                Err(Error::Gpu(e.to_string()))
            }
            (result, _) => result,
        }
    }

    /// Why the device was lost, once it was.
    pub fn lost_message(&self) -> Option<String> {
        self.lost.lock().ok().and_then(|s| s.clone())
    }

    /// Fail if the device was lost or an uncaptured wgpu error was recorded since the last check.
    /// Clears the recorded error so the next request starts clean.
    pub fn check(&self) -> Result<()> {
        if let Some(msg) = self.lost_message() {
            return Err(Error::DeviceLost(msg));
        }
        if let Some(fault) = self.error.lock().ok().and_then(|mut s| s.take()) {
            return Err(fault.into_error());
        }
        Ok(())
    }

    /// Block (natively) until all submitted work is done. A no-op in the browser, where the event loop
    /// drives the queue and readbacks are awaited instead.
    pub fn wait_idle(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        if let Backend::Wgpu(hw) = &self.backend {
            hw.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(e.to_string()))?;
        }
        self.check()
    }

    /// Until all submitted work is done: natively [`Device::wait_idle`]; in the browser an await of the
    /// queue's `onSubmittedWorkDone()` (the event loop keeps running). Also surfaces a device loss or an
    /// uncaptured GPU error.
    pub async fn finished(&self) -> Result<()> {
        #[cfg(target_arch = "wasm32")]
        if let Backend::Wgpu(hw) = &self.backend {
            let (tx, rx) = futures_channel::oneshot::channel();
            hw.queue.on_submitted_work_done(move || {
                let _ = tx.send(());
            });
            let _ = rx.await;
        }
        self.wait_idle()
    }

    /// GPU memory held by tensors now, and the peak since the device opened or the last
    /// [`Device::reset_peak_memory`].
    /// Bind groups created on this device so far (every [`crate::gpu::Recorder::dispatch`] creates one;
    /// replaying a recorded [`crate::gpu::Plan`] creates none). Tests use it to prove that a decode step
    /// replays its plan instead of recording again.
    pub fn bind_groups_created(&self) -> u64 {
        self.bind_groups.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn memory(&self) -> MemReport {
        self.mem.report()
    }

    /// Start a new peak-memory window (e.g. at the start of a request).
    pub fn reset_peak_memory(&self) {
        self.mem.reset_peak()
    }

    /// A short human-readable description of the adapter and the features in use.
    pub fn describe(&self) -> String {
        let c = &self.caps;
        if self.is_host() {
            return format!("{} (CPU backend)", c.adapter_name);
        }
        format!(
            "{} ({}; subgroups={} (min {}) max_binding={} MiB max_invocations={})",
            c.adapter_name,
            c.backend,
            c.subgroups,
            c.subgroup_min_size,
            c.max_storage_binding >> 20,
            c.max_invocations
        )
    }
}

/// A slot a device callback fills and the next submit or readback reports.
type Slot<T> = Arc<Mutex<Option<T>>>;

/// Route `device`'s uncaptured errors and loss into slots the next submit or readback reports.
fn watch_faults(device: &wgpu::Device) -> (Slot<Fault>, Slot<String>) {
    // wgpu's default handler panics on an uncaptured error; record it instead and surface it as
    // `Error::Gpu` at the next submit or readback.
    // An out-of-memory error keeps its kind, so it reaches the caller as `Error::OutOfMemory`.
    let error: Arc<Mutex<Option<Fault>>> = Arc::new(Mutex::new(None));
    let slot = error.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        if let Ok(mut s) = slot.lock() {
            if s.is_none() {
                *s = Some(Fault::from_wgpu(&e));
            }
        }
    }));
    let lost: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let lslot = lost.clone();
    device.set_device_lost_callback(move |reason, msg| {
        if let Ok(mut s) = lslot.lock() {
            *s = Some(format!("{reason:?}: {msg}"));
        }
    });
    (error, lost)
}

/// The capabilities of a device opened on `adapter` with `features` and `limits`; `web` is the
/// browser's adapter description (empty natively).
fn caps_of(
    adapter: &wgpu::Adapter,
    info: &wgpu::AdapterInfo,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    web: &str,
) -> Caps {
    let subgroups = features.contains(wgpu::Features::SUBGROUP);
    let adapter_name = if info.name.is_empty() && !web.is_empty() {
        web.to_string()
    } else {
        info.name.clone()
    };
    Caps {
        subgroups,
        timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
        subgroup_min_size: if subgroups {
            adapter.get_info().subgroup_min_size
        } else {
            0
        },
        max_storage_binding: limits.max_storage_buffer_binding_size,
        max_buffer: limits.max_buffer_size,
        max_invocations: limits.max_compute_invocations_per_workgroup,
        max_workgroup_storage: limits.max_compute_workgroup_storage_size,
        max_storage_buffers_per_stage: limits.max_storage_buffers_per_shader_stage,
        storage_offset_alignment: limits.min_storage_buffer_offset_alignment,
        uniform_offset_alignment: limits.min_uniform_buffer_offset_alignment,
        is_cpu: info.device_type == wgpu::DeviceType::Cpu
            || is_software_adapter(&format!("{} {web}", info.name)),
        device_type: format!("{:?}", info.device_type),
        adapter_name,
        backend: format!("{:?}", info.backend),
        adapter_key: format!(
            "vendor={:#x} device={:#x} name={} type={:?} driver={} driver_info={} backend={:?} \
             {web} features={:?} limits={:?}",
            info.vendor,
            info.device,
            info.name,
            info.device_type,
            info.driver,
            info.driver_info,
            info.backend,
            features,
            limits
        ),
    }
}
