//! The push-style streaming loader: any chunking (1 byte, odd sizes, whole file) gives exactly the
//! tensors of the ranged loader, for every layout (incl. GPU permutes) and dtype; stream errors are
//! named. Host memory is measured in `weights_stream_memory.rs` (its own binary: a global counting
//! allocator needs no other test running).
#![cfg(not(target_arch = "wasm32"))]

mod weights_util;

use florence2_wasm::model::config::Florence2Config;
use florence2_wasm::weights::{Assembler, LoadOptions, StreamLoader};
use florence2_wasm::Error;
use weights_util::*;

#[test]
fn any_chunking_matches_ranged_loader() {
    let gpu = gpu();
    let cfg_json = mapping_config_json();
    let cfg = Florence2Config::from_json(&cfg_json).unwrap();
    let canon = canonical_tensors(&cfg, 11);
    let mut rng = Rng::new(5);
    let odd: Vec<usize> = (0..64)
        .map(|_| 1 + (rng.next_u64() % 97) as usize)
        .collect();
    for (variant, dt) in [
        (Variant::HfNative, Dt::F32),
        (Variant::Original, Dt::F16),
        (Variant::Mlx, Dt::BF16),
    ] {
        let file = write_safetensors(&variant_tensors(&canon, variant, dt), None);
        let (_, ranged) = load_mem(
            &gpu,
            &mem_model(&cfg_json, &[("model.safetensors", file.clone())]),
        )
        .unwrap();
        let want = readback_all(&gpu, &ranged);
        // 1-byte chunks (every element split) only on the smallest file: it is slow on lavapipe.
        let mut ways = vec![
            ("odd", odd.clone()),
            ("3 bytes", vec![3]),
            ("whole", vec![file.len()]),
        ];
        if variant == Variant::Mlx {
            ways.push(("1 byte", vec![1]));
        }
        for (what, sizes) in ways {
            let w = stream(&cfg, &file, &sizes, what != "odd")
                .unwrap_or_else(|e| panic!("{variant:?} {what}: {e}"));
            let got = readback_all(&gpu, &w);
            assert_eq!(got, want, "{variant:?} {dt:?} chunks {what}");
        }
        // And both equal the canonical values rounded to the source dtype.
        for (n, _, v) in &canon {
            let r: Vec<f32> = v.iter().map(|&x| dt.round(x)).collect();
            assert_eq!(want[n], r, "{variant:?} {n}");
        }
        eprintln!(
            "{variant:?} {dt:?}: {} bytes, streamed identically",
            file.len()
        );
    }
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
    let mut asm = Assembler::new(&gpu, &cfg, LoadOptions::default());
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
    let mut asm = Assembler::new(&gpu, &cfg, LoadOptions::default());
    let mut s = StreamLoader::new("m", Some(file.len() as u64));
    assert!(matches!(
        s.feed(&mut asm, &extra),
        Err(Error::SafetensorsHeader { .. })
    ));
    // Shape errors surface as soon as the header is parsed, before any data.
    let mut raw = variant_tensors(&canon, Variant::HfNative, Dt::F32);
    raw[0].shape.push(1);
    let f = write_safetensors(&raw, None);
    let hlen = 8 + u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
    let mut asm = Assembler::new(&gpu, &cfg, LoadOptions::default());
    let mut s = StreamLoader::new("m", None);
    assert!(matches!(
        s.feed(&mut asm, &f[..hlen]),
        Err(Error::TensorShape { .. })
    ));
}
