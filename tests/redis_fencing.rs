//! Fences against a private redis-server: a paused old owner (a zombie)
//! holding an older lease token can neither trim, save a checkpoint nor
//! read anything to deliver once a newer lease was granted; the new owner
//! reads everything after the checkpoint; the checkpoint never goes back;
//! a node whose lease is superseded stops its agent and delivers the rest
//! under a fresh token; and keys of the old layout move under the queue's
//! hash tag once.

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::*;
use tailrace::adapters::redis::RedisAdapterFactory;
use tailrace::cluster::{QueueLeases, RedisLeases};
use tailrace::queue::{CheckpointError, Fence, QueueAdapter, QueueAdapterFactory, QueueError, QueueReceiver};
use tailrace::{NodeId, SequenceToken};

const LONG: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

async fn factory(server: &RedisServer) -> Arc<RedisAdapterFactory> {
    redis_server::adapter_factory(server).await
}

async fn leases(server: &RedisServer) -> RedisLeases {
    RedisLeases::connect(&server.url(), "tailrace", Duration::from_secs(5)).await.unwrap()
}

async fn conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

async fn len(server: &RedisServer, key: &str) -> u64 {
    redis::cmd("XLEN").arg(key).query_async(&mut conn(server).await).await.unwrap()
}

/// Reads until `n` containers came (a blocking read may answer early).
async fn read_n(receiver: &mut Box<dyn QueueReceiver>, n: usize) -> Vec<SequenceToken> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(tokio::time::Instant::now() < deadline, "only {} of {n} read", got.len());
        got.extend(receiver.read(n - got.len()).await.unwrap().iter().map(|b| b.token));
    }
    got
}

/// A stream of four entries (one batch each): its id, queue and key.
async fn four_entries(f: &RedisAdapterFactory) -> (tailrace::StreamId, tailrace::QueueId, String) {
    let s = stream("t", "a");
    let queue = f.queue_mapper().queue_for(&s);
    for i in 0..4 {
        f.adapter().enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }
    (s, queue, f.adapter().key(queue))
}

/// `node`'s lease of `queue` and its fenced, initialized receiver.
async fn owner(
    f: &RedisAdapterFactory,
    leases: &RedisLeases,
    queue: tailrace::QueueId,
    node: &str,
) -> (tailrace::cluster::Lease, Box<dyn QueueReceiver>) {
    let lease = leases.acquire(queue, &NodeId::new(node), LONG).await.unwrap().expect("free");
    let mut receiver = f.adapter().create_receiver(queue, Fence::lease(lease.token)).await.unwrap();
    receiver.initialize(Duration::from_secs(5)).await.unwrap();
    (lease, receiver)
}

/// Options under which a receiver trims at every chance (each delivery
/// and each empty read), so a zombie's trim is tried at once.
fn trimming_always(server: &RedisServer) -> tailrace::adapters::redis::RedisOptions {
    tailrace::adapters::redis::RedisOptions { trim_every: Duration::ZERO, ..redis_server::adapter_options(server) }
}

