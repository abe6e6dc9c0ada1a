//! Failover between `tailrace node` processes on one private Redis, seen
//! from outside through the audit log (`[diagnostics]`), the admin API,
//! the metrics and the checkpoint keys:
//!
//! - an owner paused (SIGSTOP) past its lease ttl loses its queues to the
//!   other node, not sooner (a paused process is not evicted: the kernel
//!   still accepts the dial); once resumed it gives its leases up, a write
//!   under its old fencing token is refused, no checkpoint ever goes
//!   backwards, no grant is seen with two holders, and no produced event
//!   is lost;
//! - `tailrace-bench failover --quick` reports no loss.

use tailrace_testkit as common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::cluster::{LeaseWatch, Proc, QUEUES, config, free_port, held_by};
use common::redis_server::{RedisServer, adapter_options};
use tailrace::adapters::redis::RedisAdapterFactory;
use tailrace::archive::AuditLine;
use tailrace::queue::{CheckpointError, Fence, QueueAdapterFactory, QueueMapper};
use tailrace::{Event, EventId, QueueId, SequenceToken, StreamId};
use tokio_util::sync::CancellationToken;

const STREAMS: usize = 24;
const TTL: Duration = Duration::from_secs(6);
use common::cluster::SETTLE_WITHIN;

/// A node of the common test cluster, with the audit log on.
fn audited(redis: &RedisServer, name: &str, port: u16, audit: &std::path::Path) -> String {
    format!(
        "{}[diagnostics]\naudit_namespace = \"audit\"\naudit_path = \"{}\"\n",
        config(redis, name, port),
        audit.display()
    )
}

fn audit_lines(path: &std::path::Path) -> Vec<AuditLine> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // Only complete lines: a write may be under way.
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    text[..complete].lines().map(|l| AuditLine::parse(l).unwrap_or_else(|e| panic!("`{l}`: {e}"))).collect()
}

