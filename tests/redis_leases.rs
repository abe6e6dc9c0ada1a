//! `RedisLeases` against a private redis-server: two nodes contend for a
//! queue, an expired lease goes to the other node under a higher token, a
//! stale token can neither renew nor release, a release frees the queue at
//! once, and tokens never go back (not across releases, expiries or a
//! restart of the store's client).

use tailrace_testkit as common;

use std::time::Duration;

use common::redis_cluster::RedisCluster;
use common::redis_server::RedisServer;
use tailrace::cluster::{QueueLeases, RedisLeases};
use tailrace::redis_conn::WaitReplicas;
use tailrace::{NodeId, QueueId};

const LONG: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

async fn leases(server: &RedisServer) -> RedisLeases {
    RedisLeases::connect(&server.url(), "tailrace", Duration::from_secs(5)).await.unwrap()
}

/// `RedisLeases` on `cluster` (through its first live seed).
async fn cluster_leases(cluster: &RedisCluster) -> RedisLeases {
    RedisLeases::connect_to(&cluster.endpoint(), "tailrace", Duration::from_secs(5)).await.unwrap()
}

#[tokio::test]
async fn two_nodes_contend_and_a_release_frees_the_queue_at_once() {
    let server = RedisServer::start();
    contend(&leases(&server).await, &leases(&server).await).await;
}

async fn contend(store_a: &RedisLeases, store_b: &RedisLeases) {
    let (a, b, q) = (NodeId::new("a"), NodeId::new("b"), QueueId(3));
    let lease = store_a.acquire(q, &a, LONG).await.unwrap().expect("free");
    assert_eq!(store_b.acquire(q, &b, LONG).await.unwrap(), None, "held by a");
    assert_eq!(store_b.acquire(QueueId(4), &b, LONG).await.unwrap().map(|l| l.holder), Some(b.clone()));
    let seen = store_b.holder(q).await.unwrap().unwrap();
    assert_eq!((seen.holder.clone(), seen.token), (a.clone(), lease.token));
    assert!(seen.expires_at <= lease.expires_at + Duration::from_secs(1));

    assert!(store_a.renew(&lease, LONG).await.unwrap().is_some());
    assert!(store_a.release(&lease).await.unwrap());
    assert_eq!(store_b.holder(q).await.unwrap(), None);
    let taken = store_b.acquire(q, &b, LONG).await.unwrap().expect("free at once after a release");
    assert!(taken.token > lease.token);
    let all = store_a.holders(&[QueueId(3), QueueId(4), QueueId(5)]).await.unwrap();
    assert_eq!(all.iter().map(|l| (l.queue, l.holder.as_str())).collect::<Vec<_>>(), [(q, "b"), (QueueId(4), "b")]);
}

#[tokio::test]
async fn a_stale_token_can_neither_renew_nor_release() {
    let server = RedisServer::start();
    stale(&leases(&server).await).await;
}

async fn stale(store: &RedisLeases) {
    let (a, b, q) = (NodeId::new("a"), NodeId::new("b"), QueueId(0));
    let old = store.acquire(q, &a, LONG).await.unwrap().unwrap();
    // Its own lease again: a new token fences the old one.
    let new = store.acquire(q, &a, LONG).await.unwrap().unwrap();
    assert!(new.token > old.token);
    assert_eq!(store.renew(&old, LONG).await.unwrap(), None);
    assert!(!store.release(&old).await.unwrap());
    // Another holder name with the right token is refused too.
    let forged = tailrace::cluster::Lease { holder: b.clone(), ..new.clone() };
    assert_eq!(store.renew(&forged, LONG).await.unwrap(), None);
    assert!(!store.release(&forged).await.unwrap());
    assert_eq!(store.holder(q).await.unwrap().map(|l| l.token), Some(new.token));
    assert_eq!(store.acquire(q, &b, LONG).await.unwrap(), None);
}

#[tokio::test]
async fn an_expired_lease_goes_to_the_other_node_under_a_higher_token() {
    let server = RedisServer::start();
    expire(&leases(&server).await, &leases(&server).await).await;
}

