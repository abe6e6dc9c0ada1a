//! The HTTP edge: Prometheus can scrape a running node.

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::pubsub::{ImplicitSubscriptions, StartPosition};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test]
async fn metrics_are_scrapeable_and_count_what_the_runtime_did() {
    let handle = tailrace::edge::install_metrics().unwrap();
    let stop = CancellationToken::new();
    let (addr, server) =
        tailrace::edge::serve("127.0.0.1:0".parse().unwrap(), tailrace::edge::router(handle), stop.clone())
            .await
            .unwrap();
    let factory = Arc::new(MemoryAdapterFactory::new(2, MemoryOptions::default()));
    let node = TestNode::start(factory, quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("m", "a");
    node.agent(node.node.mapper().queue_for(&s).0).await;
    let recorder = Recorder::new();
    node.node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::Latest).await.unwrap();
    node.node.produce(&s, events("e", 0..7)).await.unwrap();
    assert!(eventually(Duration::from_secs(10), || recorder.total() == 7).await);
    let health = get(addr, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("{\"live\":true}"), "{health}");
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = get(addr, "/metrics").await;
        if metrics.contains("tailrace_agent_events_delivered_total") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(metrics.contains("text/plain; version=0.0.4"), "{metrics}");
    let queue = node.node.mapper().queue_for(&s);
    let delivered = format!("tailrace_agent_events_delivered_total{{queue=\"{queue}\"}} 7");
    assert!(metrics.contains(&delivered), "{delivered} not in\n{metrics}");
    assert!(metrics.contains("tailrace_agents_running{node=\"test\"} 2"), "{metrics}");
    stop.cancel();
    server.await.unwrap().unwrap();
}
