//! Florence-2 task prompts: the 15 task markers, parsing and validating a prompt string such as `<OD>`,
//! `<CAPTION_TO_PHRASE_GROUNDING>two cats` or `<REGION_TO_DESCRIPTION><loc_52><loc_100><loc_300><loc_400>`,
//! and building the natural-language text the encoder sees (as the reference `Florence2Processor.
//! _construct_prompts` does).
//!
//! Validation happens at this boundary, before tokenization, because the prompt is untrusted input:
//! - an unknown marker is an error that lists the valid markers;
//! - a task without input must be the whole prompt; a task with input must get a non-empty input;
//! - an input is at most [`MAX_INPUT_BYTES`] bytes and contains no control characters and no Unicode
//!   format characters (general category Cf: bidi overrides, embeddings and isolates, zero-width space,
//!   word joiner, BOM, soft hyphen, tag characters, ...) except U+200C ZERO WIDTH NON-JOINER and U+200D
//!   ZERO WIDTH JOINER, which spelling in Persian, Indic scripts and emoji sequences needs. Format
//!   characters are invisible or reorder what is displayed, so a prompt shown to a user could differ
//!   from what the model reads (the "Trojan Source" and tag-character smuggling tricks); the reference
//!   accepts them, this boundary refuses them by name ([`is_refused_format_char`]);
//! - region tasks take exactly `<loc_a><loc_b><loc_c><loc_d>` (canonical decimal bins 0..=999);
//! - free-text inputs reject `<` and `>`, so no task, location or special token (every added token of the
//!   Florence-2 tokenizer is angle-bracketed) can be smuggled into the encoder prompt.
//!
//! Error messages echo at most [`ECHO_CHARS`] characters of the offending text, escaped.
//!
//! Leniency relative to the reference: surrounding whitespace of the whole prompt is trimmed (the reference
//! raises for `"<OD> "`), and the input is trimmed exactly like the reference trims it (`.strip()`; the
//! characters where Python's and Rust's whitespace differ, U+001C..U+001F, are control characters and
//! rejected anyway).

use crate::error::{Error, Result};

/// Longest accepted task input, in bytes (UTF-8).
pub const MAX_INPUT_BYTES: usize = 2048;
/// Quantization bins per axis: one per location token `<loc_0>`..`<loc_999>`.
pub const BINS: u32 = crate::processor::tokenizer::NUM_LOC_TOKENS;
/// Most characters of offending input echoed in an error message (before escaping).
pub const ECHO_CHARS: usize = 40;

/// Unicode's format characters (general category Cf, Unicode 15.1), as inclusive ranges.
const FORMAT_CHARS: [(char, char); 21] = [
    ('\u{00AD}', '\u{00AD}'),   // soft hyphen
    ('\u{0600}', '\u{0605}'),   // Arabic number signs
    ('\u{061C}', '\u{061C}'),   // Arabic letter mark (bidi)
    ('\u{06DD}', '\u{06DD}'),   // Arabic end of ayah
    ('\u{070F}', '\u{070F}'),   // Syriac abbreviation mark
    ('\u{0890}', '\u{0891}'),   // Arabic pound/piastre marks above
    ('\u{08E2}', '\u{08E2}'),   // Arabic disputed end of ayah
    ('\u{180E}', '\u{180E}'),   // Mongolian vowel separator
    ('\u{200B}', '\u{200F}'),   // zero-width space, ZWNJ, ZWJ, LRM, RLM
    ('\u{202A}', '\u{202E}'),   // bidi embeddings and overrides
    ('\u{2060}', '\u{2064}'),   // word joiner, invisible operators
    ('\u{2066}', '\u{206F}'),   // bidi isolates, deprecated format characters
    ('\u{FEFF}', '\u{FEFF}'),   // BOM / zero-width no-break space
    ('\u{FFF9}', '\u{FFFB}'),   // interlinear annotation
    ('\u{110BD}', '\u{110BD}'), // Kaithi number sign
    ('\u{110CD}', '\u{110CD}'), // Kaithi number sign above
    ('\u{13430}', '\u{1343F}'), // Egyptian hieroglyph format controls
    ('\u{1BCA0}', '\u{1BCA3}'), // shorthand format controls
    ('\u{1D173}', '\u{1D17A}'), // musical symbol format controls
    ('\u{E0001}', '\u{E0001}'), // language tag
    ('\u{E0020}', '\u{E007F}'), // tag characters
];

