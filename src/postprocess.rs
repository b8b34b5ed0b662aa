//! Post-processing: a raw Florence-2 generation (decoded with special tokens kept) into the reference-shaped
//! answer of its task, `Florence2Processor.post_process_generation(text, task, image_size=(width, height))`.
//!
//! Every answer type of the reference is reproduced, including its quirks (all checked against golden
//! cases produced by the reference, `tests/fixtures/postprocess/golden.json`):
//! - `pure_text` removes `<s>` and `</s>` and strips whitespace, but keeps `<pad>` (only the other answer
//!   types drop `<pad>`).
//! - Labels of `description_with_bboxes`, `bboxes` and `phrase_grounding` answers lose every non-ASCII
//!   character (`phrase.encode("ascii", "ignore")`); OCR and polygon labels keep them.
//! - `<REGION_PROPOSAL>` labels are always empty strings (its pattern never captures text).
//! - Phrase grounding skips phrases in the banned list of generic words ([`BANNED_GROUNDING_PHRASES`],
//!   compared before the ASCII filter, case-sensitively).
//! - A label cannot span a line break (`.` in the reference's patterns does not match `\n`): such a phrase
//!   is dropped, except for leading whitespace, which may contain line breaks.
//! - Location digits are any Unicode decimal digits (Python's `\d` and `int()`); bins are not clamped, so
//!   `<loc_1000>` yields a coordinate just outside the image, as in the reference.
//! - Where the reference raises (a bin with more than 4300 digits, or beyond int64), the result is the
//!   well-formed empty answer of the task's type.
//! - `<OPEN_VOCABULARY_DETECTION>` parses polygons if the raw text contains `<poly>` anywhere, boxes
//!   otherwise.
//! - Segmentation tasks ignore text (their pattern matches runs of four or more location/polygon tokens
//!   only); a label is whatever precedes the first `<loc_`/`<poly>` of such a run, so it is usually empty
//!   but can be markup such as `<sep>`. A polygon can be empty (`<loc_1><sep>...`: one value, dropped as
//!   an odd count), and an odd last bin is parsed by `int()` (and can raise) before it is dropped.
//! - Text preceding a run of fewer than four location tokens is not a label on its own: the scan restarts
//!   inside the markup, so `cat<loc_1><loc_2><loc_3>dog<loc_4>...` labels the next box `loc_3>dog`.
//! - An OCR line is the shortest text before eight location tokens, so location tokens that do not
//!   complete a quadrilateral become part of the next line's label.
//!
//! Coordinates: `(bin + 0.5) * size / 1000` in original-image pixels, computed in f32 exactly as the
//! reference's torch float32 arithmetic does, then widened to f64 through the f32's shortest decimal form
//! (so JSON shows `16.96`, not `16.959999084472656`). The HF-native processor (transformers >= 4.56) casts
//! these to int (truncation toward zero: 16.96 becomes 16); the original model-card processor,
//! transformers.js and this crate keep the floats.
//!
//! Every scanner is linear in the input length (no backtracking regex engine), and nothing here panics on
//! any input.
//!
//! Output bound. Box and polygon answers repeat a phrase's label once per box (or polygon instance), as
//! the reference does, so a long label followed by many boxes multiplies: 240 KB of text once made 1 GB
//! of JSON. The labels of one answer may total at most [`LABEL_BYTES_PER_INPUT_BYTE`] times the input
//! length plus [`LABEL_BYTES_SLACK`]; beyond that the answer is refused with [`Error::InvalidInput`]
//! (the reference has no such limit; a real generation, at most 1024 tokens, is far inside it). Every
//! coordinate consumes its own `<loc_N>` token (7+ input bytes) and prints in at most 24 bytes, and JSON
//! escaping writes a label byte in at most 6, so the JSON of any answer is at most
//! `6 (16 n + 64 KiB) + 4 n <= 100 n + 384 KiB` bytes for `n` input bytes (`tests/host/postprocess_props.rs`
//! checks it).

mod marker;
mod scan;

pub use marker::MarkedTask;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::processor::prompt::{dequantize, AnswerType, Task};
use scan::{
    char_at, find_quads, leading_phrase, loc_at, loc_chain, py_int, py_strip, to_int64, token_run,
    Loc, Raise, POLY, POLY_END, SEP,
};

/// `<OCR_WITH_REGION>`: one quadrilateral `[x1, y1, x2, y2, x3, y3, x4, y4]` per text line.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OcrResult {
    pub quad_boxes: Vec<[f64; 8]>,
    pub labels: Vec<String>,
}

