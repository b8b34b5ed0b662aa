//! The batch's progress bar: images done / total, images per second and the time left, on stderr, only
//! when stderr is a terminal (a log file or a pipe gets the per-image errors and the final summary
//! only).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

pub struct Progress {
    bar: ProgressBar,
    failed: u64,
}

impl Progress {
    pub fn new(total: u64) -> Progress {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        let style = ProgressStyle::with_template(
            "{bar:32} {pos}/{len} images  {rate} images/s  ETA {eta}  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.2}", s.per_sec());
        });
        bar.set_style(style);
        Progress { bar, failed: 0 }
    }

    /// One image done; `failed` when any of its tasks failed.
    pub fn image_done(&mut self, failed: bool) {
        if failed {
            self.failed += 1;
            self.bar.set_message(format!("{} failed", self.failed));
        }
        self.bar.inc(1);
    }

    /// A line on stderr, above the bar.
    pub fn note(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
