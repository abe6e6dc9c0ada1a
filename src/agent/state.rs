//! The agent's state, its internal messages, and the task helper.

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap as HashMap;
use std::future::Future;
use std::sync::Arc;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::delivery::DeliveryReport;
use super::pump::PumpOutcome;
use super::{AgentMsg, AgentServices, AgentStatus, AttachError, Internal};
use crate::cache::{CursorId, QueueCache};
use crate::checkpoint::QueueCheckpoint;
use crate::pubsub::{
    ConsumerAddress, ConsumerError, Delivery, PubSubError, StartPosition, StreamConsumer, Subscription, SubscriptionId,
    SubscriptionInfo,
};
use crate::queue::{QueueId, QueueReceiver};
use crate::stream::{BatchContainer, SequenceToken, StreamId};

/// Completions and timers, sent by the agent to itself.
pub(crate) enum InternalMsg {
    Pump,
    PumpDone(Box<PumpOutcome>),
    Registered {
        stream: StreamId,
        result: Result<Vec<Subscription>, PubSubError>,
    },
    HandshakeDone {
        stream: StreamId,
        id: SubscriptionId,
        generation: u64,
        consumer: Option<Arc<dyn StreamConsumer>>,
        result: Result<Option<StartPosition>, ConsumerError>,
    },
    Delivered {
        stream: StreamId,
        id: SubscriptionId,
        generation: u64,
        catch_up: bool,
        last: Option<SequenceToken>,
        report: DeliveryReport,
    },
    SideWorkDone,
    /// A catch-up read that failed may be asked again.
    RewindDue {
        stream: StreamId,
        id: SubscriptionId,
        epoch: u64,
    },
    /// Several completions reported together by the work lane.
    Batch(Vec<InternalMsg>),
}

/// The receiver and checkpoint: owned by the agent, lent to the pump task.
pub(crate) struct Io {
    pub receiver: Box<dyn QueueReceiver>,
    pub checkpoint: QueueCheckpoint,
}

/// One tracked stream.
pub(crate) struct StreamEntry {
    pub subs: BTreeMap<SubscriptionId, Sub>,
    /// Holds the stream's containers while its subscriptions are looked up.
    pub registration_pin: Option<CursorId>,
    pub registered: bool,
    pub last_activity: Instant,
}

/// A subscription's catch-up from the queue (its start was older than the
/// cache): rewind reads from `next` up to `until`, then the cache.
pub(crate) struct CatchUp {
    pub next: SequenceToken,
    pub until: SequenceToken,
    pub requested: bool,
    /// The rewind reads reached `until`: what is buffered is the rest.
    pub exhausted: bool,
    /// Tells this catch-up from a later one of the same subscription.
    pub epoch: u64,
    /// Failed reads so far (for the backoff).
    pub retries: u32,
    pub buffer: VecDeque<Arc<BatchContainer>>,
}

/// One subscription the agent serves.
pub(crate) struct Sub {
    pub info: SubscriptionInfo,
    pub address: Option<ConsumerAddress>,
    pub start: StartPosition,
    /// The user asked for a token at subscribe time: refuse if unservable.
    pub strict_start: bool,
    pub consumer: Option<Arc<dyn StreamConsumer>>,
    pub cursor: Option<CursorId>,
    pub handshake_pin: Option<CursorId>,
    pub generation: u64,
    pub handshaking: bool,
    pub delivering: bool,
    /// A delivery failed during the shutdown drain: nothing more is tried.
    pub parked: bool,
    /// The delivery in flight (kept for dead letters).
    pub in_flight: Option<Arc<Delivery>>,
    /// Cancelled to revoke the in-flight handshake or delivery. Shared by
    /// `Arc` so handing it to a task costs one increment, not a lock.
    pub revoke: Arc<CancellationToken>,
    pub catch_up: Option<CatchUp>,
    pub attach_replies: Vec<RpcReplyPort<Result<StartPosition, AttachError>>>,
}

pub(crate) struct PumpState {
    pub in_flight: bool,
    /// When the next timed pump is due, if one is arranged.
    pub scheduled: Option<Instant>,
    /// A pump message is already on its way with no delay.
    pub immediate: bool,
    pub blocked: bool,
    pub read_failures: u32,
    /// Consecutive empty reads (the idle wait doubles with each).
    pub empty_reads: u32,
}

pub(crate) struct ShutdownState {
    pub waiters: Vec<RpcReplyPort<()>>,
    pub done: bool,
}

