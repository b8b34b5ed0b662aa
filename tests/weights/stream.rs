//! The push-style streaming loader: any chunking (1 byte, odd sizes, whole file) gives exactly the
//! tensors of the ranged loader; stream errors are named. Host memory is measured in `weights_stream_memory.rs` (its own binary: a global counting
//! allocator needs no other test running).
#![cfg(not(target_arch = "wasm32"))]

use crate::weights_util;

use florence2_wasm::weights::{Assembler, LoadOptions, StreamLoader};
use florence2_wasm::Error;
use weights_util::*;

#[test]
fn any_chunking_matches_ranged_loader() {
    // HF-native f32 here; the original-named f16 and mlx bf16 variants are built from the reference
    // mapping, so they run in the reference suite (tests/reference/stream.rs). The committed original/mlx
    // fixtures are streamed in weights_fixtures.rs.
    let gpu = gpu();
    check_any_chunking(
        &gpu,
        &mapping_config_json(),
        Variant::HfNative,
        Dt::F32,
        false,
    );
}

#[test]
fn stream_errors_are_named() {
    let cfg = tiny_config();
    let canon = canonical_tensors(&cfg, 12);
    let file = write_safetensors(&variant_tensors(&canon, Variant::HfNative, Dt::F32), None);
    // Truncated body: every cut point class (inside the length, the header, the data).
    for cut in [3, 20, file.len() / 2, file.len() - 1] {
        match stream(&cfg, &file[..cut], &[7], false) {
            Err(Error::Truncated { .. }) => {}
            Err(e) => panic!("cut {cut}: {e}"),
            Ok(_) => panic!("cut {cut}: loaded"),
        }
    }
    // Truncated with the length announced: the header check knows early.
    let gpu = gpu();
    let mut asm = Assembler::new(
        &gpu,
        &cfg,
        LoadOptions::with_dtype(florence2_wasm::weights::WeightDType::Fp32),
    );
    let mut s = StreamLoader::new("m", Some(file.len() as u64 - 1));
    assert!(matches!(
        s.feed(&mut asm, &file[..file.len() - 1]),
        Err(Error::Truncated { .. })
    ));
    // Bad header.
    let bad = raw_file("{nope", &[0; 8]);
    assert!(matches!(
        stream(&cfg, &bad, &[5], false),
        Err(Error::SafetensorsHeader { .. })
    ));
    // Header length beyond the announced file length.
    let mut long = file.clone();
    let n = u64::from_le_bytes(long[..8].try_into().unwrap());
    long[..8].copy_from_slice(&(n + 1_000_000).to_le_bytes());
    assert!(matches!(
        stream(&cfg, &long, &[4096], true),
        Err(Error::SafetensorsHeader { .. })
    ));
    // Bytes after the last tensor, with and without a known length.
    let mut extra = file.clone();
    extra.extend_from_slice(&[1, 2, 3, 4]);
    assert!(matches!(
        stream(&cfg, &extra, &[1000], false),
        Err(Error::SafetensorsHeader { .. })
    ));
    let mut asm = Assembler::new(
        &gpu,
        &cfg,
        LoadOptions::with_dtype(florence2_wasm::weights::WeightDType::Fp32),
    );
    let mut s = StreamLoader::new("m", Some(file.len() as u64));
    assert!(matches!(
        s.feed(&mut asm, &extra),
        Err(Error::SafetensorsHeader { .. })
    ));
    // A U8 shape of 2^64 - 1 bytes: a named header error (it overflowed the file-length check), with
    // and without a known length.
    let huge = raw_file(
        r#"{"a": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 18446744073709551615]}}"#,
        &[0; 4],
    );
    for known in [false, true] {
        assert!(
            matches!(
                stream(&cfg, &huge, &[3], known),
                Err(Error::SafetensorsHeader { .. })
            ),
            "known length {known}"
        );
    }
    // Shape errors surface as soon as the header is parsed, before any data.
    let mut raw = variant_tensors(&canon, Variant::HfNative, Dt::F32);
    raw[0].shape.push(1);
    let f = write_safetensors(&raw, None);
    let hlen = 8 + u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
    let mut asm = Assembler::new(
        &gpu,
        &cfg,
        LoadOptions::with_dtype(florence2_wasm::weights::WeightDType::Fp32),
    );
    let mut s = StreamLoader::new("m", None);
    assert!(matches!(
        s.feed(&mut asm, &f[..hlen]),
        Err(Error::TensorShape { .. })
    ));
}
