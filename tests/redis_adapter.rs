//! The `redis` adapter against a real redis-server on loopback: the
//! conformance kit, a new owner starting at the checkpoint (and, on what an
//! older release left, where its consumer group stopped), rewind and
//! trimming, the Redis checkpointer and pub-sub store, and surviving a
//! Redis restart.

use tailrace_testkit as common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::*;
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions, TrimPolicy};
use tailrace::pubsub::{PubSubStore, StartPosition};
use tailrace::queue::{Fence, QueueAdapter, QueueAdapterFactory, QueueError, QueueReceiver};
use tailrace::{QueueId, SequenceToken};

const WAIT: Duration = Duration::from_secs(20);

fn options(server: &RedisServer) -> RedisOptions {
    redis_server::adapter_options(server)
}

async fn factory(server: &RedisServer) -> Arc<RedisAdapterFactory> {
    redis_server::adapter_factory(server).await
}

/// The whole kit: durable (a fresh factory reconnects to the same server),
/// rewindable with trimming to the checkpoint; not bounded, and two
/// receivers of one queue share the group rather than fence each other.
#[tokio::test]
async fn passes_the_conformance_kit() {
    let server = RedisServer::start();
    let report = redis_server::redis_kit(options(&server)).await;
    println!("{report}");
    assert_eq!(report.checks_run(), 15, "{report}");
}

/// The same kit on a Redis Cluster (three masters, three replicas): every
/// command, pipeline and script of the adapter stays in one queue's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_kit_on_a_redis_cluster() {
    let cluster = common::redis_cluster::RedisCluster::start();
    let report = redis_server::redis_kit(cluster.adapter_options()).await;
    println!("{report}");
    assert_eq!(report.checks_run(), 15, "{report}");
}

/// A Redis Cluster that asks for a password: the adapter passes the kit
/// with the password set in `[adapters.redis]`, and a wrong one is refused
/// at connect, naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_with_a_password_takes_it_from_the_setting_and_refuses_a_wrong_one() {
    let cluster = common::redis_cluster::RedisCluster::start_with_password("cluster-s3cret");
    let options = RedisOptions { password: Some("cluster-s3cret".into()), ..cluster.adapter_options() };
    let report = redis_server::redis_kit(options.clone()).await;
    assert_eq!(report.checks_run(), 15, "{report}");
    let wrong = RedisOptions { password: Some("not-it".into()), ..options };
    let error = RedisAdapterFactory::connect(2, wrong).await.err().expect("a wrong password is refused");
    let text = error.to_string();
    assert!(text.contains("[adapters.redis] password") && !text.contains("not-it"), "{text}");
}

/// With `wait_replicas = 1` an append is acknowledged only once a replica
/// has it: every acknowledged batch survives a `kill -9` of its queue's
/// master (its replica takes over). Without a replica to confirm, an append
/// is refused as transient, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_appends_survive_a_master_failover_with_wait_replicas() {
    let mut cluster = common::redis_cluster::RedisCluster::start();
    let on_cluster = RedisOptions { wait_replicas: 1, ..cluster.adapter_options() };
    let factory = RedisAdapterFactory::connect(2, on_cluster.clone()).await.unwrap();
    let adapter = factory.adapter();
    let s = stream("t", "failover");
    let queue = factory.queue_mapper().queue_for(&s);
    for i in 0..50 {
        adapter.enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }
    let master = cluster.master_of(&format!("{{q{}}}:stream", queue.0));
    cluster.kill(master);
    // A new node reads the queue from the promoted replica.
    let fresh = RedisAdapterFactory::connect(2, on_cluster).await.unwrap();
    let mut receiver = fresh.adapter().create_receiver(queue, Fence::NONE).await.unwrap();
    receiver.initialize(Duration::from_secs(10)).await.unwrap();
    let mut read = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while read.len() < 50 && tokio::time::Instant::now() < deadline {
        for batch in receiver.read(100).await.unwrap() {
            read.extend(batch.events.iter().map(|e| e.id.to_string()));
        }
    }
    assert_eq!(read, ids("e", 0..50), "every acknowledged append, once, in order");

    // One server, no replica: refused, transient, with the reason.
    let server = RedisServer::start();
    let lonely = RedisOptions { wait_replicas: 1, wait_timeout: Duration::from_millis(100), ..options(&server) };
    let factory = RedisAdapterFactory::connect(2, lonely).await.unwrap();
    let error = factory.adapter().enqueue(&s, events("e", 0..1)).await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains("0 of 1 replicas had the batch within 100ms"), "{error}");
}

