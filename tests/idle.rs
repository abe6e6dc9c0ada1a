//! Idle queues cost nothing and wake on a write: an agent whose queue is
//! empty sleeps on its receiver's wake instead of polling, and a write ends
//! the sleep. Lives of queues drained to empty and refilled, on the memory
//! adapter (paused time: ten idle minutes) and on Redis, one server or a
//! Redis Cluster (no command while idle, every event of many refills
//! delivered in order).

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::{RedisServer, adapter_options};
use common::*;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
use tailrace::queue::{QueueAdapter, QueueAdapterFactory};

const WAIT: Duration = Duration::from_secs(20);

/// Ten idle minutes cost a sleeping agent no read (one at most, when it
/// forgets its idle streams); each write wakes it, it delivers, and it
/// sleeps again, life after life.
#[tokio::test(start_paused = true)]
async fn an_idle_agent_sleeps_until_a_write_wakes_it() {
    let recorder = Recorder::new();
    let factory = Arc::new(MemoryAdapterFactory::new(1, MemoryOptions::default()));
    let node = TestNode::start(factory, quick_config(), implicit("idle", &recorder)).await;
    let s = stream("idle", "a");
    for life in 0..5u64 {
        // Asleep with everything acked (an ack may still take one pump).
        let asleep = node.wait_status(0, |status| status.asleep && status.cached == 0).await;
        tokio::time::sleep(Duration::from_secs(600)).await;
        let later = node.status(0).await;
        assert!(later.asleep, "life {life}: still asleep");
        // The one read allowed: forgetting idle streams once
        // `stream_inactivity` (30 min) passed.
        let reads = later.read_calls - asleep.read_calls;
        assert!(reads <= 1, "life {life}: {reads} reads in ten minutes while nothing was written");
        node.node.produce(&s, events("e", life * 10..life * 10 + 10)).await.unwrap();
        assert!(eventually(WAIT, || recorder.total() == (life as usize + 1) * 10).await, "life {life}");
    }
    assert_eq!(recorder.ids(&s), ids("e", 0..50));
}

/// Redis INFO commandstats, summed over the servers at `urls`: calls per
/// command.
async fn calls(urls: &[String]) -> std::collections::BTreeMap<String, u64> {
    let mut total = std::collections::BTreeMap::new();
    for url in urls {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let text: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.unwrap();
        for line in text.lines() {
            let Some((name, stats)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
            let Some(calls) = stats.split(',').find_map(|kv| kv.strip_prefix("calls=")?.parse::<u64>().ok()) else {
                continue;
            };
            *total.entry(name.to_string()).or_insert(0) += calls;
        }
    }
    total
}

/// Sixteen Redis queues drained and refilled forty times: between the
/// refills the sleeping agents send Redis no command at all, and every
/// write wakes its queue's agent, so every event arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_redis_queues_cost_no_command_and_every_refill_is_delivered() {
    let server = RedisServer::start();
    idle_life(adapter_options(&server), &[server.url()]).await;
}

/// The same on a Redis Cluster: each shard tells the process of writes to
/// the keys registered with it, so idle queues cost no command on any
/// master (replicas only see their master's replication stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_queues_on_a_redis_cluster_cost_no_command_either() {
    let cluster = common::redis_cluster::RedisCluster::start();
    // As on one server: trims at once, so no trim is due while idle.
    idle_life(cluster.adapter_options(), &cluster.masters()).await;
}

async fn idle_life(options: RedisOptions, servers: &[String]) {
    const QUEUES: u32 = 16;
    let factory = Arc::new(RedisAdapterFactory::connect(QUEUES, options).await.unwrap());
    let mapper = factory.queue_mapper();
    let recorder = Recorder::new();
    let node = TestNode::start(factory, quick_config(), implicit("idle", &recorder)).await;
    let streams: Vec<_> = (0..32).map(|i| stream("idle", &format!("s{i}"))).collect();
    let mut sent = vec![0u64; streams.len()];
    for round in 0..40usize {
        // All asleep: nothing was written since their last read.
        for q in 0..QUEUES {
            node.wait_status(q, |status| status.asleep).await;
        }
        if round % 10 == 0 {
            let before = calls(servers).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let after = calls(servers).await;
            let spent: Vec<_> = after
                .iter()
                // `info` is this test's; a replica acknowledges its offset to
                // its master every second (`replconf`): Redis', not ours.
                .filter(|(cmd, n)| !["info", "replconf"].contains(&cmd.as_str()) && before.get(*cmd) != Some(n))
                .map(|(cmd, n)| format!("{cmd}: {}", n - before.get(cmd).copied().unwrap_or(0)))
                .collect();
            assert!(spent.is_empty(), "round {round}: idle queues sent Redis {spent:?}");
        }
        // Refill a few streams (a different few each round).
        for i in (round % 4..streams.len()).step_by(4) {
            let first = sent[i];
            node.node.produce(&streams[i], events("e", first..first + 3)).await.unwrap();
            sent[i] += 3;
        }
        let want: usize = sent.iter().sum::<u64>() as usize;
        assert!(eventually(WAIT, || recorder.total() == want).await, "round {round}: {} of {want}", recorder.total());
    }
    for (i, s) in streams.iter().enumerate() {
        assert_eq!(recorder.ids(s), ids("e", 0..sent[i]), "stream {s} (queue {})", mapper.queue_for(s));
    }
}