/// `<OD>`, `<DENSE_REGION_CAPTION>`, `<REGION_PROPOSAL>`, `<CAPTION_TO_PHRASE_GROUNDING>`: boxes
/// `[x1, y1, x2, y2]`, one label per box.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BoxesResult {
    pub bboxes: Vec<[f64; 4]>,
    pub labels: Vec<String>,
}

/// `<REFERRING_EXPRESSION_SEGMENTATION>`, `<REGION_TO_SEGMENTATION>`: per instance a list of polygons, each
/// a flat `[x, y, x, y, ...]` list (possibly empty), one label per instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PolygonsResult {
    pub polygons: Vec<Vec<Vec<f64>>>,
    pub labels: Vec<String>,
}

/// `<OPEN_VOCABULARY_DETECTION>`: boxes or polygons (never both in one answer).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BoxesOrPolygonsResult {
    pub bboxes: Vec<[f64; 4]>,
    pub bboxes_labels: Vec<String>,
    pub polygons: Vec<Vec<Vec<f64>>>,
    pub polygons_labels: Vec<String>,
}

/// A task's post-processed answer. Serializes (untagged) to exactly the reference's value: a string, or an
/// object with the reference's key names.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TaskResult {
    Text(String),
    Ocr(OcrResult),
    Boxes(BoxesResult),
    Polygons(PolygonsResult),
    BoxesOrPolygons(BoxesOrPolygonsResult),
}

impl TaskResult {
    /// The empty answer of an answer type.
    pub fn empty(answer_type: AnswerType) -> TaskResult {
        match answer_type {
            AnswerType::PureText => TaskResult::Text(String::new()),
            AnswerType::Ocr => TaskResult::Ocr(OcrResult::default()),
            AnswerType::DescriptionWithBboxes
            | AnswerType::Bboxes
            | AnswerType::PhraseGrounding => TaskResult::Boxes(BoxesResult::default()),
            AnswerType::Polygons => TaskResult::Polygons(PolygonsResult::default()),
            AnswerType::DescriptionWithBboxesOrPolygons => {
                TaskResult::BoxesOrPolygons(BoxesOrPolygonsResult::default())
            }
        }
    }

    /// Exactly the reference's return value `{TASK: value}`, e.g. `{"<OD>": {"bboxes": .., "labels": ..}}`.
    pub fn to_json(&self, task: Task) -> serde_json::Value {
        self.to_json_keyed(task.marker())
    }

    /// `{marker: value}` for any marker (a model's own or an unknown task's answer is keyed by its marker).
    pub fn to_json_keyed(&self, marker: &str) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        map.insert(
            marker.to_string(),
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null),
        );
        serde_json::Value::Object(map)
    }
}

/// Phrases the reference's phrase grounding skips: `banned_grounding_tokens` of the post-processor config
/// shipped with the HF-native checkpoints (the original model-card processor's black list), deduplicated.
pub const BANNED_GROUNDING_PHRASES: [&str; 72] = [
    "it",
    "I",
    "me",
    "mine",
    "you",
    "your",
    "yours",
    "he",
    "him",
    "his",
    "she",
    "her",
    "hers",
    "they",
    "them",
    "their",
    "theirs",
    "one",
    "oneself",
    "we",
    "us",
    "our",
    "ours",
    "its",
    "myself",
    "yourself",
    "himself",
    "herself",
    "itself",
    "ourselves",
    "yourselves",
    "themselves",
    "this",
    "that",
    "these",
    "those",
    "who",
    "whom",
    "whose",
    "which",
    "what",
    "all",
    "another",
    "any",
    "anybody",
    "anyone",
    "anything",
    "each",
    "everybody",
    "everyone",
    "everything",
    "few",
    "many",
    "nobody",
    "none",
    "several",
    "some",
    "somebody",
    "someone",
    "something",
    "each other",
    "one another",
    "the image",
    "image",
    "images",
    "the",
    "a",
    "an",
    "a group",
    "other objects",
    "lots",
    "a set",
];

/// Labels of one answer may total at most this many bytes per input byte (plus [`LABEL_BYTES_SLACK`]).
pub const LABEL_BYTES_PER_INPUT_BYTE: usize = 16;
/// Label bytes always allowed, whatever the input length.
pub const LABEL_BYTES_SLACK: usize = 64 * 1024;

/// What the labels of one answer may still use (bytes).
struct LabelBudget {
    left: usize,
    exceeded: bool,
}

impl LabelBudget {
    fn for_input(n: usize) -> Self {
        LabelBudget {
            left: n
                .saturating_mul(LABEL_BYTES_PER_INPUT_BYTE)
                .saturating_add(LABEL_BYTES_SLACK),
            exceeded: false,
        }
    }

