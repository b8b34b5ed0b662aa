//! The chat-completions request: parsing and validation of the OpenAI shape, before anything is queued.
//!
//! A request is a JSON object with `messages` (the task prompt is the text of the last `user` message; the
//! image is the one `image_url` part among all messages), optional `model`, `max_tokens` (or
//! `max_completion_tokens`), `n` (1 only), `stream`, `stream_options.include_usage` and the extension
//! `num_beams` and `florence2.tiles` (`tiles.rs`). Sampling parameters (`temperature`, `top_p`, ...) are accepted and ignored: Florence-2
//! decodes deterministically (greedy or beam search). Every failure is a 400 naming the parameter, but
//! for a `model` the server does not serve: a 404 `model_not_found` (see [`Served::serves`]).
//!
//! A prompt that starts with no task marker (a generic client's plain question, or no text at all) runs
//! `--default-task` (default `<MORE_DETAILED_CAPTION>`): with the text as its input when that task takes
//! text, else without it. The answer says so (`florence2_result.default_task`).
//!
//! Images are `data:image/(png|jpeg|webp|gif|bmp);base64,...` URLs. The declared media type,
//! the encoded size (computed from the base64 length, before decoding it) and the decoded byte count are
//! checked here; the pixel count is checked from the image header before the pixels are decoded
//! (`decode_image` with [`ImageLimits`]). Remote `http(s)` URLs are refused unless the server runs with
//! `--allow-remote-images` (then they are fetched after admission, see `remote.rs`); `file:` and every
//! other scheme are always refused.

use base64::Engine as _;
use serde_json::Value;

use florence2_wasm::model::generate::MAX_BEAMS;
use florence2_wasm::processor::custom_tasks::{AnyTaskPrompt, CustomTasks};
use florence2_wasm::processor::prompt::{InputKind, Task};

use florence2_wasm::pipeline::tiles::Tiles;

use super::error::{excerpt, ApiError};
use super::media::{image_kind, media_kind, remote_scheme};
use super::tiles::parse_tiles;

/// Limits applied to every request.
#[derive(Clone, Copy, Debug)]
pub struct RequestLimits {
    /// Largest decoded image, in bytes.
    pub max_image_bytes: usize,
    /// Largest effective `max_tokens` (the model's decoder positions minus the start token).
    pub max_new_tokens: usize,
    /// `--allow-remote-images`: accept `http(s)` image URLs (fetched later, off the GPU worker).
    pub allow_remote_images: bool,
}

/// Where the request's image comes from.
#[derive(Debug)]
pub enum ImageSource {
    /// The encoded bytes of a data URL (PNG or JPEG, already checked).
    Inline(Vec<u8>),
    /// An `http(s)` URL to fetch (only with `--allow-remote-images`); `param` names it in errors.
    Remote { param: String, url: String },
}

/// What the server serves: the model id clients name, and the task a plain-text prompt runs.
#[derive(Clone, Debug)]
pub struct Served {
    pub model_id: String,
    /// A built-in task without its input (`--default-task`).
    pub default_task: Task,
}

impl Served {
    /// Whether `name` names the served model: its id, or for a hub id `org/name` also `name`, compared
    /// ASCII-case-insensitively (hub ids are case-insensitive).
    pub fn serves(&self, name: &str) -> bool {
        let id = self.model_id.as_str();
        let short = id.rsplit('/').next().unwrap_or(id);
        name.eq_ignore_ascii_case(id) || name.eq_ignore_ascii_case(short)
    }
}

/// `--default-task`: a built-in task taken as every `--task` is (`super::super::task_arg`: a name in
/// any case or a marker), without its input.
pub fn parse_default_task(s: &str) -> Result<Task, String> {
    let marker = crate::cli::task_arg(s)?;
    Task::from_marker(marker.trim()).ok_or_else(|| {
        format!(
            "takes a built-in task without its input; valid markers: {}",
            Task::valid_markers()
        )
    })
}

/// A prompt without a task marker ran the default task: which, and whether the text was its input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultTask {
    pub marker: &'static str,
    pub text_used: bool,
}

