//! Errors in the OpenAI error shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP status
//! the OpenAI API uses for the same failure (400 validation, 401 key, 404 route, 413 body, 429 queue or
//! queued images, 503 loading / shutting down / out of memory, 500 engine failure). Every 429 and 503
//! carries `Retry-After`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use florence2_wasm::Error as LibError;

/// One failed request: status, OpenAI `type` and `code`, the offending parameter and a message. Messages
/// never echo more than a short escaped excerpt of the input (see [`excerpt`]).
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<String>,
    pub message: String,
}

/// A short, escaped, quoted excerpt of untrusted text: the library's rule for prompt errors (at most
/// [`florence2_wasm::processor::prompt::ECHO_CHARS`] characters), used for every echoed input.
pub use florence2_wasm::processor::prompt::echo as excerpt;

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            kind,
            code,
            param: None,
            message,
        }
    }

    /// 400: a request field is missing, has the wrong type or fails validation.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_value",
                message.into(),
            )
        }
    }

    /// 400 with a specific `code`.
    pub fn invalid_code(param: &str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            ..ApiError::invalid(param, message)
        }
    }

    /// 400: the body is not a JSON object.
    pub fn bad_json(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_json",
            message.into(),
        )
    }

    pub fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "missing or incorrect API key: send the header 'Authorization: Bearer <key>'".into(),
        )
    }

    pub fn body_too_large(limit: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    }

    pub fn queue_full(capacity: usize) -> Self {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queue_full",
            format!(
                "the server is busy: {capacity} requests are already queued or running; retry later"
            ),
        )
    }

    /// 429: the decoded images of admitted requests would exceed `--max-queued-image-bytes`.
    pub fn queued_images_full(limit: u64) -> Self {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queued_images_full",
            format!(
                "the server is busy: the images of queued requests would exceed {limit} bytes; retry later"
            ),
        )
    }

    /// 503: the GPU ran out of memory for this request; the server goes on (what the request
    /// allocated is freed) and a retry may fit once other requests are done.
    pub fn out_of_memory(why: &str) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "out_of_memory",
            format!("the server ran out of memory for this request ({why}); retry later"),
        )
    }

    pub fn loading() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "model_loading",
            "the model is still loading; retry when GET /health answers 200".into(),
        )
    }

    /// 503: the model cannot serve anymore (the GPU device was lost).
    pub fn unavailable(why: &str) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "model_unavailable",
            format!("the model is unavailable ({why}); restart the server"),
        )
    }

    pub fn shutting_down() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "shutting_down",
            "the server is shutting down".into(),
        )
    }

    pub fn not_found(path: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            format!("no route {}", excerpt(path)),
        )
    }

    /// 404: a `model` the server does not serve (OpenAI's `model_not_found`).
    pub fn model_not_found(name: &str, served: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!(
                    "the model {} does not exist here; this server serves {}",
                    excerpt(name),
                    excerpt(served)
                ),
            )
        }
    }

    pub fn method_not_allowed() -> Self {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "method not allowed on this route".into(),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            message.into(),
        )
    }

    /// A library error from the engine: the client's fault (400) for prompt, image and input errors,
    /// 503 for a cancelled run (shutdown) and for GPU memory exhaustion, 500 for everything else (GPU,
    /// model).
    pub fn from_engine(e: &LibError) -> Self {
        match e {
            LibError::Prompt(_) => {
                ApiError::invalid_code("messages", "invalid_prompt", e.to_string())
            }
            LibError::Image(_) | LibError::ImageTooLarge { .. } => {
                ApiError::invalid_code("messages", "invalid_image", e.to_string())
            }
            LibError::InvalidInput(_) => ApiError::invalid("messages", e.to_string()),
            LibError::Cancelled | LibError::Aborted(_) => ApiError::shutting_down(),
            LibError::OutOfMemory(why) => ApiError::out_of_memory(why),
            _ => ApiError::internal(format!("{}: {e}", e.name())),
        }
    }

    /// The JSON body `{"error": {...}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if self.status == StatusCode::TOO_MANY_REQUESTS
            || self.status == StatusCode::SERVICE_UNAVAILABLE
        {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        resp
    }
}
