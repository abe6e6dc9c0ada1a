//! Bearer tokens with `read`, `write` and `admin` scopes (`[edge.auth]`).
//! On the log path reads (`GET`) need `read`, everything else `write`;
//! everything under `/api/v1/admin/` needs `admin`. Without tokens the API
//! is open, and [`check_listen`] keeps the edge on loopback. A presented
//! token is compared with every configured one in constant time (their
//! SHA-256 digests, with `subtle`), so how long a refusal takes tells
//! nothing about how much of a token was right, nor its length.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::problem::{ApiError, problem};
use crate::config::{AuthOptions, Scope};

/// The accepted tokens, by their SHA-256 digests.
pub(crate) struct Auth {
    tokens: Vec<([u8; 32], Vec<Scope>)>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Auth {
    pub(crate) fn new(options: &AuthOptions) -> Arc<Self> {
        Arc::new(Self { tokens: options.tokens.iter().map(|t| (digest(&t.token), t.scopes.clone())).collect() })
    }

    /// The scopes of `token`: every configured token is compared, each in
    /// constant time, whichever matches.
    fn scopes_of(&self, token: &str) -> Option<&[Scope]> {
        let presented = digest(token);
        let mut found = None;
        for (known, scopes) in &self.tokens {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(scopes.as_slice());
            }
        }
        found
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
    if options.tokens.iter().any(|t| t.token.trim().chars().count() < 16 || t.token.trim() != t.token) {
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
        match self.scopes_of(token) {
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
#[cfg(feature = "cluster")]
pub(crate) async fn require_admin(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match auth.check_scope(Scope::Admin, authorization) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenEntry;

    fn auth() -> Arc<Auth> {
        let entry = |token: &str, scopes: Vec<Scope>| TokenEntry { token: token.into(), scopes };
        Auth::new(&AuthOptions {
            tokens: vec![
                entry("reader-token-0123456789", vec![Scope::Read]),
                entry("writer-token-0123456789", vec![Scope::Read, Scope::Write]),
            ],
        })
    }

    fn message(refusal: ApiError) -> (StatusCode, String) {
        let response = refusal.into_response();
        let status = response.status();
        let body = futures::executor::block_on(axum::body::to_bytes(response.into_body(), 4096)).unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[test]
    fn the_right_token_passes_with_its_scopes_only() {
        let auth = auth();
        assert!(auth.check(true, Some("Bearer reader-token-0123456789")).is_ok());
        assert!(auth.check(false, Some("bearer writer-token-0123456789")).is_ok());
        let (status, body) = message(auth.check(false, Some("Bearer reader-token-0123456789")).unwrap_err());
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body.contains("this token lacks the `write` scope"), "{body}");
    }

    #[test]
    fn a_wrong_token_of_the_same_length_or_another_length_is_refused() {
        let auth = auth();
        for wrong in [
            "reader-token-0123456788",
            "Reader-token-0123456789",
            "reader-token-012345678",
            "reader-token-01234567890",
            "reader-token-0123456789reader-token-0123456789",
            "x",
        ] {
            let (status, body) = message(auth.check(true, Some(&format!("Bearer {wrong}"))).unwrap_err());
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{wrong}");
            assert!(body.contains("unknown bearer token"), "{wrong}: {body}");
        }
    }
}
