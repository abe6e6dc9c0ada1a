//! A `tailrace node` whose Redis goes away for a few seconds. Writes are
//! refused with `503` and `Retry-After` (never `500`: a backend that is
//! down for now is not a bug), saying the batch may have been stored and
//! that a retry with the same ids stores it once, which it does. Once Redis
//! answers again, the node reads its queues at once, not after the rest of
//! its read backoff (10–20 s). `/readyz` says the node is not ready, and
//! why, while Redis is down, and ready again once it is back; `/healthz`
//! (live) answers throughout.

use tailrace_testkit as common;

use std::time::Duration;

use common::cluster::Proc;
use common::logs::Sse;
use common::redis_server::RedisServer;
use tokio::time::Instant;

const FQN: &str = "svc.outage";

fn lines_path(run: &str) -> String {
    format!("/api/v1/logs/{FQN}/runs/{run}/lines")
}

async fn post(client: &reqwest::Client, node: &Proc, run: &str, body: &str) -> reqwest::Response {
    let request = client.post(node.url(&lines_path(run))).header("content-type", "application/x-ndjson");
    request.body(body.to_string()).send().await.unwrap()
}

async fn stored(client: &reqwest::Client, node: &Proc, run: &str) -> Vec<String> {
    let url = node.url(&format!("/api/v1/services/ingestionPipelines/logs/{FQN}/last/download?runId={run}"));
    client.get(url).send().await.unwrap().text().await.unwrap().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_writes_answer_503_with_retry_after_and_a_retry_stores_the_batch_once() {
    let client = common::http().timeout(Duration::from_secs(30)).build().unwrap();
    let mut server = RedisServer::start();
    let node = Proc::node(&server, "n1");
    assert_eq!(post(&client, &node, "r-1", "{\"line\":\"before\",\"id\":\"l-0\"}\n").await.status(), 202);
    server.stop();
    let batch = "{\"line\":\"during\",\"id\":\"l-1\"}\n";
    let refused = post(&client, &node, "r-1", batch).await;
    assert_eq!(refused.status(), 503, "a backend that is down for now is a 503");
    assert_eq!(refused.headers().get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    let message = refused.json::<serde_json::Value>().await.unwrap()["message"].as_str().unwrap().to_string();
    assert!(message.contains("may have been stored") && message.contains("same event ids"), "{message}");
    let status = client
        .put(node.url(&format!("/api/v1/logs/{FQN}/runs/r-1/status")))
        .json(&serde_json::json!({ "state": "success" }))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 503, "the status route too");
    assert!(status.headers().contains_key("retry-after"));

    tokio::task::block_in_place(|| server.restart());
    // The client retries the same batch (twice, as a client whose first
    // retry's answer was lost would): it is stored once.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut accepted = 0;
    while accepted < 2 {
        let answer = post(&client, &node, "r-1", batch).await;
        match answer.status().as_u16() {
            202 => accepted += 1,
            503 => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("a retry answered {other}: {}", answer.text().await.unwrap_or_default()),
        }
        assert!(Instant::now() < deadline, "no retry was accepted once Redis was back");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while stored(&client, &node, "r-1").await.len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stored(&client, &node, "r-1").await, ["before", "during"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_redis_answers_again_the_node_reads_within_a_second() {
    let client = common::http().build().unwrap();
    let mut server = RedisServer::start();
    let node = Proc::node(&server, "n1");
    assert_eq!(post(&client, &node, "r-1", "{\"line\":\"before\",\"id\":\"l-0\"}\n").await.status(), 202);
    let stream = node.url(&format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/r-1"));
    let mut viewer = Sse::open(&client, &stream).await;
    assert_eq!(viewer.event().await.unwrap()["logs"], "before");

    server.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // `restart` returns once the server answers a PING (not `LOADING`).
    tokio::task::block_in_place(|| server.restart());
    let back = Instant::now();
    let deadline = back + Duration::from_secs(60);
    loop {
        let answer = post(&client, &node, "r-1", "{\"line\":\"after\",\"id\":\"l-1\"}\n").await;
        if answer.status() == 202 {
            break;
        }
        assert_eq!(answer.status(), 503);
        assert!(Instant::now() < deadline, "no write was accepted once Redis was back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let accepted = back.elapsed();
    let event = viewer.event_within(Duration::from_secs(60)).await.unwrap();
    let took = back.elapsed();
    assert_eq!(event["logs"], "after");
    eprintln!("first delivery {took:?} after Redis answered PING (the write was accepted after {accepted:?})");
    assert!(took < Duration::from_secs(1), "the node read {took:?} after Redis was back");
}

async fn readyz(client: &reqwest::Client, node: &Proc) -> (u16, serde_json::Value) {
    let answer = client.get(node.url("/readyz")).send().await.unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_redis_while_it_is_down_and_is_ready_again_after() {
    let client = common::http().timeout(Duration::from_secs(30)).build().unwrap();
    let mut server = RedisServer::start();
    let node = Proc::node(&server, "n1");
    let (status, body) = readyz(&client, &node).await;
    assert_eq!((status, &body["ready"]), (200, &serde_json::json!(true)), "{body}");
    for check in ["stopping", "run log store", "queues", "archiver", "membership"] {
        assert_eq!(body["checks"][check], "ok", "{check}: {body}");
    }
    server.stop();
    let (status, body) = readyz(&client, &node).await;
    assert_eq!((status, &body["ready"]), (503, &serde_json::json!(false)), "{body}");
    let store = body["checks"]["run log store"].as_str().unwrap();
    let queues = body["checks"]["queues"].as_str().unwrap();
    assert!(store.starts_with("the run log store") && store != "ok", "{body}");
    assert!(queues.starts_with("the queues' backend") && queues != "ok", "{body}");
    let live = client.get(node.url("/healthz")).send().await.unwrap();
    assert_eq!(live.status(), 200, "alive while not ready");

    tokio::task::block_in_place(|| server.restart());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = readyz(&client, &node).await;
        if status == 200 {
            assert_eq!(body["ready"], true);
            break;
        }
        assert!(Instant::now() < deadline, "not ready again after Redis came back: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
