//! `tailrace`: run the demo, a node, benchmarks, and talk to a running node.

mod cli;

/// A faster allocator than glibc's under many small cross-thread
/// allocations (events, containers, tasks); see docs/benchmarks.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

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
    /// Run a benchmark scenario against its baseline; the last line is
    /// `RESULT scenario=... ratio=...`.
    Bench {
        /// The scenario: pipeline.
        scenario: String,
        /// A shorter run (CI).
        #[arg(long)]
        quick: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match args.command {
            Command::Demo(demo) => cli::demo::run(demo).await,
            Command::Bench { scenario, quick } => cli::bench::run(&scenario, quick).await,
        }
    })
}
