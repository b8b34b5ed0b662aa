//! Writes every preprocessed variant of every shader the launchers compile (`ops::SHADERS`, each subset
//! of the names its `#if`s test) to a folder, one file per variant named `SHADER[+DEFINE...].wgsl`, so
//! tools that read plain WGSL (`scripts/ci/check_wgsl.mjs`: Tint, the browser's compiler) see exactly what
//! the GPU gets. Needs no GPU.
//!
//! Usage: `cargo run --example wgsl_variants -- OUT_DIR`
use std::path::PathBuf;
use std::process::ExitCode;

use florence2_wasm::gpu::preprocess::variants;
use florence2_wasm::ops::SHADERS;

fn run(dir: PathBuf) -> florence2_wasm::Result<usize> {
    let io = |e: std::io::Error| florence2_wasm::Error::FileRead {
        file: dir.display().to_string(),
        msg: e.to_string(),
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    let mut n = 0;
    for shader in SHADERS {
        let flags = shader.flags()?;
        for defines in variants(&flags) {
            let mut name = shader.name.to_string();
            for d in &defines {
                name.push('+');
                name.push_str(d);
            }
            std::fs::write(dir.join(format!("{name}.wgsl")), shader.variant(&defines)?)
                .map_err(io)?;
            n += 1;
        }
    }
    Ok(n)
}

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: wgsl_variants OUT_DIR");
        return ExitCode::from(2);
    };
    match run(PathBuf::from(dir)) {
        Ok(n) => {
            println!("{n} shader variants written");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("wgsl_variants: {e}");
            ExitCode::FAILURE
        }
    }
}
