//! `tailrace serve` on a disk that fills up or fails, not only one that
//! loses power: its data directory on the test file system of
//! `testkit/src/powercut.rs`, told to answer every write `ENOSPC` (its
//! `statfs` then shows no room), every write `EIO`, or every `fsync` `EIO`.
//!
//! While the disk fails, a batch is refused (`503` with `Retry-After`, never
//! `202`), a full disk says so (and how much room is left) and shows in
//! `/metrics`; `/healthz` and reads keep answering. Once the disk takes
//! writes again, the next batch is accepted without a restart, and every
//! run's log holds each acknowledged batch once, in order, and none of the
//! refused ones: what a failed write or sync left in a file was cut off
//! before anything read it.

use tailrace_testkit as common;

use common::life::{Client, Model, Outcome, ServeNode};
use common::powercut::PowerCutFs;

const LINES: u32 = 20;

/// Posts the next batch of `run`; its status, `Retry-After` and body.
async fn post(node: &ServeNode, model: &Model, run: u32) -> (u16, Option<String>, String) {
    let (_, body) = model.next(run, LINES);
    let url = node.url(&format!("/api/v1/logs/life/runs/run-{run}/lines"));
    let answer =
        common::http_client().post(url).header("content-type", "application/x-ndjson").body(body).send().await.unwrap();
    let retry = answer.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (answer.status().as_u16(), retry, answer.text().await.unwrap())
}

/// Posts `n` batches that must be accepted.
async fn accepted(node: &ServeNode, model: &mut Model, run: u32, n: usize) {
    for _ in 0..n {
        let (status, _, body) = post(node, model, run).await;
        assert_eq!(status, 202, "{body}");
        model.record(run, LINES, Outcome::Acked);
    }
}

/// While the disk fails as `fail` makes it: a batch is refused with a
/// retryable answer whose message `says`; then, mended, the next batch is
/// accepted at once. Returns the refused batch's number.
async fn refused_then_mended(node: &ServeNode, model: &mut Model, fail: impl Fn(bool), says: &[&str]) -> usize {
    fail(true);
    let (batch, _) = model.next(0, LINES);
    let (status, retry, body) = post(node, model, 0).await;
    assert_eq!(status, 503, "a batch the disk did not take is refused for now: {body}");
    assert_eq!(retry.as_deref(), Some("1"), "{body}");
    for word in says {
        assert!(body.contains(word), "`{word}` in {body}");
    }
    model.record(0, LINES, Outcome::Maybe);
    let live = common::http_client().get(node.url("/healthz")).send().await.unwrap();
    assert_eq!(live.status(), 200, "alive while the disk fails");
    let page = node.url("/api/v1/services/ingestionPipelines/logs/life/last?runId=run-0");
    let read = common::http_client().get(page).send().await.unwrap();
    assert_eq!(read.status(), 200, "reads keep answering");
    fail(false);
    accepted(node, model, 0, 1).await;
    batch
}

/// `tailrace serve` with its data directory on the test file system (one
/// queue: every batch goes through the same writer); `None` where FUSE
/// cannot be mounted (the test then skips, saying why).
fn serving_on_the_test_disk() -> Option<(tempfile::TempDir, std::path::PathBuf, PowerCutFs, ServeNode)> {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let fs = PowerCutFs::mount_or_skip(&mnt)?;
    let mut node = ServeNode::with_data_dir("[queues]\ncount = 1\n", mnt.join("data"));
    node.start();
    Some((dir, mnt, fs, node))
}

async fn metric(node: &ServeNode, name: &str) -> f64 {
    let text = common::http_client().get(node.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_or_failing_disk_refuses_clearly_keeps_what_was_acknowledged_and_recovers_without_a_restart() {
    let Some((_dir, mnt, fs, mut node)) = serving_on_the_test_disk() else { return };
    let mut model = Model::default();
    accepted(&node, &mut model, 0, 5).await;
    // Stored before the disk fails: there is something to read meanwhile.
    let client = Client::new(&node);
    client.drained(&model).await.unwrap();

    let mut refused = Vec::new();
    let full = |on: bool| fs.fail_writes(on.then_some(libc::ENOSPC));
    refused.push(refused_then_mended(&node, &mut model, full, &["disk", "is full", "free", "nothing was"]).await);
    assert_eq!(metric(&node, "tailrace_queue_disk_full").await, 0.0, "the gauge falls back once it took writes");
    accepted(&node, &mut model, 0, 3).await;
    let broken = |on: bool| fs.fail_writes(on.then_some(libc::EIO));
    refused.push(refused_then_mended(&node, &mut model, broken, &["retry"]).await);
    accepted(&node, &mut model, 0, 2).await;
    let unsynced = |on: bool| fs.fail_fsync(on);
    refused.push(refused_then_mended(&node, &mut model, unsynced, &["retry"]).await);
    accepted(&node, &mut model, 0, 3).await;

    let drained = client.drained(&model).await;
    let log = client.log(0).await;
    if let Err(why) = &drained {
        let q0 = mnt.join("data/queues/q0");
        let mut files: Vec<String> = std::fs::read_dir(&q0)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let firsts: Vec<&str> = text.lines().filter(|l| l.contains("l0/")).collect();
                format!("{:?} {} bytes {:?}", e.file_name(), text.len(), firsts)
            })
            .collect();
        files.sort();
        panic!("{why}\n{}\n{}", files.join("\n"), node.log_tail());
    }
    for batch in refused {
        let first = common::life::line(0, batch, 0, LINES);
        assert!(!log.contains(&first), "refused batch {batch} reached the log");
    }
    assert_eq!(log.len() as u64, model.acked_lines(), "every acknowledged line once, and nothing else");
    node.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_shows_in_the_metrics_while_it_lasts() {
    let Some((_dir, _mnt, fs, mut node)) = serving_on_the_test_disk() else { return };
    let mut model = Model::default();
    accepted(&node, &mut model, 0, 1).await;
    fs.fail_writes(Some(libc::ENOSPC));
    let (status, _, body) = post(&node, &model, 0).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("0 bytes free"), "the free space, as statfs says: {body}");
    assert_eq!(metric(&node, "tailrace_queue_disk_full").await, 1.0);
    fs.fail_writes(None);
    node.stop();
}
