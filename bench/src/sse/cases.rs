//! The cases of `sse` beside the default one, each on a server of its own
//! and ending with a `RESULT scenario=sse-<case>` line:
//!
//! - `--sweep`: one round per viewer count, from 1 000 (500 with
//!   `--quick`) doubling until p99 passes 100 ms (or a viewer misses a
//!   line, or the cap: 24 000, under the 28 000 loopback ports one client
//!   address has, or the open-files limit less 1 024), then bisecting between the largest count that held and
//!   the smallest that did not, to 1 000 (250). Viewers start at the run's
//!   head, so a step's connections do not replay earlier steps' lines.
//! - `--burst`: 1 000 viewers (200), then 50 000 lines (10 000) posted in
//!   one second, 100 posts; whether every viewer got every line, when the
//!   last viewer had the last line, and the server's writes per viewer and
//!   second over that window.
//! - `--stalled`: 9 999 healthy viewers (999) at the head, and beside them
//!   one that sends its request from line 0 (a backlog of 5 000 lines) and
//!   never reads (a 4 KiB receive buffer and a 536-byte MSS, so the
//!   server's send buffer for it stays small), against the
//!   same healthy viewers without it, in alternating rounds (two pairs,
//!   one with `--quick`). The server's `stall_timeout_seconds` is 5 here
//!   (30 by default), so the stalled viewer is cut within the window.

use super::phase::{Load, Phase, Spec, phase};
use super::{Server, spread, steady};
use crate::sse_client::raise_open_files;

/// The p99 a viewer count must hold.
const GOAL_P99_MS: f64 = 100.0;

/// Whether a sweep step held: every viewer connected and got every line,
/// p99 within the goal.
fn held(p: &Phase) -> bool {
    p.every_line() && p.report.dropped == 0 && p.report.p99_ms() <= GOAL_P99_MS
}

pub(super) async fn sweep(quick: bool) -> anyhow::Result<()> {
    let (first, cap, unit, seconds) = if quick { (500, 2_000, 250, 5) } else { (1_000, 24_000, 1_000, 8) };
    // Each viewer is a socket of the server's and one of the clients': the
    // cap stays under the open-files limit (20 000 on the bench host, which
    // cannot raise it).
    let limit = raise_open_files(cap as u64 + 1024)?;
    let cap = cap.min(limit.saturating_sub(1024) as usize / unit * unit);
    println!(
        "sse --sweep: viewers from {first}, doubling until p99 passes {GOAL_P99_MS} ms (cap {cap}), then bisecting to {unit}; one round of {seconds} s each"
    );
    let server = Server::start(cap, |_| {}).await?;
    let mut steps: Vec<(usize, f64, bool)> = Vec::new();
    let (mut largest, mut smallest_failed) = (0, None::<usize>);
    let mut viewers = first;
    loop {
        let measured = phase(&server, Spec { at_head: true, ..Spec::stream(viewers, steady(seconds)) }).await?;
        let ok = held(&measured);
        println!("  {viewers:>6} viewers: {}{}", measured.summary(viewers), if ok { "" } else { "  (did not hold)" });
        steps.push((viewers, measured.report.p99_ms(), ok));
        if ok {
            largest = largest.max(viewers);
        } else {
            smallest_failed = Some(smallest_failed.map_or(viewers, |f: usize| f.min(viewers)));
        }
        viewers = match smallest_failed {
            None if viewers >= cap => break,
            None => (viewers * 2).min(cap),
            Some(failed) => {
                let middle = (largest + failed) / 2 / unit * unit;
                if middle <= largest || middle >= failed {
                    break;
                }
                middle
            }
        };
    }
    server.shutdown().await?;
    let steps_text: Vec<String> =
        steps.iter().map(|(n, p99, ok)| format!("{n}:{p99:.0}{}", if *ok { "" } else { "!" })).collect();
    println!(
        "  the largest viewer count at p99 <= {GOAL_P99_MS} ms: {largest}{}",
        if smallest_failed.is_none() { " (the cap: every step held)" } else { "" }
    );
    println!(
        "RESULT scenario=sse-sweep largest_viewers={largest} first_failed={} goal_p99_ms={GOAL_P99_MS:.0} cap={cap} step_seconds={seconds} steps={}",
        smallest_failed.map_or("none".to_string(), |f| f.to_string()),
        steps_text.join(",")
    );
    Ok(())
}

