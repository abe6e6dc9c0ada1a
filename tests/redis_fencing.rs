//! Fenced writes against a private redis-server: a paused old owner (a
//! zombie) holding an older lease token can neither ack, trim, save a
//! checkpoint nor take new entries once a newer lease was granted; the new
//! owner reads everything the zombie read but did not ack; the checkpoint
//! never goes back; a node whose lease is superseded stops its agent and
//! delivers the rest under a fresh token; and keys of the old layout move
//! under the queue's hash tag once.

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

async fn factory(server: &RedisServer, consumer: &str) -> Arc<RedisAdapterFactory> {
    redis_server::adapter_factory(server, consumer).await
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

async fn pending(server: &RedisServer, key: &str) -> usize {
    let entries: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg(key)
        .arg("tailrace")
        .arg("-")
        .arg("+")
        .arg(100)
        .query_async(&mut conn(server).await)
        .await
        .unwrap();
    entries.len()
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

#[tokio::test]
async fn a_zombie_cannot_ack_trim_checkpoint_or_take_entries_after_a_newer_lease() {
    let server = RedisServer::start();
    let (fa, fb, leases) = (factory(&server, "node-a").await, factory(&server, "node-b").await, leases(&server).await);
    let (s, queue, key) = four_entries(&fa).await;
    let (old, mut zombie) = owner(&fa, &leases, queue, "node-a").await;
    let read = read_n(&mut zombie, 4).await;
    zombie.delivered(&read[..1]).await.unwrap();
    let zombie_checkpoints = fa.create_checkpointer().await.unwrap();
    zombie_checkpoints.save(queue, read[0], Fence::lease(old.token)).await.unwrap();

    // node-a pauses; its lease goes to node-b under a newer token.
    assert!(leases.release(&old).await.unwrap());
    let new = leases.acquire(queue, &NodeId::new("node-b"), LONG).await.unwrap().expect("free");
    assert!(new.token > old.token);
    for i in 4..6 {
        fa.adapter().enqueue(&s, events("e", i..i + 1)).await.unwrap();
    }

    // node-a resumes: every write is refused, and nothing changed.
    let refused = zombie_checkpoints.save(queue, read[3], Fence::lease(old.token)).await;
    assert!(matches!(refused, Err(CheckpointError::Fenced { queue: q, token }) if q == queue && token == old.token));
    assert_eq!(zombie_checkpoints.load(queue).await.unwrap(), Some(read[0]), "the checkpoint did not move");
    assert!(matches!(zombie.delivered(&read[1..]).await, Err(QueueError::Fenced(q)) if q == queue));
    assert!(matches!(zombie.read(10).await, Err(QueueError::Fenced(q)) if q == queue));
    assert_eq!(len(&server, &key).await, 6, "nothing trimmed");

    // node-b reads what node-a read but never acked, then the new entries.
    let mut owner = fb.adapter().create_receiver(queue, Fence::lease(new.token)).await.unwrap();
    owner.initialize(Duration::from_secs(5)).await.unwrap();
    let taken = read_n(&mut owner, 5).await;
    assert_eq!(taken[..3], read[1..], "the zombie's unacked entries first, in order");
    owner.delivered(&taken).await.unwrap();
    let owner_checkpoints = fb.create_checkpointer().await.unwrap();
    owner_checkpoints.save(queue, taken[4], Fence::lease(new.token)).await.unwrap();

    // The zombie's late flush cannot take the checkpoint back.
    let late = zombie_checkpoints.save(queue, read[3], Fence::lease(old.token)).await;
    assert!(matches!(late, Err(CheckpointError::Fenced { .. })));
    assert_eq!(owner_checkpoints.load(queue).await.unwrap(), Some(taken[4]), "never goes back");
}

/// What Redis holds of a queue's consumer group: its last delivered id,
/// entries read, and every pending entry with its consumer and delivery count.
async fn group_state(server: &RedisServer, key: &str) -> String {
    let mut c = conn(server).await;
    let groups: redis::Value = redis::cmd("XINFO").arg("GROUPS").arg(key).query_async(&mut c).await.unwrap();
    let pending: Vec<(String, String, u64, u64)> =
        redis::cmd("XPENDING").arg(key).arg("tailrace").arg("-").arg("+").arg(100).query_async(&mut c).await.unwrap();
    // Idle times move with the clock; ids, owners and delivery counts do not.
    let pending: Vec<_> = pending.into_iter().map(|(id, consumer, _idle, times)| (id, consumer, times)).collect();
    format!("{groups:?} {pending:?}")
}

/// On one server a fenced receiver's acks ride with its next read in one
/// transaction that checks the fence for many queues at once: after a
/// newer grant, a paused owner's read and the acks it carries are refused
/// and change nothing in Redis (no ack, no entry taken, the group's
/// position kept), and the new owner gets every entry the zombie held.
#[tokio::test]
async fn a_paused_owners_read_and_ack_after_a_newer_grant_change_nothing_in_redis() {
    let server = RedisServer::start();
    // Acks wait for the next read (no trim is due to send them earlier).
    let options = tailrace::adapters::redis::RedisOptions {
        trim_every: Duration::from_secs(3600),
        ..redis_server::adapter_options(&server)
    };
    let fa = RedisAdapterFactory::connect(2, options, "node-a").await.unwrap();
    let (fb, leases) = (factory(&server, "node-b").await, leases(&server).await);
    let (s, queue, key) = four_entries(&fa).await;
    let (old, mut zombie) = owner(&fa, &leases, queue, "node-a").await;
    let first = read_n(&mut zombie, 1).await;
    let second = read_n(&mut zombie, 1).await;
    assert_eq!(pending(&server, &key).await, 2, "two entries taken");
    zombie.delivered(&first).await.unwrap();
    let third = read_n(&mut zombie, 1).await;
    assert_eq!(pending(&server, &key).await, 2, "the first acked with the third's read");
    zombie.delivered(&second).await.unwrap();
    zombie.delivered(&third).await.unwrap();

    // A newer lease elsewhere; more entries come.
    assert!(leases.release(&old).await.unwrap());
    let new = leases.acquire(queue, &NodeId::new("node-b"), LONG).await.unwrap().expect("free");
    fa.adapter().enqueue(&s, events("e", 4..6)).await.unwrap();
    let before = group_state(&server, &key).await;
    for _ in 0..3 {
        assert!(matches!(zombie.read(10).await, Err(QueueError::Fenced(q)) if q == queue));
    }
    assert_eq!(group_state(&server, &key).await, before, "the refused read and acks changed nothing");
    assert_eq!(pending(&server, &key).await, 2, "the second and third stay pending");

    let mut owner = fb.adapter().create_receiver(queue, Fence::lease(new.token)).await.unwrap();
    owner.initialize(Duration::from_secs(5)).await.unwrap();
    let taken = read_n(&mut owner, 3).await;
    assert_eq!(taken[..2], [second[0], third[0]], "the zombie's unacked entries first, in order");
    assert_eq!(len(&server, &key).await, 5, "four batches of one and one of two");
}

/// The same refusals reach the pulling manager as a lost lease: a node's
/// agent whose token a newer grant superseded stops (not a crash), and the
/// node takes the lease again under a fresh token and delivers the rest,
/// each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_lease_was_superseded_stops_and_resumes_under_a_fresh_token() {
    let server = RedisServer::start();
    let f = factory(&server, "n1").await;
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
    // and acked (what is not acked when the lease goes is delivered again).
    let deadline = tokio::time::Instant::now() + WAIT;
    while pending(&server, &f.adapter().key(queue)).await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "never acked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = leases.holder(queue).await.unwrap().expect("held");

    // A newer grant elsewhere (as after a pause): the fence counter moves on.
    let _: u64 = redis::cmd("INCR")
        .arg(format!("tailrace:{{{queue}}}:fence"))
        .query_async(&mut conn(&server).await)
        .await
        .unwrap();
    for i in 10..20 {
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
    let f = factory(&server, "node-a").await;
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

    let g = factory(&server, "node-b").await;
    let exists = |key: String| {
        let server = &server;
        async move { redis::cmd("EXISTS").arg(key).query_async::<u64>(&mut conn(server).await).await.unwrap() == 1 }
    };
    assert!(!exists(old_stream.clone()).await && !exists(old_checkpoint.clone()).await, "moved");
    assert_eq!(g.create_checkpointer().await.unwrap().load(queue).await.unwrap(), Some(read[0]));
    let mut next = g.adapter().create_receiver(queue, Fence::NONE).await.unwrap();
    next.initialize(Duration::from_secs(5)).await.unwrap();
    assert_eq!(read_n(&mut next, 2).await, read[1..], "the group and its pending entries moved along");

    // Once only: a key of the old layout next to the new one stays put.
    let _: () = redis::cmd("SET").arg(&old_checkpoint).arg("0-1").query_async(&mut c).await.unwrap();
    let _ = factory(&server, "node-c").await;
    assert!(exists(old_checkpoint).await, "the new key is never overwritten");
    assert_eq!(g.create_checkpointer().await.unwrap().load(queue).await.unwrap(), Some(read[0]));
}

/// Acks that rode with a read that failed (Redis went away) go again with
/// the reads after it until one takes them: the entries do not stay
/// pending for as long as the node owns the queue.
#[tokio::test]
async fn acks_of_a_batched_read_that_failed_go_again_with_the_next() {
    let mut server = RedisServer::start();
    // Acks wait for the next read (no trim is due to send them earlier).
    let options = tailrace::adapters::redis::RedisOptions {
        trim_every: Duration::from_secs(3600),
        ..redis_server::adapter_options(&server)
    };
    let fa = RedisAdapterFactory::connect(2, options, "node-a").await.unwrap();
    let leases = leases(&server).await;
    let (_, queue, key) = four_entries(&fa).await;
    let (_lease, mut receiver) = owner(&fa, &leases, queue, "node-a").await;
    let read = read_n(&mut receiver, 4).await;
    // The pending entries are read back first; the next read is batched.
    assert!(receiver.read(10).await.unwrap().is_empty(), "nothing new");
    receiver.delivered(&read).await.unwrap();
    server.stop();
    assert!(receiver.read(10).await.is_err(), "Redis is down: the read and its acks fail");
    server.restart();
    // The agent goes on reading (reads fail until Redis is back); each
    // read carries the acks not sent yet.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let _ = receiver.read(10).await;
        if pending(&server, &key).await == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the four entries stayed pending: the acks were lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
