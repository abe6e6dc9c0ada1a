//! The links between the nodes of a cluster of real processes: a node with
//! the wrong cookie is refused by the live members and takes nothing; a
//! link cut under load heals, and what was delivered across it meanwhile
//! arrives late, never dead-lettered.

use tailrace_testkit as common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::*;
use common::logs::Sse;
use common::redis_server::RedisServer;
use common::tcp_proxy::TcpProxy;
use tailrace::archive::RunKey;
use tailrace::queue::QueueMapper;

const FQN: &str = "svc.links";

/// The sum of a metric's samples (whose labels contain `label`) on `node`.
async fn metric(node: &Proc, name: &str, label: Option<&str>) -> f64 {
    node.metric_sum(name, label).await.expect("the node answers /metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_the_wrong_cookie_is_refused_and_takes_no_lease() {
    let server = RedisServer::start();
    let mut conn = redis(&server).await;
    let n1 = Proc::node(&server, "n1");
    let n2 = Proc::node(&server, "n2");
    settle(&n1, &[("n1", 3), ("n2", 3)]).await;
    let wrong = Link { cookie: "another-cookie-of-at-least-32-characters", ..Link::default() };
    let mut intruder = Proc::start_linked(&server, "n3", &wrong);
    let status = intruder.wait_exit();
    let log = intruder.log_text();
    assert!(!status.success(), "a refused node exits with an error:\n{log}");
    assert!(log.contains("did not accept this node") && log.contains("cookie"), "{log}");
    assert!(log.contains("node n1") || log.contains("node n2"), "the refusal names the peer:\n{log}");
    let held = settle(&n1, &[("n1", 3), ("n2", 3)]).await;
    leases_in_redis_match(&mut conn, &held).await;
    assert!(!member_exists(&mut conn, "n3").await, "the refused node left the membership");
    assert!(held.values().all(|(holder, _)| holder != "n3"));
    drop(n2);
}

/// A viewer of one run, reading until it holds `total` lines.
async fn read_to(sse: &mut Sse, lines: &mut Vec<String>, total: usize) {
    while lines.len() < total {
        let event = sse.event_within(Duration::from_secs(45)).await.expect("the stream goes on");
        assert_eq!(event["eventType"], "logs", "{event}");
        let text = event["logs"].as_str().unwrap();
        if !text.is_empty() {
            lines.extend(text.split('\n').map(str::to_string));
        }
    }
    assert_eq!(lines.len(), total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_heals_and_nothing_is_dead_lettered() {
    let server = RedisServer::start();
    let client = common::http_client();
    // Each node is reached by the other only through its proxy.
    let (l1, l2) = (free_port(), free_port());
    let (p1, p2) = (TcpProxy::start(l1).await, TcpProxy::start(l2).await);
    let link = |listen: u16, proxy: &TcpProxy| Link {
        listen,
        advertise: Some(format!("127.0.0.1:{}", proxy.port)),
        ..Link::default()
    };
    let nodes = [Proc::node_linked(&server, "n1", &link(l1, &p1)), Proc::node_linked(&server, "n2", &link(l2, &p2))];
    let held = settle(&nodes[0], &[("n1", 3), ("n2", 3)]).await;
    // Eight runs, each watched from the node that does not pull it.
    let runs: Vec<String> = (0..8).map(|r| format!("run-{r}")).collect();
    let mapper = QueueMapper::new(QUEUES);
    let watcher = |run: &str| {
        let queue = mapper.queue_for(&RunKey::new(FQN, run).unwrap().stream()).0;
        usize::from(held[&u64::from(queue)].0 == "n1")
    };
    let mut posted: BTreeMap<String, usize> = runs.iter().map(|r| (r.clone(), 0)).collect();
    let post = |posted: &mut BTreeMap<String, usize>| {
        let mut calls = Vec::new();
        for (i, (run, count)) in posted.iter_mut().enumerate() {
            let body: String = (*count..*count + 25).map(|n| format!("{run} line {n}\n")).collect();
            let url = nodes[i % 2].url(&format!("/api/v1/logs/{FQN}/runs/{run}/lines"));
            calls.push(client.post(url).header("content-type", "text/plain").body(body).send());
            *count += 25;
        }
        futures::future::join_all(calls)
    };
    for answer in post(&mut posted).await {
        assert!(answer.unwrap().status().is_success());
    }
    let mut viewers = Vec::new();
    for run in &runs {
        let path = format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/{run}");
        nodes[watcher(run)].wait_stored(FQN, run).await;
        let mut sse = Sse::open(&client, &nodes[watcher(run)].url(&path)).await;
        let mut lines = Vec::new();
        read_to(&mut sse, &mut lines, posted[run]).await;
        viewers.push((run.clone(), sse, lines));
    }

    let failed_calls = || async {
        let mut failed = 0.0;
        for node in &nodes {
            for outcome in ["outcome=\"link\"", "outcome=\"timeout\""] {
                failed += metric(node, "tailrace_transport_calls_total", Some(outcome)).await;
            }
        }
        failed
    };
    let failed_before = failed_calls().await;
    // The link goes down; lines keep coming on both sides.
    assert!(p1.cut().await + p2.cut().await > 0, "the nodes were linked through the proxies");
    for answer in post(&mut posted).await {
        assert!(answer.unwrap().status().is_success());
    }
    // Calls across the cut fail (and are retried) before it is mended.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if failed_calls().await > failed_before {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no call crossed the cut");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p1.mend();
    p2.mend();
    for (run, sse, lines) in &mut viewers {
        read_to(sse, lines, posted[run.as_str()]).await;
        let expected: Vec<String> = (0..posted[run.as_str()]).map(|n| format!("{run} line {n}")).collect();
        assert_eq!(*lines, expected, "{run}: every line once, in order, after the link healed");
    }
    for node in &nodes {
        assert_eq!(metric(node, "tailrace_agent_dead_letters_total", None).await, 0.0, "{}", node.log_text());
        // Both stayed alive and reachable at their addresses: the cut
        // evicted nobody and moved no queue (same holders, same tokens).
        assert_eq!(metric(node, "tailrace_nodes_evicted_total", None).await, 0.0, "{}", node.log_text());
    }
    assert_eq!(settle(&nodes[0], &[("n1", 3), ("n2", 3)]).await, held, "a cut link moved no queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_viewer_subscriptions_are_purged() {
    let server = RedisServer::start();
    let mut conn = redis(&server).await;
    let client = common::http_client();
    let n1 = Proc::node(&server, "n1");
    let mut n2 = Proc::node(&server, "n2");
    settle(&n1, &[("n1", 3), ("n2", 3)]).await;
    let post = n1.url(&format!("/api/v1/logs/{FQN}/runs/run-1/lines"));
    let answer = client.post(post).header("content-type", "text/plain").body("one\n").send().await.unwrap();
    assert!(answer.status().is_success());
    let path = format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/run-1");
    n2.wait_stored(FQN, "run-1").await;
    let mut sse = Sse::open(&client, &n2.url(&path)).await;
    let mut lines = Vec::new();
    read_to(&mut sse, &mut lines, 1).await;
    let index = "tailrace:subs-of:n2";
    let stored = || async {
        let mut conn = redis(&server).await;
        redis::cmd("SCARD").arg(index).query_async::<u64>(&mut conn).await.unwrap()
    };
    assert_eq!(stored().await, 1, "the viewer's node has one stored subscription");

    n2.signal("KILL");
    let _ = n2.wait_exit();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while stored().await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the dead node's subscription stays:\n{}", n1.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let key = format!("tailrace:subs:4:logs:{FQN}/run-1");
    let left: Vec<String> = redis::cmd("HVALS").arg(&key).query_async(&mut conn).await.unwrap();
    assert!(left.iter().all(|s| !s.contains("\"n2\"")), "{left:?}");
    assert_eq!(metric(&n1, "tailrace_purged_subscriptions_total", None).await, 1.0);
}
