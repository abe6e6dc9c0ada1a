//! Two cluster transports in one process, as two nodes see each other:
//! calls take the link once it opens (over mutual TLS too) and each is
//! answered once; a node with another cookie is refused, with the reason,
//! before it serves or sends anything; a peer that goes is reported lost
//! once (for the failure detector), fails calls at once, and on the same
//! address gets a new link.

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
use tailrace::cluster::{ClusterTransport, Member, Served, TcpTransport, TlsFiles, TransportError, TransportSettings};
use tokio::sync::watch;

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

fn settings(me: &str, listen: SocketAddr, cookie: &str, tls: Option<TlsFiles>) -> TransportSettings {
    TransportSettings {
        me: NodeId::new(me),
        listen,
        cookie: cookie.into(),
        call_timeout: Duration::from_secs(2),
        max_message_bytes: 1 << 20,
        max_inflight: 64,
        redial: Duration::from_millis(100),
        tls,
    }
}

/// A node: its transport and the calls it answered.
struct Node {
    transport: TcpTransport,
    answered: Arc<AtomicU64>,
}

/// Starts node `me` on `at`; an address just left by a stopped node may
/// take a moment to be free again.
async fn start(me: &str, at: SocketAddr, settings: TransportSettings, view: &watch::Receiver<Vec<Member>>) -> Node {
    let mut tries = 0;
    let transport = loop {
        match TcpTransport::start(settings.clone(), view.clone()).await {
            Ok(transport) => break transport,
            Err(error) if tries < 50 => {
                tries += 1;
                eprintln!("{me} cannot start on {at} yet: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{me} cannot start: {error}"),
        }
    };
    let answered = Arc::new(AtomicU64::new(0));
    transport.serve_with(Arc::new(Counting(answered.clone())));
    Node { transport, answered }
}

fn members(a: SocketAddr, b: SocketAddr) -> Vec<Member> {
    let member = |name: &str, at: SocketAddr| Member {
        name: NodeId::new(name),
        incarnation: "1".into(),
        advertise: at.to_string(),
        agents_started: true,
    };
    vec![member("a", a), member("b", b)]
}

/// One call to `peer`: the count its node answered with.
async fn ask(from: &TcpTransport, peer: &str) -> Result<u64, TransportError> {
    match from.call(&NodeId::new(peer), Request::Agents { command: AgentsCommand::State }).await? {
        Reply::Agents { result: Ok(report) } => Ok(report.running as u64),
        other => panic!("unexpected reply {other:?}"),
    }
}

/// `callers` tasks of `calls` calls each from `from` to `peer`; every one
/// must be answered.
async fn many(from: &TcpTransport, peer: &str, callers: usize, calls: usize) {
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

fn linked(node: &Node, peer: &str) -> bool {
    node.transport.connected().contains(&NodeId::new(peer))
}

/// Nodes `a` and `b`, each with a view of both, `a` authenticated with `b`.
async fn linked_pair(tls: Option<(TlsFiles, TlsFiles)>) -> (Node, Node, watch::Sender<Vec<Member>>) {
    let (at_a, at_b) = (free_addr(), free_addr());
    let members = members(at_a, at_b);
    let (tls_a, tls_b) = tls.map_or((None, None), |(a, b)| (Some(a), Some(b)));
    let (view_tx, view) = watch::channel(members.clone());
    let b = start("b", at_b, settings("b", at_b, COOKIE, tls_b), &view).await;
    let a = start("a", at_a, settings("a", at_a, COOKIE, tls_a), &view).await;
    a.transport.authenticate(&members[1..], Duration::from_secs(10)).await.unwrap();
    (a, b, view_tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_take_the_link_and_each_is_answered_once_both_ways() {
    let (a, b, _view) = linked_pair(None).await;
    assert!(linked(&a, "b"), "authenticated: a's link to b is open");
    many(&a.transport, "b", 8, 250).await;
    assert_eq!(b.answered.load(Ordering::SeqCst), 2_000);
    assert!(eventually(Duration::from_secs(10), || linked(&b, "a")).await, "b opens its own link to a");
    many(&b.transport, "a", 2, 50).await;
    assert_eq!(a.answered.load(Ordering::SeqCst), 100);
    assert!(linked(&a, "b"), "the link carried them and is still open");
    a.transport.shutdown().await;
    b.transport.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_open_over_tls_between_nodes_of_one_authority() {
    let certs = tempfile::tempdir().unwrap();
    authority(certs.path(), "ca", &["a", "b"]);
    let files = |name: &str| TlsFiles {
        cert: certs.path().join(format!("{name}.pem")),
        key: certs.path().join(format!("{name}.key")),
        ca: certs.path().join("ca.pem"),
    };
    let (a, b, _view) = linked_pair(Some((files("a"), files("b")))).await;
    many(&a.transport, "b", 4, 100).await;
    assert_eq!(b.answered.load(Ordering::SeqCst), 400);
    a.transport.shutdown().await;
    b.transport.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_cookie_is_refused_with_the_reason_and_reaches_nothing() {
    let (at_a, at_b) = (free_addr(), free_addr());
    let members = members(at_a, at_b);
    let (_view, view) = watch::channel(members.clone());
    let b = start("b", at_b, settings("b", at_b, COOKIE, None), &view).await;
    let other = "another-cookie-of-at-least-thirty-two-chars";
    let a = start("a", at_a, settings("a", at_a, other, None), &view).await;
    let refused = a.transport.authenticate(&members[1..], Duration::from_secs(10)).await.unwrap_err();
    assert!(matches!(refused, TransportError::Rejected { .. }), "{refused}");
    assert!(refused.to_string().starts_with("node b at 127.0.0.1:"), "{refused}");
    assert!(refused.to_string().contains("did not accept this node: the cluster cookie differs"), "{refused}");
    let error = ask(&a.transport, "b").await.unwrap_err();
    assert!(matches!(error, TransportError::NoLink(_)), "{error}");
    // Nor does b reach a: its handshake with a fails the same way.
    let error = ask(&b.transport, "a").await.unwrap_err();
    assert!(matches!(error, TransportError::NoLink(_)), "{error}");
    assert_eq!(a.answered.load(Ordering::SeqCst) + b.answered.load(Ordering::SeqCst), 0);
    a.transport.shutdown().await;
    b.transport.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_goes_is_reported_lost_fails_calls_at_once_and_gets_a_new_link_when_back() {
    let (at_a, at_b) = (free_addr(), free_addr());
    let members = members(at_a, at_b);
    let (_view, view) = watch::channel(members.clone());
    let a = start("a", at_a, settings("a", at_a, COOKIE, None), &view).await;
    let mut lost = a.transport.lost_links();
    let mut answered = 0;
    for life in 0..3 {
        let b = start("b", at_b, settings("b", at_b, COOKIE, None), &view).await;
        a.transport.authenticate(&members[1..], Duration::from_secs(10)).await.unwrap();
        many(&a.transport, "b", 4, 50).await;
        assert_eq!(b.answered.load(Ordering::SeqCst), 200, "life {life}");
        answered += b.answered.load(Ordering::SeqCst);
        b.transport.shutdown().await;
        // Its link closes with it: reported once, and a call fails well
        // before the call timeout, as one to retry (b is still a member).
        let gone = tokio::time::timeout(Duration::from_secs(5), lost.recv()).await;
        assert_eq!(gone.expect("reported within 5 s").unwrap(), NodeId::new("b"), "life {life}");
        assert!(!linked(&a, "b"), "life {life}: the link closed");
        let started = tokio::time::Instant::now();
        let error = ask(&a.transport, "b").await.unwrap_err();
        assert!(error.is_transient(), "life {life}: {error}");
        assert!(started.elapsed() < Duration::from_secs(2), "life {life}: failed at once, not at the timeout");
        assert!(lost.try_recv().is_err(), "life {life}: reported once");
    }
    assert_eq!(answered, 600);
    a.transport.shutdown().await;
}
