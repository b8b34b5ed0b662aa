//! `config.json`, mirrored. Two spellings exist and both parse to the same [`Florence2Config`]:
//! - HF-native (transformers >= 4.56): `vision_config.embed_dim`, `vision_config.max_position_embeddings`,
//!   `vision_config.max_temporal_embeddings`, `text_config` with the BART fields.
//! - Original Microsoft (model-card remote code, also mlx-community): `vision_config.dim_embed`,
//!   `vision_config.image_pos_embed.max_pos_embeddings`, `vision_config.visual_temporal_embedding
//!   .max_temporal_embeddings`, `vision_config.image_feature_source`; `vision_config.model_type` is "".
//!
//! Every integer is validated before it shapes a buffer: a config comes from the network.
//!
//! Below both the loader and the model: [`tensors`] is the table of tensors a config implies (what the
//! loader checks a checkpoint against), [`quantization`] the entry of a quantized checkpoint.

pub mod quantization;
pub mod tensors;

use serde_json::Value;

use crate::error::{Error, Result};
pub use quantization::QuantizationConfig;

/// DaViT vision tower settings.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub in_channels: usize,
    /// Channels per stage (`embed_dim` / `dim_embed`).
    pub embed_dim: Vec<usize>,
    pub depths: Vec<usize>,
    pub num_heads: Vec<usize>,
    pub num_groups: Vec<usize>,
    pub patch_size: Vec<usize>,
    pub patch_stride: Vec<usize>,
    pub patch_padding: Vec<usize>,
    /// Stage s's ConvEmbed normalises its input (true) or its output (false).
    pub patch_prenorm: Vec<bool>,
    pub window_size: usize,
    pub mlp_ratio: f64,
    pub qkv_bias: bool,
    /// Width of the projected image tokens (= text d_model).
    pub projection_dim: usize,
    /// Rows of each 2-D learned position table (50 in the released models).
    pub max_position_embeddings: usize,
    /// Rows of the cosine temporal table (100).
    pub max_temporal_embeddings: usize,
    /// Order of pooled features: `spatial_avg_pool`, `temporal_avg_pool`, `last_frame`.
    pub image_feature_source: Vec<String>,
}

impl VisionConfig {
    /// Token grid (height, width) after each stage's patch embedding for an input of `h` x `w`
    /// pixels (a stage too small for its kernel gives one row or column).
    pub fn stage_grids(&self, h: usize, w: usize) -> Vec<(usize, usize)> {
        let (mut h, mut w) = (h, w);
        (0..self.embed_dim.len())
            .map(|i| {
                let (k, s, p) = (
                    self.patch_size[i],
                    self.patch_stride[i],
                    self.patch_padding[i],
                );
                h = (h + 2 * p).saturating_sub(k) / s.max(1) + 1;
                w = (w + 2 * p).saturating_sub(k) / s.max(1) + 1;
                (h, w)
            })
            .collect()
    }
}

/// BART settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    pub d_model: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub encoder_attention_heads: usize,
    pub decoder_attention_heads: usize,
    pub encoder_ffn_dim: usize,
    pub decoder_ffn_dim: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub bos_token_id: u32,
    pub pad_token_id: u32,
    pub eos_token_id: u32,
    pub decoder_start_token_id: u32,
    pub forced_bos_token_id: Option<u32>,
    pub forced_eos_token_id: Option<u32>,
    pub scale_embedding: bool,
    pub activation_function: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Florence2Config {
    pub vision: VisionConfig,
    pub text: TextConfig,
    /// `<image>` id in HF-native checkpoints (51289); absent in original ones.
    pub image_token_id: Option<u32>,
    /// Generation defaults found in config.json itself (older checkpoints keep them there).
    pub num_beams: Option<usize>,
    pub no_repeat_ngram_size: Option<usize>,
    /// The `quantization` entry of a quantized checkpoint.
    pub quantization: Option<QuantizationConfig>,
}