/// A queue's slot moves to another master (a reshard: its keys migrate
/// while the node reads and producers write, so commands meet `ASK` and
/// `TRYAGAIN`): every event is delivered, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_of_a_queues_slot_loses_and_repeats_nothing() {
    let cluster = common::redis_cluster::RedisCluster::start();
    let options = RedisOptions { url: cluster.seeds()[0].clone(), cluster: true, ..Default::default() };
    let factory = Arc::new(RedisAdapterFactory::connect(2, options).await.unwrap());
    let s = stream("t", "reshard");
    let queue = factory.queue_mapper().queue_for(&s);
    let adapter = factory.adapter();
    let recorder = Recorder::new();
    let node = TestNode::start(factory, quick_config(), implicit("t", &recorder)).await;
    node.node.produce(&s, events("e", 0..50)).await.unwrap();
    assert!(eventually(WAIT, || recorder.total() == 50).await, "{} of 50 before the move", recorder.total());
    let producer = tokio::spawn({
        let s = s.clone();
        async move {
            for i in 50..150u64 {
                // Transient refusals while the slot moves are retried.
                while adapter.enqueue(&s, events("e", i..i + 1)).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let stream_key = format!("tailrace:{{q{}}}:stream", queue.0);
    let to = cluster
        .masters()
        .iter()
        .map(|m| m.rsplit(':').next().unwrap().parse::<u16>().unwrap())
        .find(|p| *p != cluster.master_of(&stream_key))
        .unwrap();
    tokio::task::block_in_place(|| cluster.move_slot_of(&stream_key, to));
    producer.await.unwrap();
    assert_eq!(cluster.master_of(&stream_key), to, "the queue's slot moved");
    assert!(eventually(WAIT, || recorder.total() == 150).await, "{} of 150", recorder.total());
    assert_eq!(recorder.ids(&s), ids("e", 0..150), "every event once, in order");
}

#[tokio::test]
async fn a_new_owner_starts_after_the_checkpoint() {
    let server = RedisServer::start();
    let (old, new) = (factory(&server).await, factory(&server).await);
    let s = stream("t", "a");
    let queue = old.queue_mapper().queue_for(&s);
    let adapter = old.adapter();
    for i in 0..4 {
        adapter.enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }
    let mut first = adapter.create_receiver(queue, Fence::NONE).await.unwrap();
    first.initialize(Duration::from_secs(5)).await.unwrap();
    let read = first.read(10).await.unwrap();
    assert_eq!(read.len(), 4);
    old.create_checkpointer().await.unwrap().save(queue, read[0].token, Fence::NONE).await.unwrap();
    drop(first); // node-a dies with three entries read past its checkpoint
    let mut second = new.adapter().create_receiver(queue, Fence::NONE).await.unwrap();
    second.initialize(Duration::from_secs(5)).await.unwrap();
    let taken: Vec<SequenceToken> = second.read(10).await.unwrap().iter().map(|b| b.token).collect();
    assert_eq!(taken, read[1..].iter().map(|b| b.token).collect::<Vec<_>>(), "nothing stranded, in order");
    second.delivered(&taken).await.unwrap();
    assert!(second.read(10).await.unwrap().is_empty());
}

/// What an older release that read through a consumer group left: entries
/// acked, entries pending (read, not acked), entries never read, and no
/// checkpoint, or one. This release starts where the group stopped (its
/// first entry not acked) or at the checkpoint, and loses nothing.
#[tokio::test]
async fn a_queue_an_older_release_read_through_a_consumer_group_goes_on_from_where_it_stopped() {
    let server = RedisServer::start();
    let f = factory(&server).await;
    let s = stream("t", "upgraded");
    let queue = f.queue_mapper().queue_for(&s);
    let adapter = f.adapter();
    let key = adapter.key(queue);
    let mut tokens = Vec::new();
    for i in 0..8 {
        tokens.push(adapter.enqueue(&s, events("e", i..i + 1)).await.unwrap());
    }
    let raw = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let run = |cmd: &redis::Cmd| {
        let (cmd, mut raw) = (cmd.clone(), raw.clone());
        async move { cmd.query_async::<redis::Value>(&mut raw).await.unwrap() }
    };
    // The older release: its group read six entries, acked the first two
    // and the fourth; the third, fifth and sixth stay pending.
    run(redis::cmd("XGROUP").arg("CREATE").arg(&key).arg("tailrace").arg("0")).await;
    run(redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("tailrace")
        .arg("old-node")
        .arg("COUNT")
        .arg(6)
        .arg("STREAMS")
        .arg(&key)
        .arg(">"))
    .await;
    for acked in [0, 1, 3] {
        run(redis::cmd("XACK").arg(&key).arg("tailrace").arg(tokens[acked].to_string())).await;
    }
    let read_all = |f: Arc<RedisAdapterFactory>| async move {
        let mut receiver = f.adapter().create_receiver(queue, Fence::NONE).await.unwrap();
        receiver.initialize(Duration::from_secs(5)).await.unwrap();
        let got: Vec<SequenceToken> = receiver.read(100).await.unwrap().iter().map(|b| b.token).collect();
        got
    };
    assert_eq!(read_all(f.clone()).await, tokens[2..], "from the first entry not acked; the fourth again");

    // All six acked: from the first entry the group never read.
    for acked in [2, 4, 5] {
        run(redis::cmd("XACK").arg(&key).arg("tailrace").arg(tokens[acked].to_string())).await;
    }
    assert_eq!(read_all(f.clone()).await, tokens[6..], "what the group never read");

    // A checkpoint is where the agent's deliveries were: it wins.
    f.create_checkpointer().await.unwrap().save(queue, tokens[4], Fence::NONE).await.unwrap();
    assert_eq!(read_all(f.clone()).await, tokens[5..], "after the checkpoint");
}

#[tokio::test]
async fn trimming_never_passes_the_checkpoint_and_rewinds_say_what_is_gone() {
    let server = RedisServer::start();
    let f = factory(&server).await;
    let adapter = f.adapter();
    let s = stream("t", "trim");
    let queue = f.queue_mapper().queue_for(&s);
    let mut tokens = Vec::new();
    for i in 0..6 {
        tokens.push(adapter.enqueue(&s, events("e", i..i + 1)).await.unwrap());
    }
    let mut receiver = adapter.create_receiver(queue, Fence::NONE).await.unwrap();
    receiver.initialize(Duration::from_secs(5)).await.unwrap();
    let read = receiver.read(10).await.unwrap();
    f.create_checkpointer().await.unwrap().save(queue, tokens[3], Fence::NONE).await.unwrap();
    receiver.delivered(&read.iter().map(|b| b.token).collect::<Vec<_>>()).await.unwrap();
    // Entries below the checkpoint are gone; the checkpoint's own and later stay.
    let err = receiver.rewind(tokens[1], 10).await.unwrap_err();
    assert!(matches!(err, QueueError::CannotRewind { .. }) && err.to_string().contains("trimmed"), "{err}");
    let kept: Vec<SequenceToken> = receiver.rewind(tokens[3], 10).await.unwrap().iter().map(|b| b.token).collect();
    assert_eq!(kept, tokens[3..]);
}

#[tokio::test]
async fn with_trimming_off_every_entry_stays() {
    let server = RedisServer::start();
    let f = Arc::new(
        RedisAdapterFactory::connect(1, RedisOptions { trim: TrimPolicy::Never, ..options(&server) }).await.unwrap(),
    );
    let adapter = f.adapter();
    let s = stream("t", "keep");
    let first = adapter.enqueue(&s, events("e", 0..1)).await.unwrap();
    adapter.enqueue(&s, events("e", 1..2)).await.unwrap();
    let mut receiver = adapter.create_receiver(QueueId(0), Fence::NONE).await.unwrap();
    receiver.initialize(Duration::from_secs(5)).await.unwrap();
    let read = receiver.read(10).await.unwrap();
    f.create_checkpointer().await.unwrap().save(QueueId(0), read[1].token, Fence::NONE).await.unwrap();
    receiver.delivered(&[read[0].token, read[1].token]).await.unwrap();
    assert_eq!(receiver.rewind(first, 10).await.unwrap().len(), 2);
}

#[tokio::test]
async fn checkpoints_and_subscriptions_are_shared_through_redis() {
    let server = RedisServer::start();
    let (a, b) = (factory(&server).await, factory(&server).await);
    let checkpoints_a = a.create_checkpointer().await.unwrap();
    checkpoints_a.save(QueueId(1), SequenceToken::new(1_700_000_000_000, 3), Fence::NONE).await.unwrap();
    assert_eq!(
        b.create_checkpointer().await.unwrap().load(QueueId(1)).await.unwrap(),
        Some(SequenceToken::new(1_700_000_000_000, 3))
    );
    // Node b builds its backend from configuration, as `tailrace serve` does.
    let mut config = tailrace::config::Config::default();
    config.queues.adapter = "redis".into();
    config.adapters.redis.url = server.url();
    config.pubsub.max_subscriptions_per_stream = 2;
    let built = tailrace::backend::build(&config, None).await.unwrap();
    assert_eq!(built.factory.name(), "redis");
    let (store_a, store_b) = (a.pubsub_store(2), built.store.expect("redis shares its pub-sub store"));
    shared_subscriptions(&store_a, store_b.as_ref()).await;
}

/// On a Redis Cluster (reached through a list of seeds whose first is
/// down): checkpoints, and subscriptions whose stream hash and node index
/// live in different slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_and_subscriptions_are_shared_through_a_redis_cluster() {
    let cluster = common::redis_cluster::RedisCluster::start();
    // Seeds, comma-separated: the first one answers nothing, the next does.
    let url = format!("redis://127.0.0.1:{},{}", common::free_port(), cluster.seeds()[0]);
    let options = RedisOptions { url, cluster: true, ..Default::default() };
    let a = RedisAdapterFactory::connect(8, options.clone()).await.unwrap();
    let b = RedisAdapterFactory::connect(8, options).await.unwrap();
    let token = SequenceToken::new(1_700_000_000_000, 3);
    a.create_checkpointer().await.unwrap().save(QueueId(5), token, Fence::NONE).await.unwrap();
    assert_eq!(b.create_checkpointer().await.unwrap().load(QueueId(5)).await.unwrap(), Some(token));
    shared_subscriptions(&a.pubsub_store(2), &b.pubsub_store(2)).await;
}

/// Two nodes' stores see one set of subscriptions, bounded per stream,
/// and a dead node's go with it.
async fn shared_subscriptions(store_a: &dyn PubSubStore, store_b: &dyn PubSubStore) {
    let s = stream("logs", "p:1/run");
    let subscription = |node: &str| tailrace::pubsub::Subscription {
        id: tailrace::pubsub::SubscriptionId::random(),
        stream: s.clone(),
        consumer: tailrace::pubsub::ConsumerAddress { node: tailrace::NodeId::new(node), name: "x".into() },
        start: StartPosition::Latest,
        state: tailrace::pubsub::SubscriptionState::Active,
    };
    let sub = subscription("a");
    store_a.upsert(sub.clone()).await.unwrap();
    assert_eq!(store_b.subscriptions(&s).await.unwrap(), std::slice::from_ref(&sub));
    let second = subscription("b");
    store_b.upsert(second.clone()).await.unwrap();
    let refused = store_a.upsert(subscription("c")).await.unwrap_err();
    assert!(refused.to_string().contains("pubsub.max_subscriptions_per_stream"), "{refused}");
    store_a.upsert(sub.clone()).await.expect("replacing a stored subscription is not a new one");
    assert!(store_a.remove(&s, second.id).await.unwrap());
    assert!(store_b.subscriptions(&stream("logs:p", "1/run")).await.unwrap().is_empty(), "keys never collide");
    store_b.fault(&s, sub.id, "boom").await.unwrap();
    assert!(
        matches!(&store_a.subscriptions(&s).await.unwrap()[0].state, tailrace::pubsub::SubscriptionState::Faulted(r) if r == "boom")
    );
    assert!(store_a.remove(&s, sub.id).await.unwrap());
    assert!(store_b.subscriptions(&s).await.unwrap().is_empty());

    // A dead node's subscriptions go with it, and only its.
    let (of_a, of_b) = (subscription("a"), subscription("b"));
    store_a.upsert(of_a).await.unwrap();
    store_a.upsert(of_b.clone()).await.unwrap();
    let other = tailrace::pubsub::Subscription { stream: stream("logs", "p:2/run"), ..subscription("a") };
    store_b.upsert(other.clone()).await.unwrap();
    assert_eq!(store_b.remove_node(&tailrace::NodeId::new("a")).await.unwrap(), 2);
    assert_eq!(store_a.subscriptions(&s).await.unwrap(), [of_b]);
    assert!(store_a.subscriptions(&other.stream).await.unwrap().is_empty());
    assert_eq!(store_b.remove_node(&tailrace::NodeId::new("a")).await.unwrap(), 0, "nothing twice");
}

/// A node keeps delivering through a Redis restart: appends during the
/// outage fail with a transient error and are retried by the producer;
/// everything acknowledged is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_run_loses_nothing() {
    let mut server = RedisServer::start();
    let f = factory(&server).await;
    let adapter = f.adapter();
    let recorder = Recorder::new();
    let mut config = quick_config();
    config.agent.reader_backoff = tailrace::config::Backoff::fixed(Duration::from_millis(100));
    let node = TestNode::start(f.clone(), config, implicit("t", &recorder)).await;
    let s = stream("t", "restart");
    let mut acked = BTreeSet::new();
    for i in 0..300u64 {
        if i == 150 {
            server.restart();
        }
        enqueue_retrying(adapter.as_ref(), &s, events("e", i..i + 1), Duration::from_secs(60)).await;
        acked.insert(format!("e{i}"));
    }
    let delivered = || recorder.ids(&s).into_iter().collect::<BTreeSet<_>>();
    assert!(
        eventually(WAIT, || delivered().is_superset(&acked)).await,
        "lost: {:?}",
        acked.difference(&delivered()).take(5).collect::<Vec<_>>()
    );
    node.node.shutdown().await.unwrap();
}

/// A server and a receiver after one empty read, with one entry appended
/// since.
async fn one_entry_after_an_empty_read(key: &str) -> (RedisServer, Box<dyn QueueReceiver>) {
    let server = RedisServer::start();
    let f = factory(&server).await;
    let s = stream("t", key);
    let queue = f.queue_mapper().queue_for(&s);
    let adapter = f.adapter();
    let mut receiver = adapter.create_receiver(queue, Fence::NONE).await.unwrap();
    receiver.initialize(Duration::from_secs(5)).await.unwrap();
    assert!(receiver.read(10).await.unwrap().is_empty());
    adapter.enqueue(&s, events("e", 0..1)).await.unwrap();
    (server, receiver)
}

/// A read whose reply is lost with the connection moved nothing: the next
/// read asks again from the same position and gets the entry.
#[tokio::test]
async fn an_entry_whose_read_lost_its_reply_is_read_again() {
    let (server, mut receiver) = one_entry_after_an_empty_read("lost-reply").await;
    // The receiver's connection drops.
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut errors = 0;
    for _ in 0..50 {
        match receiver.read(10).await {
            Ok(batch) => got.extend(batch.iter().flat_map(|b| b.events.iter().map(|e| e.id.to_string()))),
            Err(error) => {
                assert!(error.is_transient(), "{error}");
                errors += 1;
            }
        }
        if !got.is_empty() {
            break;
        }
    }
    assert!(errors > 0, "the dropped connection showed as an error");
    assert_eq!(got, ["e0"]);
}

/// The producer's retry loop: transient errors (Redis restarting) are
/// retried; returns once the append was acknowledged.
async fn enqueue_acked(adapter: &dyn QueueAdapter, s: &tailrace::StreamId, range: std::ops::Range<u64>) {
    for i in range {
        loop {
            match adapter.enqueue(s, events("e", i..i + 1)).await {
                Ok(_) => break,
                Err(error) if error.is_transient() => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(error) => panic!("{error}"),
            }
        }
    }
}

async fn all_delivered(recorder: &Recorder, s: &tailrace::StreamId, range: std::ops::Range<u64>) {
    let want: BTreeSet<String> = ids("e", range).into_iter().collect();
    let delivered = || recorder.ids(s).into_iter().collect::<BTreeSet<_>>();
    assert!(
        eventually(WAIT, || delivered().is_superset(&want)).await,
        "lost: {:?}",
        want.difference(&delivered()).take(5).collect::<Vec<_>>()
    );
}

async fn start_node(server: &RedisServer, recorder: &Recorder) -> (Arc<RedisAdapterFactory>, TestNode) {
    let f = factory(server).await;
    let mut config = quick_config();
    config.agent.reader_backoff = tailrace::config::Backoff::fixed(Duration::from_millis(100));
    let node = TestNode::start(f.clone(), config, implicit("t", recorder)).await;
    (f, node)
}

/// Redis restarted without its data (no persistence, a flush, the key
/// deleted) under a running node: the stream and its consumer group are
/// gone, producers append to a new stream, and the node creates the group
/// again and delivers it from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_lost_everything_under_a_running_node_is_read_again() {
    let mut server = RedisServer::start();
    let recorder = Recorder::new();
    let (f, node) = start_node(&server, &recorder).await;
    let adapter = f.adapter();
    let s = stream("t", "wiped");
    enqueue_acked(adapter.as_ref(), &s, 0..50).await;
    all_delivered(&recorder, &s, 0..50).await;
    server.restart_empty();
    enqueue_acked(adapter.as_ref(), &s, 50..100).await;
    all_delivered(&recorder, &s, 50..100).await;
    assert_eq!(recorder.ids(&s), ids("e", 0..100), "each once, in order");
    node.node.shutdown().await.unwrap();
}

