//! The `auto` weight format: the best-quality format whose estimate fits the device. Quality order
//! fp16, q8, then two mixes, then q4 (fp16 gives the f32 reference's answers, q8 moves some, q4 more:
//! README "Weight precision"); fp32 only when asked for. The CPU backend takes the same order: its
//! README section keeps fp16 as the default (identical answers) and reports the smaller formats only
//! as faster.
//!
//! The mixes ([`AUTO_MIXES`]) sit between q8 and q4, where the q4 policy study (docs/performance.md,
//! PyTorch on 100 held-out demo scenes) found the loss: q4 costs 4.3 OD mAP@0.5 points against fp32
//! (q8 none); the text model (encoder, decoder, embed) in q8 over a q4 vision tower recovers 2.2 of
//! them and reads better than fp32 (OCR 0.647 against 0.619) for 69 MB more than q4 at base shapes,
//! the shared embedding / LM head alone in q8 recovers 1.9 for 20 MB. Each is smaller than q8 and
//! loses less than q4, so a device that q8 does not fit gets one of them before q4. A mix above q8 (fp16 vision, q8 text) is not offered:
//! q8 already gives fp32's task figures there, so it would only cost memory.
//!
//! A format fits when its largest buffer fits the device's `min(maxBufferSize,
//! maxStorageBufferBindingSize)` and its peak fits the budget of the device's class:
//!
//! - mobile, 1.0 GB: iOS kills the web content process at about 1.5 GB, which is why WebKit caps WebGPU
//!   buffers at 1 GB there (WebKit/WebKit#49472); Android Chrome tabs are usually given less (older
//!   phones far less); the page, the wasm heap and the decoded image need the rest.
//! - integrated, 2.0 GB: the GPU shares system memory with the browser and the OS (8 GB laptops).
//! - discrete, 4.0 GB: the smallest common dedicated memory.
//! - cpu, 3.0 GB: the CPU backend's tensors live in wasm memory, at most 4 GiB (wasm32; V8, "Up to 4GB
//!   of memory in WebAssembly", 2020).

use crate::error::{Error, Result};
use crate::estimate::Estimate;
use crate::weights::{DTypePlan, WeightDType};

/// Kinds of device with their own memory budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    /// A phone or tablet GPU (iOS, Android).
    Mobile,
    /// A GPU sharing system memory.
    Integrated,
    /// A GPU with its own memory.
    Discrete,
    /// The CPU backend (or a software adapter).
    Cpu,
}

impl DeviceClass {
    /// Peak bytes a request may hold on this class (see the module's table).
    pub fn budget(self) -> u64 {
        match self {
            DeviceClass::Mobile => 1_000_000_000,
            DeviceClass::Integrated => 2_000_000_000,
            DeviceClass::Discrete => 4_000_000_000,
            DeviceClass::Cpu => 3_000_000_000,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceClass::Mobile => "mobile",
            DeviceClass::Integrated => "integrated",
            DeviceClass::Discrete => "discrete",
            DeviceClass::Cpu => "cpu",
        }
    }

    /// The class of an adapter from what it reports: its type (wgpu's `DeviceType` name natively:
    /// "DiscreteGpu", "IntegratedGpu", "Cpu", ...; empty in the browser, which does not say), whether
    /// it is a software or fallback adapter, and whether the platform is a phone or tablet (the
    /// browser's user agent). Unknown GPUs count as integrated (the smaller budget).
    pub fn of_adapter(device_type: &str, software: bool, mobile: bool) -> DeviceClass {
        let t = device_type.to_ascii_lowercase();
        if software || t == "cpu" {
            DeviceClass::Cpu
        } else if mobile {
            DeviceClass::Mobile
        } else if t.contains("discrete") {
            DeviceClass::Discrete
        } else {
            DeviceClass::Integrated
        }
    }
}

impl std::fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the chooser knows of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    pub class: DeviceClass,
    /// Peak bytes a request may hold: the class's [`DeviceClass::budget`] unless overridden.
    pub budget: u64,
    /// `maxBufferSize`.
    pub max_buffer: u64,
    /// `maxStorageBufferBindingSize`.
    pub max_binding: u64,
}

impl DeviceLimits {
    /// The largest buffer the chooser lets a format have.
    pub fn buffer_cap(&self) -> u64 {
        self.max_buffer.min(self.max_binding)
    }
}