/// Metric handles, created once per agent.
pub(crate) struct AgentMetrics {
    pub events_read: metrics::Counter,
    pub events_delivered: metrics::Counter,
    pub events_unsubscribed: metrics::Counter,
    pub delivery_failures: metrics::Counter,
    pub dead_letters: metrics::Counter,
    pub read_errors: metrics::Counter,
    pub cache_misses: metrics::Counter,
    pub cached: metrics::Gauge,
    pub pressure: metrics::Gauge,
}

impl AgentMetrics {
    fn new(queue: QueueId) -> Self {
        let q = queue.to_string();
        Self {
            events_read: metrics::counter!("tailrace_agent_events_read_total", "queue" => q.clone()),
            events_delivered: metrics::counter!("tailrace_agent_events_delivered_total", "queue" => q.clone()),
            events_unsubscribed: metrics::counter!("tailrace_agent_events_unsubscribed_total", "queue" => q.clone()),
            delivery_failures: metrics::counter!("tailrace_agent_delivery_failures_total", "queue" => q.clone()),
            dead_letters: metrics::counter!("tailrace_agent_dead_letters_total", "queue" => q.clone()),
            read_errors: metrics::counter!("tailrace_agent_read_errors_total", "queue" => q.clone()),
            cache_misses: metrics::counter!("tailrace_agent_cache_misses_total", "queue" => q.clone()),
            cached: metrics::gauge!("tailrace_cache_containers", "queue" => q.clone()),
            pressure: metrics::gauge!("tailrace_cache_under_pressure", "queue" => q),
        }
    }
}

/// The state of one pulling agent.
pub struct Agent {
    pub(crate) queue: QueueId,
    pub(crate) services: Arc<AgentServices>,
    pub(crate) myself: ActorRef<AgentMsg>,
    pub(crate) cache: QueueCache,
    pub(crate) io: Option<Io>,
    pub(crate) initialized: bool,
    pub(crate) pump: PumpState,
    pub(crate) streams: HashMap<StreamId, StreamEntry>,
    /// Which subscription owns each cursor.
    pub(crate) cursor_owner: HashMap<CursorId, (StreamId, SubscriptionId)>,
    /// Subscriptions waiting for a rewind read.
    pub(crate) rewinds: VecDeque<(StreamId, SubscriptionId)>,
    /// Whether a read has completed (before it, `Latest` cannot be placed).
    pub(crate) read_once: bool,
    /// Subscriptions that asked for `Latest` before the first read.
    pub(crate) deferred_latest: Vec<(StreamId, SubscriptionId)>,
    /// Numbers catch-ups, so a late rewind answer is not applied to a newer one.
    pub(crate) catch_up_epoch: u64,
    /// Containers read again at or below the progress already recorded:
    /// done, to be acked by the next pump.
    pub(crate) redelivered: Vec<SequenceToken>,
    /// Registrations, handshakes, deliveries and side work in flight.
    pub(crate) work: usize,
    /// Cancelled at shutdown: tasks finish their current attempt, no retry.
    pub(crate) stop_retries: Arc<CancellationToken>,
    /// The node's kill switch (see [`AgentServices::kill`]).
    pub(crate) kill: Arc<CancellationToken>,
    /// Where waiting work goes (see `worker.rs`).
    pub(crate) lane: tokio::sync::mpsc::UnboundedSender<super::worker::Job>,
    pub(crate) shutdown: Option<ShutdownState>,
    pub(crate) last_cleanup: Instant,
    /// The time as of the last pump: a cheap clock for stream activity.
    pub(crate) clock: Instant,
    pub(crate) status: AgentStatus,
    pub(crate) metrics: AgentMetrics,
    /// The lifecycle span (`pulling_agent{node, queue}`): every message,
    /// pump and job of the agent runs in it.
    pub(crate) span: tracing::Span,
}