/// Redis came back without its latest writes (`appendfsync everysec`, a
/// lagging replica promoted): its stream, group position and checkpoint
/// went back in time under a running node. What it re-reads is skipped as
/// already delivered, what is appended next is delivered, and so it is
/// after the node restarts on the rolled-back checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_lost_its_latest_writes_skips_nothing_new() {
    let mut server = RedisServer::start();
    let recorder = Recorder::new();
    let (f, node) = start_node(&server, &recorder).await;
    let adapter = f.adapter();
    let s = stream("t", "rolled-back");
    enqueue_acked(adapter.as_ref(), &s, 0..50).await;
    all_delivered(&recorder, &s, 0..50).await;
    let snapshot = server.snapshot();
    enqueue_acked(adapter.as_ref(), &s, 50..100).await;
    all_delivered(&recorder, &s, 50..100).await;
    server.restart_from(&snapshot);
    enqueue_acked(adapter.as_ref(), &s, 100..150).await;
    all_delivered(&recorder, &s, 100..150).await;
    assert_eq!(recorder.ids(&s), ids("e", 0..150), "nothing twice while running");
    node.node.shutdown().await.unwrap();

    let second = Recorder::new();
    let (_, node) = start_node(&server, &second).await;
    enqueue_acked(adapter.as_ref(), &s, 150..200).await;
    all_delivered(&second, &s, 150..200).await;
    node.node.shutdown().await.unwrap();
}

