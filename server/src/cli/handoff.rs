//! `tailrace handoff recover`: the operator's tool after a writer crashed
//! (a node recovers its own data directory at start; this is for
//! standalone writers, or to look before a node starts).

use std::path::PathBuf;

use anyhow::Context;
use tailrace::handoff::{DataDirLock, RecoveryReport};

/// Options of `tailrace handoff recover`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["dir", "data_dir"])))]
pub struct RecoverArgs {
    /// One directory holding the prefix's files.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A node's data directory: every queue under `{data-dir}/queues`
    /// (refused while a node runs on it).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The writer's prefix.
    #[arg(long, default_value = "events")]
    prefix: String,
    /// Also write the complete lines again into a sealed file (event ids
    /// unchanged, so consumers can drop what they already had), including
    /// those an earlier run only quarantined.
    #[arg(long)]
    republish: bool,
}

pub fn recover(args: RecoverArgs) -> anyhow::Result<()> {
    let reports: Vec<RecoveryReport> = match (&args.dir, &args.data_dir) {
        (Some(dir), _) => vec![tailrace::handoff::recover(dir, &args.prefix, args.republish)?],
        (None, Some(data_dir)) => {
            // Holding the node's lock keeps a node from starting meanwhile.
            let _held = DataDirLock::acquire(data_dir)?;
            let queues = data_dir.join("queues");
            tailrace::handoff::recover_tree(&queues, &args.prefix, args.republish)
                .with_context(|| format!("recovering the queues in {}", queues.display()))?
        }
        (None, None) => anyhow::bail!("give --dir or --data-dir"),
    };
    if reports.iter().all(RecoveryReport::is_empty) {
        println!("nothing to recover");
    }
    for report in reports.iter().filter(|r| !r.is_empty()) {
        print!("{report}");
    }
    let pending: u64 = reports.iter().map(RecoveryReport::pending_lines).sum();
    if !args.republish && pending > 0 {
        println!(
            "{pending} complete lines are in quarantine and were not republished; check them, then run again with --republish to hand them over"
        );
    }
    Ok(())
}
