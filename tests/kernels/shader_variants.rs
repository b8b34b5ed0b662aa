//! Every variant of every shader compiles: for each shader in `ops::SHADERS` and each subset of the names
//! its `#if`s test, the preprocessed WGSL builds a kernel for each of its entry points (with the
//! override constants' defaults) on the test device. The kernel tests only reach the variants their
//! launchers choose on this adapter; this test reaches the rest (e.g. the GPU-side variants lavapipe never
//! picks). `scripts/ci/check_wgsl.mjs` runs the same variants through Tint, the browser's compiler.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use florence2_wasm::gpu::{Kernel, Shader};
use florence2_wasm::ops::SHADERS;

/// Entry points of a WGSL module: the `fn` names following a `@compute` attribute.
fn entry_points(wgsl: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = wgsl;
    while let Some(i) = rest.find("@compute") {
        rest = &rest[i..];
        let Some(f) = rest.find("fn ") else { break };
        let name: String = rest[f + 3..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        out.push(name);
        rest = &rest[f..];
    }
    out
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

#[test]
fn every_variant_of_every_shader_compiles() {
    let g = common::gpu();
    let mut built = 0;
    for &shader in SHADERS {
        let shader: &'static Shader = shader;
        let flags = shader.flags().unwrap();
        assert!(
            flags.len() <= 4,
            "{}: {} flags make {} variants; split the shader",
            shader.name,
            flags.len(),
            1 << flags.len()
        );
        for defines in florence2_wasm::gpu::preprocess::variants(&flags) {
            let wgsl = shader.variant(&defines).unwrap();
            if wgsl.contains("subgroup") && !g.caps.subgroups {
                eprintln!(
                    "{} {defines:?}: needs subgroups, not checked on this device",
                    shader.name
                );
                continue;
            }
            let entries = entry_points(&wgsl);
            assert!(
                !entries.is_empty(),
                "{} {defines:?}: no entry point",
                shader.name
            );
            let defines: &'static [&'static str] =
                Box::leak(defines.iter().map(|d| leak(d)).collect::<Vec<_>>().into());
            for entry in entries {
                let k = Kernel::new(shader, leak(&entry)).defines(defines);
                if let Err(e) = g.kernels.get(&g, &k) {
                    panic!("{} {defines:?} {entry}: {e}", shader.name);
                }
                built += 1;
            }
        }
    }
    eprintln!("{built} kernels built");
    assert!(built >= SHADERS.len());
}

#[test]
fn a_variant_the_shader_does_not_have_is_a_named_error() {
    let g = common::gpu();
    let k = Kernel::new(&florence2_wasm::ops::softmax::SHADER, "softmax").defines(&["NO_SUCH"]);
    match g.kernels.get(&g, &k) {
        Err(florence2_wasm::Error::Shader(m)) => assert!(m.contains("NO_SUCH"), "{m}"),
        other => panic!("expected Error::Shader, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn entry_point_scan() {
    let src = "@compute @workgroup_size(WG)\nfn a(@builtin(x) i: u32) {}\nfn helper() {}\n@compute\n@workgroup_size(1)\nfn  b_2() {}\n";
    assert_eq!(entry_points(src), ["a", "b_2"]);
}
