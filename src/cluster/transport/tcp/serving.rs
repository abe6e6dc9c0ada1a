//! How a node serves the calls its peers make on their lanes: the handler
//! the node installs once it runs, and the bound on calls served at once
//! (`cluster.max_inflight_calls`, over every connection; more are refused
//! as busy and retried by the caller), so a slow consumer never holds up
//! the others' calls.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Served;
use crate::cluster::wire::{self, Refusal, Reply, Request};

/// Where the node's handler goes once the node runs.
#[derive(Clone, Default)]
pub(super) struct HandlerSlot(Arc<Mutex<Option<Arc<dyn Served>>>>);

impl HandlerSlot {
    pub(super) fn set(&self, handler: Arc<dyn Served>) {
        *self.0.lock() = Some(handler);
    }

    fn get(&self) -> Option<Arc<dyn Served>> {
        self.0.lock().clone()
    }
}

/// How a node serves calls: the handler and the bound on calls served at
/// once.
#[derive(Clone)]
pub(super) struct Serving {
    handler: HandlerSlot,
    limit: Arc<Semaphore>,
    max_inflight: usize,
}

/// A call admitted: it holds one of the node's call slots until answered.
pub(super) struct Admitted {
    handler: Arc<dyn Served>,
    _slot: OwnedSemaphorePermit,
}

impl Serving {
    pub(super) fn new(handler: HandlerSlot, max_inflight: usize) -> Self {
        Self { handler, limit: Arc::new(Semaphore::new(max_inflight)), max_inflight }
    }

    /// Admits a call, or answers it at once (after `prefix`) with a refusal:
    /// the node is not ready yet, or it has its limit of calls in flight.
    pub(super) fn admit(&self, prefix: &[u8]) -> Result<Admitted, Vec<u8>> {
        let Some(handler) = self.handler.get() else {
            return Err(refused(prefix, Refusal::NotReady));
        };
        let Ok(slot) = self.limit.clone().try_acquire_owned() else {
            return Err(refused(prefix, Refusal::Busy(self.max_inflight)));
        };
        Ok(Admitted { handler, _slot: slot })
    }
}

impl Admitted {
    /// The reply's envelope to `request`, after `prefix`.
    pub(super) async fn answer(self, request: &[u8], prefix: &[u8]) -> Vec<u8> {
        let answer = match wire::decode::<Request>(request) {
            Ok(request) => self.handler.serve(request).await,
            Err(refusal) => Reply::Refused { refusal },
        };
        wire::encode_after(prefix, &answer).unwrap_or_else(|e| refused(prefix, Refusal::Unreadable(e)))
    }
}

fn refused(prefix: &[u8], refusal: Refusal) -> Vec<u8> {
    wire::encode_after(prefix, &Reply::Refused { refusal }).unwrap_or_else(|_| prefix.to_vec())
}
