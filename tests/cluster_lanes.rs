//! Lanes between two cluster transports in one process: calls take the
//! lane once it opens (over TLS too) and each is answered once; a peer with
//! lanes off is still called, over the session; a peer that goes away
//! fails its calls at once and, back on the same address, gets a new lane.
//!
//! Node `a` dials and calls, node `b` answers and never learns of `a`: two
//! transports in one process share `ractor`'s process-wide groups, where a
//! gateway seen from both sides is not what two processes see. Both
//! directions, between processes and over TLS, are in `cluster_tls`. For
//! the same reason the tests run one at a time (the remote actors of two
//! node servers in one process are numbered alike).

use tailrace_testkit as common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::certs::authority;
use common::eventually;
use tailrace::NodeId;
use tailrace::cluster::wire::{AgentsCommand, AgentsReport, Reply, Request};
use tailrace::cluster::{
    ClusterTransport, Member, RactorTransport, Served, TlsFiles, TransportError, TransportSettings,
};
use tokio::sync::watch;

/// Held by each test: one pair of transports in the process at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const COOKIE: &str = "a-cookie-of-at-least-thirty-two-characters";

/// Counts the calls it answers; answers each with the count so far.
struct Counting(Arc<AtomicU64>);

#[async_trait]
impl Served for Counting {
    async fn serve(&self, request: Request) -> Reply {
        let Request::Agents { command } = request else { return Reply::Told };
        let running = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Reply::Agents { result: Ok(AgentsReport { state: format!("{command:?}"), running: running as usize }) }
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn settings(me: &str, listen: SocketAddr, lanes: bool, tls: Option<TlsFiles>) -> TransportSettings {
    TransportSettings {
        me: NodeId::new(me),
        listen,
        cookie: COOKIE.into(),
        call_timeout: Duration::from_secs(2),
        max_message_bytes: 1 << 20,
        max_inflight: 64,
        redial: Duration::from_millis(100),
        tls,
        lane_port: lanes.then_some(0),
    }
}

/// A node of the pair: its transport and the calls it answered.
struct Node {
    transport: RactorTransport,
    answered: Arc<AtomicU64>,
}

/// Starts a node on `at`; an address just left by a stopped node may
/// take a moment to be free again.
async fn start(
    me: &str,
    at: SocketAddr,
    lanes: bool,
    tls: Option<TlsFiles>,
    view: &watch::Receiver<Vec<Member>>,
) -> Node {
    let mut tries = 0;
    let transport = loop {
        match RactorTransport::start(settings(me, at, lanes, tls.clone()), view.clone()).await {
            Ok(transport) => break transport,
            Err(error) if tries < 50 => {
                tries += 1;
                eprintln!("{me} cannot start yet: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{me} cannot start: {error}"),
        }
    };
    let answered = Arc::new(AtomicU64::new(0));
    transport.serve_with(Arc::new(Counting(answered.clone())));
    Node { transport, answered }
}

/// Two node names no other test of this process uses (a node's gateway is
/// found by name in the process's `pg` groups).
fn names(test: &str) -> (String, String) {
    (format!("{test}-a"), format!("{test}-b"))
}

fn members((name_a, a): (&str, SocketAddr), (name_b, b): (&str, SocketAddr)) -> Vec<Member> {
    let member = |name: &str, at: SocketAddr| Member {
        name: NodeId::new(name),
        incarnation: "1".into(),
        advertise: at.to_string(),
        agents_started: true,
    };
    vec![member(name_a, a), member(name_b, b)]
}

/// One call to `peer`: the count its node answered with.
async fn ask(from: &RactorTransport, peer: &str) -> Result<u64, TransportError> {
    match from.call(&NodeId::new(peer), Request::Agents { command: AgentsCommand::State }).await? {
        Reply::Agents { result: Ok(report) } => Ok(report.running as u64),
        other => panic!("unexpected reply {other:?}"),
    }
}

/// `callers` tasks of `calls` calls each from `from` to `peer`; every one
/// must be answered.
async fn many(from: &RactorTransport, peer: &str, callers: usize, calls: usize) {
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (from, peer) = (from.clone(), peer.to_string());
            tokio::spawn(async move {
                for _ in 0..calls {
                    ask(&from, &peer).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// Calls `peer` until one call is answered: a session just made can still
/// be replaced (two dials crossing), which agents ride out by retrying.
async fn until_answered(from: &RactorTransport, peer: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Err(error) = ask(from, peer).await {
        assert!(error.is_transient(), "{error}");
        assert!(tokio::time::Instant::now() < deadline, "no answer from {peer} within 10 s: {error}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn laned(node: &Node, peer: &str) -> bool {
    node.transport.laned().contains(&NodeId::new(peer))
}

async fn linked_pair(
    (name_a, name_b): (&str, &str),
    a_lanes: bool,
    b_lanes: bool,
    tls: Option<(TlsFiles, TlsFiles)>,
) -> (Node, Node) {
    let (at_a, at_b) = (free_addr(), free_addr());
    let members = members((name_a, at_a), (name_b, at_b));
    let (tls_a, tls_b) = tls.map_or((None, None), |(a, b)| (Some(a), Some(b)));
    let (b_view, view) = watch::channel(members[1..].to_vec());
    let b = start(name_b, at_b, b_lanes, tls_b, &view).await;
    let (a_view, view) = watch::channel(members.clone());
    let a = start(name_a, at_a, a_lanes, tls_a, &view).await;
    a.transport.authenticate(&members[1..], Duration::from_secs(10)).await.unwrap();
    // The views live as long as the test (dropped, they would still read).
    std::mem::forget((a_view, b_view));
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_take_the_lane_once_it_opens_and_each_is_answered_once() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (na, nb) = names("taken");
    let (a, b) = linked_pair((&na, &nb), true, true, None).await;
    assert!(eventually(Duration::from_secs(10), || laned(&a, &nb)).await, "a opens a lane to b");
    many(&a.transport, &nb, 8, 250).await;
    assert_eq!(b.answered.load(Ordering::SeqCst), 2_000);
    assert!(laned(&a, &nb), "the lane carried them and is still open");
    a.transport.shutdown().await;
    b.transport.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_open_over_tls_between_nodes_of_one_authority() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let certs = tempfile::tempdir().unwrap();
    authority(certs.path(), "ca", &["a", "b"]);
    let files = |name: &str| TlsFiles {
        cert: certs.path().join(format!("{name}.pem")),
        key: certs.path().join(format!("{name}.key")),
        ca: certs.path().join("ca.pem"),
    };
    let (na, nb) = names("tls");
    let (a, b) = linked_pair((&na, &nb), true, true, Some((files("a"), files("b")))).await;
    assert!(eventually(Duration::from_secs(10), || laned(&a, &nb)).await, "a opens a lane to b");
    many(&a.transport, &nb, 4, 100).await;
    assert_eq!(b.answered.load(Ordering::SeqCst), 400);
    a.transport.shutdown().await;
    b.transport.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_lanes_off_is_called_over_the_session() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (na, nb) = names("off");
    let (a, b) = linked_pair((&na, &nb), true, false, None).await;
    until_answered(&a.transport, &nb).await;
    let before = b.answered.load(Ordering::SeqCst);
    many(&a.transport, &nb, 4, 100).await;
    // And after a asked b for a lane (b offers none).
    let peer = NodeId::new(&nb);
    assert!(eventually(Duration::from_secs(10), || a.transport.lane_failures(&peer) > 0).await, "a asked b");
    many(&a.transport, &nb, 4, 100).await;
    assert_eq!(b.answered.load(Ordering::SeqCst) - before, 800);
    assert!(!laned(&a, &nb), "b offers no lane");
    a.transport.shutdown().await;
    b.transport.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_goes_fails_calls_at_once_and_gets_a_new_lane_when_back() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (na, nb) = names("lives");
    let (at_a, at_b) = (free_addr(), free_addr());
    let members = members((&na, at_a), (&nb, at_b));
    let (a_view, view) = watch::channel(members.clone());
    let a = start(&na, at_a, true, None, &view).await;
    // b only answers: it does not dial a (see `linked_pair`).
    let (b_view, b_members) = watch::channel(members[1..].to_vec());
    let mut answered = 0;
    for life in 0..3 {
        let b = start(&nb, at_b, true, None, &b_members).await;
        a.transport.authenticate(&members[1..], Duration::from_secs(10)).await.unwrap();
        assert!(eventually(Duration::from_secs(10), || laned(&a, &nb)).await, "life {life}: a lane to b");
        many(&a.transport, &nb, 4, 50).await;
        assert_eq!(b.answered.load(Ordering::SeqCst), 200, "life {life}");
        answered += b.answered.load(Ordering::SeqCst);
        b.transport.shutdown().await;
        // Its lane closes with its session: a call fails, well before the
        // call timeout, as a link to retry (b is still a member).
        assert!(eventually(Duration::from_secs(5), || !laned(&a, &nb)).await, "life {life}: the lane closed");
        let started = tokio::time::Instant::now();
        let error = ask(&a.transport, &nb).await.unwrap_err();
        assert!(error.is_transient(), "life {life}: {error}");
        assert!(started.elapsed() < Duration::from_secs(2), "life {life}: failed at once, not at the timeout");
    }
    assert_eq!(answered, 600);
    a.transport.shutdown().await;
    drop((a_view, b_view));
}
