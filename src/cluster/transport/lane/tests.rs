//! A lane's strand against its listener on loopback: calls answered in any order by
//! id, a ticket used once, a wrong ticket refused, a closed lane failing its
//! calls, and the reopening pause of a peer's slot.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::listener::Limits;
use super::*;
use crate::cluster::transport::Served;
use crate::cluster::transport::gateway::{HandlerSlot, Serving};
use crate::cluster::wire::{self, AgentsCommand, AgentsReport, Reply, Request};

/// Answers `Agents { State }` at once and `Agents { Stop }` once `release`
/// is notified, with the command in the report's state.
struct Answers {
    release: Arc<Notify>,
}

#[async_trait]
impl Served for Answers {
    async fn serve(&self, request: Request) -> Reply {
        let Request::Agents { command } = request else { return Reply::Told };
        if command == AgentsCommand::Stop {
            self.release.notified().await;
        }
        Reply::Agents { result: Ok(AgentsReport { state: format!("{command:?}"), running: 0 }) }
    }
}

const LIMITS: Limits = Limits { within: Duration::from_secs(5), max_frame: 1 << 20 };

async fn listener(tasks: &Tasks) -> (Arc<Listener>, SocketAddr, Arc<Notify>) {
    let release = Arc::new(Notify::new());
    let handler = HandlerSlot::default();
    handler.set(Arc::new(Answers { release: release.clone() }));
    let at: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let listener = Listener::start(at, LIMITS, Serving::new(handler, 8), None, tasks.clone()).await.unwrap();
    let at = SocketAddr::new(at.ip(), listener.offer().port);
    (listener, at, release)
}

async fn open(at: SocketAddr, ticket: &str, tasks: &Tasks) -> Result<Strand, String> {
    let tcp = TcpStream::connect(at).await.unwrap();
    Strand::open(tcp, ticket, LIMITS.within, LIMITS.max_frame, tasks).await
}

fn request(command: AgentsCommand) -> Vec<u8> {
    wire::encode_after(&[0; ID_BYTES], &Request::Agents { command }).unwrap()
}

fn state(reply: &[u8]) -> String {
    match wire::decode::<Reply>(reply).unwrap() {
        Reply::Agents { result: Ok(report) } => report.state,
        other => panic!("unexpected reply {other:?}"),
    }
}

#[tokio::test]
async fn calls_are_answered_by_id_whatever_order_they_finish_in() {
    let tasks = Tasks::default();
    let (listener, at, release) = listener(&tasks).await;
    let lane = Arc::new(open(at, &listener.offer().ticket, &tasks).await.unwrap());
    let slow = tokio::spawn({
        let lane = lane.clone();
        async move { lane.call(request(AgentsCommand::Stop), Duration::from_secs(5)).await }
    });
    // The waiting call does not hold up the ones after it.
    for _ in 0..100 {
        let reply = lane.call(request(AgentsCommand::State), Duration::from_secs(5)).await.unwrap();
        assert_eq!(state(&reply), "State");
    }
    assert!(!slow.is_finished());
    release.notify_one();
    assert_eq!(state(&slow.await.unwrap().unwrap()), "Stop");
    tasks.stop("test", Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_ticket_opens_one_lane_and_a_wrong_one_none() {
    let tasks = Tasks::default();
    let (listener, at, _) = listener(&tasks).await;
    let ticket = listener.offer().ticket;
    let wrong = format!("{:032x}", 7u128);
    let refused = open(at, &wrong, &tasks).await.err().unwrap();
    assert!(refused.contains("refused"), "{refused}");
    let lane = open(at, &ticket, &tasks).await.unwrap();
    let again = open(at, &ticket, &tasks).await.err().unwrap();
    assert!(again.contains("refused"), "a ticket is used once: {again}");
    let reply = lane.call(request(AgentsCommand::State), Duration::from_secs(5)).await.unwrap();
    assert_eq!(state(&reply), "State");
    tasks.stop("test", Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_lane_whose_peer_stops_fails_its_waiting_and_later_calls() {
    let (client, server) = (Tasks::default(), Tasks::default());
    let (listener, at, _) = listener(&server).await;
    let lane = Arc::new(open(at, &listener.offer().ticket, &client).await.unwrap());
    let waiting = tokio::spawn({
        let lane = lane.clone();
        async move { lane.call(request(AgentsCommand::Stop), Duration::from_secs(30)).await }
    });
    // The call is on the peer before it stops.
    while !lane.waiting.lock().replies.contains_key(&0) {
        tokio::task::yield_now().await;
    }
    // Its call still waits (the handler is not released): left behind.
    server.stop("peer", Duration::from_millis(50)).await;
    assert!(matches!(waiting.await.unwrap(), Err(Failure::Closed)));
    while lane.is_open() {
        tokio::task::yield_now().await;
    }
    assert!(matches!(lane.call(request(AgentsCommand::State), Duration::from_secs(5)).await, Err(Failure::Closed)));
    client.stop("test", Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_slot_pauses_longer_after_each_failed_attempt_and_none_after_success() {
    let slot = Slot::default();
    let now = Instant::now();
    assert!(slot.begin(now));
    assert!(!slot.begin(now), "one attempt at a time");
    assert_eq!(slot.finish(None), 1);
    assert!(!slot.begin(Instant::now()), "a failed attempt pauses the next");
    tokio::time::advance(Duration::from_millis(1500)).await;
    assert!(slot.begin(Instant::now()), "for at most a second and a half the first time");
    assert_eq!(slot.finish(None), 2);
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(slot.begin(Instant::now()), "never longer than a minute");
    assert_eq!(slot.finish(None), 3);
    assert!(slot.lane().is_none());
}
