//! The pulling agent: one actor per owned queue. It reads its queue in batches, caches what it
//! read ([`QueueCache`]), finds each stream's subscribers (pub-sub + handshake), delivers to
//! every subscription in order and at least once, checkpoints delivery progress and, when asked
//! to stop, hands the queue over in strict order. Idle, it sleeps until its receiver says the
//! queue was written.
//!
//! This file is the loop: [`PullingAgent::handle`] matches every message and says what happens.
//! Queue I/O (a pump) and deliveries run in the agent up to their first wait: what finishes
//! without waiting (a read of a queue in memory, a local consumer's delivery) is settled before
//! the next message. Anything that waits (and every pub-sub lookup, handshake and dead letter)
//! goes on in a task that reports back with a message, so a slow consumer never blocks the pump
//! or the other subscriptions:
//!
//! ```text
//! Pump ─▶ [ack purged, checkpoint, rewinds, read ≤ one bucket; a task if it waits] ─▶ PumpDone
//! PumpDone ─▶ cache.add ─▶ new stream? LookUp ─▶ Registered ─▶ Handshake ─▶ HandshakeDone
//!          └▶ ready cursors ─▶ dispatch ─▶ [deliver with retries; the lane if it waits] ─▶ Delivered ─▶ dispatch …
//! ```
//!
//! The state is split into parts under `agent/` (`pump`, `streams`, `subscription`, `lookup`,
//! `delivery`, `shutdown`, `messages`, `calls`, `worker`, `status`, `settings`: each file opens
//! with what it owns), none calling back into the agent: they return what should happen next,
//! and the agent carries it out. `tests.rs` drives an agent through its messages.

mod calls;
mod delivery;
mod lookup;
mod messages;
mod pump;
mod settings;
mod shutdown;
mod status;
mod streams;
mod subscription;
#[cfg(test)]
mod tests;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cache::QueueCache;
use crate::pubsub::{ConsumerError, StartPosition, SubscriptionId};
use crate::queue::QueueError;
use crate::stream::{BatchContainer, QueueId, StreamId};
use calls::RetryLimits;
use delivery::{Delivered, Dispatch, Finished, Settled};
use messages::{Internal, InternalMsg, Outbox, StepContext};
use pump::{AfterRead, Io, Pump, PumpError, PumpOutcome, PumpWork, Pumped, Tick};
use shutdown::Shutdown;
use status::AgentMetrics;
use streams::{Next, Streams};

pub(crate) use messages::AgentMsg;
pub(crate) use pump::is_fenced;
pub use settings::AgentOptions;
pub(crate) use settings::AgentServices;
pub(crate) use shutdown::HANDED_OVER;
pub use status::AgentStatus;
pub use subscription::AttachError;

/// Deliveries settled per message before the agent lets others in.
const SETTLE_PER_MESSAGE: usize = 256;

/// The pulling agent actor.
pub(crate) struct PullingAgent;

/// Spawn arguments of a pulling agent.
pub(crate) struct AgentArgs {
    /// The queue to pull.
    pub(crate) queue: QueueId,
    /// Shared services.
    pub(crate) services: Arc<AgentServices>,
}

/// The state of one pulling agent: its parts, and what ties them together.
pub(crate) struct Agent {
    queue: QueueId,
    services: Arc<AgentServices>,
    /// Where its own messages and its waiting work go.
    outbox: Outbox,
    /// What was read and not yet done, with one cursor per subscription.
    cache: QueueCache,
    /// The receiver, the checkpoint and the read schedule.
    pump: Pump,
    /// Who receives each stream.
    streams: Streams,
    /// Deliveries that finished as they started, to settle.
    finished: Finished,
    /// Set once the ordered shutdown began: admission is closed.
    shutdown: Option<Shutdown>,
    /// Cancelled at shutdown: tasks finish their current attempt, no retry.
    stop_retries: Arc<CancellationToken>,
    /// How deliveries are retried (from the options).
    delivery_limits: Arc<RetryLimits>,
    /// The node's kill switch (see [`AgentServices::kill`]).
    kill: Arc<CancellationToken>,
    status: AgentStatus,
    metrics: AgentMetrics,
    /// The lifecycle span (`pulling_agent{node, queue}`): every message,
    /// pump and job of the agent runs in it.
    span: tracing::Span,
}

