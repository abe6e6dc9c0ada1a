//! `tailrace`: run the demo, a node, one process on files, and talk to a
//! running node. The process-level setup (allocator, logging, runtime) is
//! here; everything else is the library's.

mod cli;

/// A faster allocator than glibc's under many small cross-thread
/// allocations (events, containers, tasks); see docs/benchmarks.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

/// Threads for blocking file I/O (short tasks: reads, appends, fsyncs).
/// Bounded: each thread costs its own allocator heap, so a burst of
/// thousands of viewers catching up at once must not start hundreds.
const MAX_BLOCKING_THREADS: usize = 16;

#[derive(Parser)]
#[command(name = "tailrace", version, about = "Durable, ordered event streams; live log tails over SSE")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job: several nodes in this process, producers and
    /// consumers, events flowing with a progress line every second, until
    /// Ctrl-C.
    Demo(cli::demo::DemoArgs),
    /// One node on the adapter `[queues] adapter` names (file, the
    /// default; redis; kafka; memory) with its HTTP edge, until Ctrl-C or
    /// SIGTERM.
    Serve(cli::serve::ServeArgs),
    /// One node of a multi-process cluster (queues on Redis or Kafka;
    /// archive, leases and membership on Redis) with its HTTP edge, until
    /// SIGTERM or Ctrl-C.
    Node(cli::node::NodeArgs),
    /// Start, stop or read a running node's pulling agents (admin API).
    Agents(cli::agents::AgentsArgs),
    /// Send log lines to a run on a running edge: standard input, or what a
    /// command run after `--` writes (its exit then sets the run's state
    /// and this process's exit code).
    Produce(cli::produce::ProduceArgs),
    /// Follow a run's log from the terminal, resuming across disconnects.
    Tail(cli::tail::TailArgs),
    /// Read a stored run as a script or an agent wants it: a range, the
    /// last lines, matches with context, errors, or the failing groups
    /// (bounded answers; exits 1 when a filter finds nothing).
    Logs(cli::logs::LogsArgs),
    /// A Model Context Protocol server on standard input and output, whose
    /// tools read a running edge's logs for a coding agent.
    Mcp(cli::mcp::McpArgs),
    /// What changed in a run against another (by default the last
    /// successful one before it), as a unified diff: exits 0 when they are
    /// the same, 1 when they differ, 2 on an error.
    Diff(cli::diff::DiffArgs),
    /// The file handoff: recover a prefix after a writer crashed.
    Handoff {
        #[command(subcommand)]
        command: HandoffCommand,
    },
}

#[derive(Subcommand)]
enum HandoffCommand {
    /// Inspect what a crashed writer left (stale lock, .open files), report
    /// complete lines and a truncated tail, move the files aside into
    /// quarantine/ and free the prefix; with --republish, write their
    /// complete lines again. Safe to run twice.
    Recover(cli::handoff::RecoverArgs),
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // Every TLS this process speaks (the edge, the cluster, its HTTP
    // clients) uses ring.
    tailrace::tls::use_ring_by_default();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().max_blocking_threads(MAX_BLOCKING_THREADS).enable_all().build()?;
    let code = runtime.block_on(async move {
        let done = match args.command {
            // A command run by `produce` decides the exit code.
            Command::Produce(args) => return cli::produce::run(args).await,
            Command::Logs(args) => return cli::logs::run(args).await,
            // So does the diff: whether the runs differ.
            Command::Diff(args) => return Ok(cli::diff::run(args).await),
            Command::Demo(demo) => cli::demo::run(demo).await,
            Command::Serve(serve) => cli::serve::run(serve).await,
            Command::Node(node) => cli::node::run(node).await,
            Command::Agents(args) => cli::agents::run(args).await,
            Command::Tail(args) => cli::tail::run(args).await,
            Command::Mcp(args) => cli::mcp::run(args).await,
            Command::Handoff { command: HandoffCommand::Recover(args) } => cli::handoff::recover(args),
        };
        done.map(|()| 0)
    })?;
    Ok(std::process::ExitCode::from(code))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag of every command, as `command --flag`.
    fn flags(command: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long()
                && !arg.is_hide_set()
                && !["help", "version"].contains(&long)
            {
                out.push((path.to_string(), format!("--{long}")));
            }
        }
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            flags(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    /// A user finds every flag in the README or `docs/`.
    #[test]
    fn every_flag_is_documented() {
        // The workspace's root, where the README and docs/ are.
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        let mut docs = std::fs::read_to_string(root.join("README.md")).unwrap();
        for entry in std::fs::read_dir(root.join("docs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                docs.push_str(&std::fs::read_to_string(path).unwrap());
            }
        }
        let mut all = Vec::new();
        flags(&super::Args::command(), "tailrace", &mut all);
        let missing: Vec<String> =
            all.iter().filter(|(_, flag)| !docs.contains(flag.as_str())).map(|(c, f)| format!("{c} {f}")).collect();
        assert!(all.len() > 20, "the flags were found: {all:?}");
        assert!(missing.is_empty(), "flags no doc mentions: {missing:?}");
    }
}