/// A Redis user that may not run `CLIENT` cannot be told of writes: the
/// receivers find that out at their first wait and poll instead, so a queue
/// that went idle still delivers every refill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_client_command_idle_queues_poll_and_miss_nothing() {
    let acl = ["--user", "tailrace", "on", ">a-test-password", "~*", "&*", "+@all", "-client"];
    let server = RedisServer::start_with(&acl);
    let options = RedisOptions {
        username: Some("tailrace".into()),
        password: Some("a-test-password".into()),
        ..adapter_options(&server)
    };
    let factory = Arc::new(RedisAdapterFactory::connect(1, options).await.unwrap());
    let recorder = Recorder::new();
    let node = TestNode::start(factory, quick_config(), implicit("idle", &recorder)).await;
    let s = stream("idle", "a");
    for round in 0..5u64 {
        // Idle, and polling: twenty more empty reads since the last refill
        // (an agent waiting for a wake that never comes would stop here).
        let calls = node.status(0).await.read_calls;
        node.wait_status(0, |status| status.read_calls >= calls + 20).await;
        node.node.produce(&s, events("e", round * 3..round * 3 + 3)).await.unwrap();
        let want = (round as usize + 1) * 3;
        assert!(eventually(WAIT, || recorder.total() == want).await, "round {round}: {} of {want}", recorder.total());
    }
    assert_eq!(recorder.ids(&s), ids("e", 0..15));
}

/// A busy queue's reader often finds nothing for a moment between writes.
/// Such a read costs one `XRANGE` from its position, no script and nothing
/// else; after it the reader can wait for a write past that position: life
/// after life, a write ends the wait and the entry is read.
#[tokio::test]
async fn an_empty_read_is_one_range_and_an_idle_reader_wakes() {
    let server = RedisServer::start();
    // No trims: they would run a script.
    let options = RedisOptions { trim: tailrace::adapters::redis::TrimPolicy::Never, ..adapter_options(&server) };
    let factory = RedisAdapterFactory::connect(1, options).await.unwrap();
    let adapter = factory.adapter();
    let s = stream("t", "moment");
    let queue = tailrace::QueueId(0);
    let mut receiver = adapter.create_receiver(queue, tailrace::queue::Fence::NONE).await.unwrap();
    receiver.initialize(Duration::from_secs(5)).await.unwrap();
    let urls = [server.url()];
    for life in 0..3u64 {
        adapter.enqueue(&s, events("e", life..life + 1)).await.unwrap();
        let read = receiver.read(10).await.unwrap();
        assert_eq!(read_ids(&read), ids("e", life..life + 1));
        let before = calls(&urls).await;
        assert!(receiver.read(10).await.unwrap().is_empty(), "life {life}");
        let after = calls(&urls).await;
        let served: Vec<(String, u64)> = after
            .iter()
            .map(|(command, n)| (command.clone(), n - before.get(command).copied().unwrap_or(0)))
            // (not the counting's own connection)
            .filter(|(command, n)| {
                *n > 0 && !["info", "hello"].contains(&command.as_str()) && !command.starts_with("client")
            })
            .collect();
        assert_eq!(served, [("xrange".to_string(), 1)], "life {life}: the empty read");
        let wake = receiver.wake_on_write().expect("an idle reader has a wake");
        let write = enqueue_after(&adapter, &s, events("late", life..life + 1), Duration::from_millis(100));
        tokio::time::timeout(WAIT, wake).await.expect("the write ends the wait");
        write.await.unwrap();
        let read = receiver.read(10).await.unwrap();
        assert_eq!(read_ids(&read), ids("late", life..life + 1));
        receiver.delivered(&read.iter().map(|b| b.token).collect::<Vec<_>>()).await.unwrap();
    }
}

/// A queue that ran dry is polled only briefly before its agent sleeps on
/// the receiver's wake, life after life: a few reads `min_poll_period`
/// apart and doubling (1, 2, 4 ms), then asleep until a producer's write on
/// another connection ends the sleep. (Polling on with doubling delays up
/// to `poll_period` first took eight reads and 127 ms, and an event in that
/// stretch waited up to 63 ms for the next poll: the slow first line of a
/// quiet pipeline in `bench scale`, p99 58 ms.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_that_ran_dry_is_polled_briefly_then_sleeps_on_its_wake() {
    let server = RedisServer::start();
    let options = adapter_options(&server);
    let producer = RedisAdapterFactory::connect(1, options.clone()).await.unwrap().adapter();
    let factory = Arc::new(RedisAdapterFactory::connect(1, options).await.unwrap());
    let recorder = Recorder::new();
    let node = TestNode::start(factory, quick_config(), implicit("dry", &recorder)).await;
    let s = stream("dry", "a");
    node.wait_status(0, |status| status.asleep).await;
    for life in 0..20u64 {
        producer.enqueue(&s, events("e", life..life + 1)).await.unwrap();
        let delivered = node.wait_status(0, |status| status.events_delivered == life + 1).await;
        let asleep = node.wait_status(0, |status| status.asleep && status.cached == 0).await;
        let polls = asleep.read_calls - delivered.read_calls;
        assert!(polls <= 5, "life {life}: {polls} reads of a dry queue before its agent slept on the wake");
    }
    assert_eq!(recorder.ids(&s), ids("e", 0..20));
}
