//! Redis over TLS with an ACL user (no one can log in as `default`),
//! against a
//! private `redis-server --tls-port … --port 0`: the Redis adapter passes
//! the conformance kit with mutual TLS, a node takes its queues over TLS,
//! and a wrong password, a missing password, an authority the server's
//! certificate does not chain to, or a missing client certificate fail at
//! start with a message naming the setting, before anything is written.

use tailrace_testkit as common;

use std::sync::Arc;

use common::cluster::{Proc, config, free_port, settle};
use common::redis_server::{self, PASSWORD, RedisServer, USER};
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
use tailrace::redis_conn::{RedisAccess, RedisEndpoint};

/// A connection as the test's own client, with the right credentials.
async fn admin(server: &RedisServer) -> redis::aio::ConnectionManager {
    let access = RedisAccess {
        section: "test".into(),
        username: Some(USER.into()),
        password: Some(PASSWORD.into()),
        tls_ca_file: Some(server.secure().file("ca.pem")),
        ..RedisAccess::default()
    };
    let endpoint = RedisEndpoint { url: server.url(), url_setting: "test url".into(), access };
    endpoint.connect(redis::aio::ConnectionManagerConfig::new()).await.unwrap()
}

async fn key_count(server: &RedisServer) -> i64 {
    redis::cmd("DBSIZE").query_async(&mut admin(server).await).await.unwrap()
}

/// What connecting the adapter with `options` says.
async fn refusal(options: RedisOptions) -> String {
    match RedisAdapterFactory::connect(2, options).await {
        Ok(_) => panic!("the adapter connected"),
        Err(error) => error.to_string(),
    }
}

/// A node's config on `server` with `keys` added to `[adapters.redis]`.
fn node_config(server: &RedisServer, name: &str, port: u16, keys: &str) -> String {
    let url_line = format!("url = \"{}\"\n", server.url());
    let text = config(server, name, port);
    assert!(text.contains(&url_line));
    text.replacen(&url_line, &format!("{url_line}{keys}"), 1)
}

/// Runs `tailrace node` expecting it to fail at start; its log.
fn failed_start(server: &RedisServer, keys: &str, env: &[(&str, &str)]) -> String {
    let port = free_port();
    let mut node = Proc::spawn_with_env("n1", port, &node_config(server, "n1", port, keys), &["node"], &[], env);
    let status = node.wait_exit();
    let log = node.log_text();
    assert!(!status.success(), "the node must fail at start:\n{log}");
    log
}

#[tokio::test]
async fn the_redis_adapter_passes_the_conformance_kit_over_mutual_tls_as_an_acl_user() {
    let server = RedisServer::start_secure("yes");
    let options = RedisOptions {
        tls_cert_file: Some(server.secure().file("client.pem")),
        tls_key_file: Some(server.secure().file("client.key")),
        ..redis_server::secure_adapter_options(&server)
    };
    let report = redis_server::redis_kit(options).await;
    assert_eq!(report.checks_run(), 15, "{report}");
}

#[tokio::test]
async fn credentials_in_the_url_are_understood_and_never_shown() {
    let server = RedisServer::start_secure("no");
    let url = format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{}", server.port);
    let options = RedisOptions { url: url.clone(), password: None, ..redis_server::secure_adapter_options(&server) };
    RedisAdapterFactory::connect(2, options.clone()).await.expect("the URL's password is used");
    let wrong = format!("rediss://{USER}:not-{PASSWORD}@127.0.0.1:{}", server.port);
    let message = refusal(RedisOptions { url: wrong, ..options }).await;
    assert!(message.contains("[adapters.redis] url (its password)"), "{message}");
    assert!(message.contains(&format!("rediss://{USER}:***@127.0.0.1:{}", server.port)), "{message}");
    assert!(!message.contains(PASSWORD), "the password must not be shown: {message}");
}

