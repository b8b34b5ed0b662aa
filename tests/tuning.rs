//! The on-device tuner (`ops::tune`) and the kernel registry (`ops::registry`): choices are installed,
//! cached per adapter, reused without timing, re-timed for another adapter, and a corrupt cache is
//! ignored with a named warning. Shapes are tiny (the timings themselves are not asserted: speed lives
//! in `scripts/bench/kernels.rs`).
#![cfg(not(target_arch = "wasm32"))]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::Rng;
use florence2_wasm::gpu::{readback, DType, Gpu, GpuOptions, Recorder, Tensor};
use florence2_wasm::model::config::Florence2Config;
use florence2_wasm::ops::matmul::{self, Act, LinearVariant};
use florence2_wasm::ops::registry::{row_class, ShapeClass};
use florence2_wasm::ops::tune::{self, model_linear_shapes, CacheLocation, LinearShape, Tuning};

fn open(opts: GpuOptions) -> Arc<Gpu> {
    pollster::block_on(Gpu::new(opts)).expect("a GPU adapter (lavapipe)")
}

/// A fresh cache directory under Cargo's per-target scratch space (inside the repository's target/).
fn cache_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tuning-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn shapes() -> Vec<LinearShape> {
    vec![
        LinearShape {
            m: 1,
            n: 40,
            k: 64,
            format: DType::F32,
        },
        LinearShape {
            m: 70,
            n: 48,
            k: 32,
            format: DType::F32,
        },
        LinearShape {
            m: 9,
            n: 24,
            k: 21,
            format: DType::F16,
        },
    ]
}

fn json_files(d: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(d)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "json"));
    v.sort();
    v
}

fn tune_blocking(g: &Arc<Gpu>, mode: Tuning, dir: &Path) -> tune::TuneReport {
    pollster::block_on(tune::tune(
        g,
        &shapes(),
        mode,
        &CacheLocation::Dir(dir.to_path_buf()),
    ))
    .unwrap()
}

#[test]
fn cache_is_written_then_reused_without_timing() {
    let g = open(GpuOptions::default());
    let dir = cache_dir("reuse");
    let first = tune_blocking(&g, Tuning::Auto, &dir);
    eprintln!("{}", first.table());
    assert!(first.warnings.is_empty(), "{:?}", first.warnings);
    assert_eq!(first.rows.len(), 3);
    assert!(first.timings >= 3, "every class timed: {}", first.timings);
    assert!(first.rows.iter().all(|r| !r.cached));
    // Every row's choice is installed and is one of the candidates that ran.
    for r in &first.rows {
        assert_eq!(g.choices.get(&r.class), Some(r.chosen));
        assert!(r
            .times_ms
            .iter()
            .any(|(n, t)| *n == r.chosen && t.is_some()));
    }
    assert_eq!(json_files(&dir).len(), 1, "one cache file for this adapter");
    let chosen: Vec<_> = g.choices.snapshot();

    // A second load (fresh table) reads the cache and times nothing.
    g.choices.clear();
    let second = tune_blocking(&g, Tuning::Auto, &dir);
    assert_eq!(second.timings, 0, "{}", second.table());
    assert!(second.rows.iter().all(|r| r.cached));
    assert_eq!(g.choices.snapshot(), chosen);

    // Exhaustive ignores the cache and times again; off clears the table and times nothing.
    let ex = tune_blocking(&g, Tuning::Exhaustive, &dir);
    assert!(ex.timings >= 3);
    let off = tune_blocking(&g, Tuning::Off, &dir);
    assert_eq!(off.timings, 0);
    assert!(g.choices.is_empty());
}