/// A validated chat-completions request. `I` is its image: as sent ([`ImageSource`]) while it is
/// parsed and admitted, the decoded pixels once it is queued for the worker.
#[derive(Debug)]
pub struct ChatRequest<I = ImageSource> {
    /// A built-in task or one of the model's own.
    pub prompt: AnyTaskPrompt,
    /// The image (PNG or JPEG bytes, or a URL to fetch); pixel limits are checked when it is decoded.
    pub image: I,
    pub max_tokens: Option<usize>,
    pub num_beams: Option<usize>,
    /// The extension `florence2.tiles` (off when absent).
    pub tiles: Tiles,
    pub stream: bool,
    pub include_usage: bool,
    /// `Some` when the prompt had no task marker and `--default-task` ran.
    pub default_task: Option<DefaultTask>,
}

impl<I> ChatRequest<I> {
    /// The same request with `image` in place of its image, and the image it had.
    pub fn with_image<J>(self, image: J) -> (ChatRequest<J>, I) {
        let request = ChatRequest {
            prompt: self.prompt,
            image,
            max_tokens: self.max_tokens,
            num_beams: self.num_beams,
            tiles: self.tiles,
            stream: self.stream,
            include_usage: self.include_usage,
            default_task: self.default_task,
        };
        (request, self.image)
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An optional positive integer field (`null` = absent).
fn opt_count(body: &Value, key: &str, max: usize) -> Result<Option<usize>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let n = v.as_u64().ok_or_else(|| {
                ApiError::invalid(
                    key,
                    format!("{key} must be a positive integer, got {}", type_name_or(v)),
                )
            })?;
            if n == 0 {
                return Err(ApiError::invalid(key, format!("{key} must be at least 1")));
            }
            if n > max as u64 {
                return Err(ApiError::invalid(
                    key,
                    format!("{key} is {n}; this model accepts at most {max}"),
                ));
            }
            Ok(Some(n as usize))
        }
    }
}

/// `a number 1.5`, `a string "x"`, ... for error messages (bounded).
fn type_name_or(v: &Value) -> String {
    match v {
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {}", excerpt(s)),
        other => type_name(other).to_string(),
    }
}

fn opt_bool(v: Option<&Value>, key: &str) -> Result<bool, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::invalid(
            key,
            format!("{key} must be a boolean, got {}", type_name(other)),
        )),
    }
}

/// Features a client might rely on that this model cannot honour are refused rather than silently
/// ignored: structured output formats, tool calling, log-probabilities.
fn refuse_unsupported(body: &Value) -> Result<(), ApiError> {
    let unsupported = |param: &str, what: &str| {
        Err(ApiError::invalid_code(
            param,
            "unsupported_parameter",
            format!("{what} is not supported by Florence-2 (it answers a task prompt with text)"),
        ))
    };
    match body.get("response_format") {
        None | Some(Value::Null) => {}
        Some(v) if v.get("type").and_then(Value::as_str) == Some("text") => {}
        Some(_) => return unsupported("response_format", "response_format other than text"),
    }
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(t)) if t.is_empty() => {}
        Some(_) => return unsupported("tools", "tool calling"),
    }
    if body.get("logprobs").and_then(Value::as_bool) == Some(true) {
        return unsupported("logprobs", "logprobs");
    }
    Ok(())
}

/// Parse and validate a request body (already size-checked); the prompt is a built-in task or one of
/// `tasks` (the model's own markers); `served` names the model and the default task.
pub fn parse_chat_request(
    bytes: &[u8],
    limits: &RequestLimits,
    tasks: &CustomTasks,
    served: &Served,
) -> Result<ChatRequest, ApiError> {
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_json(format!("the request body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad_json(format!(
            "the request body must be a JSON object, got {}",
            type_name(&body)
        )));
    }
    let opts = parse_options(&body, limits, served)?;
    let mut prompt_text: Option<String> = None;
    let mut images: Vec<(String, &str)> = Vec::new();
    for (i, msg) in messages_of(&body)?.iter().enumerate() {
        let (role, text) = parse_message(i, msg, &mut images)?;
        if role == "user" {
            prompt_text = Some(text);
        }
    }
    let prompt_text = prompt_text.ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "no user message: the task prompt (e.g. <OD>) is the text of the last user message",
        )
    })?;
    let (prompt_text, default_task) = with_default_task(prompt_text, served.default_task);
    let prompt = tasks
        .parse(&prompt_text)
        .map_err(|e| ApiError::invalid_code("messages", "invalid_prompt", e.to_string()))?;
    let (param, url) = one_image(&images)?;
    let tiles = parse_tiles(&body, &prompt)?;
    Ok(ChatRequest {
        tiles,
        prompt,
        image: image_source(param, url, limits)?,
        max_tokens: opts.max_tokens,
        num_beams: opts.num_beams,
        stream: opts.stream,
        include_usage: opts.include_usage,
        default_task,
    })
}

