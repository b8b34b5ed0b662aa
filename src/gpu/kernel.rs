//! Kernels: compiled compute programs (wgpu compute pipelines), built once and cached. "Kernel" names the
//! GPU program so that "pipeline" keeps one meaning in this crate, the task [`crate::pipeline::Pipeline`].
//! A kernel is identified by its shader (one WGSL file per op family, `include_str!`-ed by the op's
//! launcher), the preprocessor defines that select the shader's variant (`#if NAME` blocks, see
//! [`crate::gpu::preprocess`]), the entry point, and the values of its `override` constants: WGSL
//! overrides are specialisation constants, folded in when the driver compiles the kernel, so static sizes
//! (tile shapes, head_dim, window size) cost nothing at run time and let the compiler unroll. Sizes that
//! change per step (sequence length, KV-cache fill) go in the `Params` uniform.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::gpu::preprocess;
use crate::gpu::Device;

/// Shaders compiled without naga's run-time bounds checks (`create_shader_module_trusted`). On lavapipe
/// the checks' index clamps keep Mesa from unrolling the register-blocked matmul loops (measured: the 8x4
/// subgroup GEMM goes from ~15 to ~26 GFLOP/s). Only shaders whose header proves every access in bounds
/// for all inputs their launcher accepts may be listed here.
const TRUSTED_SHADERS: &[&str] = &["matmul_sg", "matmul_rb", "attention_rows"];

/// A WGSL source file, possibly with preprocessing directives (`#if`, `#include`), and the sizes it
/// shares with its launcher.
#[derive(Debug)]
pub struct Shader {
    pub name: &'static str,
    pub source: &'static str,
    /// Sizes the shader and its launcher both depend on (workgroup sizes, tile sizes, workgroup-memory
    /// capacities), written once, in the launcher's Rust constants: every variant gets them as WGSL
    /// `const NAME: u32` declarations ([`preprocess::consts`]), so the shader reads what the launcher
    /// computes its grid and checks with.
    pub consts: &'static [(&'static str, u32)],
}

impl Shader {
    /// The WGSL of the variant with `defines` defined, followed by the shader's [`Shader::consts`].
    pub fn variant(&self, defines: &[&str]) -> Result<String> {
        let mut wgsl = preprocess::preprocess(self.name, self.source, defines, &include)?;
        wgsl.push_str(&preprocess::consts(self.consts));
        Ok(wgsl)
    }

    /// The names this shader's `#if`s test; every subset of them is a variant.
    pub fn flags(&self) -> Result<Vec<String>> {
        preprocess::flags(self.name, self.source, &include)
    }
}

/// Shared WGSL snippets for `#include NAME`: `shaders/include/NAME.wgsl`.
pub static INCLUDES: &[(&str, &str)] = &[
    (
        "attn_kv4",
        include_str!("../../shaders/include/attn_kv4.wgsl"),
    ),
    (
        "attn_len",
        include_str!("../../shaders/include/attn_len.wgsl"),
    ),
    (
        "attn_params",
        include_str!("../../shaders/include/attn_params.wgsl"),
    ),
    ("gelu", include_str!("../../shaders/include/gelu.wgsl")),
    ("lanes", include_str!("../../shaders/include/lanes.wgsl")),
    (
        "linear_epilogue",
        include_str!("../../shaders/include/linear_epilogue.wgsl"),
    ),
    (
        "linear_params",
        include_str!("../../shaders/include/linear_params.wgsl"),
    ),
    (
        "matmul_common",
        include_str!("../../shaders/include/matmul_common.wgsl"),
    ),
    (
        "row_reduce",
        include_str!("../../shaders/include/row_reduce.wgsl"),
    ),
];

/// The snippet `#include name` inserts.
pub fn include(name: &str) -> Option<&'static str> {
    INCLUDES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// One kernel: a shader variant, an entry point and its override constants.
#[derive(Clone, Copy, Debug)]
pub struct Kernel<'a> {
    pub shader: &'static Shader,
    pub entry: &'static str,
    /// Preprocessor names defined for this variant (order does not matter).
    pub defines: &'a [&'static str],
    pub overrides: &'a [(&'static str, f64)],
}

impl<'a> Kernel<'a> {
    pub fn new(shader: &'static Shader, entry: &'static str) -> Self {
        Kernel {
            shader,
            entry,
            defines: &[],
            overrides: &[],
        }
    }

