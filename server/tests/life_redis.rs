//! A node's whole life on Redis: `tailrace serve` with the Redis adapter
//! and the Redis run log store, through random sequences of producing,
//! draining, Ctrl-C, `kill -9` (also while producers post), restarts of
//! Redis under the running node and producers posting while Redis is down.
//! After every restart and at the end, each run's log holds every
//! acknowledged line exactly once, in order; a batch that got no 202
//! appears whole or not at all.
//!
//! `cargo test` runs a few cases; `TAILRACE_LIFE_CASES=50 cargo test --test
//! life_redis` runs more. One fixed life runs on a Redis that serves TLS
//! only, as an ACL user.

use tailrace_testkit as common;

use common::life::{Op, ServeNode, node_ops, proptest_config, run_life};
use common::redis_server::{PASSWORD, RedisServer, USER};
use proptest::prelude::*;

/// A node's steps, and Redis restarted or down under it.
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => node_ops(),
        1 => Just(Op::RestartRedis),
        1 => (0u32..3, 1u32..3).prop_map(|(run, batches)| Op::ProduceWhileRedisDown { run, batches }),
    ]
}

fn config(redis: &RedisServer, persist_ms: u64) -> String {
    let url = redis.url();
    format!(
        "[queues]\nadapter = \"redis\"\n\n[adapters.redis]\nurl = \"{url}\"\n\n[archive]\nstore = \"redis\"\nredis_url = \"{url}\"\n\n[checkpoint]\npersist_interval = \"{persist_ms}ms\"\n"
    )
}

fn live(ops: Vec<Op>, persist_ms: u64) -> Result<(), TestCaseError> {
    let redis = RedisServer::start();
    let config = config(&redis, persist_ms);
    live_on(redis, &config, ops)
}

fn live_on(mut redis: RedisServer, config: &str, mut ops: Vec<Op>) -> Result<(), TestCaseError> {
    ops.insert(0, Op::Produce { run: 0, batches: 3, lines: 5 });
    let mut node = ServeNode::new(config);
    let outcome = run_life(&mut node, ops, Some(&mut redis));
    prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn every_acknowledged_line_survives_a_nodes_whole_life_on_redis(
        ops in proptest::collection::vec(op(), 4..10),
        persist_ms in prop_oneof![Just(0u64), Just(300), Just(5_000)],
    ) {
        live(ops, persist_ms)?;
    }
}

/// Kills, Ctrl-Cs and Redis restarts alternating, producers posting.
#[test]
fn six_lives_on_redis_lose_nothing() {
    live(
        vec![
            Op::Produce { run: 0, batches: 40, lines: 100 },
            Op::Drain,
            Op::Stop,
            Op::Produce { run: 0, batches: 5, lines: 1 },
            Op::KillWhileProducing { run: 1, batches: 60, lines: 50, after_ms: 300 },
            Op::RestartRedis,
            Op::Stop,
            Op::ProduceWhileRedisDown { run: 2, batches: 2 },
            Op::KillWhileProducing { run: 2, batches: 60, lines: 50, after_ms: 200 },
            Op::Stop,
            Op::Produce { run: 1, batches: 3, lines: 7 },
        ],
        5_000,
    )
    .unwrap();
}

/// The same over TLS as an ACL user: kills, a
/// Ctrl-C, a Redis restart and producers posting while it is down.
#[test]
fn a_life_on_a_tls_redis_as_an_acl_user_loses_nothing() {
    let redis = RedisServer::start_secure("no");
    let access = format!(
        "username = \"{USER}\"\npassword = \"{PASSWORD}\"\ntls_ca_file = \"{}\"\n",
        redis.secure().file("ca.pem").display()
    );
    let config = config(&redis, 300).replacen("\n\n[archive]", &format!("\n{access}\n[archive]"), 1);
    assert!(config.contains("rediss://") && config.contains(&access), "{config}");
    let ops = vec![
        Op::Produce { run: 0, batches: 20, lines: 50 },
        Op::KillWhileProducing { run: 1, batches: 40, lines: 50, after_ms: 200 },
        Op::RestartRedis,
        Op::Stop,
        Op::ProduceWhileRedisDown { run: 2, batches: 2 },
        Op::Produce { run: 1, batches: 3, lines: 7 },
    ];
    live_on(redis, &config, ops).unwrap();
}
