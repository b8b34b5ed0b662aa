//! The expected-tensor table: every canonical tensor name the model needs, with its shape, derived from
//! the config. `tests/reference/expected.rs` checks the base config's table against the reference key
//! list.

use crate::config::Florence2Config;

/// Canonical name of BART's `final_logits_bias` (original checkpoints only; HF-native conversions drop
/// it). Shape `(1, vocab)`. The loader keeps it only when it is non-zero (it is all zeros in the released
/// checkpoints); when `Weights::has` says it is there, the model must add it to the logits.
pub const FINAL_LOGITS_BIAS: &str = "final_logits_bias";

/// Hidden width of a DaViT MLP: `int(C * mlp_ratio)` as in the reference.
pub fn davit_mlp_hidden(c: usize, mlp_ratio: f64) -> usize {
    (c as f64 * mlp_ratio) as usize
}

/// Every tensor the model needs (name, shape), canonical HF-native names. The tied LM head is not listed
/// (see [`optional_tensors`]). `model.multi_modal_projector.visual_temporal_embed.pos_idx_to_embed` is
/// listed; when a checkpoint lacks it the loader synthesizes it from the closed form.
pub fn expected_tensors(cfg: &Florence2Config) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    let c_last = davit_tensors(cfg, &mut out);
    projector_tensors(cfg, c_last, &mut out);
    bart_tensors(cfg, &mut out);
    out
}

/// The DaViT tower's tensors, appended to `out`; returns the last stage's width.
fn davit_tensors(cfg: &Florence2Config, out: &mut Vec<(String, Vec<usize>)>) -> usize {
    let mut add = |name: String, shape: Vec<usize>| out.push((name, shape));
    let v = &cfg.vision;
    let mut c_in = v.in_channels;
    for s in 0..v.embed_dim.len() {
        let c = v.embed_dim[s];
        let k = v.patch_size[s];
        let p = format!("model.vision_tower.convs.{s}");
        add(format!("{p}.conv.weight"), vec![c, c_in, k, k]);
        add(format!("{p}.conv.bias"), vec![c]);
        let nc = if v.patch_prenorm[s] { c_in } else { c };
        add(format!("{p}.norm.weight"), vec![nc]);
        add(format!("{p}.norm.bias"), vec![nc]);
        let hidden = davit_mlp_hidden(c, v.mlp_ratio);
        for b in 0..v.depths[s] {
            for (kind, attn) in [
                ("spatial_block", "window_attn"),
                ("channel_block", "channel_attn"),
            ] {
                let p = format!("model.vision_tower.blocks.{s}.{b}.{kind}");
                davit_block_tensors(&p, attn, c, hidden, v.qkv_bias, &mut add);
            }
        }
        c_in = c;
    }
    c_in
}

/// One DaViT block's tensors under prefix `p`: depthwise convs, norms, attention `attn`, FFN.
fn davit_block_tensors(
    p: &str,
    attn: &str,
    c: usize,
    hidden: usize,
    qkv_bias: bool,
    add: &mut impl FnMut(String, Vec<usize>),
) {
    for conv in ["conv1", "conv2"] {
        add(format!("{p}.{conv}.weight"), vec![c, 1, 3, 3]);
        add(format!("{p}.{conv}.bias"), vec![c]);
    }
    for norm in ["norm1", "norm2"] {
        add(format!("{p}.{norm}.weight"), vec![c]);
        add(format!("{p}.{norm}.bias"), vec![c]);
    }
    add(format!("{p}.{attn}.qkv.weight"), vec![3 * c, c]);
    if qkv_bias {
        add(format!("{p}.{attn}.qkv.bias"), vec![3 * c]);
    }
    add(format!("{p}.{attn}.proj.weight"), vec![c, c]);
    add(format!("{p}.{attn}.proj.bias"), vec![c]);
    add(format!("{p}.ffn.fc1.weight"), vec![hidden, c]);
    add(format!("{p}.ffn.fc1.bias"), vec![hidden]);
    add(format!("{p}.ffn.fc2.weight"), vec![c, hidden]);
    add(format!("{p}.ffn.fc2.bias"), vec![c]);
}

