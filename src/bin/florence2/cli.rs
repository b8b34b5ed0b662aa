//! The `florence2` command line: a thin adapter over [`florence2_wasm::pipeline::Pipeline`] (argument
//! parsing with clap, output formatting; no model sequencing of its own).
//!
//! ```text
//! florence2 parse --task TASK --image-size W,H --text RAW [--json]
//! florence2 run --model DIR|ORG/NAME[@REV] --image FILE --task PROMPT [--task PROMPT ...] [--text INPUT ...]
//!               [--image FILE|DIR ...] [--recursive] [--images-from FILE|-] [--jsonl] [--output FILE]
//!               [--resume] [--shard INDEX/COUNT] [--max-batch N]
//!               [--max-new-tokens N] [--num-beams N] [--no-repeat-ngram-size N]
//!               [--early-stopping true|false|never] [--length-penalty X] [--json]
//!               [--tuning auto|off|exhaustive] [--device auto|gpu|cpu] [--cpu-dot auto|int8|exact] [--profile]
//! florence2 tune --model DIR|ORG/NAME[@REV] [--image-size N] [--num-beams N] [--tuning auto|off|exhaustive]
//!                [--dtype auto|fp32|fp16|q8|q4|PART=FORMAT,..]
//! florence2 serve --model DIR|ORG/NAME[@REV] [--host 127.0.0.1] [--port 8000] ...   (see serve/mod.rs)
//! florence2 convert --model DIR|ORG/NAME[@REV] --dtype fp32|fp16|q8|q4|PART=FORMAT,.. [--shard-size N] --out DIR
//! florence2 estimate --model DIR|ORG/NAME[@REV] [--dtype auto|fp32|fp16|q8|q4|PART=FORMAT,..] [--device auto|gpu|cpu]
//!                    [--max-new-tokens N] [--num-beams N]
//! florence2 help [SUBCOMMAND]      (or --help on any subcommand)
//! ```
//!
//! `parse` post-processes a raw generation (decoded with special tokens kept) without a model, for scripting
//! and tests; `--text -` reads the text from stdin; a task marker that is not built in (`<MY_TASK>`) is pure
//! text, as the reference's post-processor treats a task it does not know. With `--json` both subcommands print one JSON object
//! `{"task": MARKER, "result": {MARKER: value}, "text": RENDERING}` where `result` is exactly what
//! `post_process_generation` returns and `text` the human-readable rendering; `run` adds
//! `generated_text` (decoded with special tokens kept), `token_ids` (decoder start token first, as the
//! reference's `generate` returns them) and `timings_ms` {load, preprocess, vision, encoder, decode}.
//! `run` with several `--task`s encodes the image once and prints a JSON array of those objects (one per
//! task, in order; the image's preprocess and vision times are counted in the first).
//! Several images (or a directory, `--images-from`, `--shard`, `--jsonl`) make a batch: JSON Lines, one
//! object per (image, task), see `batch/mod.rs`.
//! `--tuning` (default auto) runs the kernel tuner after loading (cached per adapter in the user's cache
//! directory, so only the first run times anything); `--profile` prints per-op times (op, variant, shape,
//! ms, summed per phase) to stderr, and adds `profile` to the JSON: GPU times from timestamp queries, or
//! on the CPU backend (`--device cpu`) each op's wall time, named `cpu:OP`. `--cpu-dot` (`run`, `serve`)
//! chooses how the CPU backend's decode steps dot q8/q4 weights: `int8` (integer dots), `exact` (f32 dots
//! of the dequantized weights, the GPU's results) or `auto` (int8 for q4, exact for q8; the default
//! unless `FLORENCE2_CPU_QUANT_DOT` names another).
//! Without `--json` they print the rendering. Exit status: 0 success, 1 a failure while running, 2 a usage
//! error (clap's message naming the flag, then the subcommand's usage; also an input set without images,
//! saying where and for which extensions it looked), 141 when stdout's reader went away (`| head`: the
//! process ends quietly, as tools that die of SIGPIPE do).
//! `--task` takes a marker (`<OD>`), a whole prompt, or a built-in task's name in any case (`OD`, `od`),
//! the same way in `run`, `parse` and `serve --default-task`. `run --image -` reads one image's bytes
//! from stdin; files of a directory that are not images (`.avif`, `.heic`, `.txt`) are named on stderr.
//! `convert` writes any checkpoint the loader reads as safetensors in the package's format for a
//! resident dtype (q8/q4: `florence2-wasm-block`), optionally sharded (`500MB`, `100MiB`, bytes), with
//! the configs and a completed tokenizer.json, into a new directory, and prints tensors and bytes per
//! format; loading the output with the same `--dtype` gives exactly the weights of loading SRC.
//!
//! `--dtype` takes one format or one per part of the model (`vision=fp16,text=q4`:
//! `florence2_wasm::weights::dtype_plan`). `--dtype auto` (`run`, `serve`, `tune`) picks the
//! best-quality weight format whose estimate fits the adapter (`florence2_wasm::estimate`: fp16, then
//! q8, then two q4 mixes with q8 text or embeddings, then q4, from the config and file sizes before
//! any weight is read), prints the choice and its reason on stderr, and `run --json` reports it as
//! `dtype` with `dtype_reason`.
//!
//! `--model` takes a directory or a hub id (`org/name[@revision]`), resolved by [`model_dir`] through the
//! Hugging Face cache (see `florence2_wasm::hub_cache`); `--offline` (any subcommand) reads the cache only.
//!
//! Adding a subcommand: a variant of [`Command`] with its `Args` struct, and an arm in [`dispatch`].

