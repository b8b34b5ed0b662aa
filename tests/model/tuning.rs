//! The on-device tuner (`gpu::tune`) and the kernel registry (`gpu::registry`): choices are installed,
//! cached per adapter, reused without timing, re-timed for another adapter, and a corrupt cache is
//! ignored with a named warning. Shapes are tiny (the timings themselves are not asserted: speed lives
//! in `scripts/bench/kernels.rs`).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::Rng;
use florence2_wasm::config::Florence2Config;
use florence2_wasm::gpu::registry::{row_class, LinearShape, ShapeClass};
use florence2_wasm::gpu::tune::{self, CacheLocation, Tuning};
use florence2_wasm::gpu::{readback, DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::model::workloads::{self, model_linear_shapes};
use florence2_wasm::ops::matmul::{self, Act, LinearVariant};

fn open(opts: DeviceOptions) -> Arc<Device> {
    pollster::block_on(Device::new(opts)).expect("a GPU adapter (lavapipe)")
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

fn tune_blocking(g: &Arc<Device>, mode: Tuning, dir: &Path) -> tune::TuneReport {
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
    let g = open(DeviceOptions::default());
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
    let a = open(DeviceOptions::default());
    // The same adapter opened without subgroups has other features: another key.
    let b = open(DeviceOptions {
        disable_subgroups: true,
        ..Default::default()
    });
    if a.caps.adapter_key == b.caps.adapter_key {
        // Only an adapter without subgroups gives equal keys; then vary the limits instead.
        eprintln!("adapter has no subgroups; keying by a lowered binding limit");
    }
    let b = if a.caps.adapter_key == b.caps.adapter_key {
        open(DeviceOptions {
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
    let g = open(DeviceOptions::default());
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
    let g = open(DeviceOptions::default());
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
        let before = g.kernels.len();
        let mut rec = Recorder::new(&g);
        matmul::linear(&mut rec, &tx, &tw, matmul::LinearArgs::default(), &to).unwrap();
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(&g, &to).unwrap();
        let (d, _) = common::max_diff(&got, &want);
        // 40-term f32 dot products of values <= 0.5 in magnitude: error well below 1e-5.
        assert!(d < 1e-5, "{choice}: max diff {d}");
        if choice == "tiled128" {
            assert_eq!(g.kernels.len(), before + 1, "the tiled128 kernel was built");
        }
    }
}

#[test]
fn model_shapes_cover_every_layer_kind() {
    let cfg: Florence2Config =
        Florence2Config::from_json_str(include_str!("../fixtures/models/tiny4/config.json"))
            .unwrap();
    let s = model_linear_shapes(&cfg, 64, 64, 3, DType::F16);
    let d = cfg.text.d_model;
    let v = cfg.text.vocab_size;
    assert!(
        s.iter().any(|x| x.m == 1 && x.n == v && x.k == d),
        "LM head, greedy"
    );
    assert!(
        !s.iter().any(|x| x.m == 3 && x.n == v && x.k == d),
        "decode rows run the one-row kernel: no 3-row LM head class to time"
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
    let g = open(DeviceOptions::default());
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
    matmul::linear(
        &mut rec,
        &x,
        &w,
        matmul::LinearArgs::default().variant(LinearVariant::Tiled64),
        &out,
    )
    .unwrap();
    matmul::linear(
        &mut rec,
        &x,
        &w,
        matmul::LinearArgs::default()
            .act(Act::Gelu)
            .variant(LinearVariant::Scalar),
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

/// A clock that advances a fixed step every time it is read: the budget tests depend on how many times
/// the tuner looks at the clock, never on how fast this machine is.
struct StepClock {
    reads: std::sync::atomic::AtomicU64,
    step_ms: f64,
}

impl tune::Clock for StepClock {
    fn now_ms(&self) -> f64 {
        let n = self
            .reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        n as f64 * self.step_ms
    }
}

fn tiny4_workload() -> Vec<(LinearShape, f64)> {
    let cfg: Florence2Config =
        Florence2Config::from_json_str(include_str!("../fixtures/models/tiny4/config.json"))
            .unwrap();
    workloads::model_linear_workload(&cfg, 64, 64, 2, DType::F32)
}

fn tune_opts(
    g: &Arc<Device>,
    work: &[(LinearShape, f64)],
    opts: &tune::TuneOptions,
    dir: &Path,
) -> tune::TuneReport {
    pollster::block_on(tune::tune_budgeted(
        g,
        work,
        &[],
        opts,
        &CacheLocation::Dir(dir.to_path_buf()),
    ))
    .unwrap()
}

/// A budget of 0 times nothing: every class keeps its static choice, nothing is cached.
#[test]
fn zero_budget_times_nothing() {
    let g = open(DeviceOptions::default());
    let dir = cache_dir("zero-budget");
    let work = tiny4_workload();
    let r = tune_opts(
        &g,
        &work,
        &tune::TuneOptions::new(Tuning::Auto).with_budget_ms(Some(0.0)),
        &dir,
    );
    eprint!("{}", r.table());
    assert_eq!(r.timings, 0);
    assert!(!r.rows.is_empty());
    assert_eq!(r.skipped, r.rows.len());
    assert!(r.rows.iter().all(|x| x.status == tune::RowStatus::Skipped));
    // A skipped row names the static choice, and the launchers use it (empty table).
    for x in &r.rows {
        let t = x.timed_shape.unwrap();
        let want = matmul::choose_linear_variant_for(&g.caps, t.m, t.k, t.format);
        assert_eq!(x.chosen, want.name());
    }
    assert!(g.choices.is_empty());
    assert!(json_files(&dir).is_empty(), "nothing timed, nothing cached");
    assert!(r.table().contains("left for later loads"));
}

/// A load whose budget is already spent when its first class comes up (reading the cache took that
/// long: a busy machine) still times that one class, so every load progresses; the next class waits for
/// a later load. The clock steps past the whole budget at every read.
#[test]
fn a_load_late_for_its_budget_still_times_one_class() {
    let g = open(DeviceOptions::default());
    let dir = cache_dir("late-budget");
    let work = tiny4_workload();
    let opts = tune::TuneOptions::new(Tuning::Auto)
        .with_budget_ms(Some(10.0))
        .with_clock(Arc::new(StepClock {
            reads: Default::default(),
            step_ms: 100.0,
        }));
    let r = tune_opts(&g, &work, &opts, &dir);
    eprint!("{}", r.table());
    let timed = r.rows.iter().filter(|x| x.status == tune::RowStatus::Timed);
    assert_eq!(timed.count(), 1, "{}", r.table());
    assert_eq!(r.skipped, r.rows.len() - 1);
    assert_eq!(
        r.rows[0].status,
        tune::RowStatus::Timed,
        "the costliest class"
    );
    assert_eq!(json_files(&dir).len(), 1, "the timed class is cached");
}

/// With a budget, `auto` tunes the most expensive classes first and stops; each later load continues
/// from the cache where the last one stopped, until all are cached and a load times nothing.
/// `exhaustive` ignores the budget.
#[test]
fn budget_tunes_in_cost_order_and_later_loads_continue() {
    let g = open(DeviceOptions::default());
    let dir = cache_dir("budget");
    let work = tiny4_workload();
    let classes = work.len();
    assert!(classes >= 10, "{classes} classes");
    let opts = |budget: f64| {
        tune::TuneOptions::new(Tuning::Auto)
            .with_budget_ms(Some(budget))
            .with_clock(Arc::new(StepClock {
                reads: Default::default(),
                step_ms: 1.0,
            }))
    };
    // A budget of a few clock reads: some classes, not all.
    let budget = 12.0;
    // Classes finished by earlier loads, and classes a budget cut short (best so far installed, some
    // candidates untried: resumed by a later load).
    let mut done: Vec<ShapeClass> = Vec::new();
    let mut partial: Vec<ShapeClass> = Vec::new();
    let mut loads = 0;
    loop {
        g.choices.clear();
        let r = tune_opts(&g, &work, &opts(budget), &dir);
        loads += 1;
        eprint!("load {loads}:\n{}", r.table());
        assert_eq!(r.rows.len(), classes);
        // Rows come in priority order: shares never increase.
        for w in r.rows.windows(2) {
            assert!(
                w[0].share >= w[1].share,
                "{} then {}",
                w[0].share,
                w[1].share
            );
        }
        let share: f64 = r.rows.iter().map(|x| x.share).sum();
        assert!((share - 1.0).abs() < 1e-9, "shares sum to {share}");
        // What earlier loads tuned comes from the cache now.
        for x in &r.rows {
            if done.contains(&x.class) {
                assert_eq!(x.status, tune::RowStatus::Cached, "{}", x.class.describe());
            }
        }
        // Among the classes not cached, the timed ones precede the skipped ones (cost order).
        let fresh: Vec<_> = r
            .rows
            .iter()
            .filter(|x| x.status != tune::RowStatus::Cached)
            .collect();
        let timed = fresh
            .iter()
            .take_while(|x| x.status == tune::RowStatus::Timed)
            .count();
        assert!(fresh[timed..]
            .iter()
            .all(|x| x.status == tune::RowStatus::Skipped));
        assert_eq!(r.skipped, fresh.len() - timed);
        // Installed: cached and timed rows; skipped ones keep the static choice.
        for x in &r.rows {
            let installed = g.choices.get(&x.class);
            match x.status {
                tune::RowStatus::Skipped if !partial.contains(&x.class) => {
                    assert_eq!(installed, None)
                }
                _ => assert_eq!(installed, Some(x.chosen), "{}", x.class.describe()),
            }
        }
        if fresh.is_empty() {
            assert_eq!(r.timings, 0, "everything cached: nothing timed");
            break;
        }
        assert!(timed >= 1, "every load with budget left makes progress");
        if loads == 1 {
            assert!(
                r.skipped > 0,
                "the first load stops at the budget: {}",
                r.table()
            );
        }
        for x in r.rows.iter().filter(|x| x.status == tune::RowStatus::Timed) {
            if x.untried.is_empty() {
                done.push(x.class);
                partial.retain(|c| *c != x.class);
            } else if !partial.contains(&x.class) {
                partial.push(x.class);
            }
        }
        assert!(loads <= 4 * classes, "no progress");
    }
    assert!(loads >= 3, "the budget spread the work over {loads} loads");
    // Exhaustive ignores the budget: every class timed in one run.
    let ex = tune_opts(
        &g,
        &work,
        &tune::TuneOptions::new(Tuning::Exhaustive)
            .with_budget_ms(Some(0.0))
            .with_clock(Arc::new(StepClock {
                reads: Default::default(),
                step_ms: 1.0,
            })),
        &dir,
    );
    assert_eq!(ex.skipped, 0);
    assert!(ex.rows.iter().all(|x| x.status == tune::RowStatus::Timed));
}

/// Where the adapter has timestamp queries the tuner times on the GPU (`Recorder::new_timed`), else
/// with the wall clock; a timed recorder gives a finite positive time, and without the feature a
/// named error.
#[test]
fn tuner_uses_gpu_timestamps_where_available() {
    let g = open(DeviceOptions::default());
    let r = pollster::block_on(tune::tune(
        &g,
        &shapes()[..1],
        Tuning::Auto,
        &CacheLocation::None,
    ))
    .unwrap();
    assert!(r.timings > 0);
    let x = Tensor::zeros(&g, &[1, 64], DType::F32, "x").unwrap();
    let w = Tensor::zeros(&g, &[40, 64], DType::F32, "w").unwrap();
    let out = Tensor::zeros(&g, &[1, 40], DType::F32, "out").unwrap();
    if g.caps.timestamp_query {
        assert_eq!(r.timer, "gpu timestamps");
        let mut rec = Recorder::new_timed(&g).unwrap();
        assert!(!rec.profiling());
        for _ in 0..4 {
            matmul::linear(
                &mut rec,
                &x,
                &w,
                matmul::LinearArgs::default().variant(LinearVariant::Scalar),
                &out,
            )
            .unwrap();
        }
        let ms = pollster::block_on(rec.submit_timed()).unwrap();
        assert!(ms.is_finite() && ms > 0.0, "{ms} ms");
        // An empty timed recorder measures nothing.
        let empty = pollster::block_on(Recorder::new_timed(&g).unwrap().submit_timed()).unwrap();
        assert_eq!(empty, 0.0);
    } else {
        assert_eq!(r.timer, "wall clock");
        let err = Recorder::new_timed(&g).err().unwrap();
        assert!(err.to_string().contains("timestamp-query"), "{err}");
    }
    // Forced wall time.
    let r = pollster::block_on(tune::tune_budgeted(
        &g,
        &[(shapes()[0], 1.0)],
        &[],
        &tune::TuneOptions::unbounded(Tuning::Auto).with_timer(tune::Timer::Wall),
        &CacheLocation::None,
    ))
    .unwrap();
    assert_eq!(r.timer, "wall clock");
}

/// Candidates the cache records as losers on this adapter (`banned`: lost by more than BAN_FACTOR) are
/// neither compiled nor timed by `auto` on a later load; `exhaustive` times them again.
#[test]
fn banned_candidates_in_the_cache_are_skipped_by_auto() {
    let g = open(DeviceOptions::default());
    let dir = cache_dir("banned");
    let shape = LinearShape {
        m: 70,
        n: 48,
        k: 32,
        format: DType::F32,
    };
    tune_blocking_shapes(&g, &[shape], Tuning::Auto, &dir);
    let files = json_files(&dir);
    assert_eq!(files.len(), 1);
    // Forget the class and ban the scalar kernel for GEMM rows in f32.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    v["entries"] = serde_json::json!([]);
    v["banned"] = serde_json::json!([{"regime": "gemm", "format": "F32", "variant": "scalar"}]);
    std::fs::write(&files[0], serde_json::to_string(&v).unwrap()).unwrap();
    g.choices.clear();
    let r = tune_blocking_shapes(&g, &[shape], Tuning::Auto, &dir);
    let row = &r.rows[0];
    eprint!("{}", r.table());
    assert_eq!(row.status, tune::RowStatus::Timed);
    assert!(
        row.times_ms.iter().all(|(n, _)| *n != "scalar"),
        "{:?}",
        row.times_ms
    );
    assert!(
        row.dropped.contains(&("scalar", f64::INFINITY)),
        "{:?}",
        row.dropped
    );
    assert_ne!(row.chosen, "scalar");
    // The ban stays in the rewritten cache.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert!(v["banned"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["variant"] == "scalar"));
    // Exhaustive ignores bans, and clears them.
    let ex = tune_blocking_shapes(&g, &[shape], Tuning::Exhaustive, &dir);
    assert!(ex.rows[0]
        .times_ms
        .iter()
        .any(|(n, t)| *n == "scalar" && t.is_some()));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert!(v.get("banned").is_none(), "{v}");
}

fn tune_blocking_shapes(
    g: &Arc<Device>,
    shapes: &[LinearShape],
    mode: Tuning,
    dir: &Path,
) -> tune::TuneReport {
    pollster::block_on(tune::tune(
        g,
        shapes,
        mode,
        &CacheLocation::Dir(dir.to_path_buf()),
    ))
    .unwrap()
}

/// `florence2 tune` on a full disk: the cache it cannot write is a named error and exit status 1, no
/// temporary file is left behind, and the cache written before is intact (the write goes to a
/// temporary file renamed into place). The disk is a 1 MiB tmpfs in a private mount namespace
/// (`unshare`; as root, else in a user namespace) that the test fills.
#[test]
fn a_full_disk_leaves_the_tuning_cache_intact_and_tune_fails() {
    let d = cache_dir("full_disk");
    let (small, out) = (d.join("small"), d.join("out"));
    std::fs::create_dir_all(&small).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let model = common::fixtures::fixtures().join("models/tiny2");
    let tune = format!(
        "'{}' tune --model '{}' --device gpu --dtype fp32 --tuning auto --budget-ms 300 --image-size 32",
        env!("CARGO_BIN_EXE_florence2"),
        model.display()
    );
    let script = format!(
        "mount -t tmpfs -o size=1m tmpfs \"$XDG_CACHE_HOME\" || exit 99
         {tune} >/dev/null 2>\"$OUT/first.err\" || exit 98
         cp \"$XDG_CACHE_HOME\"/florence2-wasm/tuning-*.json \"$OUT/before.json\"
         dd if=/dev/zero of=\"$XDG_CACHE_HOME/fill\" bs=4096 2>/dev/null
         {tune} >/dev/null 2>\"$OUT/second.err\"; rc=$?
         cp \"$XDG_CACHE_HOME\"/florence2-wasm/tuning-*.json \"$OUT/after.json\"
         ls -a \"$XDG_CACHE_HOME/florence2-wasm\" >\"$OUT/ls\"
         exit $rc"
    );
    let o = common::in_mount_namespace(&script)
        .env("XDG_CACHE_HOME", &small)
        .env("OUT", &out)
        .env("NODEVICE_SELECT", "1")
        .output()
        .unwrap();
    let read = |n: &str| std::fs::read_to_string(out.join(n)).unwrap_or_default();
    assert_ne!(o.status.code(), Some(99), "could not mount a tmpfs");
    assert_ne!(
        o.status.code(),
        Some(98),
        "the first tune failed: {}",
        read("first.err")
    );
    assert_eq!(o.status.code(), Some(1), "{}", read("second.err"));
    let err = read("second.err");
    assert!(
        err.contains("tuning cache") && err.contains("No space left"),
        "{err}"
    );
    assert!(
        !read("ls").contains(".tmp"),
        "a temporary file was left: {}",
        read("ls")
    );
    assert_eq!(
        read("after.json"),
        read("before.json"),
        "the old cache is intact"
    );
    assert!(read("before.json").contains("\"entries\""));
}