async fn expire(store_a: &RedisLeases, store_b: &RedisLeases) {
    let (a, b, q) = (NodeId::new("a"), NodeId::new("b"), QueueId(1));
    let dead = store_a.acquire(q, &a, Duration::from_millis(200)).await.unwrap().unwrap();
    // a stops renewing (it died); b polls until the server expired it.
    let deadline = tokio::time::Instant::now() + WAIT;
    let taken = loop {
        if let Some(lease) = store_b.acquire(q, &b, LONG).await.unwrap() {
            break lease;
        }
        assert!(tokio::time::Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(taken.token > dead.token);
    assert_eq!(store_a.renew(&dead, LONG).await.unwrap(), None, "a cannot come back with its old token");
    assert!(!store_a.release(&dead).await.unwrap());
    assert_eq!(store_a.holder(q).await.unwrap().map(|l| l.holder), Some(b));
}

#[tokio::test]
async fn tokens_never_go_back_and_keys_share_the_queue_hash_tag() {
    let server = RedisServer::start();
    let store = leases(&server).await;
    let (a, q) = (NodeId::new("a"), QueueId(7));
    let mut last = 0;
    for _ in 0..5 {
        let lease = store.acquire(q, &a, LONG).await.unwrap().unwrap();
        assert!(lease.token > last);
        last = lease.token;
        assert!(store.release(&lease).await.unwrap());
    }
    // A new client (a restarted node) continues from the stored counter.
    let again = leases(&server).await.acquire(q, &a, LONG).await.unwrap().unwrap();
    assert!(again.token > last);
    assert_eq!(store.lease_key(q), "tailrace:{q7}:lease");
    assert_eq!(store.fence_key(q), "tailrace:{q7}:fence");
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pttl: i64 = redis::cmd("PTTL").arg(store.alive_key(&a)).query_async(&mut conn).await.unwrap();
    assert!(pttl > 0, "the holder's alive key carries a server-side TTL");
    let grant_ttl: i64 = redis::cmd("PTTL").arg(store.lease_key(q)).query_async(&mut conn).await.unwrap();
    assert_eq!(grant_ttl, -1, "the grant lives with its holder's alive key, not on its own");
    let fence_ttl: i64 = redis::cmd("PTTL").arg(store.fence_key(q)).query_async(&mut conn).await.unwrap();
    assert_eq!(fence_ttl, -1, "the fencing counter never expires");
}

#[tokio::test]
async fn a_store_that_is_down_is_a_typed_error_not_a_panic() {
    let mut server = RedisServer::start();
    let store = leases(&server).await;
    let lease = store.acquire(QueueId(0), &NodeId::new("a"), LONG).await.unwrap().unwrap();
    server.stop();
    let error = store.renew(&lease, LONG).await.unwrap_err().to_string();
    assert!(error.contains("renew") && error.contains("q0"), "{error}");
}

/// On a Redis Cluster a node's alive key and a queue's lease live on
/// different shards; the same contracts hold. With `wait_replicas = 1` a
/// grant is on a replica before it is used, so after a `kill -9` of the
/// lease's master the promoted replica grants above every token handed
/// out, and none of the old grants can renew into the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_the_same_holds_and_tokens_survive_a_failover() {
    let mut cluster = RedisCluster::start();
    contend(&cluster_leases(&cluster).await, &cluster_leases(&cluster).await).await;
    stale(&cluster_leases(&cluster).await).await;
    expire(&cluster_leases(&cluster).await, &cluster_leases(&cluster).await).await;

    let wait = WaitReplicas { replicas: 1, timeout: Duration::from_secs(1) };
    let store = cluster_leases(&cluster).await.with_wait_replicas(Some(wait));
    let (a, q) = (NodeId::new("a"), QueueId(9));
    let mut granted = Vec::new();
    for _ in 0..20 {
        granted.push(store.acquire(q, &a, LONG).await.unwrap().expect("its own lease again").token);
    }
    let last = *granted.last().unwrap();
    cluster.kill(cluster.master_of(&store.fence_key(q)));
    let after = cluster_leases(&cluster).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let taken = loop {
        match after.acquire(q, &a, LONG).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => panic!("a's own lease is free to a"),
            Err(error) => assert!(tokio::time::Instant::now() < deadline, "no grant after the failover: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(taken.token > last, "granted {} after the failover, {last} before", taken.token);

    // Without a replica to confirm, a grant is not used, and says why.
    let server = RedisServer::start();
    let short = WaitReplicas { replicas: 1, timeout: Duration::from_millis(100) };
    let lonely = leases(&server).await.with_wait_replicas(Some(short));
    let error = lonely.acquire(q, &a, LONG).await.unwrap_err().to_string();
    assert!(error.contains("reached 0 of 1 replicas within 100ms"), "{error}");
}