/// True for the format characters a task input may not contain: every Cf character except U+200C (ZWNJ)
/// and U+200D (ZWJ). See the module documentation for the policy.
pub fn is_refused_format_char(c: char) -> bool {
    if c == '\u{200C}' || c == '\u{200D}' {
        return false;
    }
    FORMAT_CHARS.iter().any(|&(a, b)| (a..=b).contains(&c))
}

/// One of Florence-2's 15 task prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Task {
    Caption,
    DetailedCaption,
    MoreDetailedCaption,
    Ocr,
    OcrWithRegion,
    Od,
    DenseRegionCaption,
    RegionProposal,
    CaptionToPhraseGrounding,
    ReferringExpressionSegmentation,
    RegionToSegmentation,
    OpenVocabularyDetection,
    RegionToCategory,
    RegionToDescription,
    RegionToOcr,
}

/// What a task takes after its marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// The marker is the whole prompt.
    None,
    /// Free text (no `<`, `>`, no control characters).
    Text,
    /// Exactly four location tokens `<loc_x1><loc_y1><loc_x2><loc_y2>`.
    Region,
}

/// The reference post-processing type of a task's answer (`tasks_answer_post_processing_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnswerType {
    PureText,
    Ocr,
    DescriptionWithBboxes,
    Bboxes,
    PhraseGrounding,
    Polygons,
    DescriptionWithBboxesOrPolygons,
}

impl AnswerType {
    /// The reference's name for this type (`"pure_text"`, `"ocr"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AnswerType::PureText => "pure_text",
            AnswerType::Ocr => "ocr",
            AnswerType::DescriptionWithBboxes => "description_with_bboxes",
            AnswerType::Bboxes => "bboxes",
            AnswerType::PhraseGrounding => "phrase_grounding",
            AnswerType::Polygons => "polygons",
            AnswerType::DescriptionWithBboxesOrPolygons => "description_with_bboxes_or_polygons",
        }
    }
}

impl Task {
    /// All tasks: the 8 without input, then the 7 with input (the order of the reference's prompt tables).
    pub const ALL: [Task; 15] = [
        Task::Ocr,
        Task::OcrWithRegion,
        Task::Caption,
        Task::DetailedCaption,
        Task::MoreDetailedCaption,
        Task::Od,
        Task::DenseRegionCaption,
        Task::RegionProposal,
        Task::CaptionToPhraseGrounding,
        Task::ReferringExpressionSegmentation,
        Task::RegionToSegmentation,
        Task::OpenVocabularyDetection,
        Task::RegionToCategory,
        Task::RegionToDescription,
        Task::RegionToOcr,
    ];

