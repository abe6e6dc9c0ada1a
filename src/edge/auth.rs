//! Bearer tokens with `read` and `write` scopes (`[edge.auth]`). Reads
//! (`GET`) need `read`, everything else `write`. Without tokens the API is
//! open, and [`check_listen`] keeps the edge on loopback.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::settings::{AuthOptions, Scope};

/// The accepted tokens.
pub(crate) struct Auth {
    tokens: HashMap<String, Vec<Scope>>,
}

impl Auth {
    pub(crate) fn new(options: &AuthOptions) -> Arc<Self> {
        Arc::new(Self { tokens: options.tokens.iter().map(|t| (t.token.clone(), t.scopes.clone())).collect() })
    }
}

/// Refuses a non-loopback address when no token is configured.
pub fn check_listen(addr: SocketAddr, options: &AuthOptions) -> Result<(), String> {
    if options.tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(format!(
            "refusing to listen on {addr} without [edge.auth] tokens: anyone could read and write the logs; \
             add tokens or listen on 127.0.0.1"
        ));
    }
    if options.tokens.iter().any(|t| t.token.len() < 16) {
        return Err("every [edge.auth] token must be at least 16 characters".into());
    }
    Ok(())
}

pub(crate) async fn require(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    if auth.tokens.is_empty() {
        return next.run(request).await;
    }
    let needed = if matches!(*request.method(), Method::GET | Method::HEAD) { Scope::Read } else { Scope::Write };
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token else {
        return unauthorized("missing bearer token (Authorization: Bearer <token>)");
    };
    match auth.tokens.get(token) {
        None => unauthorized("unknown bearer token"),
        Some(scopes) if !scopes.contains(&needed) => {
            let scope = if needed == Scope::Read { "read" } else { "write" };
            (StatusCode::FORBIDDEN, format!("this token lacks the `{scope}` scope\n")).into_response()
        }
        Some(_) => next.run(request).await,
    }
}

fn unauthorized(message: &str) -> Response {
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], format!("{message}\n")).into_response()
}
