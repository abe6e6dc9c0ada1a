//! Bearer tokens with `read`, `write` and `admin` scopes (`[edge.auth]`).
//! On the log path reads (`GET`) need `read`, everything else `write`;
//! everything under `/api/v1/admin/` needs `admin`. Without tokens the API
//! is open, and [`check_listen`] keeps the edge on loopback.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::{ApiError, problem};
use crate::config::{AuthOptions, Scope};

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
    if options.tokens.iter().any(|t| t.token.trim().len() < 16 || t.token.trim() != t.token) {
        return Err("every [edge.auth] token must be at least 16 characters, without spaces around it".into());
    }
    if options.tokens.iter().any(|t| t.scopes.is_empty()) {
        return Err(
            "every [edge.auth] token needs at least one scope (scopes = [\"read\"], [\"write\"], [\"admin\"] or several)"
                .into()
        );
    }
    Ok(())
}

impl Auth {
    /// Whether a request (a read, or a write) with this `Authorization`
    /// header may go on.
    pub(crate) fn check(&self, read: bool, authorization: Option<&str>) -> Result<(), ApiError> {
        self.check_scope(if read { Scope::Read } else { Scope::Write }, authorization)
    }

    /// Whether a request needing `needed` with this `Authorization` header
    /// may go on.
    pub(crate) fn check_scope(&self, needed: Scope, authorization: Option<&str>) -> Result<(), ApiError> {
        if self.tokens.is_empty() {
            return Ok(());
        }
        let refuse = |status, message: &str| Err(problem(status, message));
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let bearer = authorization
            .and_then(|v| v.trim_start().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let Some(token) = bearer else {
            return refuse(StatusCode::UNAUTHORIZED, "missing bearer token (Authorization: Bearer <token>)");
        };
        match self.tokens.get(token) {
            None => refuse(StatusCode::UNAUTHORIZED, "unknown bearer token"),
            Some(scopes) if !scopes.contains(&needed) => {
                let scope = match needed {
                    Scope::Read => "read",
                    Scope::Write => "write",
                    Scope::Admin => "admin",
                };
                refuse(StatusCode::FORBIDDEN, &format!("this token lacks the `{scope}` scope"))
            }
            Some(_) => Ok(()),
        }
    }
}

pub(crate) async fn require(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match auth.check(read, authorization) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

/// The `admin` scope, for every request (`/api/v1/admin/…`).
pub(crate) async fn require_admin(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match auth.check_scope(Scope::Admin, authorization) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}