    /// The task marker, e.g. `"<OD>"`.
    pub fn marker(self) -> &'static str {
        match self {
            Task::Caption => "<CAPTION>",
            Task::DetailedCaption => "<DETAILED_CAPTION>",
            Task::MoreDetailedCaption => "<MORE_DETAILED_CAPTION>",
            Task::Ocr => "<OCR>",
            Task::OcrWithRegion => "<OCR_WITH_REGION>",
            Task::Od => "<OD>",
            Task::DenseRegionCaption => "<DENSE_REGION_CAPTION>",
            Task::RegionProposal => "<REGION_PROPOSAL>",
            Task::CaptionToPhraseGrounding => "<CAPTION_TO_PHRASE_GROUNDING>",
            Task::ReferringExpressionSegmentation => "<REFERRING_EXPRESSION_SEGMENTATION>",
            Task::RegionToSegmentation => "<REGION_TO_SEGMENTATION>",
            Task::OpenVocabularyDetection => "<OPEN_VOCABULARY_DETECTION>",
            Task::RegionToCategory => "<REGION_TO_CATEGORY>",
            Task::RegionToDescription => "<REGION_TO_DESCRIPTION>",
            Task::RegionToOcr => "<REGION_TO_OCR>",
        }
    }

    /// The task for an exact marker such as `"<OD>"` (case-sensitive, brackets required).
    pub fn from_marker(marker: &str) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.marker() == marker)
    }

    /// The reference's prompt template; `{input}` stands for the task input.
    pub fn prompt_template(self) -> &'static str {
        match self {
            Task::Ocr => "What is the text in the image?",
            Task::OcrWithRegion => "What is the text in the image, with regions?",
            Task::Caption => "What does the image describe?",
            Task::DetailedCaption => "Describe in detail what is shown in the image.",
            Task::MoreDetailedCaption => "Describe with a paragraph what is shown in the image.",
            Task::Od => "Locate the objects with category name in the image.",
            Task::DenseRegionCaption => "Locate the objects in the image, with their descriptions.",
            Task::RegionProposal => "Locate the region proposals in the image.",
            Task::CaptionToPhraseGrounding => "Locate the phrases in the caption: {input}",
            Task::ReferringExpressionSegmentation => "Locate {input} in the image with mask",
            Task::RegionToSegmentation => "What is the polygon mask of region {input}",
            Task::OpenVocabularyDetection => "Locate {input} in the image.",
            Task::RegionToCategory => "What is the region {input}?",
            Task::RegionToDescription => "What does the region {input} describe?",
            Task::RegionToOcr => "What text is in the region {input}?",
        }
    }

    /// What the task takes after its marker.
    pub fn input_kind(self) -> InputKind {
        match self {
            Task::CaptionToPhraseGrounding
            | Task::ReferringExpressionSegmentation
            | Task::OpenVocabularyDetection => InputKind::Text,
            Task::RegionToSegmentation
            | Task::RegionToCategory
            | Task::RegionToDescription
            | Task::RegionToOcr => InputKind::Region,
            _ => InputKind::None,
        }
    }

    /// Whether the task takes an input after its marker.
    pub fn takes_input(self) -> bool {
        self.input_kind() != InputKind::None
    }

    /// The reference post-processing type of this task's answer.
    pub fn answer_type(self) -> AnswerType {
        match self {
            Task::Caption
            | Task::DetailedCaption
            | Task::MoreDetailedCaption
            | Task::Ocr
            | Task::RegionToCategory
            | Task::RegionToDescription
            | Task::RegionToOcr => AnswerType::PureText,
            Task::OcrWithRegion => AnswerType::Ocr,
            Task::Od | Task::DenseRegionCaption => AnswerType::DescriptionWithBboxes,
            Task::RegionProposal => AnswerType::Bboxes,
            Task::CaptionToPhraseGrounding => AnswerType::PhraseGrounding,
            Task::ReferringExpressionSegmentation | Task::RegionToSegmentation => {
                AnswerType::Polygons
            }
            Task::OpenVocabularyDetection => AnswerType::DescriptionWithBboxesOrPolygons,
        }
    }

    /// A task named by its marker (`<OD>`) or by the bare name (`OD`); case-sensitive.
    pub fn from_name(name: &str) -> Option<Task> {
        Task::from_marker(name).or_else(|| {
            Task::ALL
                .into_iter()
                .find(|t| t.marker().get(1..t.marker().len() - 1) == Some(name))
        })
    }

    /// The valid markers joined by ", " (for error messages and help text).
    pub fn valid_markers() -> String {
        Task::ALL.map(Task::marker).join(", ")
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.marker())
    }
}

impl std::str::FromStr for Task {
    type Err = Error;
    /// Accepts `<OD>` or `OD`.
    fn from_str(s: &str) -> Result<Task> {
        Task::from_name(s).ok_or_else(|| {
            Error::Prompt(format!(
                "unknown Florence-2 task {}; valid markers: {}",
                echo(s),
                Task::valid_markers()
            ))
        })
    }
}

/// A validated task prompt: the task and, for input-taking tasks, its (trimmed, validated) input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskPrompt {
    task: Task,
    input: Option<String>,
    region: Option<[u32; 4]>,
}

impl TaskPrompt {
    /// The task.
    pub fn task(&self) -> Task {
        self.task
    }