#[test]
fn cache_is_keyed_by_adapter() {
    let dir = cache_dir("keyed");
    let a = open(GpuOptions::default());
    // The same adapter opened without f16 and subgroups has other features: another key.
    let b = open(GpuOptions {
        disable_f16: true,
        disable_subgroups: true,
        ..Default::default()
    });
    if a.caps.adapter_key == b.caps.adapter_key {
        // Only an adapter with neither feature gives equal keys; then vary the limits instead.
        eprintln!("adapter has neither f16 nor subgroups; keying by a lowered binding limit");
    }
    let b = if a.caps.adapter_key == b.caps.adapter_key {
        open(GpuOptions {
            max_storage_binding_size: Some(1 << 20),
            ..Default::default()
        })
    } else {
        b
    };
    assert_ne!(a.caps.adapter_key, b.caps.adapter_key);
    let ra = tune_blocking(&a, Tuning::Auto, &dir);
    assert!(ra.timings > 0);
    let rb = tune_blocking(&b, Tuning::Auto, &dir);
    assert!(rb.timings > 0, "another adapter must re-tune");
    assert_eq!(json_files(&dir).len(), 2);
    // Each adapter now hits its own entry.
    a.choices.clear();
    b.choices.clear();
    assert_eq!(tune_blocking(&a, Tuning::Auto, &dir).timings, 0);
    assert_eq!(tune_blocking(&b, Tuning::Auto, &dir).timings, 0);
}

#[test]
fn corrupt_cache_is_ignored_with_a_named_warning() {
    let g = open(GpuOptions::default());
    let dir = cache_dir("corrupt");
    tune_blocking(&g, Tuning::Auto, &dir);
    let files = json_files(&dir);
    assert_eq!(files.len(), 1);
    for garbage in [&b"{\"package\": 7, trunc"[..], &[0xff, 0xfe, 0x00][..]] {
        std::fs::write(&files[0], garbage).unwrap();
        g.choices.clear();
        let r = tune_blocking(&g, Tuning::Auto, &dir);
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("tuning cache") && w.contains("corrupt")),
            "{:?}",
            r.warnings
        );
        assert!(r.timings > 0, "re-tuned");
        assert_eq!(g.choices.len(), 3);
        // ... and rewrote a valid cache.
        g.choices.clear();
        assert_eq!(tune_blocking(&g, Tuning::Auto, &dir).timings, 0);
    }
}

/// A cached choice is what `linear` runs, and its results are right; a choice that cannot run the
/// shape (a GEMV name for a 70-row input) is ignored in favour of the static choice.
#[test]
fn linear_follows_the_registry() {
    let g = open(GpuOptions::default());
    let mut rng = Rng::new(5);
    let (m, n, k) = (70, 33, 40);
    let x = rng.vec(m * k, 1.0);
    let w = rng.vec(n * k, 0.5);
    let tx = Tensor::from_f32(&g, &[m, k], &x, "x").unwrap();
    let tw = Tensor::from_f32(&g, &[n, k], &w, "w").unwrap();
    let to = Tensor::zeros(&g, &[m, n], DType::F32, "out").unwrap();
    let class = ShapeClass::linear(m, n, k, DType::F32);
    assert_eq!(class.dims, [128, n, k]);
    assert_eq!(row_class(3), 3);
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                .sum();
            want[i * n + j] = s as f32;
        }
    }
    for choice in ["tiled64", "tiled128", "gemv", "scalar"] {
        g.choices
            .set(class, LinearVariant::from_name(choice).unwrap().name());
        let before = g.pipelines.len();
        let mut rec = Recorder::new(&g);
        matmul::linear(&mut rec, &tx, &tw, None, Act::None, &to).unwrap();
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(&g, &to).unwrap();
        let (d, _) = common::max_diff(&got, &want);
        // 40-term f32 dot products of values <= 0.5 in magnitude: error well below 1e-5.
        assert!(d < 1e-5, "{choice}: max diff {d}");
        if choice == "tiled128" {
            assert_eq!(
                g.pipelines.len(),
                before + 1,
                "the tiled128 pipeline was built"
            );
        }
    }
}

