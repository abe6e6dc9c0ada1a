//! The ordered shutdown that hands a queue over:
//!
//! 1. close admission (no read, attach, registration or handshake starts)
//!    and stop the pump timer;
//! 2. wait for in-flight work: the pump (receiver init and read), pub-sub
//!    lookups, handshakes, deliveries and dead letters, with no new retry;
//!    meanwhile deliver what the cache already holds (the drain), so that a
//!    graceful move delivers nothing twice. A delivery that fails now is
//!    left, unacked, for the next owner;
//! 3. ack what every cursor passed and record the final delivery progress
//!    (kept unchanged if a registration or handshake never resolved);
//! 4. flush the checkpoint and shut the receiver down;
//! 5. answer, and stop. Only then may the queue be released to a new owner.

use std::time::Duration;

use ractor::RpcReplyPort;
use tokio::time::Instant;

use super::state::{Agent, ShutdownState};

impl Agent {
    pub(crate) fn begin_shutdown(&mut self, reply: Option<RpcReplyPort<()>>) {
        match &mut self.shutdown {
            Some(state) => state.waiters.extend(reply),
            None => {
                tracing::info!(node = %self.services.node, queue = %self.queue, "ordered shutdown begins");
                self.shutdown = Some(ShutdownState { waiters: reply.into_iter().collect(), done: false });
                self.stop_retries.cancel();
            }
        }
    }

    /// Finishes the shutdown once nothing is in flight (called after every
    /// message).
    pub(crate) async fn finish_shutdown_if_idle(&mut self) {
        let Some(state) = &mut self.shutdown else {
            return;
        };
        if state.done || self.pump.in_flight || self.work > 0 {
            return;
        }
        state.done = true;
        let waiters = std::mem::take(&mut state.waiters);
        let unresolved = self
            .streams
            .values()
            .any(|e| !e.registered || e.subs.values().any(|s| s.cursor.is_none() || s.handshaking));
        let mut purged = self.cache.purge();
        purged.acked.append(&mut self.redelivered);
        self.status.acked += purged.acked.len() as u64;
        let progress = self.cache.progress();
        let timeout = self.services.options.init_timeout;
        if let Some(mut io) = self.io.take() {
            if !purged.acked.is_empty()
                && let Err(error) = io.receiver.delivered(&purged.acked).await
            {
                tracing::warn!(queue = %self.queue, %error, "final ack failed; the next owner may redeliver");
            }
            if !purged.failed.is_empty()
                && let Err(error) = io.receiver.failed(&purged.failed).await
            {
                tracing::warn!(queue = %self.queue, %error, "reporting failed containers failed");
            }
            if !unresolved
                && let Some(progress) = progress
                && let Err(error) = io.checkpoint.update(progress, Instant::now()).await
            {
                tracing::warn!(queue = %self.queue, %error, "final checkpoint write failed; flushing");
            }
            match tokio::time::timeout(timeout, io.checkpoint.flush()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::error!(queue = %self.queue, %error, "checkpoint flush failed; the next owner replays more")
                }
                Err(_) => {
                    tracing::error!(queue = %self.queue, ?timeout, "checkpoint flush timed out")
                }
            }
            self.status.checkpoint = io.checkpoint.latest().map(|t| t.to_string());
            match tokio::time::timeout(timeout + Duration::from_millis(100), io.receiver.shutdown(timeout)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(queue = %self.queue, %error, "receiver shutdown failed")
                }
                Err(_) => {
                    tracing::warn!(queue = %self.queue, ?timeout, "receiver shutdown timed out")
                }
            }
        }
        tracing::info!(node = %self.services.node, queue = %self.queue, checkpoint = ?self.status.checkpoint, unresolved, "ordered shutdown complete; queue released");
        for waiter in waiters {
            let _ = waiter.send(());
        }
        self.myself.stop(Some(HANDED_OVER.into()));
    }
}

/// The stop reason of an agent that finished its ordered shutdown.
pub(crate) const HANDED_OVER: &str = "handed over";
