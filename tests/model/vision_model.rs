//! DaViT / projector behaviour beyond the default path: the `image_feature_source` order, and the named
//! errors for misshapen weights, bad pixel tensors and token grids beyond the learned position tables.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

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

/// The activation bytes the DaViT arena may hold for a `(h, w)` input of f32 weights, computed here
/// from the config alone (independently of `DaVit::arena_plan`):
/// - two buffers for the residual stream ping-pong, each the largest stage's (B, H, W, C) or the
///   pixels (they also hold the windows and the attention outputs when the token grid is a whole
///   number of windows);
/// - one for the zero-padded windows of the stages whose grid is not;
/// - one for the largest of: channel attention's q|k (2 x tokens; 3 x when its qkv weight cannot be
///   split at 256-byte offsets, i.e. C not a multiple of 32), the window qkv (3 x windows) where it
///   runs whole (padded grids, the generic path) and tokens (the channel half's stream); the MLP
///   hidden, the window qkv of whole-window grids and the patch-embedding im2col run in chunks that
///   fit in it (at least one group of rows / windows whose byte offset keeps 256-byte alignment; the
///   MLP and window chunks within `chunk_budget` bytes when one is set);
/// - the Gram partials (tokens/256 x C x C/groups) of the split channel attention;
/// - three more window-sized q/k/v buffers when the generic attention path runs (in every stage
///   when `generic`).
///
/// Returns (bytes, number of arena buffers).
fn arena_bound(
    v: &florence2_wasm::config::VisionConfig,
    (ih, iw): (usize, usize),
    generic: bool,
    chunk_budget: Option<usize>,
) -> (u64, u64) {
    let pix = ih * iw * v.in_channels;
    let (mut h, mut w, mut cin) = (ih, iw, v.in_channels);
    let (mut stream, mut windows, mut others, mut split) = (pix, 0usize, 0usize, 0usize);
    let mut partials = 0usize;
    let mut im2cols = Vec::new();
    // (elements per chunked unit, units, units per aligned group)
    let mut chunked = Vec::new();
    let ws = v.window_size;
    let t = ws * ws;
    // Rows of `bytes` bytes whose offset is a multiple of 256.
    let group = |bytes: usize| (1..).find(|r| (r * bytes).is_multiple_of(256)).unwrap();
    for s in 0..v.embed_dim.len() {
        let (k, st, p, c) = (
            v.patch_size[s],
            v.patch_stride[s],
            v.patch_padding[s],
            v.embed_dim[s],
        );
        h = (h + 2 * p - k) / st + 1;
        w = (w + 2 * p - k) / st + 1;
        let rows = h * w;
        let win = h.div_ceil(ws) * ws * w.div_ceil(ws) * ws * c;
        let hidden = (c as f64 * v.mlp_ratio) as usize;
        let whole_windows = win == rows * c;
        let fused = !generic && florence2_wasm::ops::window_attn::supported(c, v.num_heads[s]);
        stream = stream.max(rows * c);
        if !whole_windows {
            windows = windows.max(win);
        }
        let split_qkv = c.is_multiple_of(32);
        if split_qkv {
            let d = c / v.num_groups[s];
            partials = partials.max(rows.div_ceil(256) * c * d);
        }
        others = others
            .max(if split_qkv { 2 } else { 3 } * rows * c)
            .max(if whole_windows && fused { 0 } else { 3 * win });
        // The conv pads K to its GEMM step (the stem's 147 -> 152) with f32 weights; its im2col
        // runs in chunks of rows too.
        let kp = florence2_wasm::ops::conv::gemm_k(cin * k * k, DType::F32).0;
        im2cols.push((rows, kp));
        chunked.push((hidden, rows, group(4 * c)));
        if whole_windows && fused {
            chunked.push((3 * t * c, win / (t * c), group(4 * t * c)));
        }
        if !fused {
            split = split.max(win);
        }
        cin = c;
    }
    let cap = chunk_budget.map_or(others, |b| others.min(b / 4));
    let big = chunked
        .iter()
        .map(|&(unit, units, group)| (units * unit).min(cap.max(group * unit)))
        .chain(
            im2cols
                .iter()
                .map(|&(rows, kp)| (rows * kp).min((others / kp).max(1) * kp)),
        )
        .fold(others, usize::max);
    (
        4 * (2 * stream + windows + big + 3 * split + partials) as u64,
        3 + u64::from(windows > 0) + if split > 0 { 3 } else { 0 } + u64::from(partials > 0),
    )
}

