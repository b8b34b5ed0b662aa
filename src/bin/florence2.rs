//! The `florence2` command line; the implementation is in `florence2/cli.rs`. It is native only: the
//! browser build (`wasm-pack test` compiles every target for wasm32) gets an empty `main`.

#[cfg(not(target_arch = "wasm32"))]
#[path = "florence2/cli.rs"]
mod cli;

#[cfg(not(target_arch = "wasm32"))]
fn main() -> std::process::ExitCode {
    cli::main()
}

#[cfg(target_arch = "wasm32")]
fn main() {}
