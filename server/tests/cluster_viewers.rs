//! Log viewers on a cluster of real `tailrace node` processes: every run
//! is watched over SSE on a node that does not pull its queue (the lines
//! reach the viewer's node over the cluster transport), lines are posted
//! through every node, and each viewer disconnects and resumes by cursor on
//! another node. An owner is killed with SIGKILL (and restarted), or leaves
//! with SIGTERM; every viewer's log must equal the run's stored log, line
//! for line, with no line twice, and the nodes' audit log must hold every
//! line posted. On a Redis Cluster the life ends with a `kill -9` of the
//! Redis master that serves the most queues while lines are posted: no
//! acknowledged line is lost or stored twice, and no queue's fence or
//! checkpoint goes back.

use tailrace_testkit as common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::cluster::*;
use common::logs::Sse;
use common::redis_server::RedisServer;
use tailrace::archive::{AuditLine, RunKey};
use tailrace::queue::QueueMapper;

const FQN: &str = "svc.cluster";
const RUNS: usize = 64;
const LINES_PER_POST: usize = 20;
/// How long a viewer may wait for its next frame: a dead owner's queues are
/// re-owned within the lease TTL (6 s here) plus an acquire period.
const FRAME_WAIT: Duration = Duration::from_secs(45);

fn run_id(run: usize) -> String {
    format!("run-{run}")
}

fn queue_of(run: usize) -> u64 {
    let key = RunKey::new(FQN, &run_id(run)).unwrap();
    u64::from(QueueMapper::new(QUEUES).queue_for(&key.stream()).0)
}

/// One browser tab: the lines it saw and its cursor.
struct Viewer {
    run: usize,
    lines: Vec<String>,
    after: Option<String>,
    sse: Option<Sse>,
}

impl Viewer {
    async fn open(&mut self, client: &reqwest::Client, node: &Proc) {
        // A node that did not accept the run's first write knows it once stored.
        node.wait_stored(FQN, &run_id(self.run)).await;
        let query = self.after.as_ref().map(|a| format!("?after={a}")).unwrap_or_default();
        let path = format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/{}{query}", run_id(self.run));
        let sse = Sse::open(client, &node.url(&path)).await;
        assert_eq!(sse.status, 200, "viewer of run {} on {}", self.run, node.name);
        self.sse = Some(sse);
    }

    /// Reads until it holds `total` lines.
    async fn read_to(&mut self, total: usize) {
        let sse = self.sse.as_mut().expect("open");
        while self.lines.len() < total {
            let event = sse.event_within(FRAME_WAIT).await.unwrap_or_else(|| {
                panic!("the stream of run {} ended at {} of {total} lines", self.run, self.lines.len())
            });
            match event["eventType"].as_str() {
                Some("logs") => {
                    assert_eq!(event["truncated"], false, "run {}: a resume by cursor is exact: {event}", self.run);
                    let text = event["logs"].as_str().unwrap();
                    if !text.is_empty() {
                        self.lines.extend(text.split('\n').map(str::to_string));
                    }
                    self.after = event["after"].as_str().map(str::to_string).or(self.after.take());
                }
                _ => panic!("run {}: unexpected event {event}", self.run),
            }
        }
        assert_eq!(self.lines.len(), total, "run {}: no line more than posted", self.run);
    }

    /// Closes the connection (the browser tab reloads).
    fn close(&mut self) {
        self.sse = None;
    }
}

/// Where lines are posted: a node's name and the base of its URLs.
type Target = (String, String);

fn targets(via: &[&Proc]) -> Vec<Target> {
    via.iter().map(|node| (node.name.clone(), node.url(""))).collect()
}