impl Agent {
    /// Builds the receiver and loads the checkpoint (`pre_start`).
    pub(crate) async fn start(
        myself: ActorRef<AgentMsg>,
        queue: QueueId,
        services: Arc<AgentServices>,
    ) -> Result<Self, ActorProcessingErr> {
        let receiver = services.adapter.create_receiver(queue).await?;
        let checkpoint =
            QueueCheckpoint::load(services.checkpointer.clone(), queue, services.checkpoint.clone()).await?;
        let span = tracing::info_span!("pulling_agent", node = %services.node, %queue);
        let kill = Arc::new(services.kill.clone());
        let lane = super::worker::start(myself.clone(), kill.clone(), span.clone());
        let mut cache = QueueCache::new(services.cache.clone());
        cache.set_purged_through(checkpoint.latest());

        let mut agent = Self {
            queue,
            myself,
            cache,
            io: Some(Io { receiver, checkpoint }),
            initialized: false,
            pump: PumpState {
                in_flight: false,
                scheduled: None,
                immediate: false,
                blocked: false,
                read_failures: 0,
                empty_reads: 0,
            },
            streams: HashMap::default(),
            cursor_owner: HashMap::default(),
            rewinds: VecDeque::new(),
            redelivered: Vec::new(),
            read_once: false,
            deferred_latest: Vec::new(),
            catch_up_epoch: 0,
            work: 0,
            stop_retries: Arc::new(CancellationToken::new()),
            lane,
            kill,
            shutdown: None,
            last_cleanup: Instant::now(),
            clock: Instant::now(),
            status: AgentStatus { queue: Some(queue), ..AgentStatus::default() },
            metrics: AgentMetrics::new(queue),
            span: span.clone(),
            services,
        };
        agent.schedule_first_pump();
        tracing::info!(parent: &span, checkpoint = ?agent.io.as_ref().and_then(|io| io.checkpoint.latest()), "pulling agent started");
        Ok(agent)
    }

    pub(crate) fn handle_internal(&mut self, msg: InternalMsg) -> Result<(), ActorProcessingErr> {
        match msg {
            InternalMsg::Pump => self.on_pump_tick(),
            InternalMsg::PumpDone(outcome) => self.on_pump_done(*outcome)?,
            InternalMsg::Registered { stream, result } => self.on_registered(stream, result),
            InternalMsg::HandshakeDone { stream, id, generation, consumer, result } => {
                self.on_handshake_done(stream, id, generation, consumer, result)
            }
            InternalMsg::Delivered { stream, id, generation, catch_up, last, report } => {
                self.on_delivered(stream, id, generation, catch_up, last, report)
            }
            InternalMsg::SideWorkDone => self.work -= 1,
            InternalMsg::RewindDue { stream, id, epoch } => self.on_rewind_due(stream, id, epoch),
            InternalMsg::Batch(done) => {
                for msg in done {
                    self.handle_internal(msg)?;
                }
            }
        }
        Ok(())
    }

    /// Sends `msg` to this agent later.
    pub(crate) fn send_self_after(
        &self,
        delay: std::time::Duration,
        msg: impl FnOnce() -> InternalMsg + Send + 'static,
    ) {
        self.myself.send_after(delay, move || AgentMsg::Internal(Internal(msg())));
    }

    /// Sends `msg` to this agent now.
    pub(crate) fn send_self(&self, msg: InternalMsg) {
        // Only fails if the agent is gone, and then nobody needs the message.
        let _ = self.myself.cast(AgentMsg::Internal(Internal(msg)));
    }

    /// Runs `work` on the agent's lane, counted as in-flight work; its
    /// result comes back as a message. A panic in it is reported through
    /// `on_panic`; a node crash (the kill switch) drops it silently.
    pub(crate) fn spawn_work<F>(&mut self, work: F, on_panic: impl FnOnce(String) -> InternalMsg + Send + 'static)
    where
        F: Future<Output = InternalMsg> + Send + 'static,
    {
        self.work += 1;
        // Fails only when the lane was killed, and then the node is gone.
        let _ = self.lane.send(super::worker::job(work, on_panic));
    }

    /// Events of a stream nobody subscribes to: counted, then acked.
    pub(crate) fn count_unsubscribed(&mut self, events: usize) {
        self.status.events_unsubscribed += events as u64;
        self.metrics.events_unsubscribed.increment(events as u64);
    }

    pub(crate) fn status(&self) -> AgentStatus {
        let mut status = self.status.clone();
        status.streams = self.streams.len();
        status.registering = self.streams.values().filter(|s| !s.registered).count();
        status.subscriptions = self.streams.values().map(|s| s.subs.len()).sum();
        status.cached = self.cache.len();
        status.buckets = self.cache.bucket_count();
        status.under_pressure = self.cache.is_under_pressure();
        status.checkpoint = self.io.as_ref().and_then(|io| io.checkpoint.latest()).map(|t| t.to_string());
        status.shutting_down = self.shutdown.is_some();
        status
    }
}

/// The text of a caught panic.
pub(crate) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