#[test]
fn model_shapes_cover_every_layer_kind() {
    let cfg: Florence2Config =
        Florence2Config::from_json_str(include_str!("fixtures/models/tiny4/config.json")).unwrap();
    let s = model_linear_shapes(&cfg, 64, 64, 3, DType::F16);
    let d = cfg.text.d_model;
    let v = cfg.text.vocab_size;
    assert!(
        s.iter().any(|x| x.m == 1 && x.n == v && x.k == d),
        "LM head, greedy"
    );
    assert!(
        s.iter().any(|x| x.m == 3 && x.n == v && x.k == d),
        "LM head, 3 beams"
    );
    let c0 = cfg.vision.embed_dim[0];
    assert!(s.iter().any(|x| x.n == 3 * c0 && x.k == c0), "stage-0 qkv");
    // Every layer in the model's format, except a patch-embedding conv whose K is padded to the fast
    // kernels' K step (`conv::gemm_k`): that one runs with an f32 weight of padded K.
    let stem_k = cfg.vision.patch_size[0].pow(2) * cfg.vision.in_channels;
    let (kg, fg) = florence2_wasm::ops::conv::gemm_k(stem_k, DType::F16);
    assert!(
        s.iter().any(|x| x.n == c0 && x.k == kg && x.format == fg),
        "stem conv as GEMM (K {stem_k} -> {kg})"
    );
    assert!(s
        .iter()
        .all(|x| x.format == DType::F16 || (x.format == DType::F32 && x.k.is_multiple_of(8))));
    // Distinct classes only.
    for (i, a) in s.iter().enumerate() {
        assert!(s[i + 1..].iter().all(|b| b.class() != a.class()));
    }
}

/// `--profile`: with timestamp queries each dispatch comes back with its phase, op, variant, shape and a
/// GPU time; without them enabling fails with a named error.
#[test]
fn profiler_times_each_dispatch() {
    use florence2_wasm::gpu::profile;
    let g = open(GpuOptions::default());
    if !g.caps.timestamp_query {
        let err = g.profiler.enable(&g, true).unwrap_err();
        assert!(err.to_string().contains("timestamp-query"), "{err}");
        eprintln!(
            "no timestamp queries on {}: only the refusal is tested",
            g.describe()
        );
        return;
    }
    g.profiler.enable(&g, true).unwrap();
    let (m, n, k) = (9, 20, 32);
    let x = Tensor::zeros(&g, &[m, k], DType::F32, "x").unwrap();
    let w = Tensor::zeros(&g, &[n, k], DType::F16, "w").unwrap();
    let out = Tensor::zeros(&g, &[m, n], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    assert!(rec.profiling());
    rec.set_phase("test");
    matmul::linear_variant(
        &mut rec,
        LinearVariant::Tiled64,
        &x,
        &w,
        None,
        Act::None,
        &out,
    )
    .unwrap();
    matmul::linear_variant(
        &mut rec,
        LinearVariant::Scalar,
        &x,
        &w,
        None,
        Act::Gelu,
        &out,
    )
    .unwrap();
    rec.submit().unwrap();
    let entries = pollster::block_on(g.profiler.take(&g)).unwrap();
    eprint!("{}", profile::table(&entries));
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert!(entries
        .iter()
        .all(|e| e.phase == "test" && e.ms.is_finite() && e.ms >= 0.0));
    assert_eq!(entries[0].op, "matmul:linear_tiled");
    assert!(
        entries[0].variant.contains("RM=4"),
        "{}",
        entries[0].variant
    );
    assert_eq!(entries[0].shape, "M=9 N=20 K=32 f16 tiled64");
    assert_eq!(entries[1].shape, "M=9 N=20 K=32 f16 scalar");
    let totals = profile::phase_totals(&entries);
    assert_eq!(totals.len(), 1);
    assert_eq!(totals[0].2, 2);
    // Taken entries are gone; a recorder made after disabling times nothing.
    g.profiler.enable(&g, false).unwrap();
    assert!(pollster::block_on(g.profiler.take(&g)).unwrap().is_empty());
    assert!(!Recorder::new(&g).profiling());
}