/// Polls `check` every 100 ms until it returns `Some` or `within` passes.
async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn parse_token(text: &str) -> Option<(u64, u64)> {
    let (major, minor) = text.split_once('-')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_is_fenced_and_loses_nothing() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // Both nodes append to one file (append mode, one write per delivery).
    let audit = dir.path().join("audit.jsonl");
    let (p1, p2) = (free_port(), free_port());
    let mut n1 = Proc::spawn("n1", p1, &audited(&server, "n1", p1, &audit), &["node"], &[]);
    let mut n2 = Proc::spawn("n2", p2, &audited(&server, "n2", p2, &audit), &["node"], &[]);
    n1.wait_serving();
    n2.wait_serving();
    let held = wait_for(SETTLE_WITHIN, "the queues split 3/3", || async {
        let held = n1.queue_holders().await?;
        (held_by(&held, "n1") == 3 && held_by(&held, "n2") == 3).then_some(held)
    })
    .await;
    // No grant is ever seen with two holders, no token goes back.
    let watch = LeaseWatch::start(&server);
    let victim_queues: HashSet<u32> =
        held.iter().filter(|(_, h)| h.as_deref() == Some("n2")).map(|(q, _)| *q as u32).collect();

    // Steady load: containers of two events, unique ids e{n}.
    let streams: Vec<StreamId> = (0..STREAMS).map(|i| StreamId::new("audit", format!("s{i}"))).collect();
    let mapper = QueueMapper::new(QUEUES);
    let victim_streams: HashSet<String> = streams
        .iter()
        .filter(|s| victim_queues.contains(&mapper.queue_for(s).0))
        .map(|s| s.key().to_string())
        .collect();
    let factory = RedisAdapterFactory::connect(QUEUES, adapter_options(&server)).await.unwrap();
    let adapter = factory.create_adapter().await.unwrap();
    let produced = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let producer = tokio::spawn({
        let (produced, stop, streams) = (produced.clone(), stop.clone(), streams.clone());
        async move {
            let mut container = 0;
            while !stop.is_cancelled() {
                let first = produced.load(Ordering::Relaxed);
                let events = (first..first + 2).map(|n| Event::new(EventId::new(format!("e{n}")), "x")).collect();
                adapter.enqueue(&streams[container % STREAMS], events).await.unwrap();
                produced.store(first + 2, Ordering::Relaxed);
                container += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    // Every queue's checkpoint, sampled until the end: it never goes back.
    let sampler = tokio::spawn({
        let (url, stop) = (server.url(), stop.clone());
        async move {
            let mut conn = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
            let mut last: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
            let (mut samples, mut regressions) = (0u64, Vec::new());
            while !stop.is_cancelled() {
                for queue in 0..QUEUES {
                    let key = format!("tailrace:{{q{queue}}}:checkpoint");
                    let value: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut conn).await.unwrap();
                    let Some(value) = value else { continue };
                    let token = parse_token(&value).unwrap_or_else(|| panic!("{key} holds `{value}`"));
                    samples += 1;
                    if let Some(previous) = last.insert(queue, token)
                        && token < previous
                    {
                        regressions.push((queue, previous, token));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (samples, regressions, last)
        }
    });

    wait_for(SETTLE_WITHIN, "deliveries of n2's queues by n2", || async {
        audit_lines(&audit).iter().any(|l| l.node == "n2" && victim_streams.contains(&l.stream)).then_some(())
    })
    .await;

    // n2's fencing tokens, as its writes carry them.
    let mut conn = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let mut old_tokens = BTreeMap::new();
    for queue in &victim_queues {
        let key = format!("tailrace:{{q{queue}}}:lease");
        let (holder, token): (Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(&key).arg("holder").arg("token").query_async(&mut conn).await.unwrap();
        assert_eq!(holder.as_deref(), Some("n2"), "{key}");
        old_tokens.insert(*queue, token.unwrap());
    }

    // Pause n2 past its leases' ttl: n1 takes its queues and delivers them.
    n2.signal("STOP");
    let paused = tokio::time::Instant::now();
    let produced_at_pause = produced.load(Ordering::Relaxed);
    wait_for(SETTLE_WITHIN, "n1 holds every queue", || async {
        let held = n1.queue_holders().await?;
        (held_by(&held, "n1") == QUEUES as usize).then_some(())
    })
    .await;
    assert!(paused.elapsed() >= TTL - Duration::from_secs(2), "n1 took live leases after {:?}", paused.elapsed());
    wait_for(SETTLE_WITHIN, "n1 delivers n2's queues", || async {
        audit_lines(&audit)
            .iter()
            .any(|l| {
                l.node == "n1"
                    && victim_streams.contains(&l.stream)
                    && l.event[1..].parse::<u64>().is_ok_and(|n| n >= produced_at_pause)
            })
            .then_some(())
    })
    .await;
    // Paused longer than the ttl in any case (9 s), then resumed.
    tokio::time::sleep_until(paused + TTL + Duration::from_secs(3)).await;
    n2.signal("CONT");

    // The resumed n2 writes under its old leases: refused by the fence.
    // The resumed n2 finds its leases lapsed before it writes again: each
    // agent is killed with no ack and no checkpoint.
    let lost = wait_for(Duration::from_secs(30), "n2 gives up the leases it held", || async {
        n2.metric_sum("tailrace_leases_lost_total", None).await.filter(|n| *n >= victim_queues.len() as f64)
    })
    .await;
    // A write it could still have had under way carries its old fencing
    // token: the fence refuses it, and the checkpoint does not move. The
    // test makes that write itself (a checkpoint far back, the worst one).
    let checkpoints = factory.create_checkpointer().await.unwrap();
    for (queue, token) in &old_tokens {
        let before = checkpoints.load(QueueId(*queue)).await.unwrap();
        let zombie = checkpoints.save(QueueId(*queue), SequenceToken::new(0, 1), Fence::lease(*token)).await;
        assert!(
            matches!(zombie, Err(CheckpointError::Fenced { .. })),
            "q{queue}: a write under n2's old token {token} was not refused: {zombie:?}"
        );
        assert_eq!(checkpoints.load(QueueId(*queue)).await.unwrap(), before, "q{queue}: the checkpoint moved");
    }
    let fenced = n2.metric_sum("tailrace_fenced_writes_total", None).await.unwrap_or(0.0);
    // It rejoins and gets its share again (it is alive and serving).
    wait_for(SETTLE_WITHIN, "the queues split 3/3 again", || async {
        let held = n1.queue_holders().await?;
        (held_by(&held, "n1") == 3 && held_by(&held, "n2") == 3).then_some(())
    })
    .await;
    // A little more load under the new split, then drain.
    let more = produced.load(Ordering::Relaxed) + 100;
    wait_for(Duration::from_secs(30), "100 more events produced", || async {
        (produced.load(Ordering::Relaxed) >= more).then_some(())
    })
    .await;
    stop.cancel();
    producer.await.unwrap();
    let produced = produced.load(Ordering::Relaxed);
    let seen = wait_for(SETTLE_WITHIN, "every produced event in the audit log", || async {
        let seen: HashSet<String> = audit_lines(&audit).into_iter().map(|l| l.event).collect();
        (0..produced).all(|n| seen.contains(&format!("e{n}"))).then_some(seen)
    })
    .await;
    assert!(seen.len() as u64 >= produced);
    let (samples, regressions, last) = sampler.await.unwrap();
    assert!(regressions.is_empty(), "checkpoints went backwards (queue, before, after): {regressions:?}");
    let used: HashSet<u32> = streams.iter().map(|s| mapper.queue_for(s).0).collect();
    assert!(used.iter().all(|q| last.contains_key(q)), "every queue in use has a checkpoint: {last:?}, used {used:?}");
    assert!(samples > 100, "too few checkpoint samples: {samples}");
    eprintln!(
        "n2 leases lost: {lost}, fenced writes counted: {fenced}; produced {produced}; checkpoint samples {samples}"
    );
    watch.check().await;
    drop((n1, n2));
}