mod annotate;
mod batch;
mod convert;
mod download_bar;
mod estimate;
mod parse;
mod run;
mod run_tiled;
mod serve;
mod tune;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Florence-2 on WebGPU (wgpu + WGSL), natively.
#[derive(Parser, Debug)]
#[command(name = "florence2", version, propagate_version = true)]
#[command(subcommand_required = true, arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Hub model ids (`--model org/name`) from the Hugging Face cache only, fetching nothing (as
    /// HF_HUB_OFFLINE=1)
    #[arg(long, global = true)]
    pub offline: bool,
}

/// `--offline`, set once from the command line.
static OFFLINE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// `--model` as a directory: a directory as it is; a hub id `org/name[@revision]` through the Hugging
/// Face cache (`HF_HUB_CACHE`/`HF_HOME`, shared with Python), fetched from `HF_ENDPOINT` as needed
/// (`HF_TOKEN` for private repositories), from the cache alone with `--offline` or `HF_HUB_OFFLINE=1`.
pub fn model_dir(arg: &std::path::Path) -> Result<std::path::PathBuf, Failure> {
    model_dir_observed(arg, None)
}

/// [`model_dir`], telling `also` the download progress too (besides the terminal's bar).
pub fn model_dir_observed(
    arg: &std::path::Path,
    also: Option<florence2_wasm::hub_cache::ProgressObserver>,
) -> Result<std::path::PathBuf, Failure> {
    use florence2_wasm::hub_cache::{resolve_model, HubCacheOptions, ProgressObserver};
    let mut opts = HubCacheOptions::from_env();
    opts.offline |= OFFLINE.get().copied().unwrap_or(false);
    download_bar::attach(&mut opts);
    if let Some(also) = also {
        let bar = opts.progress.take();
        opts.progress = Some(ProgressObserver::new(move |p| {
            if let Some(bar) = &bar {
                bar.report(p);
            }
            also.report(p);
        }));
    }
    let s = arg
        .to_str()
        .ok_or_else(|| Failure::Usage(format!("--model {}: not UTF-8", arg.display())))?;
    Ok(resolve_model(s, &opts)?)
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Post-process a raw generation (decoded with special tokens kept) without a model.
    Parse(parse::ParseArgs),
    /// Run the model on an image, or a batch of images: one or several tasks (each image encoded once).
    Run(run::RunArgs),
    /// OpenAI-compatible HTTP server (POST /v1/chat/completions, GET /v1/models, /health, /metrics).
    Serve(serve::ServeArgs),
    /// Time the candidate kernels for a model's shapes on this GPU and print the table (cached choice).
    Tune(tune::TuneArgs),
    /// Convert a checkpoint into the package's safetensors format for a weight dtype (fp32, fp16, q8, q4).
    Convert(convert::ConvertArgs),
    /// Estimate a model's memory per weight format on this device before loading it, and what
    /// --dtype auto picks (JSON).
    Estimate(estimate::EstimateArgs),
}

/// A failure: a usage error (exit 2) or a runtime error (exit 1).
#[derive(Debug)]
pub enum Failure {
    Usage(String),
    Run(String),
}

