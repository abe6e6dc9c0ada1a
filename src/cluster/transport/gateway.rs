//! The gateway: the one remotable actor of a node. A call is a wire
//! envelope and a reply port for bytes; a call that waits is answered on
//! its own task (at most `max_inflight` calls at once, over the session and
//! the lanes together; more are refused as busy), so a slow consumer never
//! holds up the others' calls. It also answers a peer's request for a lane
//! with the lane listener's offer.

use std::sync::Arc;

use parking_lot::Mutex;
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Served;
use super::lane::Listener;
use crate::cluster::wire::{self, Refusal, Reply, Request};
use crate::tasks::{Tasks, poll_now};

/// The `ractor` variant of a request for a lane (a call is `"call"`; a
/// build without lanes reads either as a call, and refuses this one as
/// unreadable).
const LANE: &str = "lane";

/// One call (a request's bytes), or a request for a lane; and where the
/// reply's bytes go.
pub struct GatewayMsg {
    lane: bool,
    request: Vec<u8>,
    reply: RpcReplyPort<Vec<u8>>,
}

impl GatewayMsg {
    pub(super) fn new(request: Vec<u8>, reply: RpcReplyPort<Vec<u8>>) -> Self {
        Self { lane: false, request, reply }
    }

    /// A request for a lane, answered with an [`super::lane::Offer`] as
    /// JSON (or nothing: no lane there).
    pub(super) fn lane(reply: RpcReplyPort<Vec<u8>>) -> Self {
        Self { lane: true, request: Vec::new(), reply }
    }
}

impl ractor::Message for GatewayMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        let variant = if self.lane { LANE } else { "call" };
        Ok(SerializedMessage::Call { variant: variant.into(), args: self.request, reply: self.reply, metadata: None })
    }

    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match message {
            SerializedMessage::Call { args, reply, variant, .. } => {
                Ok(Self { lane: variant == LANE, request: args, reply })
            }
            _ => Err(BoxedDowncastErr),
        }
    }
}

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

/// How a node serves calls, from the session or a lane: the handler and
/// the bound on calls served at once.
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

struct Gateway;

struct State {
    serving: Serving,
    lanes: Option<Arc<Listener>>,
    tasks: Tasks,
}

/// Starts a node's gateway. Unnamed: a peer in the same process (tests,
/// benches) would otherwise register the same name for its remote copy.
pub(super) async fn spawn(
    serving: Serving,
    lanes: Option<Arc<Listener>>,
    tasks: Tasks,
) -> Result<ActorRef<GatewayMsg>, SpawnErr> {
    let (gateway, _) = Actor::spawn(None, Gateway, State { serving, lanes, tasks }).await?;
    Ok(gateway)
}

impl Actor for Gateway {
    type Msg = GatewayMsg;
    type State = State;
    type Arguments = State;

    async fn pre_start(&self, _: ActorRef<GatewayMsg>, state: State) -> Result<State, ActorProcessingErr> {
        Ok(state)
    }

    async fn handle(
        &self,
        _: ActorRef<GatewayMsg>,
        msg: GatewayMsg,
        state: &mut State,
    ) -> Result<(), ActorProcessingErr> {
        let GatewayMsg { lane, request, reply } = msg;
        if lane {
            let offer = state.lanes.as_ref().and_then(|lanes| serde_json::to_vec(&lanes.offer()).ok());
            let _ = reply.send(offer.unwrap_or_default());
            return Ok(());
        }
        let admitted = match state.serving.admit(&[]) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                let _ = reply.send(refusal);
                return Ok(());
            }
        };
        let mut call = Box::pin(async move {
            let _ = reply.send(admitted.answer(&request, &[]).await);
        });
        // Most calls are answered without waiting (a delivery to a tailer
        // publishes and returns): those are answered here, and only one
        // that waits becomes a task of its own.
        if poll_now(call.as_mut()).is_pending() {
            state.tasks.spawn("gateway call", call);
        }
        Ok(())
    }
}
