//! DaViT / projector behaviour beyond the default path: the `image_feature_source` order, and the named
//! errors for misshapen weights, bad pixel tensors and token grids beyond the learned position tables.
#![cfg(not(target_arch = "wasm32"))]
mod common;

use std::path::PathBuf;

use common::{gpu, max_diff};
use florence2_wasm::gpu::{readback, DType, Recorder, Tensor};
use florence2_wasm::model::davit::DaVit;
use florence2_wasm::model::projector::Projector;
use florence2_wasm::{weights, Error};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn reference(cfg: &str, name: &str) -> (Vec<usize>, Vec<f32>) {
    let path = fixtures()
        .join("reference")
        .join(cfg)
        .join("activations.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    (t.shape().to_vec(), bytemuck::pod_collect_to_vec(t.data()))
}

#[test]
fn feature_source_order_is_honoured() {
    // The reference (released configs) puts the pooled token first: [spatial_avg_pool, temporal_avg_pool].
    // Reversing the config must give the N tokens first and the pooled token last, with the same values
    // (every row is projected and normalised independently); `last_frame` is the tokens themselves.
    let g = gpu();
    let (mut cfg, w) = weights::load_dir(&g, &fixtures().join("models/tiny4")).unwrap();
    let (pshape, pvals) = reference("tiny4", "pixel_values");
    let (oshape, want) = reference("tiny4", "projector.out");
    let (t, d) = (oshape[1], oshape[2]);
    let davit = DaVit::new(&cfg.vision, w.pp("model").pp("vision_tower")).unwrap();
    cfg.vision.image_feature_source = vec!["temporal_avg_pool".into(), "spatial_avg_pool".into()];
    let rev = Projector::new(&cfg, w.pp("model").pp("multi_modal_projector")).unwrap();
    cfg.vision.image_feature_source = vec!["last_frame".into()];
    let last = Projector::new(&cfg, w.pp("model").pp("multi_modal_projector")).unwrap();
    let px = Tensor::from_f32(&g, &pshape, &pvals, "pixels").unwrap();
    let mut rec = Recorder::new(&g);
    let (feats, grid) = davit.forward(&mut rec, &px, None).unwrap();
    let out_rev = rev.forward(&mut rec, &feats, grid).unwrap();
    let out_last = last.forward(&mut rec, &feats, grid).unwrap();
    rec.submit().unwrap();
    assert_eq!(out_rev.shape(), [1, t, d]);
    assert_eq!(out_last.shape(), [1, t - 1, d]);
    let got_rev = readback::to_f32_blocking(&g, &out_rev).unwrap();
    let got_last = readback::to_f32_blocking(&g, &out_last).unwrap();
    // Expected: reference rows 1.. (tokens) then row 0 (pooled).
    let mut want_rev = want[d..].to_vec();
    want_rev.extend_from_slice(&want[..d]);
    let tol = 1e-4 * want.iter().fold(0f32, |m, v| m.max(v.abs())); // as in vision_parity.rs
    let (dr, peak) = max_diff(&got_rev, &want_rev);
    eprintln!("reversed sources: max |diff| = {dr:.3e} (peak {peak:.3e}, tol {tol:.2e})");
    assert!(dr <= tol);
    let (dl, _) = max_diff(&got_last, &want[d..]);
    eprintln!("last_frame: max |diff| = {dl:.3e}");
    assert!(dl <= tol);
}

#[test]
fn misshapen_vision_weight_is_a_named_error() {
    let g = gpu();
    let (mut cfg, w) = weights::load_dir(&g, &fixtures().join("models/tiny2")).unwrap();
    cfg.vision.embed_dim[1] += 4; // the checkpoint's stage-1 tensors no longer fit
    let err = DaVit::new(&cfg.vision, w.pp("model").pp("vision_tower")).unwrap_err();
    assert!(matches!(err, Error::TensorShape { .. }), "{err}");
    // A view at the wrong prefix finds nothing.
    let (cfg, w) = weights::load_dir(&g, &fixtures().join("models/tiny2")).unwrap();
    let err = DaVit::new(&cfg.vision, w.pp("model").pp("vision")).unwrap_err();
    assert!(matches!(err, Error::MissingTensor { .. }), "{err}");
    let err = Projector::new(&cfg, w.pp("model").pp("vision_tower")).unwrap_err();
    assert!(matches!(err, Error::MissingTensor { .. }), "{err}");
}

#[test]
fn bad_pixels_and_oversized_grids_are_shape_errors() {
    let g = gpu();
    let (cfg, w) = weights::load_dir(&g, &fixtures().join("models/tiny4")).unwrap();
    let davit = DaVit::new(&cfg.vision, w.pp("model").pp("vision_tower")).unwrap();
    let proj = Projector::new(&cfg, w.pp("model").pp("multi_modal_projector")).unwrap();
    let mut rec = Recorder::new(&g);
    // Wrong channel count, wrong rank.
    for shape in [vec![1, 4, 32, 32], vec![3, 32, 32]] {
        let px = Tensor::zeros(&g, &shape, DType::F32, "px").unwrap();
        let err = davit.forward(&mut rec, &px, None).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{shape:?}: {err}");
    }
    // A 1x1 image still yields a token at every stage (padding), and any size is accepted by the tower;
    // but tiny4's 4-row position tables cannot place a 5x4 grid (160x128 pixels).
    let px = Tensor::zeros(&g, &[1, 3, 160, 128], DType::F32, "px").unwrap();
    let (feats, grid) = davit.forward(&mut rec, &px, None).unwrap();
    assert_eq!(grid, (5, 4));
    let err = proj.forward(&mut rec, &feats, grid).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let px = Tensor::zeros(&g, &[1, 3, 1, 1], DType::F32, "px").unwrap();
    let (_, grid) = davit.forward(&mut rec, &px, None).unwrap();
    assert_eq!(grid, (1, 1));
}

#[test]
fn batch_of_two_images_matches_reference_per_image() {
    // The tower and projector take any batch: two copies of the reference pixels must each reproduce
    // the reference outputs (same 1e-4-of-peak tolerance as vision_parity.rs), so no kernel mixes batch
    // rows (window order, channel-attention groups, pooled token per image).
    let g = gpu();
    let (cfg, w) = weights::load_dir(&g, &fixtures().join("models/tiny4")).unwrap();
    let davit = DaVit::new(&cfg.vision, w.pp("model").pp("vision_tower")).unwrap();
    let proj = Projector::new(&cfg, w.pp("model").pp("multi_modal_projector")).unwrap();
    let (mut pshape, pvals) = reference("tiny4", "pixel_values");
    pshape[0] = 2;
    let both: Vec<f32> = pvals.iter().chain(pvals.iter()).copied().collect();
    let px = Tensor::from_f32(&g, &pshape, &both, "pixels").unwrap();
    let mut rec = Recorder::new(&g);
    let (feats, grid) = davit.forward(&mut rec, &px, None).unwrap();
    let out = proj.forward(&mut rec, &feats, grid).unwrap();
    rec.submit().unwrap();
    for (name, t) in [("vision.out", &feats), ("projector.out", &out)] {
        let (shape, want) = reference("tiny4", name);
        assert_eq!(t.shape()[0], 2);
        assert_eq!(&t.shape()[1..], &shape[1..]);
        let got = readback::to_f32_blocking(&g, t).unwrap();
        let peak = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (b, half) in got.chunks_exact(want.len()).enumerate() {
            let (d, _) = max_diff(half, &want);
            eprintln!("{name} batch row {b}: max |diff| = {d:.3e} (peak {peak:.3e})");
            assert!(d <= 1e-4 * peak, "{name} row {b}");
        }
    }
}