#[tokio::test]
async fn a_zombie_cannot_trim_checkpoint_or_read_entries_after_a_newer_lease() {
    let server = RedisServer::start();
    let fa = RedisAdapterFactory::connect(2, trimming_always(&server)).await.unwrap();
    let (fb, leases) = (factory(&server).await, leases(&server).await);
    let (s, queue, key) = four_entries(&fa).await;
    let (old, mut zombie) = owner(&fa, &leases, queue, "node-a").await;
    let read = read_n(&mut zombie, 4).await;
    let zombie_checkpoints = fa.create_checkpointer().await.unwrap();
    zombie_checkpoints.save(queue, read[0], Fence::lease(old.token)).await.unwrap();
    zombie.delivered(&read[..1]).await.unwrap();
    assert_eq!(len(&server, &key).await, 4, "the checkpoint's entry and later ones stay");

    // node-a pauses; its lease goes to node-b under a newer token.
    assert!(leases.release(&old).await.unwrap());
    let new = leases.acquire(queue, &NodeId::new("node-b"), LONG).await.unwrap().expect("free");
    assert!(new.token > old.token);
    for i in 4..6 {
        fa.adapter().enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }

    // node-a resumes: every write and read is refused, and nothing changed.
    let refused = zombie_checkpoints.save(queue, read[3], Fence::lease(old.token)).await;
    assert!(matches!(refused, Err(CheckpointError::Fenced { queue: q, token }) if q == queue && token == old.token));
    assert_eq!(zombie_checkpoints.load(queue).await.unwrap(), Some(read[0]), "the checkpoint did not move");
    assert!(matches!(zombie.delivered(&read[1..]).await, Err(QueueError::Fenced(q)) if q == queue), "its trim");
    assert!(matches!(zombie.read(10).await, Err(QueueError::Fenced(q)) if q == queue));
    assert_eq!(len(&server, &key).await, 6, "nothing trimmed");

    // node-b reads everything after the checkpoint: what node-a read past
    // it, then the new entries.
    let mut owner = fb.adapter().create_receiver(queue, Fence::lease(new.token)).await.unwrap();
    owner.initialize(Duration::from_secs(5)).await.unwrap();
    let taken = read_n(&mut owner, 5).await;
    assert_eq!(taken[..3], read[1..], "what the zombie read past the checkpoint first, in order");
    owner.delivered(&taken).await.unwrap();
    let owner_checkpoints = fb.create_checkpointer().await.unwrap();
    owner_checkpoints.save(queue, taken[4], Fence::lease(new.token)).await.unwrap();

    // The zombie's late flush cannot take the checkpoint back.
    let late = zombie_checkpoints.save(queue, read[3], Fence::lease(old.token)).await;
    assert!(matches!(late, Err(CheckpointError::Fenced { .. })));
    assert_eq!(owner_checkpoints.load(queue).await.unwrap(), Some(taken[4]), "never goes back");
}

/// A paused old owner's node, with a subscriber, resumes after a newer
/// grant elsewhere: what its agent reads from then on reaches no consumer
/// and moves no checkpoint, while the new owner delivers every entry after
/// the checkpoint, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owners_reads_after_a_newer_grant_reach_no_consumer_and_move_no_checkpoint() {
    let server = RedisServer::start();
    let (fa, fb, leases) = (factory(&server).await, factory(&server).await, leases(&server).await);
    let (s, queue, _) = four_entries(&fa).await;
    let (old, mut zombie) = owner(&fa, &leases, queue, "node-a").await;
    let read = read_n(&mut zombie, 4).await;
    let checkpoints = fa.create_checkpointer().await.unwrap();
    checkpoints.save(queue, read[1], Fence::lease(old.token)).await.unwrap();

    // A newer grant while node-a is paused; more entries come.
    assert!(leases.release(&old).await.unwrap());
    let new = leases.acquire(queue, &NodeId::new("node-b"), LONG).await.unwrap().expect("free");
    for i in 4..8 {
        fa.adapter().enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }
    // node-a resumes as its agent would: read, hand what came to its
    // consumers, save the checkpoint of what they took. No read hands it
    // an entry, so nothing reaches a consumer, and the checkpoint stays
    // where the grant found it.
    for _ in 0..3 {
        match zombie.read(10).await {
            Err(QueueError::Fenced(q)) => assert_eq!(q, queue),
            other => panic!("a read after a newer grant answered {:?} entries", other.map(|b| b.len())),
        }
    }
    assert_eq!(checkpoints.load(queue).await.unwrap(), Some(read[1]), "the checkpoint did not move");

    // A whole node takes the queue after node-b: it delivers every entry
    // after the checkpoint once, in order.
    assert!(leases.release(&new).await.unwrap());
    let recorder = Recorder::new();
    let leases = Arc::new(leases);
    let node_b =
        TestNode::start_with(fb.clone(), quick_config(), implicit("t", &recorder), |b| b.leases(leases.clone())).await;
    assert!(eventually(WAIT, || recorder.ids(&s).len() >= 6).await, "{:?}", recorder.ids(&s));
    assert_eq!(recorder.ids(&s), ids("e", 2..8), "from the checkpoint on, each once, in order");
    node_b.node.shutdown().await.unwrap();
}

