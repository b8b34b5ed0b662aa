//! Per-tensor plans: what each source tensor of a header becomes (its canonical name and shape, a layout
//! fix-up, or ignored), decided by a [`Planner`] from the config's table of tensors, the checkpoint's
//! layout (HF-native or original names) and its `quantization` entry. No GPU: the loader
//! ([`crate::weights::Assembler`]) and the converter ([`crate::weights::export`]) plan alike.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::tensors::{expected_tensors, optional_tensors};
use crate::config::{Florence2Config, QuantizationConfig};
use crate::error::{Error, Result};
use crate::quant::{QFormat, QBLOCK};
use crate::weights::expected::is_matrix_weight;
use crate::weights::header::{Header, TensorInfo};
use crate::weights::names::{canonical_name, detect_layout, Layout};
use crate::weights::quantized::{quant_err, QWEIGHT_SUFFIX};

/// A layout fix-up applied after a tensor's bytes arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fixup {
    None,
    /// Output dim `i` is source dim `perm[i]` (`[1, 0]`: transpose; `[0, 3, 1, 2]`: channels-last conv
    /// `(O, kH, kW, I)` to `(O, I, kH, kW)`).
    Permute(Vec<usize>),
}

/// What a source tensor becomes.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    pub canonical: String,
    pub src: TensorInfo,
    /// Canonical shape (after the fix-up).
    pub shape: Vec<usize>,
    pub fixup: Fixup,
    /// The source holds quantized rows in this format (a `NAME.qweight` U8 tensor of a quantized
    /// checkpoint, [`crate::weights::quantized`]); `None` for float sources.
    pub quant: Option<QFormat>,
}

/// Plans the tensors of one checkpoint, file after file (the layout, channels-last convs and the names
/// already planned carry over between files).
#[derive(Clone, Debug)]
pub struct Planner {
    /// Canonical name -> (shape, required).
    pub(crate) table: BTreeMap<String, (Vec<usize>, bool)>,
    layout: Option<Layout>,
    /// Channels-last conv weights seen (or declared by metadata): resolves ambiguous conv shapes.
    channels_last: bool,
    /// The config's `quantization` entry (quantized checkpoints).
    quant: Option<QuantizationConfig>,
    planned: BTreeSet<String>,
    ignored: Vec<String>,
}

impl Planner {
    pub fn new(cfg: &Florence2Config) -> Self {
        let mut table = BTreeMap::new();
        for (n, s) in expected_tensors(cfg) {
            table.insert(n, (s, true));
        }
        for (n, s) in optional_tensors(cfg) {
            table.insert(n, (s, false));
        }
        Planner {
            table,
            layout: None,
            channels_last: false,
            quant: cfg.quantization.clone(),
            planned: BTreeSet::new(),
            ignored: Vec::new(),
        }
    }

    /// Fix the layout (e.g. from an index's names) before any header is planned.
    pub fn set_layout(&mut self, layout: Layout) {
        self.layout = Some(layout);
    }

    pub fn layout(&self) -> Option<Layout> {
        self.layout
    }

    /// Whether channels-last (mlx) convolutions were seen or declared so far.
    pub fn channels_last(&self) -> bool {
        self.channels_last
    }

    /// Names of source tensors that were skipped as unused.
    pub fn ignored(&self) -> &[String] {
        &self.ignored
    }

    /// Plan every tensor of a header (file order). `None` entries are not needed and are skipped.
    pub fn plan_header(&mut self, file: &str, header: &Header) -> Result<Vec<Option<TensorPlan>>> {
        let layout = *self
            .layout
            .get_or_insert_with(|| detect_layout(header.tensors.iter().map(|t| t.name.as_str())));
        if header
            .metadata
            .get("format")
            .is_some_and(|f| f.eq_ignore_ascii_case("mlx"))
        {
            self.channels_last = true;
        }
        // Pre-pass: an unambiguous channels-last conv anywhere in this file (every DaViT block has
        // depthwise convs, (C, 1, 3, 3) vs (C, 3, 3, 1)) decides how ambiguous ones (I == kH == kW) read.
        for t in &header.tensors {
            let Some(canonical) = canonical_name(layout, &t.name) else {
                continue;
            };
            if let Some((shape, _)) = self.table.get(&canonical) {
                if let [o, i, kh, kw] = shape.as_slice() {
                    if t.shape == [*o, *kh, *kw, *i] && t.shape != *shape {
                        self.channels_last = true;
                    }
                }
            }
        }
        let mut plans = Vec::with_capacity(header.tensors.len());
        for t in &header.tensors {
            let plan = self.plan_one(file, layout, t)?;
            if plan.is_none() {
                log::debug!(
                    "{file}: ignoring tensor '{}' (not used by the model)",
                    t.name
                );
                self.ignored.push(t.name.clone());
            }
            plans.push(plan);
        }
        Ok(plans)
    }

