//! The hub download's progress bar: one bar per file (bytes, rate, time left) on stderr, only when
//! stderr is a terminal; elsewhere the library's one line per file (`verbose`) is the record.

use std::io::IsTerminal;
use std::sync::Mutex;

use florence2_wasm::hub_cache::{DownloadProgress, HubCacheOptions, ProgressObserver};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Set `opts` to draw bars on a terminal, or to print a line per file otherwise.
pub fn attach(opts: &mut HubCacheOptions) {
    if !std::io::stderr().is_terminal() {
        opts.verbose = true;
        return;
    }
    // The file being drawn and its bar.
    let current: Mutex<Option<(String, ProgressBar)>> = Mutex::new(None);
    opts.progress = Some(ProgressObserver::new(move |p: &DownloadProgress| {
        let Ok(mut cur) = current.lock() else {
            return;
        };
        if cur.as_ref().is_none_or(|(f, _)| *f != p.file) {
            if let Some((_, old)) = cur.take() {
                old.finish_and_clear();
            }
            *cur = Some((p.file.clone(), new_bar(p)));
        }
        if let Some((_, bar)) = cur.as_ref() {
            bar.set_position(p.done);
            if p.finished {
                bar.finish_and_clear();
                eprintln!("florence2: downloaded {}", p.file);
            }
        }
    }));
}

fn new_bar(p: &DownloadProgress) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(p.total, ProgressDrawTarget::stderr());
    let template = if p.total.is_some() {
        "{msg} {bar:32} {bytes}/{total_bytes}  {bytes_per_sec}  ETA {eta}"
    } else {
        "{msg} {bytes}  {bytes_per_sec}"
    };
    let style =
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(p.file.clone());
    // A resumed file starts at what the partial blob held: the rate counts only new bytes.
    bar.set_position(p.done);
    bar.reset_eta();
    bar
}