    /// Pay for one emitted label; past the budget the parse stops (and the call fails by name).
    fn take(&mut self, label: &str) -> std::result::Result<(), Raise> {
        match self.left.checked_sub(label.len()) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => {
                self.exceeded = true;
                Err(Raise)
            }
        }
    }
}

/// Post-process a raw generation for `task` on an image of `image_size = (width, height)` pixels.
///
/// Never panics. Fails only when the answer would exceed the output bound (see the module
/// documentation): [`Error::InvalidInput`].
pub fn post_process_generation(
    text: &str,
    task: Task,
    image_size: (u32, u32),
) -> Result<TaskResult> {
    let answer_type = task.answer_type();
    let mut budget = LabelBudget::for_input(text.len());
    let parsed = match answer_type {
        AnswerType::PureText => Ok(TaskResult::Text(
            py_strip(&text.replace("<s>", "").replace("</s>", "")).to_string(),
        )),
        other => parse_located(text, other, image_size, &mut budget),
    };
    if budget.exceeded {
        return Err(Error::InvalidInput(format!(
            "the {} answer to {} bytes of text would repeat its labels past {} bytes \
             (at most {LABEL_BYTES_PER_INPUT_BYTE} bytes of labels per input byte + {LABEL_BYTES_SLACK})",
            task.marker(),
            text.len(),
            text.len()
                .saturating_mul(LABEL_BYTES_PER_INPUT_BYTE)
                .saturating_add(LABEL_BYTES_SLACK)
        )));
    }
    Ok(parsed.unwrap_or_else(|Raise| TaskResult::empty(answer_type)))
}

fn parse_located(
    raw: &str,
    answer_type: AnswerType,
    size: (u32, u32),
    budget: &mut LabelBudget,
) -> std::result::Result<TaskResult, Raise> {
    let t = raw
        .replace("<s>", "")
        .replace("</s>", "")
        .replace("<pad>", "");
    let t = t.as_str();
    Ok(match answer_type {
        AnswerType::PureText => TaskResult::Text(py_strip(raw).to_string()),
        AnswerType::Ocr => {
            let mut r = OcrResult::default();
            for (label, quad) in parse_ocr(t, size, budget)? {
                r.quad_boxes.push(quad);
                r.labels.push(label);
            }
            TaskResult::Ocr(r)
        }
        AnswerType::DescriptionWithBboxes | AnswerType::Bboxes | AnswerType::PhraseGrounding => {
            let (bboxes, labels) = parse_boxes(t, size, answer_type, budget)?
                .into_iter()
                .unzip();
            TaskResult::Boxes(BoxesResult { bboxes, labels })
        }
        AnswerType::Polygons => {
            let (polygons, labels) = parse_polygons(t, size, true, budget)?.into_iter().unzip();
            TaskResult::Polygons(PolygonsResult { polygons, labels })
        }
        AnswerType::DescriptionWithBboxesOrPolygons => {
            // The reference tests the raw text, before `<s>`/`</s>`/`<pad>` are removed.
            if raw.contains(POLY) {
                let (polygons, polygons_labels) =
                    parse_polygons(t, size, false, budget)?.into_iter().unzip();
                TaskResult::BoxesOrPolygons(BoxesOrPolygonsResult {
                    polygons,
                    polygons_labels,
                    ..Default::default()
                })
            } else {
                let (bboxes, bboxes_labels) =
                    parse_boxes(t, size, AnswerType::DescriptionWithBboxes, budget)?
                        .into_iter()
                        .unzip();
                TaskResult::BoxesOrPolygons(BoxesOrPolygonsResult {
                    bboxes,
                    bboxes_labels,
                    ..Default::default()
                })
            }
        }
    })
}

/// Lookahead targets ending a label (`(?=<od>|</od>|<box>|</box>|<bbox>|</bbox>|<loc_)`).
const BOX_TARGETS: [&str; 7] = [
    "<od>", "</od>", "<box>", "</box>", "<bbox>", "</bbox>", "<loc_",
];
/// The polygon parser's lookahead adds `<poly>`.
const POLY_TARGETS: [&str; 8] = [
    "<od>", "</od>", "<box>", "</box>", "<bbox>", "</bbox>", "<loc_", "<poly>",
];