/// The chosen format (or mix) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub dtype: DTypePlan,
    pub reason: String,
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// Whether `e` fits `limits`, and a sentence saying so (or what is over).
pub fn fits(e: &Estimate, limits: &DeviceLimits) -> (bool, String) {
    let (cap, budget) = (limits.buffer_cap(), limits.budget);
    let mut over = Vec::new();
    if e.largest_buffer_bytes > cap {
        over.push(format!(
            "its largest buffer {} exceeds the device's {} buffer limit",
            mb(e.largest_buffer_bytes),
            mb(cap)
        ));
    }
    if e.peak_bytes > budget {
        over.push(format!(
            "its peak {} exceeds the {} budget of {}",
            mb(e.peak_bytes),
            limits.class,
            mb(budget)
        ));
    }
    if over.is_empty() {
        let msg = format!(
            "peak {} within the {} budget of {}, largest buffer {} within the {} buffer limit",
            mb(e.peak_bytes),
            limits.class,
            mb(budget),
            mb(e.largest_buffer_bytes),
            mb(cap)
        );
        (true, msg)
    } else {
        (false, over.join("; "))
    }
}

/// How far `e` is from fitting: the larger of its peak over the budget and its largest buffer over
/// the buffer cap, as a ratio (<= 1 fits).
fn overshoot(e: &Estimate, limits: &DeviceLimits) -> f64 {
    let peak = e.peak_bytes as f64 / limits.budget as f64;
    let buf = e.largest_buffer_bytes as f64 / limits.buffer_cap().max(1) as f64;
    peak.max(buf)
}

/// The mixes `auto` considers (module doc): q4 with the text model in q8, q4 with the shared
/// embedding / LM head in q8.
pub const AUTO_MIXES: [DTypePlan; 2] = {
    use WeightDType::{Q4, Q8};
    [
        DTypePlan::vision_text(Q4, Q8),
        DTypePlan::from_parts([Q4, Q4, Q4, Q4, Q8]),
    ]
};

/// The formats `auto` tries on a device class, best quality first.
pub fn preference(_class: DeviceClass) -> [DTypePlan; 5] {
    [
        DTypePlan::uniform(WeightDType::Fp16),
        DTypePlan::uniform(WeightDType::Q8),
        AUTO_MIXES[0],
        AUTO_MIXES[1],
        DTypePlan::uniform(WeightDType::Q4),
    ]
}

/// Whether `e` is a mix that holds exactly q4's bytes (a model whose embedding rows are not whole
/// quantization blocks keeps them f16 in both): it would only rename q4, so `auto` passes over it.
fn same_as_q4(e: &Estimate, estimates: &[Estimate]) -> bool {
    let q4 = DTypePlan::uniform(WeightDType::Q4);
    e.dtype.as_uniform().is_none()
        && estimates
            .iter()
            .find(|x| x.dtype == q4)
            .is_some_and(|x| x.part_bytes == e.part_bytes && x.peak_bytes == e.peak_bytes)
}

/// The best-quality format among `estimates` (one per format) that fits `limits`, with the reason;
/// [`Error::NoFittingDType`] naming the closest format and by how much it misses when none fits.
pub fn choose_dtype(estimates: &[Estimate], limits: &DeviceLimits) -> Result<Choice> {
    let mut tried = Vec::new();
    for d in preference(limits.class) {
        let Some(e) = estimates.iter().find(|e| e.dtype == d) else {
            continue;
        };
        if same_as_q4(e, estimates) {
            continue;
        }
        let (ok, why) = fits(e, limits);
        if ok {
            let mut reason = format!("auto chose {d} for this {} device: {why}", limits.class);
            if !tried.is_empty() {
                reason.push_str(&format!(" (not {})", tried.join("; not ")));
            }
            return Ok(Choice { dtype: d, reason });
        }
        tried.push(format!("{d}: {why}"));
    }
    let closest = preference(limits.class)
        .iter()
        .filter_map(|d| estimates.iter().find(|e| e.dtype == *d))
        .filter(|e| !same_as_q4(e, estimates))
        .min_by(|a, b| overshoot(a, limits).total_cmp(&overshoot(b, limits)));
    let msg = match closest {
        Some(e) => {
            let mut short = Vec::new();
            if e.peak_bytes > limits.budget {
                short.push(format!(
                    "its peak {} is {} over the budget",
                    mb(e.peak_bytes),
                    mb(e.peak_bytes - limits.budget)
                ));
            }
            if e.largest_buffer_bytes > limits.buffer_cap() {
                short.push(format!(
                    "its largest buffer {} is {} over the buffer limit",
                    mb(e.largest_buffer_bytes),
                    mb(e.largest_buffer_bytes - limits.buffer_cap())
                ));
            }
            format!(
                "no weight format fits this {} device ({} budget, {} buffer limit): {} came closest \
                 ({}); {}",
                limits.class,
                mb(limits.budget),
                mb(limits.buffer_cap()),
                e.dtype,
                short.join(", "),
                tried.join("; ")
            )
        }
        None => "no estimate to choose a weight format from".to_owned(),
    };
    Err(Error::NoFittingDType(msg))
}
