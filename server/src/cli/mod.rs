//! The `tailrace` command line.

pub mod agents;
pub mod client;
pub mod demo;
pub mod diff;
pub mod handoff;
pub mod logs;
pub mod mcp;
pub mod node;
pub mod pipelines;
pub mod produce;
pub mod serve;
pub mod tail;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use tailrace::config::Config;

/// The config a node command runs with: the file (or the defaults), its
/// queues and run logs under `data_dir`, and an edge address it may use
/// (`listen`, or else `[edge] listen`).
pub fn node_config(file: Option<&PathBuf>, data_dir: &Path, listen: Option<SocketAddr>) -> anyhow::Result<Config> {
    let mut config = match file {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    config.adapters.file.dir = data_dir.join("queues");
    config.adapters.kafka.checkpoint_dir = data_dir.join("kafka");
    config.archive.dir = data_dir.join("runs");
    if let Some(listen) = listen {
        config.edge.listen = listen;
    }
    tailrace::edge::check_listen(config.edge.listen, &config.edge.auth).map_err(anyhow::Error::msg)?;
    tailrace::edge::check_tls(&config.edge)?;
    Ok(config)
}

/// Milliseconds since the Unix epoch, as events are stamped.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The scheme of the edge's URLs: `https` with `[edge.tls]`.
pub fn edge_scheme(config: &Config) -> &'static str {
    if config.edge.tls.is_some() { "https" } else { "http" }
}

/// An HTTP client for an edge (`http://` or `https://` URLs). With
/// `ca_file`, an HTTPS edge's certificate must chain to the authorities
/// in that PEM file (a private CA), and only to them; without it, to the
/// system's trusted authorities.
pub fn http_client(ca_file: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder();
    if let Some(path) = ca_file {
        let mut authorities = Vec::new();
        for der in tailrace::tls::cert_chain("--ca-file", path)? {
            let cert = reqwest::Certificate::from_der(&der)
                .with_context(|| format!("--ca-file: {} holds a certificate reqwest cannot use", path.display()))?;
            authorities.push(cert);
        }
        builder = builder.tls_certs_only(authorities);
    }
    builder.build().context("cannot make an HTTP client")
}

/// Ctrl-C (SIGINT) and SIGTERM, both asking for a graceful stop. Installed
/// once, early: a signal that comes while the node is still starting is
/// kept and answered as soon as it serves.
pub struct StopSignal {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignal {
    /// Takes over SIGINT and SIGTERM for this process.
    pub fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self { interrupt: signal(SignalKind::interrupt())?, terminate: signal(SignalKind::terminate())? })
    }

    /// Waits for the first of them; returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }

    /// The first of them, as what stops a server.
    pub fn into_future(mut self) -> tailrace::server::StopOn {
        Box::pin(async move { self.recv().await.to_string() })
    }
}
