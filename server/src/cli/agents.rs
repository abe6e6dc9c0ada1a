//! `tailrace agents start|stop|state`: switches or reads a running node's
//! pulling agents through its edge's admin API (`admin` scope). Stopped,
//! each agent hands its queue over in order and, in a cluster, the other
//! nodes take the queues.

use anyhow::{Context, bail};

/// What to do.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Action {
    /// Start the agents.
    Start,
    /// Stop the agents (returns once each finished its ordered shutdown).
    Stop,
    /// Print their state.
    State,
}

/// Options of `tailrace agents`.
#[derive(clap::Args, Debug)]
pub struct AgentsArgs {
    /// start, stop or state.
    action: Action,
    /// The node's edge (`http://` or `https://`).
    #[arg(long, default_value = "http://127.0.0.1:8585")]
    url: String,
    /// A PEM file of the authority an HTTPS edge's certificate chains to
    /// (a private CA; only it is then trusted).
    #[arg(long, env = "TAILRACE_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
    /// The node whose agents to switch or read; another node than the
    /// edge's own is reached over the cluster transport.
    #[arg(long)]
    node: Option<String>,
    /// A bearer token with the `admin` scope.
    #[arg(long, env = "TAILRACE_TOKEN")]
    token: Option<String>,
}

pub async fn run(args: AgentsArgs) -> anyhow::Result<()> {
    let base = format!("{}/api/v1/admin/agents", args.url.trim_end_matches('/'));
    let client = super::http_client(args.ca_file.as_deref())?;
    let mut request = match args.action {
        Action::State => client.get(&base),
        Action::Start => client.post(format!("{base}/start")),
        Action::Stop => client.post(format!("{base}/stop")),
    };
    if let Some(node) = &args.node {
        request = request.query(&[("node", node)]);
    }
    if let Some(token) = &args.token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.with_context(|| format!("cannot reach {}", args.url))?;
    let status = response.status();
    let body: serde_json::Value =
        response.json().await.with_context(|| format!("{} answered {status} without JSON", args.url))?;
    if !status.is_success() {
        bail!("{} answered {status}: {}", args.url, body["message"].as_str().unwrap_or("(no message)"));
    }
    println!(
        "node {}: {}, {} agent(s) running",
        body["node"].as_str().unwrap_or("?"),
        body["state"].as_str().unwrap_or("?"),
        body["running"]
    );
    Ok(())
}