impl Actor for PullingAgent {
    type Msg = AgentMsg;
    type State = Agent;
    type Arguments = AgentArgs;

    async fn pre_start(&self, myself: ActorRef<AgentMsg>, args: AgentArgs) -> Result<Agent, ActorProcessingErr> {
        Agent::start(myself, args.queue, args.services).await
    }

    /// The loop: every message, and what happens on it.
    async fn handle(&self, _: ActorRef<AgentMsg>, msg: AgentMsg, agent: &mut Agent) -> Result<(), ActorProcessingErr> {
        let span = agent.span.clone();
        let entered = span.enter();
        match msg {
            // A subscriber attaches: its stream is registered if new, and its
            // consumer is asked where to start (answered once placed).
            AgentMsg::Attach { reply, .. } if agent.shutdown.is_some() => {
                let _ = reply.send(Err(AttachError::NotServing(agent.queue)));
            }
            AgentMsg::Attach { subscription, reply } => {
                let next = agent.streams.attach(subscription, reply, &mut agent.cache);
                agent.run(next);
            }
            // Unsubscribed: its cursor goes, and what it had in flight.
            AgentMsg::Detach { stream, id, reply } => {
                agent.streams.detach(&stream, id, &mut agent.cache);
                let _ = reply.send(());
            }
            // The queue moves: admission closes, what is cached drains.
            AgentMsg::Shutdown(reply) => Shutdown::begin(&mut agent.shutdown, reply, &agent.stop_retries, agent.queue),
            AgentMsg::GetStatus(reply) => {
                let shutting_down = agent.shutdown.is_some();
                let _ = reply.send(agent.status.now(&agent.streams, &agent.cache, &agent.pump, shutting_down));
            }
            AgentMsg::Internal(Internal(msg)) => agent.on_internal(msg)?,
        }
        agent.settle_finished()?;
        if agent.pump.acks_waiting(&agent.cache) {
            agent.schedule_pump(Duration::ZERO);
        }
        drop(entered);
        if agent.shutdown.is_some() {
            // Boxed: its large future is built only while shutting down, not
            // moved around for every message.
            Box::pin(agent.finish_shutdown_if_idle().instrument(span)).await;
        }
        Ok(())
    }
}

impl Agent {
    /// The agent's own messages: timers and what its tasks report.
    fn on_internal(&mut self, msg: InternalMsg) -> Result<(), ActorProcessingErr> {
        let closing = self.shutdown.is_some();
        match msg {
            // Lend the receiver to a pump: ack, checkpoint, rewind, read.
            InternalMsg::Pump => self.pump()?,
            InternalMsg::Woken => {
                self.pump.woken();
                self.schedule_pump(Duration::ZERO);
            }
            // The pump is back: cache what it read, schedule the next.
            InternalMsg::PumpDone(outcome) => self.on_pumped(*outcome)?,
            // A new stream's subscriptions: each starts its handshake.
            InternalMsg::Registered(registered) => {
                self.outbox.reported();
                if !closing {
                    let (implicit, backoff) = (&self.services.implicit, self.services.options.delivery_backoff);
                    let next = self.streams.on_registered(registered, &mut self.cache, implicit, backoff);
                    self.run(next);
                }
            }
            // A consumer said where to start: place its cursor, deliver.
            InternalMsg::HandshakeDone(done) => {
                self.outbox.reported();
                if matches!(done.result, Err(ConsumerError::Fenced(_))) {
                    return Err(PumpError::Fenced(self.queue).into());
                }
                let failure = self.services.failure.as_ref();
                let rewindable = self.services.adapter.is_rewindable();
                let next = self.streams.on_handshake_done(done, closing, &mut self.cache, failure, rewindable);
                self.run(next);
            }
            // A delivery ended: move on, detach, park or give up.
            InternalMsg::Delivered(done) => {
                self.outbox.reported();
                // A consumer's node saw a newer owner's token: this agent's
                // lease is gone; it stops as when Redis fences it.
                if done.fenced() {
                    return Err(PumpError::Fenced(self.queue).into());
                }
                self.on_delivered(done);
            }
            InternalMsg::SideWorkDone => self.outbox.reported(),
            // A failed catch-up read may be asked again.
            InternalMsg::RewindDue { stream, id, epoch } => {
                let next = self.streams.on_rewind_due(stream, id, epoch);
                self.run(next);
            }
            InternalMsg::Batch(done) => done.into_iter().try_for_each(|msg| self.on_internal(msg))?,
            InternalMsg::SettleMore => self.finished.more_arrived(),
        }
        Ok(())
    }