/// Posts the next `LINES_PER_POST` lines of every run through `via`
/// (round robin); `posted[run]` counts them. Each line carries its own
/// event id, so a post refused while Redis fails over is sent again as is
/// and stored once.
async fn post_round(client: &reqwest::Client, via: &[Target], posted: &mut [usize]) {
    for (run, count) in posted.iter_mut().enumerate() {
        let (name, base) = &via[run % via.len()];
        let body: String = (*count..*count + LINES_PER_POST)
            .map(|i| {
                let line = format!("run {run} line {i} via {name}");
                format!("{}\n", serde_json::json!({ "line": line, "id": format!("r{run}-l{i}") }))
            })
            .collect();
        let url = format!("{base}/api/v1/logs/{FQN}/runs/{}/lines", run_id(run));
        let deadline = tokio::time::Instant::now() + FRAME_WAIT;
        loop {
            let sent = client.post(&url).header("content-type", "application/x-ndjson").body(body.clone()).send().await;
            match sent {
                Ok(response) if response.status().is_success() => break,
                other => {
                    let why = match other {
                        Ok(response) => format!("{}: {}", response.status(), response.text().await.unwrap_or_default()),
                        Err(error) => error.to_string(),
                    };
                    assert!(tokio::time::Instant::now() < deadline, "post to {name} kept failing: {why}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        *count += LINES_PER_POST;
    }
}

/// The run's stored log, as the download endpoint of `node` serves it.
async fn stored(client: &reqwest::Client, node: &Proc, run: usize) -> Vec<String> {
    let url = node.url(&format!("/api/v1/services/ingestionPipelines/logs/{FQN}/last/download?runId={}", run_id(run)));
    let text = client.get(url).send().await.unwrap().text().await.unwrap();
    text.lines().map(str::to_string).collect()
}

/// Each viewer's log is the stored log, every line once, in order.
async fn every_viewer_matches_the_store(client: &reqwest::Client, node: &Proc, viewers: &[Viewer], posted: &[usize]) {
    for viewer in viewers {
        let expected: Vec<String> =
            (0..posted[viewer.run]).map(|i| format!("run {} line {i} via ", viewer.run)).collect();
        // The archive follows the viewers: wait until it caught up.
        let deadline = tokio::time::Instant::now() + FRAME_WAIT;
        let mut store = stored(client, node, viewer.run).await;
        while store.len() < expected.len() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store = stored(client, node, viewer.run).await;
        }
        assert_eq!(store.len(), expected.len(), "run {}: every line posted is stored, once", viewer.run);
        for (line, prefix) in store.iter().zip(&expected) {
            assert!(line.starts_with(prefix), "run {}: stored {line:?} where {prefix:?}… was due", viewer.run);
        }
        let differ = store.iter().zip(&viewer.lines).position(|(a, b)| a != b);
        assert!(
            store == viewer.lines,
            "run {}: the viewer's log equals the stored log; first difference at {differ:?}: {:?} stored, {:?} seen",
            viewer.run,
            differ.map(|i| &store[i]),
            differ.map(|i| &viewer.lines[i])
        );
    }
}

/// A node other than the holder of the run's queue and other than `avoid`.
fn viewer_node(held: &BTreeMap<u64, (String, u64)>, run: usize, names: &[&str], avoid: &str) -> usize {
    let owner = &held[&queue_of(run)].0;
    let pick = names.iter().enumerate().filter(|(_, n)| *n != owner && **n != avoid).map(|(i, _)| i).nth(run % 2);
    pick.or_else(|| names.iter().position(|n| n != owner && *n != avoid)).expect("a non-owner node")
}

async fn life(server: &mut impl Backing, graceful: bool) {
    let client = common::http_client();
    let names = ["n1", "n2", "n3"];
    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    // These runs report no status, and a run quiet for
    // `unknown_run_grace_seconds` ends its viewers' streams (`runFinished`,
    // OpenMetadata's rule). A Redis master's failover on a loaded machine
    // once held a run's lines back longer than the 60 s default; that rule
    // is not what this life checks.
    let audit = format!(
        "[diagnostics]\naudit_namespace = \"logs\"\naudit_path = \"{}\"\n[edge.log_stream]\nunknown_run_grace_seconds = 600.0\n",
        audit_path.display()
    );
    let mut nodes: Vec<Proc> = names.iter().map(|n| Proc::node_with(&*server, n, &audit)).collect();
    let held = settle(&nodes[0], &[("n1", 2), ("n2", 2), ("n3", 2)]).await;
    // n1 is the node that dies; no viewer watches from it.
    let mut viewers: Vec<Viewer> =
        (0..RUNS).map(|run| Viewer { run, lines: Vec::new(), after: None, sse: None }).collect();
    let mut posted = vec![0usize; RUNS];
    post_round(&client, &targets(&nodes.iter().collect::<Vec<_>>()), &mut posted).await;
    for viewer in &mut viewers {
        let at = viewer_node(&held, viewer.run, &names, "n1");
        viewer.open(&client, &nodes[at]).await;
    }
    post_round(&client, &targets(&nodes.iter().collect::<Vec<_>>()), &mut posted).await;
    for viewer in &mut viewers {
        viewer.read_to(posted[viewer.run]).await;
    }

    // The owner of two queues goes away; lines keep coming through the others.
    if graceful {
        nodes[0].signal("TERM");
        assert!(nodes[0].wait_exit().success(), "{}", nodes[0].log_text());
    } else {
        nodes[0].signal("KILL");
        let _ = nodes[0].wait_exit();
    }
    let survivors = targets(&[&nodes[1], &nodes[2]]);
    post_round(&client, &survivors, &mut posted).await;
    for viewer in &mut viewers {
        viewer.read_to(posted[viewer.run]).await;
    }
    settle(&nodes[1], &[("n2", 3), ("n3", 3)]).await;

    // Every viewer reloads and resumes by cursor on the other survivor.
    for viewer in &mut viewers {
        viewer.close();
    }
    post_round(&client, &survivors, &mut posted).await;
    let held = settle(&nodes[1], &[("n2", 3), ("n3", 3)]).await;
    for viewer in &mut viewers {
        let at = viewer_node(&held, viewer.run, &names, "n1");
        viewer.open(&client, &nodes[at]).await;
        viewer.read_to(posted[viewer.run]).await;
    }

    // n1 comes back under its name and takes its share again.
    nodes[0] = Proc::node_with(&*server, "n1", &audit);
    let held = settle(&nodes[1], &[("n1", 2), ("n2", 2), ("n3", 2)]).await;
    post_round(&client, &targets(&nodes.iter().collect::<Vec<_>>()), &mut posted).await;
    for viewer in &mut viewers {
        viewer.read_to(posted[viewer.run]).await;
    }

    // The Redis master that serves the most queues is killed while lines
    // are posted (on a Redis Cluster: its replica takes over; every write
    // was confirmed by it). Fences and checkpoints never go back.
    let before = queue_marks(&*server).await;
    let producers = tokio::spawn({
        let (client, via, mut posted) = (client.clone(), targets(&nodes.iter().collect::<Vec<_>>()), posted.clone());
        async move {
            for _ in 0..2 {
                post_round(&client, &via, &mut posted).await;
            }
            posted
        }
    });
    let failed = tokio::task::block_in_place(|| server.fail_over_busiest());
    posted = match producers.await {
        Ok(posted) => posted,
        Err(error) => {
            let logs: Vec<String> = nodes.iter().map(|n| format!("{}:\n{}", n.name, n.log_text())).collect();
            panic!("posting through {failed:?}: {error}\n{}", logs.join("\n"));
        }
    };
    for viewer in &mut viewers {
        viewer.read_to(posted[viewer.run]).await;
    }
    let after = queue_marks(&*server).await;
    for (queue, (was, is)) in before.iter().zip(&after).enumerate() {
        assert!(is.0 >= was.0 && is.1 >= was.1, "queue {queue} went back after {failed:?}: {was:?} then {is:?}");
    }
    assert!(after.iter().all(|(fence, _)| fence.is_some()), "every queue was leased: {after:?}");
    every_viewer_matches_the_store(&client, &nodes[2], &viewers, &posted).await;
    let lines: usize = posted.iter().sum();
    assert_eq!(lines, RUNS * LINES_PER_POST * 7);
    // Every line was delivered to the owners' audit consumers (a kill may
    // have delivered some twice: at least once; a graceful leave, once).
    let entries: Vec<(String, String)> = std::fs::read_to_string(&audit_path)
        .unwrap()
        .split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n')) // a line still being written is not one yet
        .map(|l| AuditLine::parse(l).unwrap())
        .map(|a| (a.stream, a.event))
        .collect();
    let audited: HashSet<&(String, String)> = entries.iter().collect();
    assert_eq!(audited.len(), lines, "the audit log holds every line posted, once per event id");
    if graceful {
        assert_eq!(entries.len(), lines, "a graceful leave delivers no event twice");
    }
    // A run ends: its status is stored by the archiver of the run's owner,
    // and the edge it was put through (not the owner) is told at once.
    let run = (0..RUNS).find(|&run| held[&queue_of(run)].0 != "n1").expect("n1 does not own every queue");
    let path = format!("/api/v1/logs/{FQN}/runs/{}/status", run_id(run));
    let put = client.put(nodes[0].url(&path)).json(&serde_json::json!({ "state": "success" })).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let answer: serde_json::Value = put.json().await.unwrap();
    assert_eq!(answer["stored"], true, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_on_other_nodes_lose_nothing_when_an_owner_is_killed() {
    life(&mut RedisServer::start(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_on_other_nodes_see_every_line_once_when_an_owner_leaves() {
    life(&mut RedisServer::start(), true).await;
}

/// The same life on a Redis Cluster (three masters, three replicas,
/// `wait_replicas = 1`), ending with a `kill -9` of the master that serves
/// the most queues while lines are posted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_viewers_lose_nothing_through_a_node_kill_and_a_master_failover() {
    life(&mut common::redis_cluster::RedisCluster::start(), false).await;
}