/// Largest value any size field may take; far above every released model, far below what could
/// overflow a buffer-size computation.
const MAX_DIM: usize = 1 << 16;

/// Cost bounds, checked before anything is allocated from a config (a 1 KB config.json must not be able to
/// make the loader build a huge name table or synthesize a huge table):
/// - at most this many blocks per DaViT stage (released models: 1, 1, 9, 1);
pub const MAX_STAGE_DEPTH: usize = 64;
/// - at most this many rows in each 2-D position table and in the temporal table (released: 50 and 100);
pub const MAX_TABLE_ROWS: usize = 4096;
/// - at most this many parameters in all (every expected and optional tensor, the synthesized temporal
///   table included): 2^31, i.e. 8 GiB in f32 (Florence-2-large has 0.77e9).
pub const MAX_PARAMETERS: u64 = 1 << 31;
/// - the temporal table, which the loader synthesizes when a checkpoint lacks it (so its size is not paid
///   for by checkpoint bytes), has at most 2^24 elements (64 MiB in f32; released: 100 x 1024).
pub const MAX_SYNTHESIZED_ELEMENTS: u64 = 1 << 24;

fn cfg_err(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn uint(v: &Value, key: &str, ctx: &str) -> Result<usize> {
    let x = get(v, key).ok_or_else(|| cfg_err(format!("{ctx}.{key} is missing")))?;
    let n = x.as_u64().ok_or_else(|| {
        cfg_err(format!(
            "{ctx}.{key} must be a non-negative integer, got {x}"
        ))
    })?;
    // Range-checked in u64 before the cast: on wasm32 `(2^32 + 32) as usize` is 32.
    if n > MAX_DIM as u64 {
        return Err(cfg_err(format!("{ctx}.{key} = {n} is out of range")));
    }
    Ok(n as usize)
}

fn uint_opt(v: &Value, key: &str, ctx: &str) -> Result<Option<usize>> {
    match get(v, key) {
        Some(_) => uint(v, key, ctx).map(Some),
        None => Ok(None),
    }
}

fn uint_or(v: &Value, key: &str, ctx: &str, default: usize) -> Result<usize> {
    if get(v, key).is_some() {
        uint(v, key, ctx)
    } else {
        Ok(default)
    }
}

fn id_opt(v: &Value, key: &str, ctx: &str) -> Result<Option<u32>> {
    match get(v, key) {
        None => Ok(None),
        Some(x) => {
            let n = x.as_u64().ok_or_else(|| {
                cfg_err(format!(
                    "{ctx}.{key} must be a non-negative integer, got {x}"
                ))
            })?;
            u32::try_from(n)
                .map(Some)
                .map_err(|_| cfg_err(format!("{ctx}.{key} = {n} is out of range")))
        }
    }
}

fn uint_list(v: &Value, keys: &[&str], ctx: &str) -> Result<Vec<usize>> {
    let (key, x) = keys
        .iter()
        .find_map(|k| get(v, k).map(|x| (*k, x)))
        .ok_or_else(|| cfg_err(format!("{ctx}.{} is missing", keys[0])))?;
    let arr = x
        .as_array()
        .ok_or_else(|| cfg_err(format!("{ctx}.{key} must be a list")))?;
    arr.iter()
        .map(|e| {
            e.as_u64()
                .filter(|&n| n <= MAX_DIM as u64)
                .map(|n| n as usize)
                .ok_or_else(|| cfg_err(format!("{ctx}.{key} has a bad entry {e}")))
        })
        .collect()
}

impl Florence2Config {
    pub fn from_json_str(s: &str) -> Result<Self> {
        let v: Value = crate::json::parse_strict(s)
            .map_err(|e| cfg_err(format!("config.json is not JSON: {e}")))?;
        Self::from_json(&v)
    }

    pub fn from_json(v: &Value) -> Result<Self> {
        let vc = get(v, "vision_config").ok_or_else(|| cfg_err("vision_config is missing"))?;
        let tc = get(v, "text_config").ok_or_else(|| cfg_err("text_config is missing"))?;
        let vision = parse_vision(vc, v)?;
        let text = parse_text(tc)?;
        let cfg = Florence2Config {
            image_token_id: id_opt(v, "image_token_id", "config")?,
            num_beams: uint_opt(v, "num_beams", "config")?,
            no_repeat_ngram_size: uint_opt(v, "no_repeat_ngram_size", "config")?,
            quantization: QuantizationConfig::from_config(v)?,
            vision,
            text,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Cross-field checks: list lengths agree, channels divide into heads and groups, ids fit the vocab.
    pub fn validate(&self) -> Result<()> {
        let s = self.vision.embed_dim.len();
        if s == 0 || s > 8 {
            return Err(cfg_err(format!(
                "vision_config has {s} stages (1..=8 supported)"
            )));
        }
        self.validate_vision_lists(s)?;
        self.validate_vision_stages(s)?;
        self.validate_vision_tables(s)?;
        self.validate_text()?;
        // Every count above is bounded, so the table below is small (at most ~25k names); its element
        // counts are summed in saturating u64.
        let params = self.parameter_count();
        if params > MAX_PARAMETERS {
            return Err(cfg_err(format!(
                "the config describes {params} parameters (at most {MAX_PARAMETERS})"
            )));
        }
        Ok(())
    }

    /// Every per-stage list has one entry per stage (`s`).
    fn validate_vision_lists(&self, s: usize) -> Result<()> {
        let v = &self.vision;
        for (name, len) in [
            ("depths", v.depths.len()),
            ("num_heads", v.num_heads.len()),
            ("num_groups", v.num_groups.len()),
            ("patch_size", v.patch_size.len()),
            ("patch_stride", v.patch_stride.len()),
            ("patch_padding", v.patch_padding.len()),
            ("patch_prenorm", v.patch_prenorm.len()),
        ] {
            if len != s {
                return Err(cfg_err(format!(
                    "vision_config.{name} has {len} entries for {s} stages"
                )));
            }
        }
        Ok(())
    }

    /// Each stage's channels split into its heads and groups; patch geometry is sane.
    fn validate_vision_stages(&self, s: usize) -> Result<()> {
        let v = &self.vision;
        for i in 0..s {
            let c = v.embed_dim[i];
            if c == 0 || v.num_heads[i] == 0 || !c.is_multiple_of(v.num_heads[i]) {
                return Err(cfg_err(format!(
                    "stage {i}: {c} channels do not split into {} heads",
                    v.num_heads[i]
                )));
            }
            if v.num_groups[i] == 0 || !c.is_multiple_of(v.num_groups[i]) {
                return Err(cfg_err(format!(
                    "stage {i}: {c} channels do not split into {} groups",
                    v.num_groups[i]
                )));
            }
            if v.patch_size[i] == 0 || v.patch_stride[i] == 0 || v.patch_size[i] > 64 {
                return Err(cfg_err(format!("stage {i}: bad patch size/stride")));
            }
            if v.patch_padding[i] >= v.patch_size[i].max(1) * 2 {
                return Err(cfg_err(format!("stage {i}: padding too large")));
            }
        }
        Ok(())
    }

    /// Scalar vision sizes, the position/temporal tables and the feature sources.
    fn validate_vision_tables(&self, s: usize) -> Result<()> {
        let v = &self.vision;
        if v.in_channels == 0 || v.in_channels > 4 {
            return Err(cfg_err("vision_config.in_channels must be 1..=4"));
        }
        if v.window_size == 0 || v.window_size > 64 {
            return Err(cfg_err("vision_config.window_size must be 1..=64"));
        }
        if !(v.mlp_ratio > 0.0 && v.mlp_ratio <= 16.0) {
            return Err(cfg_err("vision_config.mlp_ratio must be in (0, 16]"));
        }
        let last = v.embed_dim[s - 1];
        if !last.is_multiple_of(2) {
            return Err(cfg_err(
                "the last stage's width must be even (2-D position halves)",
            ));
        }
        if v.max_position_embeddings == 0 || v.max_temporal_embeddings == 0 {
            return Err(cfg_err("position tables must have at least one row"));
        }
        if let Some(d) = v.depths.iter().find(|&&d| d > MAX_STAGE_DEPTH) {
            return Err(cfg_err(format!(
                "vision_config.depths has a stage of {d} blocks (at most {MAX_STAGE_DEPTH})"
            )));
        }
        for (name, rows) in [
            ("max_position_embeddings", v.max_position_embeddings),
            ("max_temporal_embeddings", v.max_temporal_embeddings),
        ] {
            if rows > MAX_TABLE_ROWS {
                return Err(cfg_err(format!(
                    "vision_config.{name} = {rows} (at most {MAX_TABLE_ROWS})"
                )));
            }
        }
        for src in &v.image_feature_source {
            if !matches!(
                src.as_str(),
                "spatial_avg_pool" | "temporal_avg_pool" | "last_frame"
            ) {
                return Err(cfg_err(format!("unknown image_feature_source '{src}'")));
            }
        }
        if v.image_feature_source.is_empty() {
            return Err(cfg_err("image_feature_source is empty"));
        }
        let temporal = (v.max_temporal_embeddings as u64).saturating_mul(last as u64);
        if temporal > MAX_SYNTHESIZED_ELEMENTS {
            return Err(cfg_err(format!(
                "the temporal table ({} x {last}) has more than {MAX_SYNTHESIZED_ELEMENTS} elements",
                v.max_temporal_embeddings
            )));
        }
        Ok(())
    }

    /// The text model's sizes and token ids (and the projector's width matching it).
    fn validate_text(&self) -> Result<()> {
        let v = &self.vision;
        let t = &self.text;
        if v.projection_dim != t.d_model {
            return Err(cfg_err(format!(
                "projection_dim {} != text d_model {}",
                v.projection_dim, t.d_model
            )));
        }
        for (name, h) in [
            ("encoder_attention_heads", t.encoder_attention_heads),
            ("decoder_attention_heads", t.decoder_attention_heads),
        ] {
            if h == 0 || !t.d_model.is_multiple_of(h) {
                return Err(cfg_err(format!(
                    "d_model {} does not split into {name} = {h}",
                    t.d_model
                )));
            }
        }
        if t.d_model == 0 || t.encoder_ffn_dim == 0 || t.decoder_ffn_dim == 0 {
            return Err(cfg_err("text sizes must be positive"));
        }
        if t.encoder_layers == 0
            || t.decoder_layers == 0
            || t.encoder_layers > 64
            || t.decoder_layers > 64
        {
            return Err(cfg_err("layer counts must be 1..=64"));
        }
        if t.vocab_size == 0 || t.vocab_size > 1 << 20 {
            return Err(cfg_err("vocab_size out of range"));
        }
        if t.max_position_embeddings < 2 {
            return Err(cfg_err("max_position_embeddings must be at least 2"));
        }
        let vocab = t.vocab_size as u32;
        for (name, id) in [
            ("bos_token_id", Some(t.bos_token_id)),
            ("pad_token_id", Some(t.pad_token_id)),
            ("eos_token_id", Some(t.eos_token_id)),
            ("decoder_start_token_id", Some(t.decoder_start_token_id)),
            ("forced_bos_token_id", t.forced_bos_token_id),
            ("forced_eos_token_id", t.forced_eos_token_id),
        ] {
            if let Some(id) = id {
                if id >= vocab {
                    return Err(cfg_err(format!(
                        "{name} {id} is outside the vocabulary ({vocab})"
                    )));
                }
            }
        }
        if t.activation_function != "gelu" {
            return Err(cfg_err(format!(
                "activation_function '{}' is not supported (gelu)",
                t.activation_function
            )));
        }
        Ok(())
    }

    /// Parameters of every tensor the config implies (expected + optional, the temporal table included),
    /// in saturating u64. Call on a validated config (the table's size is bounded by the counts).
    pub fn parameter_count(&self) -> u64 {
        tensors::expected_tensors(self)
            .iter()
            .chain(tensors::optional_tensors(self).iter())
            .map(|(_, shape)| {
                shape
                    .iter()
                    .fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Token grid (height, width) after the last stage for an input of `h` x `w` pixels.
    pub fn feature_grid(&self, h: usize, w: usize) -> (usize, usize) {
        self.vision
            .stage_grids(h, w)
            .last()
            .copied()
            .unwrap_or((h, w))
    }
}

fn parse_vision(vc: &Value, top: &Value) -> Result<VisionConfig> {
    let ctx = "vision_config";
    match get(vc, "model_type").and_then(|m| m.as_str()) {
        None | Some("") | Some("davit") | Some("florence_vision") => {}
        Some(other) => {
            return Err(cfg_err(format!(
                "vision_config.model_type '{other}' is not a Florence-2 DaViT"
            )))
        }
    }
    let embed_dim = uint_list(vc, &["embed_dim", "dim_embed"], ctx)?;
    let s = embed_dim.len();
    let prenorm = match get(vc, "patch_prenorm") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|b| {
                b.as_bool()
                    .ok_or_else(|| cfg_err("patch_prenorm entries must be booleans"))
            })
            .collect::<Result<Vec<_>>>()?,
        Some(_) => return Err(cfg_err("vision_config.patch_prenorm must be a list")),
        None => (0..s).map(|i| i > 0).collect(),
    };
    // Original configs nest the position settings; HF-native flattens them.
    let max_pos = match get(vc, "image_pos_embed") {
        Some(p) => uint_or(p, "max_pos_embeddings", "image_pos_embed", 50)?,
        None => uint_or(vc, "max_position_embeddings", ctx, 50)?,
    };
    let max_temporal = match get(vc, "visual_temporal_embedding") {
        Some(p) => uint_or(
            p,
            "max_temporal_embeddings",
            "visual_temporal_embedding",
            100,
        )?,
        None => uint_or(vc, "max_temporal_embeddings", ctx, 100)?,
    };
    let sources = get(vc, "image_feature_source")
        .or_else(|| get(top, "image_feature_source"))
        .and_then(|x| x.as_array())
        .map(|a| {
            a.iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| cfg_err("image_feature_source entries must be strings"))
                })
                .collect::<Result<Vec<_>>>()
        })
        .transpose()?
        .unwrap_or_else(|| vec!["spatial_avg_pool".into(), "temporal_avg_pool".into()]);
    let projection_dim = match get(vc, "projection_dim") {
        Some(_) => uint(vc, "projection_dim", ctx)?,
        None => uint(top, "projection_dim", "config")?,
    };
    Ok(VisionConfig {
        in_channels: uint_or(vc, "in_channels", ctx, 3)?,
        depths: uint_list(vc, &["depths"], ctx)?,
        num_heads: uint_list(vc, &["num_heads"], ctx)?,
        num_groups: uint_list(vc, &["num_groups"], ctx)?,
        patch_size: uint_list(vc, &["patch_size"], ctx)?,
        patch_stride: uint_list(vc, &["patch_stride"], ctx)?,
        patch_padding: uint_list(vc, &["patch_padding"], ctx)?,
        patch_prenorm: prenorm,
        window_size: uint(vc, "window_size", ctx)?,
        mlp_ratio: get(vc, "mlp_ratio").and_then(|x| x.as_f64()).unwrap_or(4.0),
        qkv_bias: get(vc, "qkv_bias")
            .and_then(|x| x.as_bool())
            .unwrap_or(true),
        projection_dim,
        max_position_embeddings: max_pos,
        max_temporal_embeddings: max_temporal,
        image_feature_source: sources,
        embed_dim,
    })
}

fn parse_text(tc: &Value) -> Result<TextConfig> {
    let ctx = "text_config";
    let d_model = uint(tc, "d_model", ctx)?;
    let enc_layers = uint(tc, "encoder_layers", ctx)?;
    Ok(TextConfig {
        d_model,
        encoder_layers: enc_layers,
        decoder_layers: uint_or(tc, "decoder_layers", ctx, enc_layers)?,
        encoder_attention_heads: uint(tc, "encoder_attention_heads", ctx)?,
        decoder_attention_heads: uint(tc, "decoder_attention_heads", ctx)?,
        encoder_ffn_dim: uint(tc, "encoder_ffn_dim", ctx)?,
        decoder_ffn_dim: uint(tc, "decoder_ffn_dim", ctx)?,
        vocab_size: uint_or(tc, "vocab_size", ctx, 51289)?.max(1),
        max_position_embeddings: uint_or(tc, "max_position_embeddings", ctx, 1024)?,
        bos_token_id: id_opt(tc, "bos_token_id", ctx)?.unwrap_or(0),
        pad_token_id: id_opt(tc, "pad_token_id", ctx)?.unwrap_or(1),
        eos_token_id: id_opt(tc, "eos_token_id", ctx)?.unwrap_or(2),
        decoder_start_token_id: id_opt(tc, "decoder_start_token_id", ctx)?.unwrap_or(2),
        forced_bos_token_id: id_opt(tc, "forced_bos_token_id", ctx)?,
        forced_eos_token_id: id_opt(tc, "forced_eos_token_id", ctx)?,
        scale_embedding: get(tc, "scale_embedding")
            .and_then(|x| x.as_bool())
            .unwrap_or(false),
        activation_function: get(tc, "activation_function")
            .and_then(|x| x.as_str())
            .unwrap_or("gelu")
            .to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        serde_json::json!({
            "model_type": "florence2",
            "image_token_id": 51289,
            "text_config": {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
                "encoder_attention_heads": 12, "decoder_attention_heads": 12,
                "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "vocab_size": 51328,
                "max_position_embeddings": 1024, "forced_eos_token_id": 2},
            "vision_config": {"embed_dim": [128, 256, 512, 1024], "depths": [1, 1, 9, 1],
                "num_heads": [4, 8, 16, 32], "num_groups": [4, 8, 16, 32],
                "patch_size": [7, 3, 3, 3], "patch_stride": [4, 2, 2, 2],
                "patch_padding": [3, 1, 1, 1], "patch_prenorm": [false, true, true, true],
                "window_size": 12, "projection_dim": 768, "model_type": "florence_vision"}
        })
    }

    #[test]
    fn parses_hf_native_base() {
        let c = Florence2Config::from_json(&base()).unwrap();
        assert_eq!(c.vision.embed_dim, vec![128, 256, 512, 1024]);
        assert_eq!(c.feature_grid(768, 768), (24, 24));
        assert_eq!(c.text.decoder_start_token_id, 2);
        assert_eq!(c.vision.image_feature_source[0], "spatial_avg_pool");
    }

    #[test]
    fn parses_original_spelling() {
        let mut v = base();
        let vc = v["vision_config"].as_object_mut().unwrap();
        let dims = vc.remove("embed_dim").unwrap();
        vc.insert("dim_embed".into(), dims);
        vc.insert("model_type".into(), "".into());
        vc.insert(
            "image_pos_embed".into(),
            serde_json::json!({"type": "learned_abs_2d", "max_pos_embeddings": 40}),
        );
        vc.insert(
            "image_feature_source".into(),
            serde_json::json!(["temporal_avg_pool", "spatial_avg_pool"]),
        );
        let c = Florence2Config::from_json(&v).unwrap();
        assert_eq!(c.vision.embed_dim[3], 1024);
        assert_eq!(c.vision.max_position_embeddings, 40);
        assert_eq!(c.vision.image_feature_source[0], "temporal_avg_pool");
    }

    #[test]
    fn rejects_bad_values() {
        let cases: Vec<(&str, Value)> = vec![
            (
                "heads",
                serde_json::json!({"vision_config": {"num_heads": [3, 8, 16, 32]}}),
            ),
            (
                "negative",
                serde_json::json!({"text_config": {"d_model": -1}}),
            ),
            (
                "huge",
                serde_json::json!({"text_config": {"d_model": 1u64 << 40}}),
            ),
            (
                "vocab id",
                serde_json::json!({"text_config": {"eos_token_id": 60000}}),
            ),
            (
                "stages",
                serde_json::json!({"vision_config": {"depths": [1, 1]}}),
            ),
            (
                "model type",
                serde_json::json!({"vision_config": {"model_type": "clip"}}),
            ),
        ];
        for (name, patch) in cases {
            let mut v = base();
            for (sect, obj) in patch.as_object().unwrap() {
                for (k, x) in obj.as_object().unwrap() {
                    v[sect][k] = x.clone();
                }
            }
            let err = Florence2Config::from_json(&v).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{name}: {err}");
        }
    }

    fn patched(patch: Value) -> Value {
        let mut v = base();
        for (sect, obj) in patch.as_object().unwrap() {
            match obj.as_object() {
                Some(o) => {
                    for (k, x) in o {
                        v[sect][k] = x.clone();
                    }
                }
                None => v[sect] = obj.clone(),
            }
        }
        v
    }

    /// Cost bounds and u64 range checks: each of these configs used to be accepted (a 1 KB config that
    /// describes tens of GB, or an integer that a 32-bit cast would wrap); each must fail by name.
    #[test]
    fn cost_bounds_and_u64_ranges() {
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "stage depth",
                serde_json::json!({"vision_config": {"depths": [1, 1, 65536, 1]}}),
                "blocks",
            ),
            (
                "temporal rows",
                serde_json::json!({"vision_config": {"max_temporal_embeddings": 65536}}),
                "max_temporal_embeddings",
            ),
            (
                "position rows",
                serde_json::json!({"vision_config": {"max_position_embeddings": 65536}}),
                "max_position_embeddings",
            ),
            (
                "synthesized table",
                serde_json::json!({"vision_config": {"max_temporal_embeddings": 4096,
                    "embed_dim": [128, 256, 512, 8192], "depths": [1, 1, 1, 0]}}),
                "temporal table",
            ),
            (
                "parameters",
                serde_json::json!({"text_config": {"encoder_layers": 64, "decoder_layers": 64,
                    "encoder_ffn_dim": 65536, "decoder_ffn_dim": 65536}}),
                "parameters",
            ),
            (
                "2^32 + 32",
                serde_json::json!({"text_config": {"encoder_layers": (1u64 << 32) + 32}}),
                "out of range",
            ),
            (
                "list entry 2^32 + 1",
                serde_json::json!({"vision_config": {"depths": [1, 1, (1u64 << 32) + 1, 1]}}),
                "bad entry",
            ),
            (
                "num_beams",
                serde_json::json!({"num_beams": u64::MAX}),
                "out of range",
            ),
            (
                "no_repeat_ngram_size",
                serde_json::json!({"no_repeat_ngram_size": (1u64 << 32) + 3}),
                "out of range",
            ),
        ];
        for (name, patch, want) in cases {
            let err = Florence2Config::from_json(&patched(patch)).unwrap_err();
            assert!(
                matches!(&err, Error::Config(m) if m.contains(want)),
                "{name}: {err}"
            );
        }
        // The released base config is far inside every bound.
        let c = Florence2Config::from_json(&base()).unwrap();
        assert!(c.parameter_count() < 300_000_000, "{}", c.parameter_count());
    }
}