/// The stored checkpoint is past every id the stream ever generated: the
/// history it counted was lost (the key deleted or evicted, writes lost)
/// and the server numbers new entries from a clock behind the one that
/// numbered the old ones. New entries must still be delivered, not taken
/// for old ones and skipped (or trimmed away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_past_the_streams_ids_hides_no_new_entry() {
    let server = RedisServer::start();
    let f = factory(&server).await;
    let s = stream("t", "ahead");
    let queue = f.queue_mapper().queue_for(&s);
    let ahead = SequenceToken::new(std::time::UNIX_EPOCH.elapsed().unwrap().as_millis() as u64 + 86_400_000, 0);
    f.create_checkpointer().await.unwrap().save(queue, ahead, Fence::NONE).await.unwrap();
    let recorder = Recorder::new();
    let node = TestNode::start(f.clone(), quick_config(), implicit("t", &recorder)).await;
    // The agent's first pump (its receiver's start) is over: it found
    // nothing and sleeps.
    node.wait_status(queue.0, |status| status.asleep).await;
    let token = f.adapter().enqueue(&s, events("e", 0..3)).await.unwrap();
    assert!(token > ahead, "the entry was numbered {token}, at or below the checkpoint {ahead}");
    all_delivered(&recorder, &s, 0..3).await;
    node.node.shutdown().await.unwrap();
}

