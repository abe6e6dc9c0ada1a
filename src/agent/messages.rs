//! The agent's messages, and how it sends them: to itself now or later,
//! and as the report of work run on its lane (see `worker.rs`), which it
//! counts until the report comes back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::calls::RetryLimits;
use super::delivery::Delivered;
use super::lookup::{self, Registered};
use super::pump::PumpOutcome;
use super::settings::AgentServices;
use super::status::AgentStatus;
use super::streams::Next;
use super::subscription::{AttachError, Handshaken};
use super::worker;
use crate::pubsub::{Origin, StartPosition, Subscription, SubscriptionId};
use crate::stream::{QueueId, StreamId};
use crate::tasks::{Tasks, poll_now};

/// What [`Outbox::start_step`] needs of the agent.
pub(super) struct StepContext<'a> {
    pub(super) services: &'a AgentServices,
    /// Cancelled at shutdown: lookups and handshakes stop retrying.
    pub(super) stop: &'a Arc<CancellationToken>,
    pub(super) queue: QueueId,
}

/// Messages of the pulling agent (its tests drive an agent through them).
pub(crate) enum AgentMsg {
    /// Attach a subscription (from `subscribe` or a re-attach); answers with
    /// the concrete start position once its cursor is in place.
    Attach {
        /// The stored subscription.
        subscription: Subscription,
        /// Where the answer goes.
        reply: RpcReplyPort<Result<StartPosition, AttachError>>,
    },
    /// Stop serving a subscription; its in-flight handshake and delivery are
    /// revoked.
    Detach {
        /// Its stream.
        stream: StreamId,
        /// The subscription.
        id: SubscriptionId,
        /// Answered once detached.
        reply: RpcReplyPort<()>,
    },
    /// Begin the ordered shutdown; answered when it is complete.
    Shutdown(Option<RpcReplyPort<()>>),
    /// Report status.
    GetStatus(RpcReplyPort<AgentStatus>),
    /// Internal bookkeeping (timers and task completions).
    Internal(Internal),
}

/// An internal message of the agent.
pub(crate) struct Internal(pub(super) InternalMsg);

/// Completions and timers, sent by the agent to itself.
pub(super) enum InternalMsg {
    /// Time to pump.
    Pump,
    /// The receiver's wake completed: the queue may hold something new.
    Woken,
    /// A pump came back.
    PumpDone(Box<PumpOutcome>),
    /// A new stream's subscriptions were looked up.
    Registered(Registered),
    /// A handshake answered.
    HandshakeDone(Handshaken),
    /// A delivery ended.
    Delivered(Delivered),
    /// A dead letter, fault report or notice was sent.
    SideWorkDone,
    /// A catch-up read that failed may be asked again.
    RewindDue { stream: StreamId, id: SubscriptionId, epoch: u64 },
    /// Several completions reported together by the work lane.
    Batch(Vec<InternalMsg>),
    /// Deliveries that finished as they started are still to be settled
    /// (more than one message's share, see `Agent::settle_finished`).
    SettleMore,
}

/// Where the agent's own messages and its waiting work go.
pub(super) struct Outbox {
    myself: ActorRef<AgentMsg>,
    /// Where waiting work goes (see `worker.rs`).
    lane: UnboundedSender<worker::Job<InternalMsg>>,
    /// Lookups, handshakes, deliveries and side work in flight on the lane.
    work: usize,
    /// Cancels the waits on the receiver (its wake, its backend probe)
    /// when the agent's state goes.
    waits: tokio_util::sync::DropGuard,
}

impl Outbox {
    /// Starts the agent's work lane (a task of `tasks`), whose reports come
    /// back to `myself` in batches.
    pub(super) fn start(
        myself: ActorRef<AgentMsg>,
        tasks: &Tasks,
        kill: Arc<CancellationToken>,
        span: tracing::Span,
    ) -> Self {
        let to = myself.clone();
        let report = move |done| to.cast(AgentMsg::Internal(Internal(InternalMsg::Batch(done)))).is_ok();
        let lane = worker::start(tasks, report, kill, span);
        Self { myself, lane, work: 0, waits: CancellationToken::new().drop_guard() }
    }

    /// The agent itself.
    pub(super) fn myself(&self) -> &ActorRef<AgentMsg> {
        &self.myself
    }

    /// A piece of work on the lane reported back.
    pub(super) fn reported(&mut self) {
        self.work -= 1;
    }

    /// Work sent to the lane and not reported back yet.
    pub(super) fn in_flight(&self) -> usize {
        self.work
    }

    /// Runs `work` on the agent's lane, counted as in-flight work; its
    /// result comes back as a message. A panic in it is reported through
    /// `on_panic`; a node crash (the kill switch) drops it silently.
    pub(super) fn spawn_work(
        &mut self,
        work: impl Future<Output = InternalMsg> + Send + 'static,
        on_panic: impl FnOnce(String) -> InternalMsg + Send + 'static,
    ) {
        self.work += 1;
        // Fails only when the lane was killed, and then the node is gone.
        let _ = self.lane.send(worker::job(work, on_panic));
    }