/// A prompt that starts with a task marker as it is; any other (plain text, or none) as `task`'s
/// prompt, with the text as its input when `task` takes text.
fn with_default_task(text: String, task: Task) -> (String, Option<DefaultTask>) {
    let trimmed = text.trim();
    if trimmed.starts_with('<') {
        return (text, None);
    }
    let text_used = task.input_kind() == InputKind::Text && !trimmed.is_empty();
    let prompt = match text_used {
        true => format!("{}{trimmed}", task.marker()),
        false => task.marker().to_string(),
    };
    let marker = task.marker();
    (prompt, Some(DefaultTask { marker, text_used }))
}

/// The request's scalar options.
struct Options {
    max_tokens: Option<usize>,
    num_beams: Option<usize>,
    stream: bool,
    include_usage: bool,
}

/// `model`, `n`, `max_(completion_)tokens`, `num_beams`, `stream`, `stream_options`; unsupported
/// parameters are refused by name.
fn parse_options(
    body: &Value,
    limits: &RequestLimits,
    served: &Served,
) -> Result<Options, ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if served.serves(m) => {}
        Some(Value::String(m)) => return Err(ApiError::model_not_found(m, &served.model_id)),
        Some(m) => {
            return Err(ApiError::invalid(
                "model",
                format!("model must be a string, got {}", type_name(m)),
            ))
        }
    }
    match body.get("n") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(v) => {
            return Err(ApiError::invalid(
                "n",
                format!(
                    "n must be 1 (one answer per request), got {}",
                    type_name_or(v)
                ),
            ))
        }
    }
    // Bounded by the model's positions: a larger value (1024, the model card's default, on a model with
    // 1024 positions) is clamped, not refused; generation could not go further anyway.
    let max_tokens = match opt_count(body, "max_completion_tokens", usize::MAX)? {
        Some(n) => Some(n),
        None => opt_count(body, "max_tokens", usize::MAX)?,
    }
    .map(|n| n.min(limits.max_new_tokens));
    let num_beams = opt_count(body, "num_beams", MAX_BEAMS)?;
    let stream = opt_bool(body.get("stream"), "stream")?;
    refuse_unsupported(body)?;
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => opt_bool(o.get("include_usage"), "stream_options.include_usage")?,
        Some(other) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("stream_options must be an object, got {}", type_name(other)),
            ))
        }
    };
    Ok(Options {
        max_tokens,
        num_beams,
        stream,
        include_usage,
    })
}

/// The non-empty `messages` array.
fn messages_of(body: &Value) -> Result<&Vec<Value>, ApiError> {
    match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => Ok(m),
        Some(Value::Array(_)) => Err(ApiError::invalid("messages", "messages must not be empty")),
        Some(other) => Err(ApiError::invalid(
            "messages",
            format!("messages must be an array, got {}", type_name(other)),
        )),
        None => Err(ApiError::invalid("messages", "messages is required")),
    }
}

/// Message `i`: its role and its text (the text parts concatenated); its image URLs go to `images`
/// with the parameter that names them.
fn parse_message<'a>(
    i: usize,
    msg: &'a Value,
    images: &mut Vec<(String, &'a str)>,
) -> Result<(&'a str, String), ApiError> {
    let param = format!("messages[{i}]");
    let Some(obj) = msg.as_object() else {
        return Err(ApiError::invalid(
            &param,
            format!("{param} must be an object, got {}", type_name(msg)),
        ));
    };
    let role = match obj.get("role") {
        Some(Value::String(r)) => r.as_str(),
        _ => {
            return Err(ApiError::invalid(
                &format!("{param}.role"),
                format!("{param}.role must be a string"),
            ))
        }
    };
    if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
        return Err(ApiError::invalid(
            &format!("{param}.role"),
            format!(
                "{param}.role {} is not one of system, developer, user, assistant, tool",
                excerpt(role)
            ),
        ));
    }
    let mut text = String::new();
    match obj.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => text.push_str(s),
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                parse_part(&format!("{param}.content[{j}]"), part, &mut text, images)?;
            }
        }
        Some(other) => {
            return Err(ApiError::invalid(
                &format!("{param}.content"),
                format!(
                    "{param}.content must be a string or an array of parts, got {}",
                    type_name(other)
                ),
            ))
        }
    }
    Ok((role, text))
}

