//! The `florence2` command line.
//!
//! ```text
//! florence2 parse --task TASK --image-size W,H --text RAW [--json]
//! florence2 run --model DIR --image FILE --task PROMPT [--json]
//! ```
//!
//! `parse` post-processes a raw generation (decoded with special tokens kept) without a model, for scripting
//! and tests; `--text -` reads the text from stdin. With `--json` both subcommands print one JSON object
//! `{"task": MARKER, "result": {MARKER: value}, "text": RENDERING}` where `result` is exactly what
//! `post_process_generation` returns and `text` the human-readable rendering; without it they print the
//! rendering. Exit status: 0 success, 1 a failure while running, 2 a usage error.
//!
//! Argument parsing is hand-rolled (`--flag value` pairs and boolean `--json`) to keep the binary free of
//! dependencies.

use std::collections::HashMap;
use std::io::Read;
use std::process::ExitCode;

use florence2_wasm::postprocess::{post_process_generation, TaskResult};
use florence2_wasm::processor::prompt::{parse_task_prompt, Task};
use florence2_wasm::render::render;

const USAGE: &str = "\
usage:
  florence2 parse --task TASK --image-size W,H --text RAW [--json]
      post-process a raw generation (RAW '-' reads stdin); TASK is a marker (<OD>), a name (OD) or a
      whole prompt ('<OPEN_VOCABULARY_DETECTION>cat')
  florence2 run --model DIR --image FILE --task PROMPT [--json]
      run the model on an image (PROMPT e.g. '<OD>' or '<CAPTION_TO_PHRASE_GROUNDING>two cats')
  florence2 help";

/// A failure: a usage error (exit 2) or a runtime error (exit 1).
enum Failure {
    Usage(String),
    Run(String),
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("parse") => parse_cmd(&args[1..]),
        Some("run") => run_cmd(&args[1..]),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(Failure::Usage(format!("unknown subcommand {other:?}"))),
        None => Err(Failure::Usage("missing subcommand".into())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("florence2: {msg}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            eprintln!("florence2: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Parsed `--flag value` options and boolean switches.
struct Opts {
    values: HashMap<String, String>,
    json: bool,
}

impl Opts {
    fn parse(args: &[String], value_flags: &[&str]) -> Result<Opts, Failure> {
        let mut values = HashMap::new();
        let mut json = false;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            if arg == "--json" {
                json = true;
            } else if let Some(name) = arg.strip_prefix("--").filter(|n| value_flags.contains(n)) {
                let value = it
                    .next()
                    .ok_or_else(|| Failure::Usage(format!("--{name} needs a value")))?;
                if values.insert(name.to_string(), value.clone()).is_some() {
                    return Err(Failure::Usage(format!("--{name} given twice")));
                }
            } else {
                return Err(Failure::Usage(format!("unexpected argument {arg:?}")));
            }
        }
        Ok(Opts { values, json })
    }

    fn required(&self, name: &str) -> Result<&str, Failure> {
        self.values
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Failure::Usage(format!("missing --{name}")))
    }
}

/// `W,H` (or `WxH`) with both positive.
fn parse_image_size(s: &str) -> Result<(u32, u32), Failure> {
    let bad = || {
        Failure::Usage(format!(
            "--image-size takes W,H (positive integers), got {s:?}"
        ))
    };
    let (w, h) = s.split_once([',', 'x']).ok_or_else(bad)?;
    let w: u32 = w.trim().parse().map_err(|_| bad())?;
    let h: u32 = h.trim().parse().map_err(|_| bad())?;
    if w == 0 || h == 0 {
        return Err(bad());
    }
    Ok((w, h))
}

/// Print an answer as the rendering or, with `json`, as `{"task", "result", "text"}`.
fn print_answer(task: Task, result: &TaskResult, json: bool) -> Result<(), Failure> {
    let text = render(result);
    if json {
        let out = serde_json::json!({
            "task": task.marker(),
            "result": result.to_json(task),
            "text": text,
        });
        let s = serde_json::to_string(&out).map_err(|e| Failure::Run(e.to_string()))?;
        println!("{s}");
    } else if !text.is_empty() {
        println!("{text}");
    }
    Ok(())
}

fn parse_cmd(args: &[String]) -> Result<(), Failure> {
    let opts = Opts::parse(args, &["task", "image-size", "text"])?;
    // A marker (`<OD>`), a bare name (`OD`), or a whole prompt (`<OPEN_VOCABULARY_DETECTION>cat`).
    let task_arg = opts.required("task")?;
    let task: Task = match task_arg.parse() {
        Ok(task) => task,
        Err(e) => parse_task_prompt(task_arg)
            .map(|p| p.task())
            .map_err(|_| Failure::Usage(e.to_string()))?,
    };
    let size = parse_image_size(opts.required("image-size")?)?;
    let raw = match opts.required("text")? {
        "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| Failure::Run(format!("reading stdin: {e}")))?;
            s
        }
        text => text.to_string(),
    };
    let result =
        post_process_generation(&raw, task, size).map_err(|e| Failure::Run(e.to_string()))?;
    print_answer(task, &result, opts.json)
}

/// `florence2 run`: the model pipeline plugs in here (load `--model DIR`, read `--image FILE`, parse
/// `--task PROMPT` with `processor::prompt::parse_task_prompt`, generate, decode with special tokens kept,
/// then `post_process_generation` with the original image size and `print_answer`).
fn run_cmd(args: &[String]) -> Result<(), Failure> {
    let _opts = Opts::parse(args, &["model", "image", "task"])?;
    Err(Failure::Run(
        "`run` is not available yet in this build (the model pipeline has not landed)".into(),
    ))
}
