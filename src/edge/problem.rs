//! What every refusal of the edge looks like, on either HTTP path: a
//! status and a JSON body `{"code": …, "message": …}` (a `401` also
//! carries `WWW-Authenticate: Bearer`).

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::archive::RunKey;

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
