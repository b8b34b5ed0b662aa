//! Where a batch's JSON Lines go (stdout or `--output FILE`), one line per (image, task) written and
//! flushed as soon as it is known, and what `--resume` reads back from that file.
//!
//! `--resume` skips the (image, prompt) pairs that have an answer in the file (a line with `"image"` and
//! `"prompt"` and no `"error"`); failed pairs run again. New lines are appended. A last line cut off
//! mid-write (the process was killed) is removed first: it was not answered.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cli::Failure;

/// The (image, prompt) pairs answered in a JSON Lines file.
pub type Done = HashSet<(String, String)>;

/// The pair an output line answers, when it is an answer (not an error).
fn answered(line: &[u8]) -> Option<(String, String)> {
    let v: Value = serde_json::from_slice(line).ok()?;
    if v.get("error").is_some() {
        return None;
    }
    let image = v.get("image")?.as_str()?;
    let prompt = v.get("prompt")?.as_str()?;
    Some((image.to_string(), prompt.to_string()))
}

/// The answered pairs of `path` and the length of its complete lines (a cut-off last line excluded).
pub fn read_done(path: &Path) -> Result<(Done, u64), Failure> {
    let fail = |e: std::io::Error| Failure::Run(format!("reading {}: {e}", path.display()));
    let (file, _) = florence2_wasm::files::open_regular(path)?;
    let mut reader = BufReader::new(file);
    let mut done = Done::new();
    let (mut complete, mut line) = (0u64, Vec::new());
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(fail)?;
        if n == 0 || line.last() != Some(&b'\n') {
            return Ok((done, complete));
        }
        complete += n as u64;
        if let Some(pair) = answered(&line) {
            done.insert(pair);
        }
    }
}

/// The JSON Lines destination.
pub struct Sink {
    out: Box<dyn Write>,
    /// The file, for error messages (`None`: stdout).
    path: Option<PathBuf>,
}

impl Sink {
    /// Stdout, `path` truncated, or with `resume` `path` appended to after what [`read_done`] found
    /// (`resume_from`: the length of its complete lines; `None` when the file does not exist yet).
    pub fn open(path: Option<&Path>, resume_from: Option<u64>) -> Result<Sink, Failure> {
        let Some(path) = path else {
            return Ok(Sink {
                out: Box::new(std::io::stdout()),
                path: None,
            });
        };
        let fail = |e: std::io::Error| Failure::Run(format!("opening {}: {e}", path.display()));
        let file = match resume_from {
            Some(len) => {
                let mut f: File = OpenOptions::new().write(true).open(path).map_err(fail)?;
                f.set_len(len).map_err(fail)?;
                f.seek(SeekFrom::End(0)).map_err(fail)?;
                f
            }
            None => File::create(path).map_err(fail)?,
        };
        Ok(Sink {
            out: Box::new(file),
            path: Some(path.to_path_buf()),
        })
    }

    /// Write `v` as one line and flush it.
    pub fn line(&mut self, v: &Value) -> Result<(), Failure> {
        let mut s = serde_json::to_string(v).map_err(|e| Failure::Run(e.to_string()))?;
        s.push('\n');
        let shown = || {
            self.path
                .as_ref()
                .map_or("stdout".to_string(), |p| p.display().to_string())
        };
        let r = self
            .out
            .write_all(s.as_bytes())
            .and_then(|()| self.out.flush());
        r.map_err(|e| Failure::write(&shown(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_reads_answers_and_drops_a_cut_off_line() {
        let p = std::env::temp_dir().join(format!("florence2-resume-{}.jsonl", std::process::id()));
        let lines = [
            r#"{"image":"a.png","prompt":"<OD>","task":"<OD>"}"#,
            r#"{"image":"b.png","error":{"name":"Florence2ImageError","message":"x"}}"#,
            r#"{"image":"c.png","prompt":"<OD>","error":{"name":"n","message":"m"}}"#,
            "not json",
            r#"{"image":"a.png","prompt":"<CAPTION>"}"#,
        ];
        let complete = lines.join("\n") + "\n";
        std::fs::write(&p, format!("{complete}{{\"image\":\"d.png\",\"pro")).unwrap();
        let (done, len) = read_done(&p).unwrap();
        assert_eq!(len, complete.len() as u64);
        let want: Done = [("a.png", "<OD>"), ("a.png", "<CAPTION>")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .into();
        assert_eq!(done, want);
        let mut sink = Sink::open(Some(&p), Some(len)).unwrap();
        sink.line(&serde_json::json!({"image": "d.png"})).unwrap();
        drop(sink);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text, format!("{complete}{{\"image\":\"d.png\"}}\n"));
        std::fs::remove_file(&p).unwrap();
    }
}
