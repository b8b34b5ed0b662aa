//! [`Weights`]: the loaded GPU tensors by canonical (HF-native) name, and candle-style prefixed views.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::gpu::Tensor;

/// GPU tensors by canonical HF-native name (`model.vision_tower.convs.0.conv.weight`, ...), in HF-native
/// layout whatever the checkpoint's layout and dtype were: matrix weights in the resident dtype of the
/// load ([`crate::weights::LoadOptions::dtype`]), every other tensor f32.
#[derive(Clone, Debug, Default)]
pub struct Weights {
    map: BTreeMap<String, Tensor>,
}

impl Weights {
    pub fn new() -> Self {
        Self::default()
    }

    /// Insert (or replace) a tensor under its canonical name.
    pub fn insert(&mut self, name: impl Into<String>, t: Tensor) {
        self.map.insert(name.into(), t);
    }

    /// The tensor `name`, checked to have exactly `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.map.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
        })?;
        if t.shape() != shape {
            return Err(Error::TensorShape {
                name: name.to_owned(),
                expected: shape.to_vec(),
                got: t.shape().to_vec(),
            });
        }
        Ok(t.clone())
    }

    /// The tensor `name` whatever its shape (for callers that check shapes themselves).
    pub fn get_any(&self, name: &str) -> Result<Tensor> {
        self.map
            .get(name)
            .cloned()
            .ok_or_else(|| Error::MissingTensor {
                name: name.to_owned(),
            })
    }

    pub fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// A view that prefixes every name with `prefix.` (`pp("model").pp("vision_tower")`).
    pub fn pp(&self, prefix: &str) -> WeightsView<'_> {
        WeightsView {
            weights: self,
            prefix: prefix.to_owned(),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Canonical names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    /// Total GPU bytes held (a buffer shared by two names, e.g. the tied LM head, counts once).
    pub fn byte_size(&self) -> u64 {
        let mut seen: Vec<&Tensor> = Vec::new();
        let mut total = 0;
        for t in self.map.values() {
            if !seen.iter().any(|s| s.same_buffer(t)) {
                seen.push(t);
                total += t.byte_size();
            }
        }
        total
    }

    /// True when `a` and `b` are the same GPU buffer (e.g. `lm_head.weight` tied to the shared embedding).
    pub fn same_buffer(&self, a: &str, b: &str) -> bool {
        match (self.map.get(a), self.map.get(b)) {
            (Some(x), Some(y)) => x.same_buffer(y),
            _ => false,
        }
    }
}

/// A prefixed view of [`Weights`]: `view.pp("blocks").pp("0").get("qkv.weight", &[3 * c, c])`.
#[derive(Clone, Debug)]
pub struct WeightsView<'a> {
    weights: &'a Weights,
    prefix: String,
}

impl<'a> WeightsView<'a> {
    fn full(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    pub fn pp(&self, prefix: &str) -> WeightsView<'a> {
        WeightsView {
            weights: self.weights,
            prefix: self.full(prefix),
        }
    }

    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.weights.get(&self.full(name), shape)
    }

    pub fn get_any(&self, name: &str) -> Result<Tensor> {
        self.weights.get_any(&self.full(name))
    }

    pub fn has(&self, name: &str) -> bool {
        self.weights.has(&self.full(name))
    }

    /// The full name `name` resolves to under this view.
    pub fn name(&self, name: &str) -> String {
        self.full(name)
    }
}
