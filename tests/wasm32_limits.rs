//! The 32-bit cases of issue 15, run where usize is 32 bits: wasm32 in headless Chromium (wasm-bindgen-test;
//! `scripts/test.sh` runs it with the browser tests). Natively these inputs were already refused or
//! harmless; on wasm32 each one used to go wrong:
//! - a config integer of 2^32 + 32 was cast to usize (32) before its range check;
//! - a safetensors dimension of 2^32 + 1 beside a zero dimension (element count 0) was cast to 1;
//! - a tensor of exactly 4 GiB made the streaming loader compute a zero-byte step and loop forever.
#![cfg(target_arch = "wasm32")]

use florence2_wasm::config::Florence2Config;
use florence2_wasm::gpu::{Device, DeviceOptions};
use florence2_wasm::weights::stream::step_len;
use florence2_wasm::weights::{parse_header, Assembler, LoadOptions, StreamLoader};
use florence2_wasm::Error;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

fn tiny_config() -> serde_json::Value {
    serde_json::json!({
        "model_type": "florence2",
        "projection_dim": 16,
        "text_config": {"d_model": 16, "encoder_layers": 1, "decoder_layers": 2,
            "encoder_attention_heads": 2, "decoder_attention_heads": 2,
            "encoder_ffn_dim": 24, "decoder_ffn_dim": 32, "vocab_size": 40,
            "max_position_embeddings": 12},
        "vision_config": {"embed_dim": [8, 12], "depths": [1, 2],
            "num_heads": [2, 2], "num_groups": [2, 3],
            "patch_size": [7, 3], "patch_stride": [4, 2],
            "patch_padding": [3, 1], "patch_prenorm": [false, true],
            "window_size": 2, "projection_dim": 16, "max_position_embeddings": 5,
            "max_temporal_embeddings": 4}
    })
}

fn file_with_header(header: &str, data_len: usize) -> Vec<u8> {
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.resize(f.len() + data_len, 0);
    f
}

#[wasm_bindgen_test]
fn usize_is_32_bits_here() {
    assert_eq!(usize::BITS, 32);
}

#[wasm_bindgen_test]
fn config_integers_are_range_checked_before_the_cast() {
    for (sect, key, n) in [
        ("text_config", "encoder_layers", (1u64 << 32) + 1),
        ("text_config", "d_model", (1u64 << 32) + 16),
        ("text_config", "vocab_size", (1u64 << 32) + 40),
    ] {
        let mut v = tiny_config();
        v[sect][key] = n.into();
        let e = Florence2Config::from_json(&v).unwrap_err();
        assert!(
            matches!(&e, Error::Config(m) if m.contains("out of range")),
            "{key} = {n}: {e}"
        );
    }
    let mut v = tiny_config();
    v["vision_config"]["depths"] = serde_json::json!([1, (1u64 << 32) + 2]);
    assert!(matches!(
        Florence2Config::from_json(&v),
        Err(Error::Config(_))
    ));
    let mut v = tiny_config();
    v["num_beams"] = ((1u64 << 32) + 3).into();
    assert!(matches!(
        Florence2Config::from_json(&v),
        Err(Error::Config(_))
    ));
}

#[wasm_bindgen_test]
fn header_dimensions_must_fit_usize() {
    // Element count 0, so the count check passes; the 2^32 + 1 dimension itself must not wrap to 1.
    let f = file_with_header(
        r#"{"a": {"dtype": "F32", "shape": [0, 4294967297], "data_offsets": [0, 0]}}"#,
        0,
    );
    let e = parse_header(&f, "m").unwrap_err();
    assert!(
        matches!(&e, Error::SafetensorsHeader { msg, .. } if msg.contains("too large")),
        "{e}"
    );
    // 2^32 elements overflow usize here.
    let f = file_with_header(
        r#"{"a": {"dtype": "U8", "shape": [65536, 65536], "data_offsets": [0, 4294967296]}}"#,
        0,
    );
    assert!(parse_header(&f, "m").is_err());
}

#[wasm_bindgen_test]
fn stream_step_is_computed_before_narrowing() {
    assert_eq!(step_len(1 << 32, 4096), 4096);
    assert_eq!(step_len((1 << 32) + 5, 4096), 4096);
    assert_eq!(step_len(5, 4096), 5);
}

/// A 4 GiB tensor the model does not use (F32, 2^30 elements: its count fits usize, its byte length does
/// not): the loader must route the bytes that arrive (it used to take zero-byte steps forever) and report
/// the file as truncated at the end.
#[wasm_bindgen_test]
async fn a_4_gib_tensor_streams_instead_of_looping() {
    let gpu = Device::new(DeviceOptions::default())
        .await
        .expect("WebGPU adapter (Chromium needs --enable-unsafe-webgpu)");
    let cfg = Florence2Config::from_json(&tiny_config()).unwrap();
    let f = file_with_header(
        r#"{"unused.blob": {"dtype": "F32", "shape": [1073741824], "data_offsets": [0, 4294967296]}}"#,
        64 * 1024,
    );
    let mut asm = Assembler::new(&gpu, &cfg, LoadOptions::default());
    let mut s = StreamLoader::new("model.safetensors", None);
    for chunk in f.chunks(10_000) {
        s.feed(&mut asm, chunk).unwrap();
    }
    assert_eq!(s.received(), f.len() as u64);
    assert!(matches!(s.finish(&mut asm), Err(Error::Truncated { .. })));
}