/// The exit status when stdout's reader went away (`florence2 run --json ... | head -c1`): 141
/// (128 + SIGPIPE), what a shell reports for `cat`, `yes` and the other tools that die of SIGPIPE, so
/// a `set -o pipefail` script sees what it sees for those. The process ends quietly (no message).
pub const EXIT_STDOUT_CLOSED: u8 = 141;

/// Set by the first write that finds stdout closed; [`main`] then exits with [`EXIT_STDOUT_CLOSED`]
/// whatever the subcommand returned.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Failure {
    /// A failed write to `what`: a broken pipe marks stdout closed (a quiet exit 141); anything else
    /// is a runtime error naming `what`.
    pub fn write(what: &str, e: std::io::Error) -> Failure {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT_CLOSED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Failure::Run(format!("writing {what}: {e}"))
    }
}

/// Write `s` to stdout and flush it (no panic when the reader has gone, see [`EXIT_STDOUT_CLOSED`]).
pub fn out(s: &str) -> Result<(), Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(s.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::write("stdout", e))
}

/// Write `s` and a newline to stdout (see [`out`]).
pub fn out_line(s: &str) -> Result<(), Failure> {
    out(&format!("{s}\n"))
}

/// The weight format `run` loads (and so `tune` tunes) unless `--dtype` says otherwise.
pub const DEFAULT_DTYPE: &str = "fp16";

/// A `--task` value as every subcommand takes it: a built-in task's name in any case (`OD`, `od`,
/// `caption_to_phrase_grounding`) becomes its marker (`<OD>`); a value that starts with `<` (a marker
/// or a whole prompt, `<OPEN_VOCABULARY_DETECTION>cat`, a fine-tune's `<MY_TASK>`) stays as given.
pub fn task_arg(s: &str) -> Result<String, String> {
    use florence2_wasm::processor::prompt::Task;
    let t = s.trim();
    if t.starts_with('<') {
        return Ok(s.to_string());
    }
    Task::from_name(&t.to_ascii_uppercase())
        .map(|task| task.marker().to_string())
        .ok_or_else(|| {
            format!(
                "{t:?} is not a task: give a task name (OD, caption, ...) or a marker; valid markers: {}",
                Task::valid_markers()
            )
        })
}

/// A library error, named as the JS package names it: `florence2: DeviceLostError: the GPU device was
/// lost: ...`.
impl From<florence2_wasm::Error> for Failure {
    fn from(e: florence2_wasm::Error) -> Self {
        Failure::Run(format!("{}: {e}", e.name()))
    }
}