/// Entries trimmed away before a new owner starts (by hand here; the
/// owner only trims up to the checkpoint) do not stall it: it reads the
/// rest.
#[tokio::test]
async fn entries_trimmed_before_a_new_owner_starts_do_not_stall_it() {
    let server = RedisServer::start();
    let f = factory(&server).await;
    let s = stream("t", "trimmed-pending");
    let queue = f.queue_mapper().queue_for(&s);
    let adapter = f.adapter();
    let mut tokens = Vec::new();
    for i in 0..4 {
        tokens.push(adapter.enqueue(&s, events("e", i..i + 1)).await.unwrap());
    }
    let mut first = adapter.create_receiver(queue, Fence::NONE).await.unwrap();
    first.initialize(Duration::from_secs(5)).await.unwrap();
    assert_eq!(first.read(10).await.unwrap().len(), 4);
    drop(first); // dies without a checkpoint
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let trimmed: u64 = redis::cmd("XTRIM")
        .arg(adapter.key(queue))
        .arg("MINID")
        .arg(tokens[2].to_string())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(trimmed, 2);
    let mut next = factory(&server).await.adapter().create_receiver(queue, Fence::NONE).await.unwrap();
    next.initialize(Duration::from_secs(5)).await.unwrap();
    let got: Vec<SequenceToken> = next.read(10).await.unwrap().iter().map(|b| b.token).collect();
    assert_eq!(got, tokens[2..]);
}