/// f32 coordinate widened through its shortest decimal representation.
fn widen(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// Python `int()` of every bin of `locs` (raising like the reference).
fn py_ints(s: &str, locs: &[Loc]) -> std::result::Result<Vec<Option<u64>>, Raise> {
    locs.iter().map(|loc| py_int(loc.digits(s))).collect()
}

/// `torch.tensor(bins)` then the float `dequantize`: alternating x, y pixel coordinates.
fn xy_coords(bins: &[Option<u64>], (w, h): (u32, u32)) -> std::result::Result<Vec<f64>, Raise> {
    bins.iter()
        .enumerate()
        .map(|(i, &bin)| {
            let bin = to_int64(bin)?;
            Ok(widen(dequantize(bin, if i % 2 == 0 { w } else { h })))
        })
        .collect()
}

/// `(.+?)<loc_(\d+)>{x8}` with `re.findall`; label stripped, not ASCII-filtered.
fn parse_ocr(
    t: &str,
    size: (u32, u32),
    budget: &mut LabelBudget,
) -> std::result::Result<Vec<(String, [f64; 8])>, Raise> {
    let mut matches: Vec<(&str, [Loc; 8])> = Vec::new();
    let mut p = 0;
    while let Some(c) = char_at(t, p) {
        if c == '\n' {
            p += 1;
            continue;
        }
        // The lazy `.+?` grows one character at a time and cannot cross '\n'.
        let mut q = p + c.len_utf8();
        let found = loop {
            if let Some(locs) = eight_locs(t, q) {
                break Some((q, locs));
            }
            match char_at(t, q) {
                None | Some('\n') => break None,
                Some(c2) => q += c2.len_utf8(),
            }
        };
        match found {
            Some((q, locs)) => {
                matches.push((t.get(p..q).unwrap_or(""), locs));
                p = locs[7].end;
            }
            // No start before this line break can match either.
            None => p = q,
        }
    }
    let mut out = Vec::with_capacity(matches.len());
    for (content, locs) in matches {
        let quad =
            <[f64; 8]>::try_from(xy_coords(&py_ints(t, &locs)?, size)?).map_err(|_| Raise)?;
        let label = py_strip(content);
        budget.take(label)?;
        out.push((label.to_string(), quad));
    }
    Ok(out)
}

fn eight_locs(s: &str, at: usize) -> Option<[Loc; 8]> {
    let mut locs = [Loc {
        digits: (0, 0),
        end: 0,
    }; 8];
    let mut p = at;
    for slot in &mut locs {
        let loc = loc_at(s, p)?;
        p = loc.end;
        *slot = loc;
    }
    Some(locs)
}

/// `re.findall(r"([^<]+(?:TOKEN){4,})", t)`: a maximal run of non-`<` characters followed by at least four
/// tokens (all of them, greedily).
fn text_phrases(t: &str, polygon: bool) -> Vec<&str> {
    let mut out = Vec::new();
    let mut p = 0;
    while p < t.len() {
        if t.as_bytes().get(p) == Some(&b'<') {
            p += 1;
            continue;
        }
        // `[^<]+` only succeeds at its maximal extent: a shorter run is followed by a non-'<' character.
        let r = t
            .get(p..)
            .and_then(|s| s.find('<'))
            .map_or(t.len(), |i| p + i);
        match token_run(t, r, polygon, 4) {
            Some(end) => {
                out.push(t.get(p..end).unwrap_or(""));
                p = end;
            }
            // Every start inside this run ends at the same `r` and fails the same way.
            None => p = r,
        }
    }
    out
}

/// `re.findall(r"(?:(?:TOKEN){4,})", t)`: runs of at least four tokens.
fn token_phrases(t: &str, polygon: bool) -> Vec<&str> {
    let mut out = Vec::new();
    let mut p = 0;
    while let Some(c) = char_at(t, p) {
        match token_run(t, p, polygon, 4) {
            Some(end) => {
                out.push(t.get(p..end).unwrap_or(""));
                p = end;
            }
            None => p += c.len_utf8(),
        }
    }
    out
}

/// Keep only ASCII characters (`s.encode("ascii", "ignore").decode("ascii")`).
fn ascii_only(s: &str) -> String {
    s.chars().filter(char::is_ascii).collect()
}

/// `parse_description_with_bboxes_from_text_and_spans` (`DescriptionWithBboxes`; `Bboxes` is its
/// `allow_empty_phrase=True` form) and `parse_phrase_grounding_from_text_and_spans`
/// (`PhraseGrounding`), flattened to one (box, label) pair per box as `post_process_generation` does.
fn parse_boxes(
    t: &str,
    size: (u32, u32),
    answer_type: AnswerType,
    budget: &mut LabelBudget,
) -> std::result::Result<Vec<([f64; 4], String)>, Raise> {
    let phrases = if answer_type == AnswerType::Bboxes {
        token_phrases(t, false)
    } else {
        text_phrases(t, false)
    };
    let mut out = Vec::new();
    for phrase_text in phrases {
        // The reference first removes one `<ground>` and one `<obj>`: a phrase's only '<' characters start
        // location tokens, so neither can occur.
        let Some(m) = leading_phrase(phrase_text, &BOX_TARGETS) else {
            continue;
        };
        let phrase = py_strip(m);
        if answer_type == AnswerType::PhraseGrounding && BANNED_GROUNDING_PHRASES.contains(&phrase)
        {
            continue;
        }
        let quads = find_quads(phrase_text);
        if quads.is_empty() {
            continue;
        }
        let mut boxes = Vec::with_capacity(quads.len());
        for quad in &quads {
            let c = xy_coords(&py_ints(phrase_text, quad)?, size)?;
            boxes.push(<[f64; 4]>::try_from(c).map_err(|_| Raise)?);
        }
        let label = ascii_only(phrase);
        for _ in &boxes {
            budget.take(&label)?;
        }
        out.extend(boxes.into_iter().map(|b| (b, label.clone())));
    }
    Ok(out)
}

/// One instance's polygons, each a flat `[x, y, ...]` list.
type Polygons = Vec<Vec<f64>>;

/// `parse_description_with_polygons_from_text_and_spans` (`with_box_at_start=False`): one instance per
/// `<poly>...</poly>` group (or per phrase without both), each a list of polygons.
fn parse_polygons(
    t: &str,
    size: (u32, u32),
    allow_empty_phrase: bool,
    budget: &mut LabelBudget,
) -> std::result::Result<Vec<(Polygons, String)>, Raise> {
    let phrases = if allow_empty_phrase {
        token_phrases(t, true)
    } else {
        text_phrases(t, true)
    };
    let mut out = Vec::new();
    for phrase_text in phrases {
        // re.sub(r"^<loc_\d+>", "", phrase_text, count=1)
        let stripped = match loc_at(phrase_text, 0) {
            Some(loc) => phrase_text.get(loc.end..).unwrap_or(""),
            None => phrase_text,
        };
        if stripped.is_empty() && !allow_empty_phrase {
            continue;
        }
        let Some(m) = leading_phrase(stripped, &POLY_TARGETS) else {
            continue;
        };
        let phrase = py_strip(m);
        let instances = if phrase_text.contains(POLY) && phrase_text.contains(POLY_END) {
            poly_groups(phrase_text)
        } else {
            vec![phrase_text]
        };
        for inst in instances {
            let chains = poly_chains(inst);
            if chains.is_empty() {
                continue;
            }
            let mut polygons = Vec::with_capacity(chains.len());
            for chain in &chains {
                // Every bin goes through int() before an odd count drops the last one.
                let mut bins = py_ints(inst, chain)?;
                if bins.len() % 2 == 1 {
                    bins.pop();
                }
                polygons.push(xy_coords(&bins, size)?);
            }
            budget.take(phrase)?;
            out.push((polygons, phrase.to_string()));
        }
    }
    Ok(out)
}

/// `re.finditer(r"<poly>(.*?)</poly>", s)`: the contents.
fn poly_groups(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(start) = s.get(i..).and_then(|r| r.find(POLY)).map(|k| i + k) {
        let c0 = start + POLY.len();
        let Some(end) = s.get(c0..).and_then(|r| r.find(POLY_END)).map(|k| c0 + k) else {
            break; // no later `<poly>` has a closing tag either
        };
        let content = s.get(c0..end).unwrap_or("");
        if content.contains('\n') {
            // `.` cannot cross '\n'; unreachable for phrases (their '\n' precede every '<'), kept exact.
            i = start + 1;
            continue;
        }
        out.push(content);
        i = end + POLY_END.len();
    }
    out
}

/// `re.finditer(r"((?:<loc_\d+>)+)(?:<sep>|$)", s)`: the loc chains followed by `<sep>` or the end.
fn poly_chains(s: &str) -> Vec<Vec<Loc>> {
    let mut out = Vec::new();
    let mut p = 0;
    while let Some(c) = char_at(s, p) {
        let chain = loc_chain(s, p);
        let Some(end) = chain.last().map(|l| l.end) else {
            p += c.len_utf8();
            continue;
        };
        let rest = s.get(end..).unwrap_or("");
        if rest.starts_with(SEP) {
            out.push(chain);
            p = end + SEP.len();
        } else if rest.is_empty() || rest == "\n" {
            // `$` matches at the end and before a final '\n'.
            out.push(chain);
            p = end;
        } else {
            // A start later in this chain ends at the same place and fails the same way.
            p = end;
        }
    }
    out
}
