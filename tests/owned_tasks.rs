//! Every task the library spawns belongs to a node or an edge, and
//! stopping either one waits for them: once a node's `shutdown` or an
//! edge's server task returned, none of their tasks runs any more.

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::logs::{Sse, quick_settings};
use common::*;
use tailrace::Node;
use tailrace::NodeId;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::archive::{Archiver, FileRunLogStore, LOGS_NAMESPACE};
use tailrace::config::EdgeOptions;
use tailrace::edge::LogEdge;
use tailrace::pubsub::{ImplicitSubscriptions, StartPosition};
use tokio::io::AsyncWriteExt;

/// A guard against a hang, well above the stop bound (2 s, the bound of
/// `Node::shutdown` and of the edge's server task); never waited out when
/// the code is right.
const HANG: Duration = Duration::from_secs(30);

/// A node's shutdown returns only once its ownership driver, its manager's
/// helpers and its agents' pumps and work lanes all ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_shutdown_leaves_none_of_its_tasks_running() {
    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let recorder = Recorder::new();
    let node = Node::builder(NodeId::new("owner"), factory).config(quick_config()).start().await.unwrap();
    let events = stream("orders", "o-1");
    node.subscribe(&events, Arc::new(recorder.clone()), StartPosition::EarliestAvailable).await.unwrap();
    node.produce(&events, common::events("e", 0..20)).await.unwrap();
    assert!(eventually(Duration::from_secs(10), || recorder.total() == 20).await, "delivered");
    // The driver, and a pump task or a work lane per running agent.
    assert!(node.tracked_tasks() >= 5, "{} tasks while running", node.tracked_tasks());

    tokio::time::timeout(HANG, node.shutdown()).await.expect("shutdown returns").unwrap();
    assert_eq!(node.tracked_tasks(), 0, "every task of the node ended before shutdown returned");
}

/// With a viewer connected (its tailer running), a connection that never
/// sent its request head, and the heartbeat sweep, cancelling the edge's
/// stop ends the viewer's stream and the server task returns with no task
/// of the edge left; the node then shuts down clean, the tailer's
/// unsubscribe included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_edge_ends_its_streams_and_leaves_none_of_its_tasks_running() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FileRunLogStore::open(dir.path().join("runs"), false).unwrap());
    let factory = Arc::new(MemoryAdapterFactory::new(2, MemoryOptions::default()));
    let archiver = Archiver::new(store);
    let implicit = ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone());
    let node = Arc::new(
        Node::builder(NodeId::new("edge"), factory).config(quick_config()).implicit(implicit).start().await.unwrap(),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let options = EdgeOptions { log_stream: quick_settings(), ..EdgeOptions::default() };
    let edge = LogEdge::new(node.clone(), archiver, options, stop.clone());
    let (bound, server) = edge.serve("127.0.0.1:0".parse().unwrap(), axum::Router::new(), stop.clone()).await.unwrap();
    let base = format!("http://{bound}");
    let client = common::http_client();

    let posted = client
        .post(format!("{base}/api/v1/logs/svc.etl/runs/r-1/lines"))
        .header("content-type", "text/plain")
        .body("first line\n")
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    let url = format!("{base}/api/v1/services/ingestionPipelines/logs/svc.etl/stream/r-1");
    let mut viewer = Sse::open(&client, &url).await;
    assert_eq!(viewer.status, 200);
    assert_eq!(viewer.event().await.unwrap()["logs"], "first line");
    let mut silent = tokio::net::TcpStream::connect(bound).await.unwrap();
    silent.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    assert_eq!(edge.active_runs(), 1);
    // The tailer, the viewer's connection and the silent one.
    assert!(
        eventually(Duration::from_secs(10), || edge.tracked_tasks() >= 3).await,
        "{} tasks while serving",
        edge.tracked_tasks()
    );

    stop.cancel();
    tokio::time::timeout(HANG, server).await.expect("the server task returns").unwrap().unwrap();
    assert_eq!(edge.tracked_tasks(), 0, "every task of the edge ended before its server task returned");
    assert_eq!(edge.active_runs(), 0);
    assert!(viewer.rest().await.is_empty(), "the viewer's stream ended");

    tokio::time::timeout(HANG, node.shutdown()).await.expect("shutdown returns").unwrap();
    assert_eq!(node.tracked_tasks(), 0);
}