    /// The validated input (`None` for tasks without input).
    pub fn input(&self) -> Option<&str> {
        self.input.as_deref()
    }

    /// The region bins `[x1, y1, x2, y2]` of a region task.
    pub fn region(&self) -> Option<[u32; 4]> {
        self.region
    }

    /// The text the encoder sees (before `<s>`/`</s>` are added): the task's template with `{input}`
    /// substituted once. The input is not re-scanned, so a literal `{input}` inside it stays literal (as with
    /// Python's `str.format`).
    pub fn encoder_text(&self) -> String {
        let template = self.task.prompt_template();
        match (&self.input, template.split_once("{input}")) {
            (Some(input), Some((before, after))) => {
                let mut s = String::with_capacity(template.len() + input.len());
                s.push_str(before);
                s.push_str(input);
                s.push_str(after);
                s
            }
            _ => template.to_string(),
        }
    }
}

/// Parse and validate a task prompt (see the module docs for the rules).
pub fn parse_task_prompt(prompt: &str) -> Result<TaskPrompt> {
    let (task, marker, input) = split_marker(prompt)?;
    let kind = task.input_kind();
    if kind == InputKind::None {
        if !input.is_empty() {
            return Err(Error::Prompt(format!(
                "{marker} takes no input and must be the whole prompt; got trailing {}",
                echo(input)
            )));
        }
        return Ok(TaskPrompt {
            task,
            input: None,
            region: None,
        });
    }
    check_input(marker, kind, input)?;
    let region = if kind == InputKind::Region {
        Some(region_bins(input).ok_or_else(|| {
            Error::Prompt(format!(
                "{marker} takes a region as exactly four location tokens \
                 <loc_x1><loc_y1><loc_x2><loc_y2> with bins 0..=999; got {}",
                echo(input)
            ))
        })?)
    } else {
        if input.contains(['<', '>']) {
            return Err(Error::Prompt(format!(
                "{marker} input must be plain text without '<' or '>'; got {}",
                echo(input)
            )));
        }
        None
    };
    Ok(TaskPrompt {
        task,
        input: Some(input.to_string()),
        region,
    })
}

/// The task, its marker and the trimmed rest of a prompt that starts with a known task marker.
fn split_marker(prompt: &str) -> Result<(Task, &str, &str)> {
    let trimmed = prompt.trim();
    if !trimmed.starts_with('<') {
        return Err(Error::Prompt(format!(
            "a Florence-2 prompt starts with a task marker such as <OD>; got {}; valid markers: {}",
            echo(trimmed),
            Task::valid_markers()
        )));
    }
    let Some(close) = trimmed.find('>') else {
        return Err(Error::Prompt(format!(
            "unclosed task marker in {}; valid markers: {}",
            echo(trimmed),
            Task::valid_markers()
        )));
    };
    let (marker, rest) = trimmed.split_at(close + 1);
    let Some(task) = Task::from_marker(marker) else {
        return Err(Error::Prompt(format!(
            "unknown Florence-2 task marker {}; valid markers: {}",
            echo(marker),
            Task::valid_markers()
        )));
    };
    Ok((task, marker, rest.trim()))
}

/// An input-taking task's input: present, bounded, without control or invisible format characters.
fn check_input(marker: &str, kind: InputKind, input: &str) -> Result<()> {
    if input.is_empty() {
        let (what, example) = if kind == InputKind::Region {
            (
                "a region <loc_x1><loc_y1><loc_x2><loc_y2>",
                "<loc_52><loc_100><loc_300><loc_400>",
            )
        } else {
            ("a text input", "a cat")
        };
        return Err(Error::Prompt(format!(
            "{marker} needs {what} after the marker, e.g. {marker}{example}"
        )));
    }
    if input.len() > MAX_INPUT_BYTES {
        return Err(Error::Prompt(format!(
            "{marker} input is {} bytes; at most {MAX_INPUT_BYTES} bytes are accepted",
            input.len()
        )));
    }
    if let Some(c) = input.chars().find(|c| c.is_control()) {
        return Err(Error::Prompt(format!(
            "{marker} input contains the control character {}; got {}",
            c.escape_unicode(),
            echo(input)
        )));
    }
    if let Some(c) = input.chars().find(|&c| is_refused_format_char(c)) {
        return Err(Error::Prompt(format!(
            "{marker} input contains the invisible format character {} (bidi controls, \
             zero-width and other format characters are refused); got {}",
            c.escape_unicode(),
            echo(input)
        )));
    }
    Ok(())
}