/// The projector's tensors (the tower's last width is `c_last`), appended to `out`.
fn projector_tensors(cfg: &Florence2Config, c_last: usize, out: &mut Vec<(String, Vec<usize>)>) {
    let mut add = |name: String, shape: Vec<usize>| out.push((name, shape));
    let v = &cfg.vision;
    let d = cfg.text.d_model;
    let p = "model.multi_modal_projector";
    for t in ["row_embeddings", "column_embeddings"] {
        add(
            format!("{p}.image_position_embed.{t}.weight"),
            vec![v.max_position_embeddings, c_last / 2],
        );
    }
    add(format!("{p}.image_projection.weight"), vec![d, c_last]);
    add(format!("{p}.image_proj_norm.weight"), vec![d]);
    add(format!("{p}.image_proj_norm.bias"), vec![d]);
    add(
        format!("{p}.visual_temporal_embed.pos_idx_to_embed"),
        vec![v.max_temporal_embeddings, c_last],
    );
}

/// BART's tensors (shared embedding, encoder, decoder), appended to `out`.
fn bart_tensors(cfg: &Florence2Config, out: &mut Vec<(String, Vec<usize>)>) {
    let mut add = |name: String, shape: Vec<usize>| out.push((name, shape));
    let t = &cfg.text;
    let d = t.d_model;
    let lm = "model.language_model";
    add(format!("{lm}.shared.weight"), vec![t.vocab_size, d]);
    for (side, layers, ffn) in [
        ("encoder", t.encoder_layers, t.encoder_ffn_dim),
        ("decoder", t.decoder_layers, t.decoder_ffn_dim),
    ] {
        let p = format!("{lm}.{side}");
        // BART's learned positions are offset by 2.
        add(
            format!("{p}.embed_positions.weight"),
            vec![t.max_position_embeddings + 2, d],
        );
        add(format!("{p}.layernorm_embedding.weight"), vec![d]);
        add(format!("{p}.layernorm_embedding.bias"), vec![d]);
        for l in 0..layers {
            let p = format!("{p}.layers.{l}");
            bart_layer_tensors(&p, side == "decoder", d, ffn, &mut add);
        }
    }
}

/// One BART layer's tensors under prefix `p` (a decoder layer adds cross-attention).
fn bart_layer_tensors(
    p: &str,
    decoder: bool,
    d: usize,
    ffn: usize,
    add: &mut impl FnMut(String, Vec<usize>),
) {
    let mut attn = vec!["self_attn"];
    if decoder {
        attn.push("encoder_attn");
    }
    for a in attn {
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            add(format!("{p}.{a}.{proj}.weight"), vec![d, d]);
            add(format!("{p}.{a}.{proj}.bias"), vec![d]);
        }
        add(format!("{p}.{a}_layer_norm.weight"), vec![d]);
        add(format!("{p}.{a}_layer_norm.bias"), vec![d]);
    }
    add(format!("{p}.fc1.weight"), vec![ffn, d]);
    add(format!("{p}.fc1.bias"), vec![ffn]);
    add(format!("{p}.fc2.weight"), vec![d, ffn]);
    add(format!("{p}.fc2.bias"), vec![d]);
    add(format!("{p}.final_layer_norm.weight"), vec![d]);
    add(format!("{p}.final_layer_norm.bias"), vec![d]);
}

/// Tensors loaded when present: the untied LM head `(V, D)` (aliased to the shared embedding when
/// absent) and the original checkpoints' `final_logits_bias` `(1, V)`.
pub fn optional_tensors(cfg: &Florence2Config) -> Vec<(String, Vec<usize>)> {
    let v = cfg.text.vocab_size;
    vec![
        ("lm_head.weight".to_owned(), vec![v, cfg.text.d_model]),
        (FINAL_LOGITS_BIAS.to_owned(), vec![1, v]),
    ]
}