pub(super) async fn burst(quick: bool) -> anyhow::Result<()> {
    let (viewers, lines_per_post) = if quick { (200, 100) } else { (1_000, 500) };
    let load = Load { posts_per_second: 100, lines_per_post, seconds: 1 };
    let lines = load.posts() * lines_per_post as u64;
    println!("sse --burst: {viewers} viewers, {lines} lines posted in one second ({} posts)", load.posts());
    let server = Server::start(viewers, |_| {}).await?;
    let measured = phase(&server, Spec { expect_all: true, ..Spec::stream(viewers, load) }).await?;
    server.shutdown().await?;
    let report = &measured.report;
    let every_line = measured.every_line() && report.complete == viewers;
    let since = |us: u64| report.last_complete_us.saturating_sub(us) as f64 / 1000.0;
    let (all_ms, last_line_ms) = (since(measured.started_us), since(measured.last_post_us));
    let writes = measured.writes_per_viewer_s(viewers);
    println!("  {}", measured.summary(viewers));
    println!(
        "  every viewer every line: {}  ({} of {viewers} viewers had all {lines}; fewest {})",
        if every_line { "yes" } else { "NO" },
        report.complete,
        report.min_lines
    );
    println!(
        "  posting took {:.0} ms; the last viewer had the last line {all_ms:.0} ms after the first post, {last_line_ms:.0} ms after the last",
        measured.posting_seconds * 1000.0
    );
    println!(
        "RESULT scenario=sse-burst viewers={viewers} lines={lines} every_viewer_every_line={every_line} viewers_complete={} \
         post_ms={:.0} all_lines_ms={all_ms:.0} last_line_ms={last_line_ms:.0} window_ms={:.0} writes_per_viewer_s={} \
         client_reads_per_viewer_s={:.1} p99_ms={:.0} server_cores={:.2} client_cores={:.2} host_busy={:.2}",
        report.complete,
        measured.posting_seconds * 1000.0,
        measured.window_seconds * 1000.0,
        writes.map_or("na".to_string(), |w| format!("{w:.1}")),
        report.reads_per_viewer_s(),
        report.p99_ms(),
        measured.cpu.server,
        measured.cpu.client,
        measured.cpu.host_busy
    );
    Ok(())
}

pub(super) async fn stalled(quick: bool) -> anyhow::Result<()> {
    let (healthy, pairs, seconds) = if quick { (999, 1, 8) } else { (9_999, 2, 15) };
    println!(
        "sse --stalled: {healthy} healthy viewers with one stalled viewer and without it, {pairs} pair(s) of rounds of {seconds} s"
    );
    let server = Server::start(healthy + 1, |s| s.stall_timeout_seconds = 5.0).await?;
    // A backlog the stalled viewer's replay starts with (5 000 lines, about
    // 200 KiB of frames): its socket is full before the window opens.
    for batch in 0..100 {
        server.post(batch, 50).await?;
    }
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut cut = Vec::new();
    for pair in 1..=pairs {
        for stalled in [0, 1] {
            let spec = Spec { stalled, at_head: true, ..Spec::stream(healthy, steady(seconds)) };
            let measured = phase(&server, spec).await?;
            let label = if stalled == 0 { "without" } else { "with" };
            println!("  pair {pair}, {label:<7} the stalled viewer: {}", measured.summary(healthy + stalled));
            if stalled == 0 {
                without.push(measured.report.p99_ms());
            } else {
                // Cut: fewer connections at the window's end than viewers.
                cut.push(measured.connections_at_end < healthy + 1);
                with.push(measured.report.p99_ms());
            }
            anyhow::ensure!(measured.every_line(), "a healthy viewer missed lines");
        }
    }
    server.shutdown().await?;
    let (with_p99, with_min, with_max) = spread(&mut with);
    let (without_p99, without_min, without_max) = spread(&mut without);
    let ratio = if without_p99 > 0.0 { with_p99 / without_p99 } else { 0.0 };
    let was_cut = cut.iter().all(|c| *c);
    println!(
        "  healthy viewers' p99: {with_p99:.0} ms with the stalled viewer ({with_min:.0}–{with_max:.0}), {without_p99:.0} ms without ({without_min:.0}–{without_max:.0}): ratio {ratio:.2}; stalled viewer cut within the window: {was_cut}"
    );
    println!(
        "RESULT scenario=sse-stalled healthy_viewers={healthy} stalled=1 p99_ms={with_p99:.0} p99_ms_min={with_min:.0} p99_ms_max={with_max:.0} \
         baseline_p99_ms={without_p99:.0} baseline_p99_ms_min={without_min:.0} baseline_p99_ms_max={without_max:.0} ratio={ratio:.3} rounds={pairs} stalled_cut={was_cut}"
    );
    Ok(())
}
