//! `tailrace node` processes for failover tests: spawned on a config text,
//! waited for until they serve, signalled, and read from outside (the
//! admin API's holders, the Prometheus metrics).
//!
//! Included with `#[path = "common/node_procs.rs"] mod node_procs;` next to
//! `mod common;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One `tailrace node` process and its log.
pub struct NodeProc {
    pub name: String,
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl NodeProc {
    /// Spawns `tailrace node --config <text>` as `name`, edge on `port`,
    /// and waits until it serves (at most `within`).
    pub fn start(name: &str, port: u16, text: &str, within: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let log = dir.path().join(format!("{name}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_tailrace"))
            .arg("node")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let node = Self { name: name.into(), port, child: Some(child), log, _dir: dir };
        let serving = super::common::life::serving_within(stdout, within);
        assert!(serving, "{name} did not serve within {within:?}:\n{}", node.log_text());
        node
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, `KILL`).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
    }

    /// Queue → holder (`None`: free), from this node's admin API; `None`
    /// if it does not answer.
    pub async fn holders(&self) -> Option<BTreeMap<u64, Option<String>>> {
        let url = format!("http://127.0.0.1:{}/api/v1/admin/cluster", self.port);
        let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().ok()?;
        let body: Value = client.get(url).send().await.ok()?.error_for_status().ok()?.json().await.ok()?;
        let mut held = BTreeMap::new();
        for queue in body["queues"].as_array()? {
            held.insert(queue["queue"].as_u64()?, queue["holder"].as_str().map(str::to_string));
        }
        Some(held)
    }

    /// The sum of every sample of `metric` on this node's `/metrics`
    /// (`None` if it does not answer; 0 if the metric is not there yet).
    pub async fn metric_sum(&self, metric: &str) -> Option<f64> {
        let url = format!("http://127.0.0.1:{}/metrics", self.port);
        let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().ok()?;
        let text = client.get(url).send().await.ok()?.text().await.ok()?;
        let sum = text
            .lines()
            .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |sum, n| sum + n);
        Some(sum)
    }

    /// SIGTERM and wait for the exit (SIGKILL after `within`); whether it
    /// exited successfully.
    pub fn stop(&mut self, within: Duration) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process must be resumed to die of anything but KILL.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How many queues `node` holds in `held`.
pub fn held_by(held: &BTreeMap<u64, Option<String>>, node: &str) -> usize {
    held.values().filter(|h| h.as_deref() == Some(node)).count()
}
