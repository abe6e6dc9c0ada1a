//! `tailrace handoff recover`: the operator's tool after a writer crashed.

use std::path::PathBuf;

/// Options of `tailrace handoff recover`.
#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// The directory holding the prefix's files.
    #[arg(long)]
    dir: PathBuf,
    /// The writer's prefix.
    #[arg(long)]
    prefix: String,
    /// Also write the complete lines again into a sealed file (event ids
    /// unchanged, so consumers can drop what they already had).
    #[arg(long)]
    republish: bool,
}

pub fn recover(args: RecoverArgs) -> anyhow::Result<()> {
    let report = tailrace::handoff::recover(&args.dir, &args.prefix, args.republish)?;
    print!("{report}");
    if !args.republish && report.files.iter().any(|f| f.valid_lines > 0) {
        println!("nothing was republished; check the lines above, then run again with --republish to hand them over");
    }
    Ok(())
}
