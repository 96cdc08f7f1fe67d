//! Errors as OpenAI clients expect them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::engine::{EngineError, FrontendError};

/// An error answer. `param` names the request field at fault, when there is one.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    /// Seconds after which a retry may succeed (`Retry-After`, with 503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, retry_after: None }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A 400 naming the field at fault.
    pub fn bad_field(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..ApiError::bad_request(message) }
    }

    /// A 503 that tells the client when to come back.
    pub fn unavailable(message: impl Into<String>, retry_after: u32) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// OpenAI's `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => "server_busy",
            s if s.is_server_error() => "internal_server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl From<FrontendError> for ApiError {
    fn from(e: FrontendError) -> Self {
        use crate::sample::SampleError;
        let param = e.field().map(str::to_string);
        // Sampling messages name the CLI flags; over HTTP name the JSON fields.
        let message = match &e {
            FrontendError::Sampling(SampleError::Temperature(t)) => {
                format!("temperature {t} is invalid; use a finite value ≥ 0 (0 = greedy)")
            }
            FrontendError::Sampling(SampleError::TopK) => {
                "top_k 0 is invalid; use at least 1, or -1 to keep every token".to_string()
            }
            FrontendError::Sampling(SampleError::TopP(p)) => {
                format!("top_p {p} is invalid; use a value in (0, 1] (1 keeps every token)")
            }
            other => other.to_string(),
        };
        ApiError { param, ..ApiError::bad_request(message) }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Frontend(e) => e.into(),
            EngineError::Sampling(e) => FrontendError::Sampling(e).into(),
            EngineError::Sched(e) => ApiError::bad_request(e.to_string()),
            EngineError::Config(m) => ApiError::bad_request(m),
            EngineError::Stopped => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the engine has stopped")
            }
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}