/// A read cancelled while the server held it (the agent bounds every
/// receiver call: a Redis that stalls past the limit) moved nothing: the
/// next read gets the entry.
#[tokio::test]
async fn an_entry_whose_read_was_cancelled_is_read_again() {
    let (server, mut receiver) = one_entry_after_an_empty_read("cancelled").await;
    // The server holds every command for 300 ms; the read is given up
    // before that, and the server answers it afterwards.
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(300).arg("ALL").query_async(&mut raw).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(50), receiver.read(10)).await.is_err());
    let mut got = Vec::new();
    for _ in 0..5 {
        got.extend(receiver.read(10).await.unwrap().iter().flat_map(|b| b.events.iter().map(|e| e.id.to_string())));
    }
    assert_eq!(got, ["e0"]);
}

/// Replay beyond the cache on Redis (trimming off, so the stream keeps its
/// history): 100 000 events back, then live, exactly; and 100 random trials
/// (`TAILRACE_REPLAY_CASES`) of history then live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_100_000_events_back_then_goes_live_exactly() {
    let server = RedisServer::start();
    let options = RedisOptions { trim: TrimPolicy::Never, ..options(&server) };
    let factory = Arc::new(RedisAdapterFactory::connect(1, options).await.unwrap());
    common::replay::hundred_thousand_back(factory).await;
}