    /// Builds the receiver, loads the checkpoint and arranges the first pump
    /// (`pre_start`).
    async fn start(
        myself: ActorRef<AgentMsg>,
        queue: QueueId,
        services: Arc<AgentServices>,
    ) -> Result<Self, ActorProcessingErr> {
        let io = Io::open(&services, queue).await?;
        let span = tracing::info_span!("pulling_agent", node = %services.node, %queue);
        let kill = Arc::new(services.kill.clone());
        let outbox = Outbox::start(myself, &services.tasks, kill.clone(), span.clone());
        let mut cache = QueueCache::new(services.cache.clone());
        cache.set_purged_through(io.checkpoint.latest());
        let mut agent = Self {
            queue,
            outbox,
            cache,
            pump: Pump::new(io),
            streams: Streams::new(),
            finished: Finished::default(),
            shutdown: None,
            stop_retries: Arc::new(CancellationToken::new()),
            delivery_limits: Arc::new(RetryLimits::from(&services.options)),
            kill,
            status: AgentStatus { queue: Some(queue), ..AgentStatus::default() },
            metrics: AgentMetrics::new(queue),
            span: span.clone(),
            services,
        };
        agent.schedule_pump(Pump::first_delay(&agent.services.options));
        tracing::info!(parent: &span, checkpoint = ?agent.pump.checkpoint(), "pulling agent started");
        Ok(agent)
    }

    /// Arranges a pump after `delay` (coalesced: at most one is arranged or
    /// in flight).
    fn schedule_pump(&mut self, delay: Duration) {
        match self.pump.schedule(delay, self.shutdown.is_some()) {
            Some(Tick::Now) => self.outbox.send_self(InternalMsg::Pump),
            Some(Tick::After(delay)) => self.outbox.send_self_after(delay, || InternalMsg::Pump),
            None => {}
        }
    }

    /// Starts a pump: forget idle streams, purge what every cursor passed,
    /// then lend the receiver to a task that acks, checkpoints, serves
    /// rewinds and reads what fits. The task runs here up to its first
    /// wait: a pump that never waits (a queue in memory) is applied at once.
    fn pump(&mut self) -> Result<(), ActorProcessingErr> {
        if !self.pump.ticked(self.shutdown.is_some()) {
            return Ok(());
        }
        let options = &self.services.options;
        self.streams.clean_up(Instant::now(), &mut self.cache, options, self.queue);
        let mut purged = self.cache.purge();
        self.pump.take_redelivered(&mut purged);
        self.status.acked += purged.acked.len() as u64;
        let paused = self.cache.is_under_pressure() || self.streams.len() >= options.max_streams;
        let room = self.cache.max_add_count();
        // Rewinds wait for a receiver that initialized (a failed initialize
        // would drop them).
        let rewinds = match self.pump.initialized() {
            true => self.streams.take_rewinds(options.max_rewinds_per_pump, room),
            false => Vec::new(),
        };
        let work = PumpWork { purged, progress: self.cache.progress(), rewinds, paused, room };
        let Some(run) = self.pump.begin(self.queue, options.init_timeout, work) else { return Ok(()) };
        if run.reads() {
            self.status.read_calls += 1;
        }
        let kill = self.kill.clone();
        let task = async move { run.run(&kill).await.map(Box::new) }.instrument(self.span.clone());
        match self.outbox.run_reporting(&self.services.tasks, "agent pump", task, InternalMsg::PumpDone) {
            Some(outcome) => self.on_pumped(*outcome),
            None => Ok(()),
        }
    }