/// One content part (`pparam` names it): text is appended to `text`, an image URL to `images`.
fn parse_part<'a>(
    pparam: &str,
    part: &'a Value,
    text: &mut String,
    images: &mut Vec<(String, &'a str)>,
) -> Result<(), ApiError> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => match part.get("text") {
            Some(Value::String(s)) => text.push_str(s),
            _ => {
                return Err(ApiError::invalid(
                    &format!("{pparam}.text"),
                    format!("{pparam}.text must be a string"),
                ))
            }
        },
        "image_url" => {
            let url = match part.get("image_url") {
                Some(Value::String(u)) => u.as_str(),
                Some(Value::Object(o)) => match o.get("url") {
                    Some(Value::String(u)) => u.as_str(),
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{pparam}.image_url.url"),
                            format!("{pparam}.image_url.url must be a string"),
                        ))
                    }
                },
                _ => {
                    return Err(ApiError::invalid(
                        &format!("{pparam}.image_url"),
                        format!("{pparam}.image_url must be an object with a url"),
                    ))
                }
            };
            images.push((format!("{pparam}.image_url.url"), url));
        }
        other => {
            return Err(ApiError::invalid_code(
                &format!("{pparam}.type"),
                "unsupported_content",
                format!(
                    "{pparam}.type {} is not supported (text and image_url are)",
                    excerpt(other)
                ),
            ))
        }
    }
    Ok(())
}

/// Exactly one image among all messages.
fn one_image<'i, 'a>(images: &'i [(String, &'a str)]) -> Result<&'i (String, &'a str), ApiError> {
    match images {
        [] => Err(ApiError::invalid_code(
            "messages",
            "image_required",
            "no image: send one content part {\"type\": \"image_url\", \"image_url\": {\"url\": \
                 \"data:image/png;base64,...\"}}",
        )),
        [one] => Ok(one),
        more => Err(ApiError::invalid_code(
            "messages",
            "too_many_images",
            format!(
                "{} images were sent; Florence-2 takes exactly one per request",
                more.len()
            ),
        )),
    }
}

/// The image URL as a source: a remote URL to fetch later (with `--allow-remote-images`), else a data
/// URL decoded and checked now.
fn image_source(param: &str, url: &str, limits: &RequestLimits) -> Result<ImageSource, ApiError> {
    match remote_scheme(url) {
        Some(_) if limits.allow_remote_images => {
            if url.len() > MAX_URL_CHARS {
                return Err(ApiError::invalid_code(
                    param,
                    "invalid_image_url",
                    format!(
                        "the image URL is {} characters long; at most {MAX_URL_CHARS} are accepted",
                        url.len()
                    ),
                ));
            }
            Ok(ImageSource::Remote {
                param: param.to_string(),
                url: url.to_string(),
            })
        }
        _ => Ok(ImageSource::Inline(decode_data_url(
            param,
            url,
            limits.max_image_bytes,
        )?)),
    }
}

/// The longest remote image URL accepted.
const MAX_URL_CHARS: usize = 8192;

/// The bytes of a `data:image/(png|jpeg);base64,...` URL, size-checked before and after decoding.
fn decode_data_url(param: &str, url: &str, max_bytes: usize) -> Result<Vec<u8>, ApiError> {
    let (media, payload) = data_url_parts(param, url)?;
    let bytes = decode_base64_bounded(param, payload, max_bytes)?;
    check_image_bytes(param, &media, &bytes)?;
    Ok(bytes)
}