/// The same refusals reach the pulling manager as a lost lease: a node's
/// agent whose token a newer grant superseded stops (not a crash), and the
/// node takes the lease again under a fresh token and delivers the rest,
/// each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_lease_was_superseded_stops_and_resumes_under_a_fresh_token() {
    let server = RedisServer::start();
    let f = factory(&server).await;
    let recorder = Recorder::new();
    let leases = Arc::new(leases(&server).await);
    let node =
        TestNode::start_with(f.clone(), quick_config(), implicit("t", &recorder), |b| b.leases(leases.clone())).await;
    let s = stream("t", "run");
    let queue = f.queue_mapper().queue_for(&s);
    for i in 0..10 {
        f.adapter().enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }
    assert!(eventually(WAIT, || recorder.ids(&s).len() == 10).await, "delivered under the first lease");
    // and checkpointed (what the checkpoint has not passed when the lease
    // goes is delivered again).
    let last = f.adapter().enqueue(&s, events("e", 10..11)).await.unwrap();
    assert!(eventually(WAIT, || recorder.ids(&s).len() == 11).await, "delivered under the first lease");
    let checkpoints = f.create_checkpointer().await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while checkpoints.load(queue).await.unwrap() != Some(last) {
        assert!(tokio::time::Instant::now() < deadline, "never checkpointed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = leases.holder(queue).await.unwrap().expect("held");

    // A newer grant elsewhere (as after a pause): the fence counter moves on.
    let _: u64 = redis::cmd("INCR")
        .arg(format!("tailrace:{{{queue}}}:fence"))
        .query_async(&mut conn(&server).await)
        .await
        .unwrap();
    for i in 11..20 {
        f.adapter().enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }
    assert!(eventually(WAIT, || recorder.ids(&s).len() >= 20).await, "delivered under a fresh lease");
    let again = leases.holder(queue).await.unwrap().expect("held again");
    assert!(again.token > first.token + 1, "the agent was fenced and took a fresh lease");
    let status = node.node.status().await.unwrap();
    assert_eq!(status.restarts, 0, "a fenced agent is not a crash");
    assert_eq!(recorder.ids(&s), ids("e", 0..20), "each once, in order");
    node.node.shutdown().await.unwrap();
}

#[tokio::test]
async fn keys_of_the_old_layout_move_under_the_queue_hash_tag_once() {
    let server = RedisServer::start();
    let f = factory(&server).await;
    let s = stream("t", "a");
    let queue = f.queue_mapper().queue_for(&s);
    let (stream_key, checkpoint_key) = (f.adapter().key(queue), f.create_checkpointer().await.unwrap());
    assert_eq!(stream_key, format!("tailrace:{{{queue}}}:stream"));
    for i in 0..3 {
        f.adapter().enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }
    let mut reader = f.adapter().create_receiver(queue, Fence::NONE).await.unwrap();
    reader.initialize(Duration::from_secs(5)).await.unwrap();
    let read = read_n(&mut reader, 3).await;
    reader.delivered(&read[..1]).await.unwrap();
    checkpoint_key.save(queue, read[0], Fence::NONE).await.unwrap();
    drop(reader);

    // What an older release left: the same data under the old names.
    let mut c = conn(&server).await;
    let (old_stream, old_checkpoint) = (format!("tailrace:{queue}"), format!("tailrace:checkpoint:{queue}"));
    let new_checkpoint = format!("tailrace:{{{queue}}}:checkpoint");
    let _: () = redis::cmd("RENAME").arg(&stream_key).arg(&old_stream).query_async(&mut c).await.unwrap();
    let _: () = redis::cmd("RENAME").arg(&new_checkpoint).arg(&old_checkpoint).query_async(&mut c).await.unwrap();

    let g = factory(&server).await;
    let exists = |key: String| {
        let server = &server;
        async move { redis::cmd("EXISTS").arg(key).query_async::<u64>(&mut conn(server).await).await.unwrap() == 1 }
    };
    assert!(!exists(old_stream.clone()).await && !exists(old_checkpoint.clone()).await, "moved");
    assert_eq!(g.create_checkpointer().await.unwrap().load(queue).await.unwrap(), Some(read[0]));
    let mut next = g.adapter().create_receiver(queue, Fence::NONE).await.unwrap();
    next.initialize(Duration::from_secs(5)).await.unwrap();
    assert_eq!(read_n(&mut next, 2).await, read[1..], "the stream and its checkpoint moved along");

    // Once only: a key of the old layout next to the new one stays put.
    let _: () = redis::cmd("SET").arg(&old_checkpoint).arg("0-1").query_async(&mut c).await.unwrap();
    let _ = factory(&server).await;
    assert!(exists(old_checkpoint).await, "the new key is never overwritten");
    assert_eq!(g.create_checkpointer().await.unwrap().load(queue).await.unwrap(), Some(read[0]));
}
