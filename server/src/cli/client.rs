//! The client side of a running edge, for the commands that talk to one
//! (`produce`, `tail`, `logs`, `diff`, `mcp`): where it is, how to trust
//! it, the token, and its JSON and JSON Lines reads with the edge's own
//! error message when it refuses.

use anyhow::{Context, bail};
use serde_json::Value;

/// An edge, and how to reach it.
#[derive(clap::Args, Debug, Clone)]
pub struct EdgeTarget {
    /// The edge (`http://` or `https://`).
    #[arg(long, default_value = "http://127.0.0.1:8585")]
    pub url: String,
    /// A PEM file of the authority an HTTPS edge's certificate chains to
    /// (a private CA; only it is then trusted).
    #[arg(long, env = "TAILRACE_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// A bearer token (`write` scope to produce, `read` to read).
    #[arg(long, env = "TAILRACE_TOKEN")]
    pub token: Option<String>,
}

impl EdgeTarget {
    /// A client for this edge.
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        super::http_client(self.ca_file.as_deref())
    }

    /// A request to `{url}{path}` with the token.
    pub fn request(&self, client: &reqwest::Client, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = client.request(method, format!("{}{path}", self.url.trim_end_matches('/')));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}

/// `error` with the causes under it, as `error: cause: cause`: a failed
/// request's own message (`error sending request for url …`) leaves out
/// why (a refused connection, a certificate not trusted).
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// The run a command talks to, and how to reach it.
#[derive(clap::Args, Debug)]
pub struct RunTarget {
    #[command(flatten)]
    pub edge: EdgeTarget,
    /// The pipeline's fully qualified name.
    #[arg(long)]
    pub fqn: String,
    /// The run id.
    #[arg(long)]
    pub run: String,
}

impl RunTarget {
    /// A client for this edge.
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        self.edge.client()
    }

    /// A request to `{url}{path}`, with `{fqn}` and `{run}` in `path`
    /// replaced by the percent-encoded pipeline and run, and the token.
    pub fn request(&self, client: &reqwest::Client, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.edge.request(client, method, &run_path(path, &self.fqn, &self.run))
    }
}

/// `path` with `{fqn}` and `{run}` replaced by the percent-encoded names.
pub fn run_path(path: &str, fqn: &str, run: &str) -> String {
    path.replace("{fqn}", &enc(fqn)).replace("{run}", &enc(run))
}

/// Percent-encodes a path segment.
pub fn enc(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A read of an edge: `GET {path}` with `query`.
pub struct Reader {
    pub edge: EdgeTarget,
    pub client: reqwest::Client,
}

impl Reader {
    pub fn new(edge: EdgeTarget) -> anyhow::Result<Self> {
        let client = edge.client()?;
        Ok(Reader { edge, client })
    }

    async fn get(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<reqwest::Response> {
        let request = self.edge.request(&self.client, reqwest::Method::GET, path).query(query);
        let response = request.send().await.with_context(|| format!("cannot reach the edge at {}", self.edge.url))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        // The edge says why in `{"code", "message"}`.
        let body = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or(body);
        bail!("the edge answered {}: {}", status.as_u16(), message.trim())
    }

    /// A JSON answer.
    pub async fn json(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        self.get(path, query).await?.json().await.context("the edge's answer is not JSON")
    }

    /// A JSON Lines answer: its records, and its last line (the summary).
    pub async fn json_lines(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<(Vec<Value>, Value)> {
        let text = self.get(path, query).await?.text().await.context("the edge's answer broke off")?;
        let mut records = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<Vec<Value>, _>>()
            .context("the edge's answer is not JSON Lines")?;
        let summary = records.pop().context("the edge's answer is empty")?;
        Ok((records, summary))
    }
}
