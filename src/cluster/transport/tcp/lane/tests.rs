//! A lane's strand against a listener on loopback: calls answered in any
//! order by id, a dialer with another cookie refused, a closed lane failing
//! its calls and telling so once, and the reopening pause of a peer's slot.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::listener::Limits;
use super::*;
use crate::cluster::transport::Served;
use crate::cluster::transport::tcp::serving::{HandlerSlot, Serving};
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

const COOKIE: &str = "a-cluster-cookie-of-at-least-32-characters";

/// Node `b`, listening on a free port.
async fn listener(tasks: &Tasks) -> (SocketAddr, Arc<Notify>) {
    let release = Arc::new(Notify::new());
    let handler = HandlerSlot::default();
    handler.set(Arc::new(Answers { release: release.clone() }));
    let at: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let me = (NodeId::new("b"), COOKIE.to_string());
    let at = Listener::start(at, LIMITS, me, Serving::new(handler, 8), None, tasks.clone()).await.unwrap();
    (at, release)
}

/// A strand from node `a` (holding `cookie`) to `b`; `closed` runs when
/// it closes.
async fn open_with(
    at: SocketAddr,
    cookie: &str,
    tasks: &Tasks,
    closed: Box<dyn FnOnce() + Send>,
) -> Result<Strand, Failed> {
    let tcp = TcpStream::connect(at).await.unwrap();
    let me = NodeId::new("a");
    let credentials = Credentials { me: &me, cookie, within: LIMITS.within };
    Strand::open(tcp, &credentials, &NodeId::new("b"), LIMITS.max_frame, tasks, closed).await
}

async fn open(at: SocketAddr, tasks: &Tasks) -> Strand {
    open_with(at, COOKIE, tasks, Box::new(|| {})).await.unwrap()
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
    let (at, release) = listener(&tasks).await;
    let lane = Arc::new(open(at, &tasks).await);
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
async fn a_dialer_with_another_cookie_is_refused_and_serves_nothing() {
    let tasks = Tasks::default();
    let (at, _) = listener(&tasks).await;
    let refused = open_with(at, "another-cookie-of-at-least-32-characters!", &tasks, Box::new(|| {})).await;
    match refused {
        Err(Failed::Rejected(reason)) => assert_eq!(reason, "the cluster cookie differs"),
        Err(other) => panic!("expected a rejection, got {other}"),
        Ok(_) => panic!("a dialer with another cookie opened a strand"),
    }
    let lane = open(at, &tasks).await;
    let reply = lane.call(request(AgentsCommand::State), Duration::from_secs(5)).await.unwrap();
    assert_eq!(state(&reply), "State");
    tasks.stop("test", Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_lane_whose_peer_stops_fails_its_waiting_and_later_calls() {
    let (client, server) = (Tasks::default(), Tasks::default());
    let (at, _) = listener(&server).await;
    let (told, closed) = tokio::sync::oneshot::channel();
    let closed_once = Box::new(move || {
        let _ = told.send(());
    });
    let lane = Arc::new(open_with(at, COOKIE, &client, closed_once).await.unwrap());
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
    closed.await.expect("the strand told it closed");
    client.stop("test", Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_slot_pauses_longer_after_each_failed_attempt_and_none_after_success() {
    let slot = Slot::default();
    let broken = || Err(Failed::Broken("refused".into()));
    let now = Instant::now();
    let first = slot.begin(now).unwrap();
    assert!(slot.begin(now).is_none(), "one attempt at a time");
    assert_eq!(slot.finish(first, broken()), 1);
    assert!(slot.begin(Instant::now()).is_none(), "a failed attempt pauses the next");
    tokio::time::advance(Duration::from_millis(400)).await;
    let second = slot.begin(Instant::now()).expect("for at most 400 ms the first time");
    assert_eq!(slot.finish(second, broken()), 2);
    tokio::time::advance(Duration::from_secs(6)).await;
    let third = slot.begin(Instant::now()).expect("never longer than five seconds");
    assert_eq!(slot.finish(third, Err(Failed::Rejected("the cluster cookie differs".into()))), 3);
    assert!(slot.lane().is_none());
    assert_eq!(slot.rejected().as_deref(), Some("the cluster cookie differs"));
    assert!(slot.wait_open(Instant::now() + Duration::from_secs(1)).await.is_none(), "no attempt being made");
}

#[tokio::test]
async fn only_the_lane_a_strand_belongs_to_is_closed_by_it() {
    let tasks = Tasks::default();
    let (at, _) = listener(&tasks).await;
    let slot = Slot::default();
    let first = slot.begin(Instant::now()).unwrap();
    slot.finish(first, Ok(vec![open(at, &tasks).await]));
    assert!(slot.lane().is_some());
    assert!(!slot.close(first + 1), "a strand of another attempt closes nothing");
    assert!(slot.lane().is_some());
    assert!(slot.close(first), "its own attempt's lane");
    assert!(!slot.close(first), "and tells it once");
    assert!(slot.lane().is_none());
    tasks.stop("test", Duration::from_secs(5)).await;
}
