//! The gateway: the one remotable actor of a node. A call is a wire
//! envelope and a reply port for bytes; a call that waits is answered on
//! its own task (at most `max_inflight` calls at once, more are refused as
//! busy), so a slow consumer never holds up the others' calls.

use std::sync::Arc;

use parking_lot::Mutex;
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tokio::sync::Semaphore;

use super::Served;
use crate::cluster::wire::{self, Refusal, Reply, Request};
use crate::tasks::{Tasks, poll_now};

/// One call: the request's bytes and where its reply's bytes go.
pub struct GatewayMsg {
    request: Vec<u8>,
    reply: RpcReplyPort<Vec<u8>>,
}

impl GatewayMsg {
    pub(super) fn new(request: Vec<u8>, reply: RpcReplyPort<Vec<u8>>) -> Self {
        Self { request, reply }
    }
}

impl ractor::Message for GatewayMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        Ok(SerializedMessage::Call { variant: "call".into(), args: self.request, reply: self.reply, metadata: None })
    }

    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match message {
            SerializedMessage::Call { args, reply, .. } => Ok(Self { request: args, reply }),
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

struct Gateway;

struct State {
    handler: HandlerSlot,
    limit: Arc<Semaphore>,
    max_inflight: usize,
    tasks: Tasks,
}

/// Starts a node's gateway. Unnamed: a peer in the same process (tests,
/// benches) would otherwise register the same name for its remote copy.
pub(super) async fn spawn(
    handler: HandlerSlot,
    max_inflight: usize,
    tasks: Tasks,
) -> Result<ActorRef<GatewayMsg>, SpawnErr> {
    let state = State { handler, limit: Arc::new(Semaphore::new(max_inflight)), max_inflight, tasks };
    let (gateway, _) = Actor::spawn(None, Gateway, state).await?;
    Ok(gateway)
}

fn refused(refusal: Refusal) -> Vec<u8> {
    wire::encode(&Reply::Refused { refusal }).unwrap_or_default()
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
        let GatewayMsg { request, reply } = msg;
        let Some(handler) = state.handler.get() else {
            let _ = reply.send(refused(Refusal::NotReady));
            return Ok(());
        };
        let Ok(permit) = state.limit.clone().try_acquire_owned() else {
            let _ = reply.send(refused(Refusal::Busy(state.max_inflight)));
            return Ok(());
        };
        let mut call = Box::pin(async move {
            let answer = match wire::decode::<Request>(&request) {
                Ok(request) => handler.serve(request).await,
                Err(refusal) => Reply::Refused { refusal },
            };
            let bytes = wire::encode(&answer).unwrap_or_else(|e| refused(Refusal::Unreadable(e)));
            let _ = reply.send(bytes);
            drop(permit);
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