fn plan_buffers(p: &florence2_wasm::model::davit::ArenaPlan) -> u64 {
    3 + u64::from(p.windows > 0) + if p.split > 0 { 3 } else { 0 } + u64::from(p.partials > 0)
}

#[test]
fn davit_activation_arena_is_planned_and_reused() {
    // The tower's activations live in one arena of 3 large buffers per forward (one more when a stage
    // pads its windows, as tiny4's do; 3 more with the generic attention path) and a small one for
    // channel attention's Gram partials, whatever the number of stages and blocks. The bound below is
    // what that plan needs; the
    // per-op-family buffers it replaced held 6 buffers per stage (a, b, n, p, the 4x MLP hidden, the
    // 3x qkv: 11 stage-0 activations) beside the NHWC pixels and a fresh im2col scratch per conv,
    // which is over the bound on both fixtures (asserted below), so a regression to per-stage or
    // per-op buffers fails.
    // A device of its own: the memory counters are per device, and other tests run in parallel.
    let g = std::sync::Arc::new(
        pollster::block_on(florence2_wasm::gpu::Device::new(Default::default())).unwrap(),
    );
    for fixture in ["tiny2", "tiny4"] {
        let (cfg, w) = weights::load_dir(&g, &fixtures().join("models").join(fixture)).unwrap();
        // The default, the generic attention path, and an MLP budget of 50 stage-0 hidden rows
        // (12800 B) that forces the MLP's row chunks (in place, through views at row offsets).
        for (fused, mlp_budget) in [(true, None), (false, None), (true, Some(12800usize))] {
            let mut davit = DaVit::new(&cfg.vision, w.pp("model").pp("vision_tower")).unwrap();
            davit.fused_window_attention = fused;
            if let Some(b) = mlp_budget {
                davit.mlp_chunk_bytes = b as u64;
            }
            let (pshape, pvals) = reference(fixture, "pixel_values");
            let (ih, iw) = (pshape[2], pshape[3]);
            let (bound, buffers) = arena_bound(&cfg.vision, (ih, iw), !fused, mlp_budget);
            let chunk0 = davit
                .tower_shape()
                .unwrap()
                .mlp_chunk_rows(g.caps.max_storage_binding, 1, (ih, iw))
                .unwrap()[0];
            let rows0 = {
                let (h0, w0) = davit.stage_grids(ih, iw).unwrap()[0];
                h0 * w0
            };
            // As at Florence-2's 768 px, stage 0's 4x MLP hidden exceeds what the rest of `big`
            // needs: it runs in chunks (smaller ones under the budget).
            assert!(
                chunk0 < rows0,
                "{fixture}: stage 0's MLP in chunks of {chunk0} of {rows0} rows"
            );
            assert_eq!(
                plan_buffers(
                    &davit
                        .tower_shape()
                        .unwrap()
                        .arena_plan(u64::MAX, 1, (ih, iw))
                        .unwrap()
                ),
                buffers
            );
            // tiny2's grids (16x16, 8x8) are whole windows of 4: no window buffer; tiny4's are not.
            // Both have a 32-channel stage whose channel attention runs from q|k and v apart.
            let plan = davit
                .tower_shape()
                .unwrap()
                .arena_plan(u64::MAX, 1, (ih, iw))
                .unwrap();
            assert_eq!(plan.windows > 0, fixture == "tiny4", "{fixture}");
            assert!(plan.partials > 0, "{fixture}");
            let plan = davit
                .tower_shape()
                .unwrap()
                .arena_plan(g.caps.max_storage_binding, 1, (ih, iw))
                .unwrap();
            assert!(
                plan.bytes() <= bound,
                "{fixture}: plan {plan:?} over {bound}"
            );
            // What the per-op-family buffers held at the stem conv: the NHWC pixels, stage 0's 11
            // activations of (H0*W0, C0), its separate zero-padded windows and their qkv (1 + 3
            // padded-window activations) when the grid is not a whole number of windows, and the
            // conv's im2col scratch of (H0*W0, K padded).
            let (h0, w0) = davit.stage_grids(ih, iw).unwrap()[0];
            let (k0, c0, ws) = (
                cfg.vision.patch_size[0],
                cfg.vision.embed_dim[0],
                cfg.vision.window_size,
            );
            let padded0 = h0.div_ceil(ws) * ws * w0.div_ceil(ws) * ws;
            let windows0 = if padded0 > h0 * w0 {
                4 * padded0 * c0
            } else {
                0
            };
            let kp0 = florence2_wasm::ops::conv::gemm_k(3 * k0 * k0, DType::F32).0;
            let old_stage0 =
                4 * (ih * iw * 3 + 11 * h0 * w0 * c0 + windows0 + h0 * w0 * kp0) as u64;
            // Besides the arena, ops hold scratch for their own duration only (the depthwise conv's
            // (9, C) taps, channel attention's Gram partials of (N/256, groups, d, d)), each below one
            // stage-0 activation: allow one. Per-op or per-stage activation buffers exceed that.
            let unit0 = 4 * (h0 * w0 * cfg.vision.embed_dim[0]) as u64;
            let bound = bound + unit0;
            assert!(
                old_stage0 > bound,
                "{fixture}: the bound {bound} must catch {old_stage0}"
            );
            let px = Tensor::from_f32(&g, &pshape, &pvals, "pixels").unwrap();
            let want = reference(fixture, "vision.out").1;
            let mut peaks = Vec::new();
            let mut allocs_seen = Vec::new();
            let mut outputs = Vec::new();
            // Round 0 on a pixel tensor, round 1 on the same pixels from the CPU (`forward_host`,
            // written into the arena): the same arena, the same values.
            for round in 0..2 {
                let before = g.memory();
                g.reset_peak_memory();
                let mut rec = Recorder::new(&g);
                let (feats, _) = if round == 0 {
                    davit.forward(&mut rec, &px, None).unwrap()
                } else {
                    let shape = [pshape[0], pshape[1], pshape[2], pshape[3]];
                    davit.forward_host(&mut rec, &pvals, shape, None).unwrap()
                };
                rec.submit().unwrap();
                let m = g.memory();
                let used = m.peak_activations_bytes - before.activations_bytes;
                let allocs = m.allocations - before.allocations;
                eprintln!(
                    "{fixture} fused={fused} mlp_budget={mlp_budget:?} round {round}: arena peak {used} B in {allocs} buffers \
                     (bound {bound} B, plan {} B; old stage 0 alone {old_stage0} B)",
                    plan.bytes()
                );
                assert!(
                    used <= bound,
                    "{fixture}: {used} B of activations > {bound}"
                );
                assert!(used >= plan.bytes(), "{fixture}: the arena is allocated");
                allocs_seen.push(allocs);
                // Same values as the reference (vision_parity.rs' tolerance): reuse is safe.
                let got = readback::to_f32_blocking(&g, &feats).unwrap();
                let peak = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!(
                    max_diff(&got, &want).0 <= 1e-4 * peak,
                    "{fixture} round {round}"
                );
                outputs.push(got);
                drop(feats);
                // Nothing outlives the forward: the arena is released with its output.
                assert_eq!(g.memory().activations_bytes, before.activations_bytes);
                peaks.push(used);
            }
            assert_eq!(
                peaks[0], peaks[1],
                "{fixture}: repeated forwards use the same memory"
            );
            assert_eq!(
                allocs_seen[0], allocs_seen[1],
                "{fixture}: and the same buffers"
            );
            assert!(
                outputs[0] == outputs[1],
                "{fixture}: pixels from the CPU give the same values"
            );
        }
    }
}
