//! What the transport keeps for each peer: the bound on calls in flight to
//! it, its lane and its call counter, made once rather than at every call (a call
//! otherwise formatted the peer's name for a metrics label each time).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::stream::NodeId;
use crate::telemetry::TRANSPORT_CALLS;

/// One peer.
pub(super) struct Peer {
    /// Calls in flight to it (`cluster.max_inflight`).
    pub(super) permits: Arc<Semaphore>,
    /// Its lane.
    pub(super) lane: super::lane::Slot,
    ok: metrics::Counter,
    name: String,
}

impl Peer {
    /// Counts a call's outcome.
    pub(super) fn count(&self, outcome: &'static str) {
        match outcome {
            "ok" => self.ok.increment(1),
            _ => metrics::counter!(TRANSPORT_CALLS, "peer" => self.name.clone(), "outcome" => outcome).increment(1),
        }
    }
}

/// Every peer called so far (members that left are forgotten).
pub(super) struct Peers {
    max_inflight: usize,
    map: Mutex<HashMap<NodeId, Arc<Peer>>>,
}

impl Peers {
    pub(super) fn new(max_inflight: usize) -> Self {
        Self { max_inflight, map: Mutex::new(HashMap::new()) }
    }

    pub(super) fn get(&self, peer: &NodeId) -> Arc<Peer> {
        self.map
            .lock()
            .entry(peer.clone())
            .or_insert_with(|| {
                let name = peer.to_string();
                Arc::new(Peer {
                    permits: Arc::new(Semaphore::new(self.max_inflight)),
                    lane: super::lane::Slot::default(),
                    ok: metrics::counter!(TRANSPORT_CALLS, "peer" => name.clone(), "outcome" => "ok"),
                    name,
                })
            })
            .clone()
    }

    /// Forgets the peers `keep` refuses, and closes their lanes.
    pub(super) fn retain(&self, keep: impl Fn(&NodeId) -> bool) {
        let mut gone = Vec::new();
        self.map.lock().retain(|name, peer| {
            let kept = keep(name);
            if !kept {
                gone.push(peer.clone());
            }
            kept
        });
        for peer in gone {
            peer.lane.close_any();
        }
    }
}
