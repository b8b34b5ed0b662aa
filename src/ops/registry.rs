//! The kernel registry: which variant runs an op for a given weight format and shape class.
//!
//! Several launchers have more than one kernel for the same op (tiled vs. register-blocked vs. subgroup
//! GEMMs, GEMVs for decode). Which is fastest depends on the adapter: a workgroup-memory tile wins on a
//! discrete GPU, barrier-free register blocks win on CPU adapters. Every launcher with variants asks the
//! [`Choices`] table of its [`Gpu`](crate::gpu::Gpu) first; the table is filled by the on-device tuner
//! ([`crate::ops::tune`]) or from its cache, and is empty with tuning off, in which case the launcher
//! falls back to its static choice (`choose_*_variant`).
//!
//! To add a variant (a new kernel, or a kernel for a new weight format): add it to the op's variant enum
//! (`LinearVariant` in `matmul.rs`) with its name, its entry in `ALL` and its `supports` rule; the tuner
//! then times it wherever it `supports` the shape, and a cached choice naming it is honoured.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::gpu::DType;

/// An op that has variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// `ops::matmul::linear`: out (M, N) = x (M, K) @ w (N, K)^T (+ bias, GELU).
    Linear,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Linear => "linear",
        }
    }

    pub fn from_name(s: &str) -> Option<OpKind> {
        match s {
            "linear" => Some(OpKind::Linear),
            _ => None,
        }
    }
}

/// Rows up to this count form one class each (decode: one row per beam); above it rows are bucketed by
/// powers of two, so one tuned choice covers every prompt length of the same order.
pub const EXACT_ROWS: usize = 4;

/// Largest row bucket; all larger row counts share it.
pub const MAX_ROW_CLASS: usize = 1 << 16;

/// The row class of `m` rows: `m` itself up to [`EXACT_ROWS`], else the next power of two (capped).
pub fn row_class(m: usize) -> usize {
    if m <= EXACT_ROWS {
        m
    } else {
        m.next_power_of_two().min(MAX_ROW_CLASS)
    }
}

/// What a choice is keyed by: the op, the weight format and the shape class (for linear: row class, N,
/// K; N and K are exact because a model has only a handful of distinct layer widths).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShapeClass {
    pub op: OpKind,
    pub format: DType,
    pub dims: [usize; 3],
}

impl ShapeClass {
    /// The class of a linear with `m` rows of `k` inputs and `n` outputs, weights in `format`.
    pub fn linear(m: usize, n: usize, k: usize, format: DType) -> Self {
        ShapeClass {
            op: OpKind::Linear,
            format,
            dims: [row_class(m), n, k],
        }
    }

    /// "linear f16 M~1024 N=768 K=3072" (for tables and logs).
    pub fn describe(&self) -> String {
        let [m, n, k] = self.dims;
        let fmt = format!("{:?}", self.format).to_lowercase();
        let rows = if m <= EXACT_ROWS {
            format!("M={m}")
        } else {
            format!("M<={m}")
        };
        format!("{} {fmt} {rows} N={n} K={k}", self.op.name())
    }
}

/// The chosen variant (by name) per shape class, for one device. Filled by the tuner; read by the
/// launchers on every dispatch (a short critical section: one hash lookup).
#[derive(Default, Debug)]
pub struct Choices {
    map: Mutex<HashMap<ShapeClass, &'static str>>,
}

impl Choices {
    pub fn get(&self, class: &ShapeClass) -> Option<&'static str> {
        self.map.lock().ok().and_then(|m| m.get(class).copied())
    }

    pub fn set(&self, class: ShapeClass, variant: &'static str) {
        if let Ok(mut m) = self.map.lock() {
            m.insert(class, variant);
        }
    }

    /// Forget every choice (launchers return to their static choice).
    pub fn clear(&self) {
        if let Ok(mut m) = self.map.lock() {
            m.clear();
        }
    }

    /// All choices, sorted by class description.
    pub fn snapshot(&self) -> Vec<(ShapeClass, &'static str)> {
        let mut v: Vec<_> = self
            .map
            .lock()
            .map(|m| m.iter().map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default();
        v.sort_by_key(|(c, _)| c.describe());
        v
    }

    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Parse a weight-format name as written in the tuning cache (`DType`'s debug name).
pub fn format_from_name(s: &str) -> Option<DType> {
    match s {
        "F32" => Some(DType::F32),
        "F16" => Some(DType::F16),
        "U32" => Some(DType::U32),
        "Q8" => Some(DType::Q8),
        "Q4" => Some(DType::Q4),
        _ => None,
    }
}
