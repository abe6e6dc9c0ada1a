//! Failures inside the server as clients see them: the full error (paths,
//! OS error text, backend messages) goes to the log under a short random
//! id, and the client gets a fixed message with that id, which an operator
//! finds in the log.

use axum::http::StatusCode;

use super::problem::{ApiError, problem};

/// Logs `error` under a new id as a failure to do `what`; returns what a
/// client is told: `{what} (incident {id})`.
pub(crate) fn report(what: &str, error: &dyn std::fmt::Display) -> String {
    let id = format!("{:08x}", rand::random::<u32>());
    tracing::warn!(incident = %id, %error, "{what}");
    format!("{what} (incident {id})")
}

/// A store that failed, as a `503`: retry.
pub(crate) fn store_unavailable(error: crate::archive::StoreError) -> ApiError {
    problem(StatusCode::SERVICE_UNAVAILABLE, format!("{}; retry later", report("the run log store failed", &error)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_gets_the_id_and_not_the_error() {
        let error = std::io::Error::other("/srv/tailrace/data/runs/x: File name too long (os error 36)");
        let told = report("the run log store failed", &error);
        assert!(told.starts_with("the run log store failed (incident ") && told.ends_with(')'), "{told}");
        assert!(!told.contains("/srv") && !told.contains("os error"), "{told}");
    }
}