    /// A pump came back: apply its rewind answers, then its read (cached and
    /// dispatched, or backed off), and arrange the next pump.
    fn on_pumped(&mut self, outcome: PumpOutcome) -> Result<(), ActorProcessingErr> {
        let (rewinds, read) = match self.pump.finish(outcome, self.queue, &self.services.options)? {
            Pumped::InitFailed { error, wait } => {
                tracing::warn!(queue = %self.queue, %error, ?wait, "receiver initialize failed; retrying");
                self.back_off(wait);
                return Ok(());
            }
            Pumped::Ran { rewinds, read } => (rewinds, read),
        };
        for rewind in rewinds {
            let next = self.streams.on_rewind(rewind, &mut self.cache, self.services.options.reader_backoff);
            self.run(next);
        }
        match read {
            Err(QueueError::Fenced(queue)) => return Err(PumpError::Fenced(queue).into()),
            Err(error) => {
                self.metrics.read_errors.increment(1);
                let wait = self.pump.failed(&self.services.options);
                tracing::warn!(queue = %self.queue, %error, ?wait, "queue read failed; backing off");
                self.back_off(wait);
            }
            // Admission is closed: what was read now is left unacknowledged
            // for the next owner.
            Ok(_) if self.shutdown.is_some() => {}
            Ok(batch) => {
                let read = batch.len();
                if read > 0 {
                    self.add_batch(batch)?;
                }
                let next = self.streams.read_completed(&mut self.cache, self.services.adapter.is_rewindable());
                self.run(next);
                let rewinds_waiting = self.streams.rewinds_waiting();
                match self.pump.after_read(read, rewinds_waiting, &self.services.options) {
                    AfterRead::Pump(delay) => self.schedule_pump(delay),
                    AfterRead::Sleep(wake) => self.sleep(wake),
                }
            }
        }
        self.metrics.cached.set(self.cache.len() as f64);
        self.metrics.pressure.set(if self.cache.is_under_pressure() { 1.0 } else { 0.0 });
        Ok(())
    }

    /// After a failed read or initialize: pump after `wait`, or once the receiver's probe finds its backend.
    fn back_off(&mut self, wait: Duration) {
        self.schedule_pump(wait);
        if let Some(probe) = self.pump.reachable() {
            self.outbox.wake_when(&self.services.tasks, probe, "agent backend probe");
        }
    }

    /// Nothing to read: wait for the receiver's wake, pumping only to write
    /// a throttled checkpoint and to forget idle streams in time.
    fn sleep(&mut self, wake: Option<crate::queue::Wake>) {
        if let Some(wake) = wake {
            self.outbox.wake_when(&self.services.tasks, wake, "agent wake");
        }
        if let Some(due) = self.pump.asleep_due(&self.services, self.streams.len()) {
            self.schedule_pump(due);
        }
    }

    /// A read's containers: cached; cursors that were waiting deliver; new
    /// streams are registered.
    fn add_batch(&mut self, batch: Vec<Arc<BatchContainer>>) -> Result<(), ActorProcessingErr> {
        self.status.read(batch.len());
        let order = streams::appearance(&batch);
        self.metrics.events_read.increment(order.iter().map(|(_, n)| *n).sum::<usize>() as u64);
        // The pump reads at most what fits, so a full cache is a bug; the
        // containers stay unacknowledged in the queue for the next owner.
        let mut added = self.cache.add(batch)?;
        self.pump.redelivered(&mut added.skipped);
        for cursor in added.ready {
            if let Some((stream, id)) = self.streams.owner(cursor) {
                self.dispatch(&stream, id);
            }
        }
        let next = self.streams.saw(order, &mut self.cache);
        self.run(next);
        Ok(())
    }

    /// Starts the subscription's next delivery, if it has one.
    fn dispatch(&mut self, stream: &StreamId, id: SubscriptionId) {
        let draining = self.shutdown.is_some();
        let max = self.services.options.max_delivery_batch.max(1);
        let Some(sub) = self.streams.sub_mut(stream, id) else { return };
        let fence = self.services.lease_token;
        match delivery::next_delivery(sub, stream, id, &mut self.cache, max, draining, fence) {
            Dispatch::Idle => {}
            Dispatch::Rewind => {
                self.streams.request_rewind(stream.clone(), id);
                self.schedule_pump(Duration::ZERO);
            }
            Dispatch::Deliver(call) => {
                let work = call.start(self.delivery_limits.clone(), self.stop_retries.clone());
                if let Some(done) = self.outbox.run_work(work, InternalMsg::Delivered) {
                    self.finished.push(done);
                }
            }
        }
    }

