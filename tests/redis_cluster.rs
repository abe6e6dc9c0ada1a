//! The local Redis Cluster the Redis Cluster work is tested on (three
//! masters, three replicas): it forms with every slot served, a cluster
//! client follows its redirections, and the rule `wait_replicas` will rest
//! on holds: a write one replica confirmed (`WAIT 1`) survives a `kill -9`
//! of its master, whose replica takes over.

use tailrace_testkit as common;

use common::redis_cluster::RedisCluster;
use redis::AsyncCommands;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_a_replica_confirmed_survives_the_death_of_its_master() {
    let mut cluster = RedisCluster::start();
    // One queue's keys share a hash tag: one slot, one master.
    let master = cluster.master_of("{q7}:stream");
    assert_eq!(cluster.master_of("{q7}:checkpoint"), master);
    let direct = redis::Client::open(format!("redis://127.0.0.1:{master}")).unwrap();
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(std::time::Duration::from_secs(10)));
    let mut conn = direct.get_multiplexed_async_connection_with_config(&config).await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..100 {
        pipe.cmd("XADD").arg("{q7}:stream").arg("*").arg("line").arg(i).ignore();
    }
    pipe.cmd("WAIT").arg(1).arg(5_000);
    let (replicas,): (i64,) = pipe.query_async(&mut conn).await.unwrap();
    assert!(replicas >= 1, "a replica confirmed the writes ({replicas})");

    cluster.kill(master);
    assert_ne!(cluster.master_of("{q7}:stream"), master, "the replica took over the slot");
    let client = redis::cluster::ClusterClient::new(cluster.seeds()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let length: u64 = conn.xlen("{q7}:stream").await.unwrap();
    assert_eq!(length, 100, "no confirmed write was lost");
    // And the cluster takes writes again, through the client's redirections.
    let () = conn.set("{q8}:x", "y").await.unwrap();
    let read: String = conn.get("{q8}:x").await.unwrap();
    assert_eq!(read, "y");
}
