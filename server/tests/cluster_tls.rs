//! Nodes that talk TLS (`[cluster.tls]`): with certificates from the
//! cluster's authority they link up, each with a link to the other, and
//! deliver across nodes; a node whose
//! certificate comes from another authority is refused (even with the
//! right cookie) and takes no lease. Certificates are made with `openssl`.

use tailrace_testkit as common;

use std::path::Path;
use std::time::Duration;

use common::certs::authority;
use common::cluster::*;
use common::logs::Sse;
use common::redis_server::RedisServer;
use tailrace::archive::RunKey;
use tailrace::queue::QueueMapper;

const FQN: &str = "svc.tls";

fn tls_node(server: &RedisServer, name: &str, dir: &Path, ca: &str) -> Proc {
    let port = free_port();
    let text = format!(
        "{}[cluster.tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n",
        config(server, name, port),
        dir.join(format!("{name}.pem")).display(),
        dir.join(format!("{name}.key")).display(),
        dir.join(format!("{ca}.pem")).display()
    );
    Proc::spawn(name, port, &text, &["node"], &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_link_over_tls_and_a_node_of_another_authority_is_refused() {
    let certs = tempfile::tempdir().unwrap();
    authority(certs.path(), "cluster-ca", &["n1", "n2"]);
    authority(certs.path(), "other-ca", &["n3"]);
    let server = RedisServer::start();
    let client = common::http_client();
    let mut n1 = tls_node(&server, "n1", certs.path(), "cluster-ca");
    n1.wait_serving();
    let mut n2 = tls_node(&server, "n2", certs.path(), "cluster-ca");
    n2.wait_serving();
    let held = settle(&n1, &[("n1", 3), ("n2", 3)]).await;
    // Each has its link to the other, over TLS.
    for node in [&n1, &n2] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while node.metric_sum("tailrace_transport_links", None).await != Some(1.0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no link from {} within 20 s:\n{}",
                node.name,
                node.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // A run watched from the node that does not pull it: its lines cross TLS.
    let run = "run-1";
    let queue = QueueMapper::new(QUEUES).queue_for(&RunKey::new(FQN, run).unwrap().stream()).0;
    let watcher = if held[&u64::from(queue)].0 == "n1" { &n2 } else { &n1 };
    let url = n1.url(&format!("/api/v1/logs/{FQN}/runs/{run}/lines"));
    let body: String = (0..50).map(|i| format!("line {i}\n")).collect();
    assert!(
        client.post(url).header("content-type", "text/plain").body(body).send().await.unwrap().status().is_success()
    );
    let path = format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/{run}");
    watcher.wait_stored(FQN, run).await;
    let mut sse = Sse::open(&client, &watcher.url(&path)).await;
    let mut lines = Vec::new();
    while lines.len() < 50 {
        let event = sse.event_within(Duration::from_secs(30)).await.expect("the stream goes on");
        lines.extend(event["logs"].as_str().unwrap().split('\n').map(str::to_string));
    }
    assert_eq!(lines, (0..50).map(|i| format!("line {i}")).collect::<Vec<_>>());

    // The right cookie is not enough without the cluster's authority.
    let mut stranger = tls_node(&server, "n3", certs.path(), "other-ca");
    let status = stranger.wait_exit();
    let log = stranger.log_text();
    assert!(!status.success(), "{log}");
    assert!(log.contains("did not accept this node"), "{log}");
    let held = settle(&n1, &[("n1", 3), ("n2", 3)]).await;
    assert!(held.values().all(|(holder, _)| holder != "n3"));
}
