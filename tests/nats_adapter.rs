//! The NATS JetStream adapter of `examples/nats_jetstream` (written against
//! the public API only) passes the whole conformance kit against a real
//! `nats-server`, started here on a free loopback port with its own store.
//! Without `nats-server` the test says so and passes, except under CI,
//! where `.ci/run` installs it and its absence is a failure.

#[allow(dead_code)]
#[path = "../examples/nats_jetstream/adapter.rs"]
mod adapter;
#[path = "../examples/nats_jetstream/receiver.rs"]
mod receiver;
#[allow(dead_code)]
#[path = "../examples/nats_jetstream/server.rs"]
mod server;

use std::sync::Arc;
use std::time::Duration;

use adapter::{JetStreamFactory, JetStreamOptions};
use tailrace::conformance::{self, Claims};
use tailrace::queue::QueueAdapterFactory;

fn server() -> Option<server::NatsServer> {
    if !server::available() {
        assert!(std::env::var_os("CI").is_none(), "nats-server is missing under CI: {}", server::INSTALL_HINT);
        println!("skipped: nats-server is not installed; {}", server::INSTALL_HINT);
        return None;
    }
    Some(server::NatsServer::start().unwrap())
}

#[tokio::test]
async fn passes_the_conformance_kit() {
    let Some(server) = server() else { return };
    let mut options = JetStreamOptions::new(server.url());
    options.max_messages = Some(128);
    options.purge_every = Duration::ZERO;
    options.read_wait = Duration::from_millis(50);
    let claims =
        Claims { durable: true, rewindable: true, exclusive_receivers: true, bounded: Some(128 * 8), trims: true };
    let report = conformance::run(claims, move || {
        let options = options.clone();
        async move { Ok(Arc::new(JetStreamFactory::connect(4, options).await?) as Arc<dyn QueueAdapterFactory>) }
    })
    .await
    .unwrap_or_else(|failures| panic!("{failures}"));
    println!("{report}");
    assert_eq!(report.checks_run(), 17, "{report}");
}
