//! The `tailrace` command line.

pub mod agents;
pub mod bench;
pub mod cluster;
pub mod demo;
pub mod handoff;
pub mod node;
pub mod pipelines;
pub mod produce;
pub mod serve;
pub mod tail;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

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
    config.archive.dir = data_dir.join("runs");
    if let Some(listen) = listen {
        config.edge.listen = listen;
    }
    tailrace::edge::check_listen(config.edge.listen, &config.edge.auth).map_err(anyhow::Error::msg)?;
    Ok(config)
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
}