fn dispatch(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Parse(a) => parse::parse_cmd(a),
        Command::Run(a) => run::run_cmd(a),
        Command::Serve(a) => serve::main(a).map_err(Failure::Run),
        Command::Tune(a) => tune::tune_cmd(a),
        Command::Convert(a) => convert::convert_cmd(a),
        Command::Estimate(a) => estimate::estimate_cmd(a),
    }
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(e),
    };
    let _ = OFFLINE.set(cli.offline);
    let result = dispatch(cli);
    if STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed) {
        return ExitCode::from(EXIT_STDOUT_CLOSED);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("florence2: {msg}\nusage: florence2 --help, florence2 SUBCOMMAND --help");
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            eprintln!("florence2: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Help and version go to stdout with status 0; parse errors to stderr with status 2, with clap's
/// "Usage:" heading in this CLI's lower case.
fn clap_exit(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => match out(&e.to_string()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(EXIT_STDOUT_CLOSED),
        },
        _ => {
            let mut msg = e.to_string();
            if !msg.contains("Usage:") {
                // Value errors carry no usage line: add the subcommand's.
                let mut cmd = Cli::command();
                cmd.build();
                let sub = std::env::args().nth(1).unwrap_or_default();
                let usage = match cmd.find_subcommand_mut(&sub) {
                    Some(s) => s.render_usage(),
                    None => cmd.render_usage(),
                };
                msg = format!("{}\n{usage}\n", msg.trim_end());
            }
            eprint!("{}", msg.replace("Usage:", "usage:"));
            ExitCode::from(2)
        }
    }
}

/// `--device`: auto, gpu (or webgpu) or cpu.
pub fn parse_device(s: &str) -> Result<florence2_wasm::pipeline::DeviceChoice, String> {
    s.parse().map_err(|e: florence2_wasm::Error| e.to_string())
}

/// `--cpu-dot` of `run` and `serve`: auto, int8 or exact.
pub fn parse_cpu_dot(s: &str) -> Result<florence2_wasm::cpu::qdot_int8::QuantDot, String> {
    s.parse().map_err(|e: florence2_wasm::Error| e.to_string())
}

/// `--dtype` of `run`, `serve`, `tune` and `estimate`: a weight format, a mix (`vision=fp16,text=q4`)
/// or `auto`.
pub fn parse_dtype_request(s: &str) -> Result<florence2_wasm::estimate::DTypeRequest, String> {
    s.parse().map_err(|e: florence2_wasm::Error| e.to_string())
}

/// Print a JSON value on one line.
pub fn print_json(v: &serde_json::Value) -> Result<(), Failure> {
    let s = serde_json::to_string(v).map_err(|e| Failure::Run(e.to_string()))?;
    out_line(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every subcommand's `--help` renders, and a flag with a default value does not state it again
    /// in its own text (clap appends `[default: X]` once).
    #[test]
    fn help_texts_render_and_state_each_default_once() {
        let mut cli = Cli::command();
        cli.build();
        for sub in cli.get_subcommands_mut() {
            let name = sub.get_name().to_string();
            let help = sub.render_long_help().to_string();
            assert!(help.contains("Usage:"), "{name} --help: {help}");
            for arg in sub.get_arguments() {
                let text = arg
                    .get_long_help()
                    .or(arg.get_help())
                    .map(|h| h.to_string());
                let stated = text.as_deref().is_some_and(|t| t.contains("[default:"));
                assert!(
                    arg.get_default_values().is_empty() || !stated,
                    "{name} --{}: the default is stated twice",
                    arg.get_id()
                );
            }
            for line in help.lines().filter(|l| l.contains("[default: ")) {
                assert_eq!(line.matches("[default: ").count(), 1, "{name}: {line}");
            }
        }
    }

    /// The flags of the synopsis in this module's documentation exist on their subcommands.
    #[test]
    fn documented_flags_exist() {
        let cli = Cli::command();
        let doc = include_str!("cli.rs");
        let mut sub: Option<&clap::Command> = None;
        let mut checked = 0;
        for line in doc.lines().take_while(|l| l.starts_with("//!")) {
            let line = line.trim_start_matches("//!").trim();
            if let Some(rest) = line.strip_prefix("florence2 ") {
                let name = rest.split_whitespace().next().unwrap_or("");
                sub = cli.find_subcommand(name);
            }
            let Some(cmd) = sub else { continue };
            for flag in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
                let Some(long) = flag.strip_prefix("--").filter(|f| !f.is_empty()) else {
                    continue;
                };
                let known = long == "help"
                    || cli.get_arguments().any(|a| a.get_long() == Some(long))
                    || cmd.get_arguments().any(|a| a.get_long() == Some(long));
                assert!(
                    known,
                    "{} --{long} is documented but not defined",
                    cmd.get_name()
                );
                checked += 1;
            }
            if line.starts_with("```") && checked > 0 {
                break;
            }
        }
        assert!(checked > 30, "only {checked} documented flags found");
    }

    #[test]
    fn task_names_are_accepted_in_any_case() {
        assert_eq!(task_arg("OD").unwrap(), "<OD>");
        assert_eq!(task_arg("od").unwrap(), "<OD>");
        assert_eq!(task_arg("<OD>").unwrap(), "<OD>");
        assert_eq!(
            task_arg("caption_to_phrase_grounding").unwrap(),
            "<CAPTION_TO_PHRASE_GROUNDING>"
        );
        assert_eq!(task_arg("<MY_TASK>x").unwrap(), "<MY_TASK>x");
        let e = task_arg("describe this").unwrap_err();
        assert!(e.contains("not a task") && e.contains("<OD>"), "{e}");
    }

    #[test]
    fn tune_tunes_the_format_run_loads() {
        let cli = Cli::command();
        let default = |sub: &str| {
            let cmd = cli.find_subcommand(sub).unwrap();
            let arg = cmd.get_arguments().find(|a| a.get_long() == Some("dtype"));
            arg.unwrap().get_default_values()[0]
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(default("run"), DEFAULT_DTYPE);
        assert_eq!(default("tune"), DEFAULT_DTYPE);
    }
}
