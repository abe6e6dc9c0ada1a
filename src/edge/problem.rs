//! What every refusal of the edge looks like, on either HTTP path: a
//! status and a JSON body `{"code": …, "message": …}` (a `401` also
//! carries `WWW-Authenticate: Bearer`, a `503` `Retry-After`: it is what a
//! backend that is down for now, or a full budget, answers, and clients
//! and proxies retry it).

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::archive::RunKey;

/// What a `503` tells a client to wait before it retries.
pub(crate) const RETRY_AFTER_SECONDS: &str = "1";

/// A clear 4xx/5xx, answered with a JSON body `{"code": …, "message": …}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({ "code": self.status.as_u16(), "message": self.message }));
        if self.status == StatusCode::UNAUTHORIZED {
            return (self.status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response();
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            return (self.status, [(header::RETRY_AFTER, RETRY_AFTER_SECONDS)], body).into_response();
        }
        (self.status, body).into_response()
    }
}

/// A refusal with `status` saying `message`.
pub(crate) fn problem(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError { status, message: message.into() }
}

/// The run named by a request's path, or a `400` saying what is wrong.
pub(crate) fn run_key(fqn: &str, run: &str) -> Result<RunKey, ApiError> {
    RunKey::new(fqn, run).map_err(|e| problem(StatusCode::BAD_REQUEST, e.to_string()))
}
