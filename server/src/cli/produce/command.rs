//! `produce -- COMMAND ARGS…`: runs the command with its standard output
//! and error on one pipe (so its lines keep the order it wrote them),
//! echoes and sends what it writes, passes SIGTERM, SIGINT and SIGHUP on to
//! it, and ends the run with its exit: `success` (0), `failed` (another
//! code) or `stopped` (a signal). Exits with the command's code (128 + the
//! signal's number after a signal), or 1 if the command succeeded but its
//! log or its state did not reach the edge.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;
use tokio::signal::unix::{SignalKind, signal};

use super::{Poster, Read};

/// How long the output is still read after the command exited: a process
/// it left behind may hold the pipe open for ever.
const LINGER: Duration = Duration::from_secs(2);

pub(super) async fn run(poster: &mut Poster) -> anyhow::Result<u8> {
    let command = poster.args.command.clone();
    let (program, args) = command.split_first().context("no command after `--`")?;
    let (reader, writer) = std::io::pipe().context("creating a pipe for the command's output")?;
    let both = writer.try_clone().context("creating a pipe for the command's output")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdout(Stdio::from(both))
        .stderr(Stdio::from(writer))
        .spawn()
        .with_context(|| format!("starting `{program}`"))?;
    // The command holds the only write ends now: the pipe ends with it
    // (and with whatever it started that kept them).
    let pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let mut input = BufReader::new(pipe);
    let mut delivered = match poster.set_status("running").await {
        Ok(()) => true,
        Err(error) => {
            eprintln!("  {error:#}");
            false
        }
    };
    let pid = child.id().and_then(|id| i32::try_from(id).ok());
    let mut signals = [SignalKind::terminate(), SignalKind::interrupt(), SignalKind::hangup()]
        .map(|kind| signal(kind).map(|s| (kind, s)))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .context("listening for signals")?;
    let mut stdout = tokio::io::stdout();
    let mut exited = None;
    let read = {
        let shipping = poster.ship(&mut input, Some(&mut stdout));
        tokio::pin!(shipping);
        loop {
            let linger = async {
                match exited {
                    Some(()) => tokio::time::sleep(LINGER).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                outcome = &mut shipping => break outcome,
                status = child.wait(), if exited.is_none() => {
                    status.context("waiting for the command")?;
                    exited = Some(());
                }
                () = linger => break Ok(Read::default()),
                kind = next_signal(&mut signals) => forward(pid, kind),
            }
        }
    };
    let read = match read {
        Ok(read) => read,
        Err(error) => {
            eprintln!("\n  {error:#}; the rest of the command's output is not sent");
            delivered = false;
            drain(&mut input, &mut stdout, &mut child, exited.is_some()).await;
            Read::default()
        }
    };
    let status = child.wait().await.context("waiting for the command")?;
    let (state, code) = match (status.code(), status.signal()) {
        (Some(0), _) => ("success", 0),
        (Some(code), _) => ("failed", u8::try_from(code).unwrap_or(1)),
        (None, Some(signal)) => ("stopped", u8::try_from(128 + signal).unwrap_or(255)),
        (None, None) => ("failed", 1),
    };
    poster.summary(&read);
    match poster.set_status(state).await {
        Ok(()) => eprintln!("  `{program}` exited with {status}; run is now {state}"),
        Err(error) => {
            eprintln!("  `{program}` exited with {status}; {error:#}");
            delivered = false;
        }
    }
    Ok(if code == 0 && !delivered { 1 } else { code })
}

/// The kind of the next signal of `signals` that arrives.
async fn next_signal(signals: &mut [(SignalKind, tokio::signal::unix::Signal)]) -> SignalKind {
    let waits = signals.iter_mut().map(|(kind, s)| Box::pin(async move { s.recv().await.map(|_| *kind) }));
    match futures::future::select_all(waits).await.0 {
        Some(kind) => kind,
        None => std::future::pending().await,
    }
}

/// Passes `kind` on to the command.
fn forward(pid: Option<i32>, kind: SignalKind) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) with a pid this process started and a signal number.
        unsafe {
            libc::kill(pid, kind.as_raw_value());
        }
    }
}

/// Echoes what is left of the output (so the command never blocks on a
/// full pipe) until it ends, or [`LINGER`] after the command exited.
async fn drain(
    input: &mut (impl AsyncBufRead + Unpin),
    stdout: &mut tokio::io::Stdout,
    child: &mut Child,
    exited: bool,
) {
    let mut buf = Vec::new();
    let read_all = async {
        loop {
            buf.clear();
            match input.read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let _ = stdout.write_all(&buf).await;
                }
            }
        }
    };
    let ended = async {
        if !exited {
            let _ = child.wait().await;
        }
        tokio::time::sleep(LINGER).await;
    };
    tokio::select! {
        () = read_all => {}
        () = ended => {}
    }
}
