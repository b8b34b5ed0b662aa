//! `pipeline::open`, the one way every front end opens a model: its device and dtype decisions with
//! their reasons, and a pipeline that answers exactly as one loaded by hand with the same choices.
//! On the CPU backend (deterministic, any machine).

use crate::common;

use common::fixtures::fixtures;
use florence2_wasm::estimate::{
    choose_dtype, device_limits, DTypeRequest, EstimateOptions, ModelFacts,
};
use florence2_wasm::gpu::tune::{CacheLocation, TuneOptions, Tuning};
use florence2_wasm::pipeline::{
    open, Backend, Callbacks, DeviceChoice, Image, NeverCancel, OpenOptions, Pipeline, TaskOptions,
};
use florence2_wasm::weights::{DirFiles, LoadOptions, WeightDType};

fn options(dtype: DTypeRequest) -> OpenOptions {
    OpenOptions {
        device: DeviceChoice::Cpu,
        dtype,
        tuning: TuneOptions::new(Tuning::Off),
        tune_cache: CacheLocation::None,
        ..OpenOptions::default()
    }
}

fn caption(p: &Pipeline, image: &[u8]) -> String {
    let opts = TaskOptions {
        max_new_tokens: Some(8),
        ..TaskOptions::greedy()
    };
    p.run_task_blocking(
        Image::Encoded(image).into(),
        "<CAPTION>",
        &opts,
        &NeverCancel,
        &Callbacks::default(),
    )
    .unwrap()
    .text
}

#[test]
fn open_auto_dtype_on_the_cpu_backend_says_why_and_answers_as_a_manual_load() {
    let dir = fixtures().join("models").join("tiny2");
    let files = DirFiles::new(&dir);
    let opened = pollster::block_on(open(&files, &files, &options(DTypeRequest::Auto))).unwrap();
    assert_eq!(opened.device.backend, Backend::Cpu);
    assert!(
        opened.device.reason.contains("cpu"),
        "{}",
        opened.device.reason
    );
    assert!(opened.gpu.is_host());

    // The choice is the estimate chooser's for this device, and the pipeline holds it.
    let facts = pollster::block_on(ModelFacts::read(&files)).unwrap();
    let limits = device_limits(&opened.gpu, false);
    let all = facts
        .estimate_all(&EstimateOptions {
            max_binding: limits.max_binding,
            host: true,
            ..Default::default()
        })
        .unwrap();
    let expected = choose_dtype(&all, &limits).unwrap();
    assert_eq!(opened.dtype, expected.dtype);
    assert_eq!(
        opened.dtype_reason.as_deref(),
        Some(expected.reason.as_str())
    );
    assert_eq!(opened.pipeline.weight_dtype(), opened.dtype);

    // Same answer as the steps taken by hand with the same decisions.
    let image = std::fs::read(fixtures().join("images").join("scene.png")).unwrap();
    let by_hand =
        Pipeline::load_dir_with(&opened.gpu, &dir, LoadOptions::with_dtype(opened.dtype)).unwrap();
    assert_eq!(caption(&opened.pipeline, &image), caption(&by_hand, &image));
}

#[test]
fn open_with_a_fixed_dtype_gives_no_reason_and_tunes_the_sizes_asked() {
    let dir = fixtures().join("models").join("tiny2");
    let files = DirFiles::new(&dir);
    let mut opts = options(DTypeRequest::from(WeightDType::Q8));
    opts.tune_image_size = Some(64);
    opts.tune_beams = Some(2);
    let opened = pollster::block_on(open(&files, &files, &opts)).unwrap();
    assert_eq!(opened.dtype, WeightDType::Q8);
    assert_eq!(opened.dtype_reason, None);
    assert_eq!(opened.pipeline.weight_dtype(), WeightDType::Q8);
    let s = opened.tune_sizes;
    assert_eq!((s.height, s.width, s.beams), (64, 64, 2));
    assert!(opened.tuning.failed.is_none());
}

#[test]
fn open_names_a_model_that_is_not_there() {
    let dir = fixtures().join("models").join("no-such-model");
    let files = DirFiles::new(&dir);
    let err = pollster::block_on(open(&files, &files, &options(DTypeRequest::Auto)))
        .err()
        .expect("a missing model does not open");
    assert!(err.to_string().contains("config.json"), "{err}");
}