/// The bins of a region input: exactly `<loc_a><loc_b><loc_c><loc_d>`, each bin canonical decimal (no sign,
/// no leading zero) in 0..=999; `None` otherwise. The inverse of [`region_tokens`]; pixel coordinates with
/// [`dequantize_box`].
pub fn region_bins(s: &str) -> Option<[u32; 4]> {
    let mut bins = [0u32; 4];
    let mut rest = s;
    for bin in &mut bins {
        rest = rest.strip_prefix("<loc_")?;
        let end = rest.find('>')?;
        let digits = rest.get(..end)?;
        let ok_len = (1..=3).contains(&digits.len());
        let canonical = digits == "0" || !digits.starts_with('0');
        if !ok_len || !canonical || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *bin = digits.parse().ok()?;
        rest = rest.get(end + 1..)?;
    }
    rest.is_empty().then_some(bins)
}

/// A short, escaped, quoted prefix of untrusted text for error messages (also used by `florence2 serve`).
pub fn echo(s: &str) -> String {
    let mut out = String::from("\"");
    let mut chars = s.chars();
    for c in chars.by_ref().take(ECHO_CHARS) {
        out.extend(c.escape_debug());
    }
    out.push('"');
    if chars.next().is_some() {
        out.push_str(&format!("... ({} bytes)", s.len()));
    }
    out
}

/// Width of one bin in pixels, as the reference computes it (`size / 1000` in Python's double, used as an
/// f32 by the torch float32 arithmetic).
fn per_bin(size: u32) -> f32 {
    (f64::from(size) / f64::from(BINS)) as f32
}

/// The pixel coordinate of a bin's centre: `(bin + 0.5) * size / 1000`, computed in f32 exactly as the
/// reference's torch float32 arithmetic does (`bin` converted to f32, plus 0.5, times the f32 bin width).
/// Bins beyond 999 (a malformed generation) extrapolate linearly.
pub fn dequantize(bin: u64, size: u32) -> f32 {
    (bin as f32 + 0.5) * per_bin(size)
}

/// One pixel coordinate to its bin: `floor(coord / (size / 1000))` clamped to 0..=999 (the reference's
/// `quantize`). NaN and a zero size give bin 0.
pub fn quantize(coord: f32, size: u32) -> u32 {
    if size == 0 {
        return 0;
    }
    let q = (coord / per_bin(size)).floor();
    if q.is_nan() || q <= 0.0 {
        0
    } else if q >= (BINS - 1) as f32 {
        BINS - 1
    } else {
        q as u32
    }
}

/// A pixel box `[x1, y1, x2, y2]` in an image of `(width, height)` to its bins.
pub fn quantize_box(box_px: [f32; 4], image_size: (u32, u32)) -> [u32; 4] {
    let (w, h) = image_size;
    [
        quantize(box_px[0], w),
        quantize(box_px[1], h),
        quantize(box_px[2], w),
        quantize(box_px[3], h),
    ]
}

/// Bins `[x1, y1, x2, y2]` to pixel coordinates (bin centres) in an image of `(width, height)`.
pub fn dequantize_box(bins: [u32; 4], image_size: (u32, u32)) -> [f32; 4] {
    let (w, h) = image_size;
    [
        dequantize(bins[0].into(), w),
        dequantize(bins[1].into(), h),
        dequantize(bins[2].into(), w),
        dequantize(bins[3].into(), h),
    ]
}

/// The region input of a region task: `<loc_x1><loc_y1><loc_x2><loc_y2>` (bins above 999 are clamped).
/// Combine with [`quantize_box`] for a pixel box: `region_tokens(quantize_box(px, (w, h)))`.
pub fn region_tokens(bins: [u32; 4]) -> String {
    bins.iter()
        .map(|b| format!("<loc_{}>", (*b).min(BINS - 1)))
        .collect()
}