/// The media type (lower case, checked) and the base64 payload of a data URL.
fn data_url_parts<'u>(param: &str, url: &'u str) -> Result<(String, &'u str), ApiError> {
    let scheme_end = url.find(':').unwrap_or(0);
    let scheme = url[..scheme_end].to_ascii_lowercase();
    match scheme.as_str() {
        "data" => {}
        "http" | "https" => {
            return Err(ApiError::invalid_code(
                param,
                "remote_image_refused",
                "remote image URLs are not fetched by this server (it runs without \
                 --allow-remote-images); send the image inline as a data:image/png;base64,... or \
                 data:image/jpeg;base64,... URL",
            ))
        }
        _ => {
            return Err(ApiError::invalid_code(
                param,
                "invalid_image_url",
                format!(
                "the image URL must be a data:image/png;base64,... or data:image/jpeg;base64,... \
                     URL; got {}",
                excerpt(url)
            ),
            ))
        }
    }
    let rest = &url[scheme_end + 1..];
    let Some((meta, payload)) = rest.split_once(',') else {
        return Err(ApiError::invalid_code(
            param,
            "invalid_image_url",
            "the data URL has no ',' before its payload",
        ));
    };
    let mut fields = meta.split(';').map(|f| f.trim().to_ascii_lowercase());
    let media = fields.next().unwrap_or_default();
    let is_base64 = fields.any(|f| f == "base64");
    if media_kind(&media).is_none() {
        return Err(ApiError::invalid_code(
            param,
            "invalid_image_type",
            format!(
                "image type {} is not supported (image/png, image/jpeg, image/webp, image/gif and \
                 image/bmp are)",
                excerpt(&media)
            ),
        ));
    }
    if !is_base64 {
        return Err(ApiError::invalid_code(
            param,
            "invalid_image_url",
            "the data URL must be base64-encoded (data:image/png;base64,...)",
        ));
    }
    Ok((media, payload))
}

/// The base64 `payload` decoded, its size checked against `max_bytes` from its length before decoding.
fn decode_base64_bounded(
    param: &str,
    payload: &str,
    max_bytes: usize,
) -> Result<Vec<u8>, ApiError> {
    // Some encoders wrap base64 in lines (MIME style): whitespace is dropped (the copy is bounded by the
    // body limit).
    let unwrapped: String;
    let payload = if payload.bytes().any(|b| b.is_ascii_whitespace()) {
        unwrapped = payload
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        unwrapped.as_str()
    } else {
        payload
    };
    let payload = payload.trim_end_matches('=');
    // Decoded size from the length alone, before decoding anything.
    let decoded_len = payload.len() / 4 * 3 + (payload.len() % 4).saturating_sub(1);
    if decoded_len > max_bytes {
        return Err(ApiError::invalid_code(
            param,
            "image_too_large",
            format!("the image is {decoded_len} bytes; at most {max_bytes} bytes are accepted"),
        ));
    }
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(payload)
        .map_err(|e| {
            ApiError::invalid_code(
                param,
                "invalid_image_url",
                format!("the data URL payload is not valid base64: {e}"),
            )
        })?;
    if bytes.is_empty() {
        return Err(ApiError::invalid_code(
            param,
            "invalid_image",
            "the image is empty",
        ));
    }
    Ok(bytes)
}