    /// Set the `override` constants.
    pub fn with(mut self, overrides: &'a [(&'static str, f64)]) -> Self {
        self.overrides = overrides;
        self
    }

    /// Select the shader variant: the names its `#if NAME` blocks test that are defined.
    pub fn defines(mut self, defines: &'a [&'static str]) -> Self {
        self.defines = defines;
        self
    }

    /// `shader[DEF,...]`: the shader module's key (one module per variant).
    fn module_key(&self) -> String {
        let mut d: Vec<_> = self.defines.to_vec();
        d.sort_unstable();
        d.dedup();
        format!("{}[{}]", self.shader.name, d.join(","))
    }

    /// `shader[DEF,...]:entry:NAME=value...`: the kernel's key.
    fn key(&self) -> String {
        let mut k = format!("{}:{}", self.module_key(), self.entry);
        let mut o: Vec<_> = self.overrides.to_vec();
        o.sort_by(|a, b| a.0.cmp(b.0));
        for (n, v) in o {
            k.push_str(&format!(":{n}={v}"));
        }
        k
    }
}

/// A compiled kernel: wgpu's compute pipeline and its (auto-derived) bind group layout.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

#[derive(Default)]
pub struct KernelCache {
    /// Keyed by [`Kernel::module_key`] (shader and defines).
    modules: Mutex<HashMap<String, wgpu::ShaderModule>>,
    compiled: Mutex<HashMap<String, Arc<CompiledKernel>>>,
}

impl KernelCache {
    pub fn len(&self) -> usize {
        self.compiled.lock().map(|p| p.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Get or build `kernel`. Compilation errors come back as [`Error::Gpu`] with the
    /// shader's name, never as a panic.
    pub fn get(&self, gpu: &Device, kernel: &Kernel) -> Result<Arc<CompiledKernel>> {
        let key = kernel.key();
        if let Some(p) = self.compiled.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(p);
        }
        let module_key = kernel.module_key();
        let cached_module = self
            .modules
            .lock()
            .map_err(|_| Error::Gpu("kernel cache poisoned".into()))?
            .get(&module_key)
            .cloned();
        // Preprocess outside the error scope: a directive error comes back as `Error::Shader`.
        let wgsl = match cached_module {
            Some(_) => None,
            None => Some(kernel.shader.variant(kernel.defines)?),
        };
        let device = &gpu.wgpu()?.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = match (cached_module, wgsl) {
            (Some(m), _) => m,
            (None, wgsl) => {
                let desc = wgpu::ShaderModuleDescriptor {
                    label: Some(&module_key),
                    source: wgpu::ShaderSource::Wgsl(wgsl.unwrap_or_default().into()),
                };
                let module = if TRUSTED_SHADERS.contains(&kernel.shader.name) {
                    // SAFETY: every shader in TRUSTED_SHADERS carries, in its header, a proof that
                    // all of its buffer and array accesses are in bounds for any input its launcher
                    // accepts (the launcher checks the shapes those proofs rely on), in every variant.
                    unsafe {
                        device.create_shader_module_trusted(
                            desc,
                            wgpu::ShaderRuntimeChecks::unchecked(),
                        )
                    }
                } else {
                    device.create_shader_module(desc)
                };
                if let Ok(mut m) = self.modules.lock() {
                    m.insert(module_key.clone(), module.clone());
                }
                module
            }
        };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&key),
            layout: None,
            module: &module,
            entry_point: Some(kernel.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: kernel.overrides,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        if let Some(err) = block_on_scope(scope.pop()) {
            // Forget the module too, so a fixed source (hot reload in tests) is recompiled.
            if let Ok(mut m) = self.modules.lock() {
                m.remove(&module_key);
            }
            return Err(Error::Gpu(format!("building kernel {key}: {err}")));
        }
        let cached = Arc::new(CompiledKernel { pipeline, layout });
        if let Ok(mut m) = self.compiled.lock() {
            m.insert(key, cached.clone());
        }
        Ok(cached)
    }
}

/// Resolve an error-scope future. Natively wgpu resolves it immediately; in the browser the answer comes
/// later, so we do not wait for it there (validation errors then surface through the uncaptured-error
/// handler at the next [`Device::check`]).
fn block_on_scope<F: std::future::Future<Output = Option<wgpu::Error>>>(
    f: F,
) -> Option<wgpu::Error> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        pollster::block_on(f)
    }
    #[cfg(target_arch = "wasm32")]
    {
        drop(f);
        None
    }
}
