//! The body of an ingest request (`POST …/lines`, `PUT …/status`): read
//! under a deadline, within a server-wide budget of body bytes held in
//! memory, into one buffer the handler owns.
//!
//! - Longer than `edge.max_body_bytes` (declared or received): `413`.
//! - Not complete within `edge.body_timeout_seconds` of the handler
//!   starting to read it: `408`.
//! - Past `edge.max_total_body_bytes` held by all requests together:
//!   `503` with `Retry-After`, at once (nothing waits for room). A body
//!   with a `Content-Length` reserves it before anything is read; a chunked
//!   body reserves as its bytes arrive. The reservation is held until the
//!   handler is done with the body.
//!
//! Every refusal is the JSON `{"code", "message"}` of the other ingest
//! errors, and closes the connection (the rest of the body is not read).
//!
//! Why by hand rather than `Bytes` / `http_body_util::Limited` +
//! `collect()`: hyper hands a slow body over as one `Bytes` per TCP read,
//! each a slice of the connection's 8 KiB read buffer; collecting them keeps
//! every one of those buffers alive, so a client sending one byte per
//! second pinned 3.5–7 KB of server memory per byte it sent (1 000 such
//! connections: 19 MB to 250 MB of RSS in 30 s). Here every frame is copied
//! into one growing buffer and dropped at once, so memory follows what was
//! sent. tower-http's `RequestBodyTimeoutLayer` is an idle timeout (it
//! restarts with each frame), which one byte per second never trips; the
//! deadline here is for the whole body.

use std::ops::Deref;
use std::sync::Arc;

use axum::body::{Body, HttpBody};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::LogEdge;
use super::problem::problem;
use crate::config::secs;

/// What a client refused for lack of room is told to wait, in seconds.
const RETRY_AFTER_SECONDS: u32 = 1;

/// The bytes of request bodies held in memory by the whole edge
/// (`edge.max_total_body_bytes`).
pub(crate) struct Budget {
    bytes: Arc<Semaphore>,
}

impl Budget {
    pub(crate) fn new(max_total_bytes: usize) -> Self {
        Self { bytes: Arc::new(Semaphore::new(max_total_bytes.min(Semaphore::MAX_PERMITS))) }
    }

    /// `n` more bytes, now or never.
    fn reserve(&self, n: usize) -> Result<OwnedSemaphorePermit, Refusal> {
        let n = u32::try_from(n).map_err(|_| Refusal::Budget)?;
        self.bytes.clone().try_acquire_many_owned(n).map_err(|_| Refusal::Budget)
    }
}

/// An ingest request's whole body; its bytes count against the budget
/// until it is dropped.
pub(crate) struct IngestBody {
    bytes: Vec<u8>,
    _reserved: OwnedSemaphorePermit,
}

impl Deref for IngestBody {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Why a body was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// Past `edge.max_body_bytes`.
    #[error("the body is larger than {max} bytes (setting edge.max_body_bytes)")]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// Not received within `edge.body_timeout_seconds`.
    #[error("the body was not received within {seconds} s (setting edge.body_timeout_seconds)")]
    Timeout {
        /// The limit.
        seconds: f64,
    },
    /// The edge holds `edge.max_total_body_bytes` of bodies already.
    #[error(
        "the server is holding as many request bodies as it may (setting edge.max_total_body_bytes); retry shortly"
    )]
    Budget,
    /// The connection failed while the body was read.
    #[error("the body could not be read: {0}")]
    Broken(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = match &self {
            Refusal::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Refusal::Budget => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Broken(_) => StatusCode::BAD_REQUEST,
        };
        let mut response = problem(status, self.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        if matches!(self, Refusal::Budget) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

impl FromRequest<Arc<LogEdge>> for IngestBody {
    type Rejection = Refusal;

    async fn from_request(request: Request, edge: &Arc<LogEdge>) -> Result<Self, Refusal> {
        let seconds = edge.options.body_timeout_seconds;
        let deadline = Instant::now() + secs(seconds);
        read(&edge.bodies, request.into_body(), edge.options.max_body_bytes, deadline, seconds).await
    }
}

async fn read(budget: &Budget, body: Body, max: usize, deadline: Instant, seconds: f64) -> Result<IngestBody, Refusal> {
    // hyper's hint is exact when the request has a `Content-Length`.
    let declared = body.size_hint().exact().map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if declared.is_some_and(|n| n > max) {
        return Err(Refusal::TooLarge { max });
    }
    let mut reserved = budget.reserve(declared.unwrap_or(0))?;
    // Grows with what arrives (never sized by what is only declared).
    let mut bytes = Vec::new();
    let mut frames = body.into_data_stream();
    loop {
        let frame = match tokio::time::timeout_at(deadline, frames.next()).await {
            Err(_) => return Err(Refusal::Timeout { seconds }),
            Ok(None) => break,
            Ok(Some(Err(error))) => return Err(Refusal::Broken(error.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        if bytes.len() + frame.len() > max {
            return Err(Refusal::TooLarge { max });
        }
        if declared.is_none() {
            reserved.merge(budget.reserve(frame.len())?);
        }
        bytes.extend_from_slice(&frame);
        // `frame` goes here, and with it hyper's read buffer it pinned.
    }
    Ok(IngestBody { bytes, _reserved: reserved })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(parts: Vec<&'static [u8]>) -> Body {
        let frames = futures::stream::iter(parts.into_iter().map(|p| Ok::<_, std::io::Error>(bytes::Bytes::from(p))));
        Body::from_stream(frames)
    }

    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    #[tokio::test]
    async fn a_chunked_body_reserves_what_arrives_and_gives_it_back() {
        let budget = Budget::new(10);
        let body = read(&budget, chunked(vec![b"abc", b"def"]), 100, later(), 60.0).await.unwrap();
        assert_eq!(&body[..], b"abcdef");
        assert_eq!(budget.bytes.available_permits(), 4, "held while the body lives");
        let refused = read(&budget, chunked(vec![b"12345"]), 100, later(), 60.0).await;
        assert!(matches!(refused, Err(Refusal::Budget)), "past the budget");
        drop(body);
        assert_eq!(budget.bytes.available_permits(), 10);
        let too_large = read(&budget, chunked(vec![b"1234", b"5678"]), 6, later(), 60.0).await;
        assert!(matches!(too_large, Err(Refusal::TooLarge { max: 6 })));
        assert_eq!(budget.bytes.available_permits(), 10, "a refused body gives its bytes back");
    }

    #[tokio::test]
    async fn a_declared_length_is_reserved_before_anything_is_read() {
        let budget = Budget::new(10);
        let held = read(&budget, Body::from("12345678"), 100, later(), 60.0).await.unwrap();
        assert_eq!(budget.bytes.available_permits(), 2);
        assert!(matches!(read(&budget, Body::from("123"), 100, later(), 60.0).await, Err(Refusal::Budget)));
        assert!(matches!(
            read(&budget, Body::from("x".repeat(101)), 100, later(), 60.0).await,
            Err(Refusal::TooLarge { .. })
        ));
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_ends_meets_the_deadline() {
        let budget = Budget::new(10);
        let stalled = Body::from_stream(futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>());
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        assert!(matches!(read(&budget, stalled, 100, deadline, 5.0).await, Err(Refusal::Timeout { .. })));
        assert_eq!(budget.bytes.available_permits(), 10);
    }
}