/// The bytes are a non-empty image of the declared media type.
fn check_image_bytes(param: &str, media: &str, bytes: &[u8]) -> Result<(), ApiError> {
    let Some(kind) = image_kind(bytes) else {
        return Err(ApiError::invalid_code(
            param,
            "invalid_image",
            "the image bytes are not PNG, JPEG, WebP, GIF or BMP",
        ));
    };
    if media_kind(media) != Some(kind) {
        return Err(ApiError::invalid_code(
            param,
            "invalid_image_type",
            format!(
                "the data URL says {media} but the bytes are {}",
                kind.to_ascii_uppercase()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits {
            max_image_bytes: 100,
            max_new_tokens: 127,
            allow_remote_images: false,
        }
    }

    fn png_url() -> String {
        let png = b"\x89PNG\r\n\x1a\n0123456789";
        format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(png)
        )
    }

    fn served() -> Served {
        Served {
            model_id: "org/m".into(),
            default_task: Task::MoreDetailedCaption,
        }
    }

    fn body(text: &str, url: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": url}}
            ]}]
        }))
        .unwrap()
    }

    fn body_with(v: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    /// `parse_chat_request` with the default limits, no custom tasks and the served id.
    fn parse_with_defaults(bytes: &[u8]) -> Result<ChatRequest, ApiError> {
        parse_chat_request(bytes, &limits(), &CustomTasks::new(), &served())
    }

    #[test]
    fn a_plain_text_prompt_runs_the_default_task() {
        let parse = |text: &str, task: Task| {
            let s = Served {
                default_task: task,
                ..served()
            };
            parse_chat_request(&body(text, &png_url()), &limits(), &CustomTasks::new(), &s)
        };
        let r = parse("What is in this picture?", Task::MoreDetailedCaption).unwrap();
        assert_eq!(r.prompt.marker(), "<MORE_DETAILED_CAPTION>");
        let want = DefaultTask {
            marker: "<MORE_DETAILED_CAPTION>",
            text_used: false,
        };
        assert_eq!(r.default_task, Some(want));
        // An image alone (empty text) too.
        let r = parse("", Task::MoreDetailedCaption).unwrap();
        assert_eq!(r.prompt.marker(), "<MORE_DETAILED_CAPTION>");
        // A default task that takes text gets the text as its input.
        let r = parse("  a red car ", Task::OpenVocabularyDetection).unwrap();
        assert_eq!(r.prompt.marker(), "<OPEN_VOCABULARY_DETECTION>");
        assert_eq!(r.prompt.encoder_text(), "Locate a red car in the image.");
        assert!(r.default_task.unwrap().text_used);
        // A marker is never the default task's business.
        let r = parse("<OD>", Task::MoreDetailedCaption).unwrap();
        assert_eq!((r.prompt.marker(), r.default_task), ("<OD>", None));
    }

    #[test]
    fn only_the_served_model_is_accepted() {
        let with_model = |m: serde_json::Value| {
            body_with(serde_json::json!({
                "model": m,
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "<OD>"},
                    {"type": "image_url", "image_url": {"url": png_url()}}
                ]}]
            }))
        };
        let parse =
            |m| parse_chat_request(&with_model(m), &limits(), &CustomTasks::new(), &served());
        for ok in ["org/m", "m", "M", "ORG/M"] {
            assert!(parse(serde_json::json!(ok)).is_ok(), "{ok}");
        }
        assert!(parse(serde_json::Value::Null).is_ok());
        for other in ["gpt-4o", "", "org/mm", "other/m"] {
            let e = parse(serde_json::json!(other)).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.code),
                (404, "model_not_found"),
                "{other}"
            );
            assert_eq!(e.param.as_deref(), Some("model"));
            assert_eq!(e.kind, "invalid_request_error");
        }
        let e = parse(serde_json::json!(3)).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (400, "invalid_value"));
    }

    #[test]
    fn parses_a_valid_request() {
        let r = parse_with_defaults(&body("<OD>", &png_url())).unwrap();
        assert_eq!(r.prompt.marker(), "<OD>");
        assert!(matches!(r.image, ImageSource::Inline(ref b) if b.len() == 18));
        assert!(!r.stream);
    }

    #[test]
    fn image_size_is_checked_from_the_base64_length() {
        // 200 bytes of payload decode to 150 > 100: refused before decoding (the payload is not even base64).
        let url = format!("data:image/png;base64,{}", "!".repeat(200));
        let e = parse_with_defaults(&body("<OD>", &url)).unwrap_err();
        assert_eq!(e.code, "image_too_large", "{}", e.message);
    }

    #[test]
    fn declared_type_must_match_the_bytes() {
        let url = png_url().replace("image/png", "image/jpeg");
        let e = parse_with_defaults(&body("<OD>", &url)).unwrap_err();
        assert_eq!(e.code, "invalid_image_type");
        let url = png_url().replace("image/png", "image/gif");
        let e = parse_with_defaults(&body("<OD>", &url)).unwrap_err();
        assert_eq!(e.code, "invalid_image_type");
    }

    #[test]
    fn wrapped_base64_is_accepted() {
        let url = png_url();
        let (head, payload) = url.split_once(',').unwrap();
        let wrapped = format!("{head},{}\n{}", &payload[..8], &payload[8..]);
        let r = parse_with_defaults(&body("<OD>", &wrapped)).unwrap();
        assert!(matches!(r.image, ImageSource::Inline(ref b) if b.len() == 18));
    }

    #[test]
    fn unsupported_features_are_refused() {
        for (k, v) in [
            (
                "response_format",
                serde_json::json!({"type": "json_object"}),
            ),
            ("tools", serde_json::json!([{"type": "function"}])),
            ("logprobs", serde_json::json!(true)),
        ] {
            let mut b: Value = serde_json::from_slice(&body("<OD>", &png_url())).unwrap();
            b[k] = v;
            let e = parse_with_defaults(&serde_json::to_vec(&b).unwrap()).unwrap_err();
            assert_eq!(e.code, "unsupported_parameter", "{k}");
            assert_eq!(e.param.as_deref(), Some(k));
        }
        let mut b: Value = serde_json::from_slice(&body("<OD>", &png_url())).unwrap();
        b["response_format"] = serde_json::json!({"type": "text"});
        b["tools"] = serde_json::json!([]);
        b["logprobs"] = serde_json::json!(false);
        b["temperature"] = serde_json::json!(0.7);
        assert!(parse_with_defaults(&serde_json::to_vec(&b).unwrap()).is_ok());
    }

    #[test]
    fn remote_and_file_urls_are_refused() {
        for url in ["http://x/a.png", "https://x/a.png"] {
            let e = parse_with_defaults(&body("<OD>", url)).unwrap_err();
            assert_eq!(e.code, "remote_image_refused");
        }
        let e = parse_with_defaults(&body("<OD>", "file:///etc/passwd")).unwrap_err();
        assert_eq!(e.code, "invalid_image_url");
        let allow = RequestLimits {
            allow_remote_images: true,
            ..limits()
        };
        let parse_allowing_remote = |url: &str| {
            parse_chat_request(&body("<OD>", url), &allow, &CustomTasks::new(), &served())
        };
        let r = parse_allowing_remote("https://x/a.png").unwrap();
        assert!(matches!(r.image, ImageSource::Remote { ref url, .. } if url == "https://x/a.png"));
        let e = parse_allowing_remote("file:///etc/passwd").unwrap_err();
        assert_eq!(e.code, "invalid_image_url");
    }

    #[test]
    fn prompt_errors_are_the_library_rules() {
        let e = parse_with_defaults(&body("<NOPE>", &png_url())).unwrap_err();
        assert_eq!(e.code, "invalid_prompt");
        assert!(e.message.contains("<CAPTION>"), "{}", e.message);
        let e = parse_with_defaults(&body(
            "<REGION_TO_CATEGORY><loc_1><loc_2><loc_3>",
            &png_url(),
        ))
        .unwrap_err();
        assert_eq!(e.code, "invalid_prompt");
    }

    #[test]
    fn a_models_own_markers_are_accepted() {
        let tasks =
            CustomTasks::from_processor_config(br#"{"tasks": ["<GENERATE_TAGS>"]}"#).unwrap();
        let r = parse_chat_request(
            &body("<GENERATE_TAGS>", &png_url()),
            &limits(),
            &tasks,
            &served(),
        )
        .unwrap();
        assert_eq!(r.prompt.marker(), "<GENERATE_TAGS>");
        let e = parse_with_defaults(&body("<GENERATE_TAGS>", &png_url())).unwrap_err();
        assert_eq!(e.code, "invalid_prompt");
        let e = parse_chat_request(&body("<OTHER>", &png_url()), &limits(), &tasks, &served())
            .unwrap_err();
        assert!(e.message.contains("<GENERATE_TAGS>"), "{}", e.message);
    }

    #[test]
    fn every_accepted_format_needs_its_media_type() {
        let webp = b"RIFF\x10\0\0\0WEBPVP8L0123";
        let gif = b"GIF89a0123";
        let bmp = b"BM0123";
        for (media, bytes) in [
            ("image/webp", &webp[..]),
            ("image/gif", gif),
            ("image/bmp", bmp),
        ] {
            let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
            let url = format!("data:{media};base64,{b64}");
            let r = parse_with_defaults(&body("<OD>", &url)).unwrap();
            assert!(
                matches!(r.image, ImageSource::Inline(ref b) if b == bytes),
                "{media}"
            );
            let url = format!("data:image/png;base64,{b64}");
            let e = parse_with_defaults(&body("<OD>", &url)).unwrap_err();
            assert_eq!(e.code, "invalid_image_type", "{media}");
        }
    }
}
