//! A whole node process as a library: the node on its queue adapter, the
//! archiver and its run log store, the HTTP edge (ingest, SSE viewers,
//! pages, the viewer page, metrics, probes, the admin API), retention, and,
//! for a member of a cluster, its Redis membership and leases, the cluster
//! transport and the failure detector. `tailrace serve` and `tailrace node`
//! are two users of it; a program with its own adapter is another:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # async fn run(factory: Arc<dyn tailrace::queue::QueueAdapterFactory>) -> Result<(), tailrace::server::ServerError> {
//! let config = tailrace::config::Config::load(std::path::Path::new("node.toml"))?;
//! tailrace::server::Server::builder(config)
//!     .adapter(factory, None) // your queues; subscriptions then live in memory (or pass a shared store)
//!     .member()               // one node of several: leases and membership on [adapters.redis]'s Redis
//!     .run()                  // until SIGTERM or Ctrl-C, then every queue is handed over in order
//!     .await
//! # }
//! ```
//!
//! Alone (the default, `serve`'s role) the node pulls every queue and takes
//! its leases in memory; on Redis queues it first makes sure no other
//! process is a member there. A member (`node`'s role) needs a cluster
//! cookie, `[archive] store = "redis"` (every node reads every run) and the
//! Redis of `[adapters.redis]` for its leases and member record, whatever
//! adapter carries the queues; its balancer is `lease` unless `[balancer]`
//! says otherwise.
//!
//! The parts: `run.rs` runs the node and its edge until a stop and then
//! hands over in order; `cluster.rs` joins the Redis membership and the
//! transport; `member.rs` is a member's start and end.

mod cluster;
mod member;
mod run;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::backend::Backend;
use crate::cluster::{Membership, MemoryLeases, RedisMembership};
use crate::config::Config;
use crate::handoff::DataDirLock;
use crate::pubsub::PubSubStore;
use crate::queue::QueueAdapterFactory;

pub use cluster::check_persistence;

/// What `advertise` a `serve` process publishes: it accepts no node
/// connections, and `tailrace node` refuses to join next to it.
pub const SERVE_ADVERTISE: &str = "serve";

/// A node process could not start, or stopped on a failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The config cannot run this way; the message says why and what to
    /// change.
    #[error("{0}")]
    Refused(String),
    /// A step failed: what was being done, and why (the source).
    #[error("{doing}")]
    Failed {
        /// What was being done.
        doing: String,
        /// The error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl From<crate::config::ConfigError> for ServerError {
    fn from(error: crate::config::ConfigError) -> Self {
        ServerError::Refused(error.to_string())
    }
}

/// Wraps an error as [`ServerError::Failed`] doing `doing`.
fn failed<E: std::error::Error + Send + Sync + 'static>(doing: impl Into<String>) -> impl FnOnce(E) -> ServerError {
    let doing = doing.into();
    move |source| ServerError::Failed { doing, source: Box::new(source) }
}

/// What makes a running server stop gracefully; resolves to what it was
/// (printed as `{what}: stopping, handing every queue over`).
pub type StopOn = Pin<Box<dyn Future<Output = String> + Send>>;

/// See the module documentation.
pub struct Server;

impl Server {
    /// A server for `config`, alone on the adapter `[queues] adapter` names
    /// unless told otherwise.
    pub fn builder(config: Config) -> ServerBuilder {
        ServerBuilder { config, adapter: None, member: false, data_dir: None, command: "serve" }
    }
}

/// Builds and runs a [`Server`].
pub struct ServerBuilder {
    config: Config,
    adapter: Option<Backend>,
    member: bool,
    data_dir: Option<DataDirLock>,
    command: &'static str,
}

impl ServerBuilder {
    /// The queues come from `factory` (any adapter, yours included) instead
    /// of the one `[queues] adapter` names; `store` is the subscription
    /// store every node shares (`None`: each node keeps its own in memory,
    /// which a cluster whose viewers reach other nodes' queues must not).
    pub fn adapter(mut self, factory: Arc<dyn QueueAdapterFactory>, store: Option<Arc<dyn PubSubStore>>) -> Self {
        self.adapter = Some(Backend { factory, store });
        self
    }

    /// One node of several (`tailrace node`): see the module documentation.
    pub fn member(mut self) -> Self {
        self.member = true;
        self.command = "node";
        self
    }

    /// The held lock of the node's data directory: the file adapter then
    /// recovers what a crash left in its queue directories.
    pub fn data_dir(mut self, lock: DataDirLock) -> Self {
        self.data_dir = Some(lock);
        self
    }

    /// Runs until SIGTERM or SIGINT (Ctrl-C), then hands every queue over
    /// in order.
    pub async fn run(self) -> Result<(), ServerError> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = failed("listening for SIGTERM and SIGINT");
        let mut interrupt = signal(SignalKind::interrupt()).map_err(listen)?;
        let mut terminate = signal(SignalKind::terminate()).map_err(failed("listening for SIGTERM"))?;
        let stop = Box::pin(async move {
            tokio::select! {
                _ = interrupt.recv() => "SIGINT".to_string(),
                _ = terminate.recv() => "SIGTERM".to_string(),
            }
        });
        self.run_until(stop).await
    }

    /// Runs until `stop` resolves (or the node loses its membership), then
    /// hands every queue over in order.
    pub async fn run_until(self, stop: StopOn) -> Result<(), ServerError> {
        crate::edge::check_listen(self.config.edge.listen, &self.config.edge.auth).map_err(ServerError::Refused)?;
        crate::edge::check_tls(&self.config.edge).map_err(failed("reading [edge.tls]"))?;
        if self.member {
            return member::run(self, stop).await;
        }
        let ServerBuilder { config, adapter, data_dir, command, .. } = self;
        // Alone on its Redis: claimed before anything is pulled, given
        // back on every way out.
        let alone = match (&adapter, config.queues.adapter.as_str()) {
            (None, "redis") => Some(join_alone(&config).await?),
            _ => None,
        };
        let served = async {
            let backend = run::backend(&config, adapter, data_dir.as_ref()).await?;
            let plan = run::Plan {
                command,
                leases: Arc::new(MemoryLeases::new()),
                view: None,
                membership: alone.clone(),
                transport: None,
            };
            run::run_node(&config, backend, stop, plan).await
        }
        .await;
        if let Some(alone) = alone {
            cluster::leave(&alone).await;
        }
        drop(data_dir);
        served
    }
}

/// Claims the node's member record on the queues' Redis (advertising `serve`,
/// agents published as stopped so no node balances queues to it) and
/// refuses to go on while another process is a live member there.
async fn join_alone(config: &Config) -> Result<RedisMembership, ServerError> {
    let joined = cluster::join(config, SERVE_ADVERTISE, Membership::new(), false).await?;
    let others = cluster::others_after_ttl(config, &joined.membership, |_| true).await?;
    if others.is_empty() {
        return Ok(joined.membership);
    }
    cluster::leave(&joined.membership).await;
    Err(ServerError::Refused(format!(
        "another process is a live member on Redis {} under the key prefix `{}`: {}; `tailrace serve` pulls every \
         queue and must run alone on its Redis; run every process as `tailrace node --config FILE` to share the queues",
        crate::redis_conn::redact(&config.adapters.redis.url),
        config.adapters.redis.key_prefix,
        cluster::names(&others)
    )))
}