    fn plan_one(
        &mut self,
        file: &str,
        layout: Layout,
        t: &TensorInfo,
    ) -> Result<Option<TensorPlan>> {
        let quantized = t.name.strip_suffix(QWEIGHT_SUFFIX);
        let base = quantized.unwrap_or(&t.name);
        let Some(canonical) = canonical_name(layout, base) else {
            return Ok(None);
        };
        let Some((shape, _)) = self.table.get(&canonical) else {
            return Ok(None);
        };
        let shape = shape.clone();
        let listed = self
            .quant
            .as_ref()
            .is_some_and(|q| q.tensors.contains(base));
        if let Some(base) = quantized {
            let fmt = self.check_quantized(layout, t, base, &canonical, &shape)?;
            self.mark_planned(file, &canonical)?;
            return Ok(Some(TensorPlan {
                canonical,
                src: t.clone(),
                shape,
                fixup: Fixup::None,
                quant: Some(fmt),
            }));
        }
        if listed {
            return Err(quant_err(
                &t.name,
                format!(
                    "config.json lists it as quantized, but the checkpoint stores it as {} (expected '{}{QWEIGHT_SUFFIX}')",
                    t.dtype.as_str(),
                    t.name
                ),
            ));
        }
        if !t.dtype.is_loadable() {
            return Err(Error::UnsupportedDtype {
                name: t.name.clone(),
                dtype: t.dtype.as_str().to_owned(),
            });
        }
        self.mark_planned(file, &canonical)?;
        let fixup = self.fixup(layout, &canonical, &shape, t)?;
        Ok(Some(TensorPlan {
            canonical,
            src: t.clone(),
            shape,
            fixup,
            quant: None,
        }))
    }

    /// Mark `canonical` as planned; a second source tensor for it (in `file`) is an error.
    fn mark_planned(&mut self, file: &str, canonical: &str) -> Result<()> {
        if !self.planned.insert(canonical.to_owned()) {
            return Err(Error::SafetensorsHeader {
                file: file.to_owned(),
                msg: format!("tensor '{canonical}' appears twice in the checkpoint"),
            });
        }
        Ok(())
    }

    /// How source tensor `t` becomes the config's `shape` for `canonical`: as stored, or permuted (the
    /// original layout's transposed `image_projection`; channels-last convs, which latch the
    /// planner's channels-last mode). A shape neither way is an error.
    fn fixup(
        &mut self,
        layout: Layout,
        canonical: &str,
        shape: &[usize],
        t: &TensorInfo,
    ) -> Result<Fixup> {
        let mismatch = || Error::TensorShape {
            name: canonical.to_owned(),
            expected: shape.to_vec(),
            got: t.shape.clone(),
        };
        Ok(
            if canonical == crate::weights::expected::IMAGE_PROJECTION && layout == Layout::Original
            {
                // Raw (C_last, D) parameter applied as x @ P; HF-native stores its transpose.
                match shape {
                    [d, c] if t.shape == [*c, *d] => Fixup::Permute(vec![1, 0]),
                    _ => return Err(mismatch()),
                }
            } else if let [o, i, kh, kw] = shape {
                let cl = [*o, *kh, *kw, *i];
                let is_cf = t.shape == shape;
                let is_cl = t.shape == cl;
                match (is_cf, is_cl) {
                    (true, true) if self.channels_last => Fixup::Permute(vec![0, 3, 1, 2]),
                    (true, _) => Fixup::None,
                    (false, true) => {
                        self.channels_last = true;
                        Fixup::Permute(vec![0, 3, 1, 2])
                    }
                    (false, false) => return Err(mismatch()),
                }
            } else if t.shape == *shape {
                Fixup::None
            } else {
                return Err(mismatch());
            },
        )
    }

    /// Check a `BASE.qweight` source tensor against the config's `quantization` entry and the expected
    /// `(N, K)` shape of its canonical tensor; returns its format.
    fn check_quantized(
        &self,
        layout: Layout,
        t: &TensorInfo,
        base: &str,
        canonical: &str,
        shape: &[usize],
    ) -> Result<QFormat> {
        let Some(q) = &self.quant else {
            return Err(quant_err(
                &t.name,
                "the checkpoint holds quantized rows but config.json has no quantization entry",
            ));
        };
        if !q.tensors.contains(base) {
            return Err(quant_err(
                &t.name,
                format!("'{base}' is not listed in config.json quantization.tensors"),
            ));
        }
        let fmt = q.format;
        let permuted =
            canonical == crate::weights::expected::IMAGE_PROJECTION && layout == Layout::Original;
        let &[n, k] = shape else {
            return Err(quant_err(
                &t.name,
                format!("'{canonical}' {shape:?} is not a matrix and cannot be quantized"),
            ));
        };
        if !is_matrix_weight(canonical, shape) || permuted || !k.is_multiple_of(QBLOCK) {
            return Err(quant_err(
                &t.name,
                format!(
                    "'{canonical}' {shape:?} is not a matrix weight with rows of whole {QBLOCK}-weight blocks (only those are quantized)"
                ),
            ));
        }
        if t.dtype != crate::weights::header::StDtype::U8 {
            return Err(quant_err(
                &t.name,
                format!("stored as {}; quantized rows are U8", t.dtype.as_str()),
            ));
        }
        let rb = fmt.row_bytes(k);
        if t.shape != [n, rb] {
            return Err(quant_err(
                &t.name,
                format!(
                    "shape {:?} does not hold {} rows of ({n}, {k}): expected [{n}, {rb}]",
                    t.shape,
                    fmt.name()
                ),
            ));
        }
        Ok(fmt)
    }

    /// The first required tensor no header held (the temporal table excepted: the loader makes it).
    pub fn first_missing(&self) -> Option<&str> {
        self.table
            .iter()
            .find(|(n, (_, req))| {
                *req && !self.planned.contains(*n)
                    && n.as_str() != crate::weights::expected::TEMPORAL_TABLE
            })
            .map(|(n, _)| n.as_str())
    }
}