    /// Settles the deliveries that finished as they started, in order (each
    /// may start its subscription's next, which may finish too): at most
    /// `SETTLE_PER_MESSAGE`, so that one message never holds the agent
    /// long; the rest after a `SettleMore` it sends itself.
    fn settle_finished(&mut self) -> Result<(), ActorProcessingErr> {
        for _ in 0..SETTLE_PER_MESSAGE {
            let Some(done) = self.finished.pop() else { return Ok(()) };
            if done.fenced() {
                return Err(PumpError::Fenced(self.queue).into());
            }
            self.on_delivered(done);
        }
        if self.finished.ask_more() {
            self.outbox.send_self(InternalMsg::SettleMore);
        }
        Ok(())
    }

    /// A delivery ended: count it, follow a seek, detach a gone consumer,
    /// or hand a given-up batch to the failure handler; then deliver the
    /// next and pump (progress may free queue capacity and cache room).
    fn on_delivered(&mut self, done: Delivered) {
        let (stream, id) = (done.stream().clone(), done.id);
        let draining = self.shutdown.is_some();
        let Some(sub) = self.streams.touched(&stream, id) else { return };
        match delivery::settle(sub, &mut self.cache, done, draining) {
            Settled::Next => {}
            Settled::Delivered { events, seek, more } => {
                self.status.events_delivered += events as u64;
                self.metrics.events_delivered.increment(events as u64);
                if let Some(token) = seek {
                    let rewindable = self.services.adapter.is_rewindable();
                    let next = self.streams.seek(&stream, id, StartPosition::After(token), &mut self.cache, rewindable);
                    self.run(next);
                    return;
                }
                if !more {
                    // Caught up: its cursor waits in the cache for the next
                    // container of its stream (`add` makes it ready).
                    self.pump.wake();
                    self.schedule_pump(Duration::ZERO);
                    return;
                }
            }
            Settled::Unavailable(reason) => {
                tracing::warn!(queue = %self.queue, %stream, subscription = %id, %reason, "consumer unavailable; subscription detached");
                let refusal = AttachError::ConsumerUnavailable { id, reason };
                self.streams.remove_sub(&stream, id, refusal, &mut self.cache);
                return;
            }
            Settled::Parked => return,
            Settled::GaveUp(gave_up) => {
                let (letters, fault) = gave_up.give_up(&self.services, &self.metrics, self.queue);
                self.outbox.spawn_side_work(letters);
                if let Some(reason) = fault {
                    let next = self.streams.fault(&stream, id, reason, &mut self.cache);
                    self.run(next);
                    return;
                }
            }
        }
        self.dispatch(&stream, id);
        self.pump.wake();
        self.schedule_pump(Duration::ZERO);
    }

    /// Carries out what a part asked for, in order.
    fn run(&mut self, next: Vec<Next>) {
        for step in next {
            let cx = StepContext { services: &self.services, stop: &self.stop_retries, queue: self.queue };
            match self.outbox.start_step(step, &cx) {
                Some(Next::Dispatch(stream, id)) => self.dispatch(&stream, id),
                Some(Next::Unsubscribed(events)) => {
                    self.status.events_unsubscribed += events as u64;
                    self.metrics.events_unsubscribed.increment(events as u64);
                }
                Some(Next::CacheMiss) => self.metrics.cache_misses.increment(1),
                _ => {}
            }
        }
    }

    /// Steps 3 to 5, once nothing is in flight (checked after every message).
    async fn finish_shutdown_if_idle(&mut self) {
        let busy = self.pump.in_flight() || self.outbox.in_flight() > 0 || !self.finished.is_empty();
        let Some(waiters) = self.shutdown.as_mut().and_then(|s| s.finish_if_idle(busy)) else { return };
        let unresolved = self.streams.unresolved();
        let mut purged = self.cache.purge();
        self.pump.take_redelivered(&mut purged);
        self.status.acked += purged.acked.len() as u64;
        let progress = self.cache.progress().filter(|_| !unresolved);
        if let Some(io) = self.pump.take_io() {
            let limit = self.services.options.init_timeout;
            let checkpoint = shutdown::release(io, self.queue, purged, progress, limit).await;
            self.status.checkpoint = checkpoint.map(|t| t.to_string());
        }
        tracing::info!(node = %self.services.node, queue = %self.queue, checkpoint = ?self.status.checkpoint, unresolved, "ordered shutdown complete; queue released");
        for waiter in waiters {
            let _ = waiter.send(());
        }
        self.outbox.myself().stop(Some(HANDED_OVER.into()));
    }
}