#[tokio::test]
async fn a_wrong_or_missing_password_is_refused_naming_the_setting() {
    let server = RedisServer::start_secure("no");
    let options = redis_server::secure_adapter_options(&server);
    let wrong = refusal(RedisOptions { password: Some("not-the-password".into()), ..options.clone() }).await;
    assert!(wrong.contains("[adapters.redis] password: Redis at rediss://127.0.0.1:"), "{wrong}");
    assert!(wrong.contains(&format!("refused the credentials of user `{USER}`")), "{wrong}");
    assert!(!wrong.contains("not-the-password"), "{wrong}");
    let missing = refusal(RedisOptions { username: None, password: None, ..options }).await;
    assert!(missing.contains("[adapters.redis] password: Redis at"), "{missing}");
    assert!(missing.contains("requires a password") && missing.contains("NOAUTH"), "{missing}");
}

#[tokio::test]
async fn a_ca_the_server_certificate_does_not_chain_to_is_refused_naming_the_setting() {
    let server = RedisServer::start_secure("no");
    let other = server.secure().file("other.pem");
    let options = RedisOptions { tls_ca_file: Some(other.clone()), ..redis_server::secure_adapter_options(&server) };
    let message = refusal(options).await;
    assert!(message.contains("[adapters.redis] tls_ca_file: "), "{message}");
    assert!(
        message.contains(&format!("the server's certificate is not signed by the authority in {}", other.display())),
        "{message}"
    );
}

#[tokio::test]
async fn a_server_that_requires_a_client_certificate_refuses_a_client_without_one() {
    let server = RedisServer::start_secure("yes");
    let message = refusal(redis_server::secure_adapter_options(&server)).await;
    assert!(message.contains("[adapters.redis] tls_cert_file: "), "{message}");
}

#[tokio::test]
async fn tls_files_with_a_plain_url_are_refused() {
    let server = RedisServer::start();
    let options = RedisOptions { tls_ca_file: Some("ca.pem".into()), ..redis_server::adapter_options(&server) };
    let message = refusal(options).await;
    assert!(message.contains("[adapters.redis] tls_ca_file: set, but [adapters.redis] url"), "{message}");
    assert!(message.contains("is not a rediss:// (TLS) URL"), "{message}");
}

#[tokio::test]
async fn a_node_takes_its_queues_over_tls_with_the_password_from_a_file() {
    let server = RedisServer::start_secure("no");
    let secret = tempfile::tempdir().unwrap();
    let password_file = secret.path().join("redis-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let keys = format!(
        "username = \"{USER}\"\npassword_file = \"{}\"\ntls_ca_file = \"{}\"\n",
        password_file.display(),
        server.secure().file("ca.pem").display()
    );
    let port = free_port();
    let mut node = Proc::spawn("n1", port, &node_config(&server, "n1", port, &keys), &["node"], &[]);
    node.wait_serving();
    let held = settle(&node, &[("n1", common::cluster::QUEUES as usize)]).await;
    let token: Option<u64> = redis::cmd("HGET")
        .arg("tailrace:{q0}:lease")
        .arg("token")
        .query_async(&mut admin(&server).await)
        .await
        .unwrap();
    assert_eq!(token, Some(held[&0].1), "the lease in Redis is the node's");
}

#[tokio::test]
async fn a_node_with_a_wrong_password_fails_at_start_and_takes_no_lease() {
    let server = RedisServer::start_secure("no");
    let keys = format!("username = \"{USER}\"\ntls_ca_file = \"{}\"\n", server.secure().file("ca.pem").display());
    let log = failed_start(&server, &keys, &[("TAILRACE_REDIS_PASSWORD", "not-the-password")]);
    assert!(log.contains("TAILRACE_REDIS_PASSWORD (the [adapters.redis] password): Redis at rediss://"), "{log}");
    assert!(log.contains(&format!("refused the credentials of user `{USER}`")), "{log}");
    assert!(!log.contains("not-the-password"), "the password must not be logged:\n{log}");
    assert_eq!(key_count(&server).await, 0, "a refused node writes nothing: no lease, no member key");
}