#[test]
fn replays_exactly_in_random_trials() {
    let server = RedisServer::start();
    let prefix = std::sync::atomic::AtomicU32::new(0);
    common::replay::trial_life(common::replay::cases(100), async || {
        let key_prefix = format!("trial-{}", prefix.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let options = RedisOptions { trim: TrimPolicy::Never, key_prefix, ..options(&server) };
        Arc::new(RedisAdapterFactory::connect(1, options).await.unwrap()) as Arc<dyn QueueAdapterFactory>
    });
}

/// A start the stream was trimmed past is refused, naming the oldest entry
/// it holds; from there a subscription gets everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_trimmed_away_is_refused_naming_the_oldest_entry_held() {
    let server = RedisServer::start();
    let factory = Arc::new(RedisAdapterFactory::connect(1, options(&server)).await.unwrap());
    let key = factory.adapter().key(QueueId(0));
    let node = common::replay::node(factory).await;
    let s = stream("replay", "trimmed");
    let mut tokens = Vec::new();
    for i in 0..300 {
        tokens.push(node.node.produce(&s, common::replay::numbered(&s, i..i + 1)).await.unwrap());
    }
    node.wait_status(0, |status| status.acked >= 300).await;
    let mut conn = common::cluster::redis(&server).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while redis::cmd("XLEN").arg(&key).query_async::<u64>(&mut conn).await.unwrap() >= 300 {
        assert!(tokio::time::Instant::now() < deadline, "the stream was never trimmed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    common::replay::past_retention(node, s, tokens[0], 300).await;
}