    /// Runs `work` up to its first wait, here and now. Work that finishes
    /// without waiting (a local consumer's delivery, mostly) is returned at
    /// once, for the agent to settle before its next message: no lane, no
    /// report message. Work that waits goes on on the lane from where it
    /// stopped (a future registers the waker of its latest poll, so the
    /// lane's first poll takes over the wake-up) and reports as `report`.
    pub(super) fn run_work<T: Send + 'static>(
        &mut self,
        mut work: Pin<Box<dyn Future<Output = T> + Send>>,
        report: fn(T) -> InternalMsg,
    ) -> Option<T> {
        match poll_now(work.as_mut()) {
            Poll::Ready(done) => Some(done),
            Poll::Pending => {
                self.work += 1;
                // Fails only when the lane was killed, and then the node is gone.
                let _ = self.lane.send(Box::pin(work.map(report)));
                None
            }
        }
    }

    /// Starts the work a step of a part asks for: a lookup, a handshake,
    /// a fault's report, a notice to a consumer, a timer. The steps only
    /// the agent can carry out (a dispatch, a count) come back.
    pub(super) fn start_step(&mut self, step: Next, cx: &StepContext<'_>) -> Option<Next> {
        let (services, timeout) = (cx.services, cx.services.options.delivery_attempt_timeout);
        match step {
            Next::LookUp { stream, after } => {
                let (store, stop) = (services.store.clone(), cx.stop.clone());
                let (work, panicked) = lookup::look_up(store, stream, after, &services.options, stop);
                self.spawn_work(work.map(InternalMsg::Registered), move |p| InternalMsg::Registered(panicked(p)));
            }
            Next::Handshake(call) => {
                let limits = RetryLimits::from(&services.options);
                let origin = Origin { queue: cx.queue, fence: services.lease_token };
                let (work, panicked) = call.start(services.consumers.clone(), origin, limits, cx.stop.clone());
                self.spawn_work(work.map(InternalMsg::HandshakeDone), move |p| InternalMsg::HandshakeDone(panicked(p)));
            }
            Next::Fault(faulted) => self.spawn_side_work(faulted.report(services.store.clone(), timeout)),
            Next::Tell { consumer, info, error } => self.spawn_side_work(async move {
                let _ = tokio::time::timeout(timeout, consumer.on_error(&info, &error)).await;
            }),
            Next::RewindLater { stream, id, epoch, after } => {
                self.send_self_after(after, move || InternalMsg::RewindDue { stream, id, epoch })
            }
            own => return Some(own),
        }
        None
    }

    /// Work whose only report is that it finished.
    pub(super) fn spawn_side_work(&mut self, work: impl Future<Output = ()> + Send + 'static) {
        self.spawn_work(work.map(|()| InternalMsg::SideWorkDone), |_| InternalMsg::SideWorkDone);
    }

    /// Sends `msg` to this agent later.
    pub(super) fn send_self_after(&self, delay: Duration, msg: impl FnOnce() -> InternalMsg + Send + 'static) {
        self.myself.send_after(delay, move || AgentMsg::Internal(Internal(msg())));
    }

    /// Runs `task` as a task of `tasks` named `name` and sends this agent
    /// the message it ends with, if any. Not counted as work: nothing
    /// waits for it (the pump, and the wait on the receiver's wake).
    pub(super) fn spawn_reporting(
        &self,
        tasks: &Tasks,
        name: &'static str,
        task: impl Future<Output = Option<InternalMsg>> + Send + 'static,
    ) {
        let myself = self.myself.clone();
        tasks.spawn(name, async move {
            if let Some(msg) = task.await {
                // Only fails if the agent is gone, and then nobody needs it.
                let _ = myself.cast(AgentMsg::Internal(Internal(msg)));
            }
        });
    }

    /// Tells the agent `Woken` once `ready` (its receiver's wake, or its
    /// backend probe) completes, unless the agent's state went first.
    pub(super) fn wake_when(&self, tasks: &Tasks, ready: crate::queue::Wake, name: &'static str) {
        let cancel = self.waits.token().clone();
        self.spawn_reporting(tasks, name, async move {
            cancel.run_until_cancelled(ready).await.map(|()| InternalMsg::Woken)
        });
    }

    /// Runs `task` up to its first wait, here and now, like
    /// [`Outbox::run_work`]: its result if it finished without waiting
    /// (a read of a queue in memory, mostly), otherwise it goes on as a
    /// task of `tasks` named `name` and reports as `report`.
    pub(super) fn run_reporting<T: Send + 'static>(
        &self,
        tasks: &Tasks,
        name: &'static str,
        task: impl Future<Output = Option<T>> + Send + 'static,
        report: fn(T) -> InternalMsg,
    ) -> Option<T> {
        let mut task = Box::pin(task);
        match poll_now(task.as_mut()) {
            Poll::Ready(done) => done,
            Poll::Pending => {
                self.spawn_reporting(tasks, name, async move { task.await.map(report) });
                None
            }
        }
    }

    /// Sends `msg` to this agent now.
    pub(super) fn send_self(&self, msg: InternalMsg) {
        // Only fails if the agent is gone, and then nobody needs the message.
        let _ = self.myself.cast(AgentMsg::Internal(Internal(msg)));
    }
}
