//! Checkpoint layouts and the rules mapping each source tensor name to its canonical HF-native name.
//!
//! - HF-native (transformers >= 4.56): names are already canonical.
//! - Original Microsoft (model-card remote code) and mlx-community conversions (same names): mapped by
//!   the rules in [`original_to_canonical`]; `tests/reference/layouts.rs` checks that the rules reproduce
//!   every entry of the reference mapping `reference/key_mapping_original_to_hf_native.json`.
//!
//! Tensor *layout* fix-ups (mlx channels-last convs, the original `[C_last, D]` image projection) are
//! decided per tensor by [`crate::weights::plan`], from the source shape against the expected one.

/// Which naming a checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `model.vision_tower.*`, `model.multi_modal_projector.*`, `model.language_model.*`, `lm_head.weight`.
    HfNative,
    /// `vision_tower.*`, `image_projection`, `image_pos_embed.*`, `language_model.model.*`, ... (also mlx).
    Original,
}

pub use crate::config::tensors::FINAL_LOGITS_BIAS;

/// Detect the layout from the tensor names (any name in HF-native form decides HF-native).
pub fn detect_layout<'a>(names: impl IntoIterator<Item = &'a str>) -> Layout {
    let mut original = false;
    for n in names {
        if n.starts_with("model.vision_tower.")
            || n.starts_with("model.language_model.")
            || n.starts_with("model.multi_modal_projector.")
        {
            return Layout::HfNative;
        }
        if n.starts_with("vision_tower.") || n.starts_with("language_model.") {
            original = true;
        }
    }
    if original {
        Layout::Original
    } else {
        Layout::HfNative
    }
}

/// The canonical name of a source tensor, or `None` if the model never uses it.
pub fn canonical_name(layout: Layout, name: &str) -> Option<String> {
    match layout {
        Layout::HfNative => Some(name.to_owned()),
        Layout::Original => original_to_canonical(name),
    }
}

/// Original / mlx name -> HF-native name, by rules. `None` for tensors the model does not use
/// (`vision_tower.norms.*`, `vision_tower.head.*`, anything unknown).
pub fn original_to_canonical(name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("language_model.model.") {
        return Some(format!("model.language_model.{rest}"));
    }
    if name == "language_model.lm_head.weight" {
        return Some("lm_head.weight".into());
    }
    if name == "language_model.final_logits_bias" {
        return Some(FINAL_LOGITS_BIAS.into());
    }
    if name == "image_projection" {
        return Some("model.multi_modal_projector.image_projection.weight".into());
    }
    if let Some(rest) = name.strip_prefix("image_pos_embed.") {
        return Some(format!(
            "model.multi_modal_projector.image_position_embed.{rest}"
        ));
    }
    for head in ["image_proj_norm.", "visual_temporal_embed."] {
        if name.starts_with(head) {
            return Some(format!("model.multi_modal_projector.{name}"));
        }
    }
    if let Some(rest) = name.strip_prefix("vision_tower.convs.") {
        // convs.{i}.proj.* -> convs.{i}.conv.*; convs.{i}.norm.* unchanged.
        let (idx, tail) = rest.split_once('.')?;
        idx.parse::<usize>().ok()?;
        let tail = match tail.strip_prefix("proj.") {
            Some(t) => format!("conv.{t}"),
            None if tail.starts_with("norm.") => tail.to_owned(),
            None => return None,
        };
        return Some(format!("model.vision_tower.convs.{idx}.{tail}"));
    }
    if let Some(rest) = name.strip_prefix("vision_tower.blocks.") {
        // blocks.{i}.{j}.{spatial_block|channel_block}.<module rule>
        let mut it = rest.splitn(4, '.');
        let (i, j, kind, tail) = (it.next()?, it.next()?, it.next()?, it.next()?);
        i.parse::<usize>().ok()?;
        j.parse::<usize>().ok()?;
        let attn = match kind {
            "spatial_block" => "window_attn",
            "channel_block" => "channel_attn",
            _ => return None,
        };
        let tail = block_tail(attn, tail)?;
        return Some(format!("model.vision_tower.blocks.{i}.{j}.{kind}.{tail}"));
    }
    None
}

/// Inside a DaViT block: original module path -> HF-native one.
fn block_tail(attn: &str, tail: &str) -> Option<String> {
    let (module, param) = tail.rsplit_once('.')?;
    let mapped = match module {
        "conv1.fn.dw" => "conv1".to_owned(),
        "conv2.fn.dw" => "conv2".to_owned(),
        "ffn.norm" => "norm2".to_owned(),
        "ffn.fn.net.fc1" => "ffn.fc1".to_owned(),
        "ffn.fn.net.fc2" => "ffn.fc2".to_owned(),
        m if m == format!("{attn}.norm") => "norm1".to_owned(),
        m => {
            let sub = m.strip_prefix(attn)?.strip_prefix(".fn.")?;
            if sub != "qkv" && sub != "proj" {
                return None;
            }
            format!("{attn}.{sub}")
        }
    };
    Some(format!("{mapped}.{param}"))
}
