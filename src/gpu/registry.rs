//! The kernel registry: which variant runs an op for a given weight format and shape class.
//!
//! Several launchers have more than one kernel for the same op (tiled vs. register-blocked vs. subgroup
//! GEMMs, GEMVs for decode). Which is fastest depends on the adapter: a workgroup-memory tile wins on a
//! discrete GPU, barrier-free register blocks win on CPU adapters. Every launcher with variants asks the
//! [`Choices`] table of its [`Device`](crate::gpu::Device) first; the table is filled by the on-device tuner
//! ([`crate::gpu::tune`]) or from its cache, and is empty with tuning off, in which case the launcher
//! falls back to its static choice (`choose_*_variant`).
//!
//! To add a variant (a new kernel, or a kernel for a new weight format): add it to the op's variant enum
//! (`LinearVariant` in `matmul.rs`, `AttnVariant` in `attention.rs`, `WindowAttnVariant` in
//! `window_attn.rs`) with its name, its entry in `ALL` and its `supports` rule; the op's tune case
//! (`ops/linear_tune.rs`, `AttnShape`, `WindowShape`) then offers it wherever it `supports` the shape,
//! and a cached choice naming it is honoured.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::gpu::DType;

/// An op that has variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// `ops::matmul::linear`: out (M, N) = x (M, K) @ w (N, K)^T (+ bias, GELU).
    Linear,
    /// `ops::attention::attention`: multi-head softmax(q k^T * scale + mask) v.
    Attention,
    /// `ops::window_attn::window_attention`: DaViT window attention over the fused qkv output.
    WindowAttention,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Linear => "linear",
            OpKind::Attention => "attention",
            OpKind::WindowAttention => "window_attention",
        }
    }

    pub fn from_name(s: &str) -> Option<OpKind> {
        match s {
            "linear" => Some(OpKind::Linear),
            "attention" => Some(OpKind::Attention),
            "window_attention" => Some(OpKind::WindowAttention),
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
/// K; N and K are exact because a model has only a handful of distinct layer widths). Attention classes
/// keep three dims too (the tuning cache stores three): rows, keys and a packed head word
/// ([`pack_heads`]: head dim, heads, causal, masked); their format is always f32.
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

    /// The class of an attention call with `rows` query rows in all (B * Tq), `tk` allocated key rows
    /// (not the fill, so a decode step keeps one class as its cache fills), head dim `d`, `heads`
    /// heads, causal, masked: rows and keys bucketed like linear rows.
    pub fn attention(
        rows: usize,
        tk: usize,
        d: usize,
        heads: usize,
        causal: bool,
        masked: bool,
    ) -> Self {
        ShapeClass {
            op: OpKind::Attention,
            format: DType::F32,
            dims: [
                row_class(rows),
                row_class(tk),
                pack_heads(d, heads, causal, masked),
            ],
        }
    }

    /// The class of a window attention over `windows` windows of `t` tokens (exact: a model has one or
    /// two window sizes), head dim `d`, `heads` heads.
    pub fn window_attention(windows: usize, t: usize, d: usize, heads: usize) -> Self {
        ShapeClass {
            op: OpKind::WindowAttention,
            format: DType::F32,
            dims: [row_class(windows), t, pack_heads(d, heads, false, false)],
        }
    }

    /// "linear f16 M~1024 N=768 K=3072" (for tables and logs).
    pub fn describe(&self) -> String {
        let [m, n, k] = self.dims;
        let bucket = |name: &str, x: usize| {
            if x <= EXACT_ROWS {
                format!("{name}={x}")
            } else {
                format!("{name}<={x}")
            }
        };
        match self.op {
            OpKind::Linear => {}
            OpKind::Attention | OpKind::WindowAttention => {
                let (d, heads, causal, masked) = unpack_heads(k);
                let (rows, keys) = if self.op == OpKind::Attention {
                    (bucket("M", m), bucket("Tk", n))
                } else {
                    (bucket("nW", m), format!("T={n}"))
                };
                let flags = match (causal, masked) {
                    (false, false) => "",
                    (true, false) => " causal",
                    (false, true) => " masked",
                    (true, true) => " causal masked",
                };
                return format!("{} {rows} {keys} D={d} H={heads}{flags}", self.op.name());
            }
        }
        let fmt = format!("{:?}", self.format).to_lowercase();
        format!("{} {fmt} {} N={n} K={k}", self.op.name(), bucket("M", m))
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

/// A linear layer's call shape: x (M, K) @ w (N, K)^T with weights in `format` (the exact shape a
/// [`ShapeClass::linear`] buckets). Its tune case (candidates, shrinking, operands) is
/// `ops/linear_tune.rs`, beside the launcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub format: DType,
}

impl LinearShape {
    pub fn class(&self) -> ShapeClass {
        ShapeClass::linear(self.m, self.n, self.k, self.format)
    }

    /// Floating-point operations of one call.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Bytes of its weight matrix.
    pub fn weight_bytes(&self) -> f64 {
        (self.n * self.format.row_bytes(self.k)) as f64
    }

    /// The estimated cost of one call used to rank classes: its FLOPs plus [`BYTE_COST`] per weight
    /// byte (a decode step's GEMVs are bound by reading their weights, not by arithmetic).
    pub fn cost(&self) -> f64 {
        self.flops() + BYTE_COST * self.weight_bytes()
    }
}

/// FLOPs one weight byte read is worth in [`LinearShape::cost`] (about a GPU's or CPU's arithmetic to
/// memory bandwidth ratio).
pub const BYTE_COST: f64 = 16.0;

/// Head dim, heads and the causal / masked flags of an attention class in one dim: 12 bits of head dim,
/// 12 of heads (values above 4095 saturate: no such model exists, and the class only groups shapes).
pub fn pack_heads(d: usize, heads: usize, causal: bool, masked: bool) -> usize {
    d.min(0xfff) | (heads.min(0xfff) << 12) | ((causal as usize) << 24) | ((masked as usize) << 25)
}

/// Inverse of [`pack_heads`].
pub fn unpack_heads(x: usize) -> (usize, usize, bool, bool) {
    (
        x & 0xfff,
        (x >> 12) & 0xfff,
        x & (1 << 24) != 0,
        x & (1 << 25) != 0,
    )
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
