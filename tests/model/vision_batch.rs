//! The vision tower on a batch of images (`Pipeline::encode_images`): each image's features equal, bit
//! for bit, what `Pipeline::encode_image` gives it alone, on lavapipe and on the CPU backend, and an
//! unreadable image fails alone. On lavapipe the kernel registry is set against it: every linear class
//! at the batch's row count (B x one image's rows) gets the scalar kernel, which one image alone never
//! uses; a batch keyed by its own rows instead of one image's would take it and differ. Exact equality:
//! any difference is a bug.
#![cfg(not(target_arch = "wasm32"))]

use crate::common::fixtures;
use std::sync::Arc;

use florence2_wasm::gpu::{readback, Device, DeviceOptions};
use florence2_wasm::model::workloads::model_linear_shapes;
use florence2_wasm::ops::matmul::LinearVariant;
use florence2_wasm::pipeline::{cpu_device, Image, Pipeline};
use florence2_wasm::weights::{LoadOptions, WeightDType};

fn check_on(g: &Arc<Device>, dtype: WeightDType) {
    let p = Pipeline::load_dir_with(g, &fixtures::demo_model(), LoadOptions::with_dtype(dtype))
        .unwrap();
    let what = format!("{} {dtype:?}", g.describe());
    let imgs = fixtures::demo_samples(3);
    let (h, w) = (p.processor().height, p.processor().width);
    assert!(p.model().can_batch_images(imgs.len(), h, w), "{what}");
    if !g.is_host() {
        let cfg = &p.model().config;
        let fmt = p.model().shared.dtype();
        for s in model_linear_shapes(cfg, h, w, 1, fmt) {
            let batch_rows = s.m * imgs.len();
            if s.m > 4 && LinearVariant::Scalar.supports(&g.caps, batch_rows, s.k, s.format) {
                let class = florence2_wasm::gpu::registry::ShapeClass::linear(
                    batch_rows, s.n, s.k, s.format,
                );
                g.choices.set(class, LinearVariant::Scalar.name());
            }
        }
    }
    let mut inputs: Vec<Image> = imgs.iter().map(|b| Image::Encoded(b)).collect();
    inputs.insert(1, Image::Encoded(b"not an image"));
    let got = p.encode_images(&inputs);
    assert_eq!(got.len(), 4);
    assert!(got[1].is_err(), "{what}: the unreadable image fails alone");
    for (i, r) in got.iter().enumerate().filter(|(i, _)| *i != 1) {
        let e = r.as_ref().unwrap();
        let alone = p.encode_image(inputs[i]).unwrap();
        assert_eq!(e.tokens(), alone.tokens());
        let (a, b) = (
            readback::to_f32_blocking(g, e.features()).unwrap(),
            readback::to_f32_blocking(g, alone.features()).unwrap(),
        );
        let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{what}: image {i} differs from its encoding alone");
    }
}

#[test]
fn batched_images_encode_as_each_alone() {
    // A device of its own: the registry entries set here must not reach other tests.
    let g = pollster::block_on(Device::new(DeviceOptions::default())).unwrap();
    check_on(&g, WeightDType::Fp32);
    check_on(&g, WeightDType::Fp16);
    check_on(&cpu_device(), WeightDType::Fp32);
}