#[tokio::test]
async fn a_node_with_a_ca_the_server_does_not_chain_to_fails_at_start_and_takes_no_lease() {
    let server = RedisServer::start_secure("no");
    let keys = format!(
        "username = \"{USER}\"\npassword = \"{PASSWORD}\"\ntls_ca_file = \"{}\"\n",
        server.secure().file("other.pem").display()
    );
    let log = failed_start(&server, &keys, &[]);
    assert!(log.contains("[adapters.redis] tls_ca_file: the server's certificate is not signed by"), "{log}");
    assert_eq!(key_count(&server).await, 0, "a refused node writes nothing: no lease, no member key");
}

/// A Redis restart under a node over TLS: the connections come back (a
/// new TLS session each), appends retried by the producer are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_redis_restart_mid_run_loses_nothing() {
    use common::*;
    use std::collections::BTreeSet;
    use std::time::Duration;
    let mut server = RedisServer::start_secure("no");
    let f = Arc::new(RedisAdapterFactory::connect(2, redis_server::secure_adapter_options(&server)).await.unwrap());
    let adapter = f.adapter();
    let recorder = Recorder::new();
    let mut config = quick_config();
    config.agent.reader_backoff = tailrace::config::Backoff::fixed(Duration::from_millis(100));
    let node = TestNode::start(f.clone(), config, implicit("t", &recorder)).await;
    let s = stream("t", "restart");
    let mut acked = BTreeSet::new();
    for i in 0..200u64 {
        if i == 100 {
            server.restart();
        }
        enqueue_retrying(adapter.as_ref(), &s, events("e", i..i + 1), Duration::from_secs(60)).await;
        acked.insert(format!("e{i}"));
    }
    let delivered = || recorder.ids(&s).into_iter().collect::<BTreeSet<_>>();
    assert!(
        eventually(Duration::from_secs(30), || delivered().is_superset(&acked)).await,
        "lost: {:?}",
        acked.difference(&delivered()).take(5).collect::<Vec<_>>()
    );
    node.node.shutdown().await.unwrap();
}

/// A config printed for debugging (`{:?}`) shows neither the password
/// key nor a password in a URL.
#[test]
fn settings_printed_for_debugging_hold_no_password() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    let text = "[adapters.redis]\nurl = \"rediss://tailrace:url-s3cret@10.0.0.5:6380\"\npassword = \"key-s3cret\"\n\
                [archive]\nstore = \"redis\"\nredis_url = \"redis://tailrace:archive-s3cret@10.0.0.6:6379\"\n";
    std::fs::write(&path, text).unwrap();
    let config = tailrace::config::Config::load(&path).unwrap();
    let shown = format!("{config:?}");
    for secret in ["url-s3cret", "key-s3cret", "archive-s3cret"] {
        assert!(!shown.contains(secret), "{secret} is shown: {shown}");
    }
    assert!(shown.contains("rediss://tailrace:***@10.0.0.5:6380"), "{shown}");
}

#[tokio::test]
async fn a_ca_file_without_a_certificate_is_refused_before_dialling() {
    let server = RedisServer::start_secure("no");
    let not_pem = server.secure().file("redis.key");
    let options = RedisOptions { tls_ca_file: Some(not_pem.clone()), ..redis_server::secure_adapter_options(&server) };
    let message = refusal(options).await;
    assert!(message.contains("[adapters.redis] tls_ca_file: "), "{message}");
    assert!(message.contains(&format!("{} holds no PEM certificate", not_pem.display())), "{message}");
}

#[tokio::test]
async fn a_rediss_url_to_a_plain_server_asks_whether_it_serves_tls() {
    let server = RedisServer::start();
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let message = refusal(RedisOptions { url, ..redis_server::adapter_options(&server) }).await;
    // A plain server waits for the rest of what it took for a command: the
    // handshake times out.
    assert!(message.contains("cannot reach Redis at rediss://127.0.0.1:"), "{message}");
    assert!(message.contains("does the server serve TLS on that port?"), "{message}");
}
