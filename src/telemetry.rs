//! Every metric tailrace records, named and described in one place.
//!
//! Call sites use these constants, never a string of their own, so a name is
//! reviewed once; [`describe`] gives each its help text and unit, and runs
//! once when the edge installs its Prometheus recorder, so `/metrics` shows
//! a `# HELP` line for every metric. Labels: `queue` (`q3`) on per-queue
//! metrics, `node` on the manager's.

use metrics::{Unit, describe_counter, describe_gauge};

/// Events the pulling agents read from their queues (label `queue`).
pub const AGENT_EVENTS_READ: &str = "tailrace_agent_events_read_total";
/// Events delivered to a subscriber (label `queue`).
pub const AGENT_EVENTS_DELIVERED: &str = "tailrace_agent_events_delivered_total";
/// Events read for a stream nobody subscribes to (label `queue`).
pub const AGENT_EVENTS_UNSUBSCRIBED: &str = "tailrace_agent_events_unsubscribed_total";
/// Deliveries given up after their retries (label `queue`).
pub const AGENT_DELIVERY_FAILURES: &str = "tailrace_agent_delivery_failures_total";
/// Containers given up and sent to the dead-letter sink (label `queue`).
pub const AGENT_DEAD_LETTERS: &str = "tailrace_agent_dead_letters_total";
/// Queue reads that failed (label `queue`).
pub const AGENT_READ_ERRORS: &str = "tailrace_agent_read_errors_total";
/// Cursors asked for positions the cache had already purged (label `queue`).
pub const AGENT_CACHE_MISSES: &str = "tailrace_agent_cache_misses_total";
/// Batches (containers of a stream's events, as read) held in a queue's
/// cache now (label `queue`).
pub const CACHE_CONTAINERS: &str = "tailrace_cache_containers";
/// 1 while a queue's cache is under pressure and its agent does not read (label `queue`).
pub const CACHE_UNDER_PRESSURE: &str = "tailrace_cache_under_pressure";
/// Pulling agents running on a node now (label `node`).
pub const AGENTS_RUNNING: &str = "tailrace_agents_running";
/// Crashed agents restarted by their manager (label `node`).
pub const AGENT_RESTARTS: &str = "tailrace_agent_restarts_total";
/// Queue leases a node holds now (label `node`).
pub const LEASES_HELD: &str = "tailrace_leases_held";
/// Queue leases a node lost before releasing them: its agent was killed (label `node`).
pub const LEASES_LOST: &str = "tailrace_leases_lost_total";
/// Peers this node's failure detector found dead and evicted.
pub const NODES_EVICTED: &str = "tailrace_nodes_evicted_total";
/// Writes of an old lease's owner refused by the queue's fence (label
/// `kind`: `read`, `trim`, `checkpoint`, `append`).
pub const FENCED_WRITES: &str = "tailrace_fenced_writes_total";
/// Checkpoints written (label `queue`).
pub const CHECKPOINT_WRITES: &str = "tailrace_checkpoint_writes_total";
/// Log lines the archiver stored in the run log store.
pub const ARCHIVE_LINES: &str = "tailrace_archive_lines_total";
/// Runs removed from the run log store by retention.
pub const ARCHIVE_RUNS_PRUNED: &str = "tailrace_archive_runs_pruned_total";
/// Bytes freed in the run log store by retention.
pub const ARCHIVE_BYTES_PRUNED: &str = "tailrace_archive_bytes_pruned_total";
/// Handoff files the file adapter recovered after a crash.
pub const RECOVERED_FILES: &str = "tailrace_recovered_files_total";
/// Events the file adapter wrote again while recovering after a crash.
pub const RECOVERED_EVENTS: &str = "tailrace_recovered_events_total";
/// Bytes of truncated tails the file adapter set aside while recovering.
pub const RECOVERED_TAIL_BYTES: &str = "tailrace_recovered_tail_bytes_total";
/// Log lines accepted by `POST …/lines`.
pub const EDGE_INGESTED_LINES: &str = "tailrace_edge_ingested_lines_total";
/// Runs with a tailer on this node now (someone watches them).
pub const EDGE_RUNS: &str = "tailrace_edge_runs";
/// SSE viewers connected now.
pub const EDGE_CONNECTIONS: &str = "tailrace_edge_connections";
/// Log frames queued to viewers (one per viewer per chunk).
pub const EDGE_FRAMES: &str = "tailrace_edge_frames_total";
/// SSE viewers cut because their socket took nothing for
/// `stall_timeout_seconds` while lines waited.
pub const EDGE_VIEWERS_DROPPED: &str = "tailrace_edge_viewers_dropped_total";
/// 1 while a queue's writer finds its disk full (its appends are refused),
/// by queue.
pub const QUEUE_DISK_FULL: &str = "tailrace_queue_disk_full";
/// Offsets a queue's read found missing below where the broker's answer
/// went on, by `outcome`: `filled` (read again until they showed), or
/// `skipped` (still missing after the adapter's patience).
pub const QUEUE_OFFSET_GAPS: &str = "tailrace_queue_offset_gaps_total";
/// Records or lines a queue could not read, sent to the dead-letter sink
/// (labels `queue` and `reason`: `format`, not in the queue's format;
/// `misplaced`, a Kafka record whose stream another partition holds).
pub const QUEUE_UNREADABLE: &str = "tailrace_queue_unreadable_total";
/// Tailers re-based on the run log store after a gap in their run's
/// stream (events their subscription skipped: a batch given up, a
/// catch-up the queue could no longer serve).
pub const EDGE_REBASES: &str = "tailrace_edge_rebases_total";
/// Reads the edge made from the run log store (catch-ups, pages, downloads).
pub const EDGE_STORE_READS: &str = "tailrace_edge_store_reads_total";

/// Calls to another node's gateway, by peer and outcome (`ok`, `link`,
/// `timeout`, `refused`, `fenced`, `not_member`).
pub const TRANSPORT_CALLS: &str = "tailrace_transport_calls_total";
/// Peers this node has an open link to now (its lane to them).
pub const TRANSPORT_LINKS: &str = "tailrace_transport_links";
/// Calls this node refused because they carried a stale lease token.
pub const FENCED_CALLS: &str = "tailrace_fenced_calls_total";
/// Deliveries and handshakes of this node's agents that a consumer's node
/// refused for a stale lease token.
pub const FENCED_DELIVERIES: &str = "tailrace_fenced_deliveries_total";
/// Stored subscriptions removed because their consumer's node left.
pub const PURGED_SUBSCRIPTIONS: &str = "tailrace_purged_subscriptions_total";

/// Gives every metric above its help text (and unit) in the installed
/// recorder. Call once, right after installing it.
pub fn describe() {
    let counters = [
        (AGENT_EVENTS_READ, Unit::Count, "Events the pulling agents read from their queues."),
        (AGENT_EVENTS_DELIVERED, Unit::Count, "Events delivered to a subscriber."),
        (AGENT_EVENTS_UNSUBSCRIBED, Unit::Count, "Events read for a stream nobody subscribes to."),
        (
            AGENT_DELIVERY_FAILURES,
            Unit::Count,
            "Deliveries given up after their retries (the failure handler decided).",
        ),
        (AGENT_DEAD_LETTERS, Unit::Count, "Containers given up and sent to the dead-letter sink."),
        (AGENT_READ_ERRORS, Unit::Count, "Queue reads that failed."),
        (AGENT_CACHE_MISSES, Unit::Count, "Cursors that asked for positions the cache had already purged."),
        (AGENT_RESTARTS, Unit::Count, "Crashed pulling agents restarted by their manager."),
        (LEASES_LOST, Unit::Count, "Queue leases lost before being released (their agent was killed)."),
        (NODES_EVICTED, Unit::Count, "Peers found dead (link closed, nothing listening) and evicted at once."),
        (CHECKPOINT_WRITES, Unit::Count, "Checkpoints written."),
        (FENCED_WRITES, Unit::Count, "Writes of an old lease's owner refused because a newer lease was granted."),
        (TRANSPORT_CALLS, Unit::Count, "Calls to other nodes, by peer and outcome."),
        (FENCED_CALLS, Unit::Count, "Calls from other nodes refused for a stale lease token."),
        (
            FENCED_DELIVERIES,
            Unit::Count,
            "Calls of this node's agents refused by a consumer's node for a stale lease token.",
        ),
        (PURGED_SUBSCRIPTIONS, Unit::Count, "Stored subscriptions removed because their consumer's node left."),
        (ARCHIVE_LINES, Unit::Count, "Log lines the archiver stored in the run log store."),
        (ARCHIVE_RUNS_PRUNED, Unit::Count, "Runs removed from the run log store by retention."),
        (ARCHIVE_BYTES_PRUNED, Unit::Bytes, "Bytes freed in the run log store by retention."),
        (RECOVERED_FILES, Unit::Count, "Handoff files the file adapter recovered after a crash."),
        (RECOVERED_EVENTS, Unit::Count, "Events the file adapter wrote again while recovering after a crash."),
        (RECOVERED_TAIL_BYTES, Unit::Bytes, "Bytes of truncated tails set aside while recovering after a crash."),
        (EDGE_INGESTED_LINES, Unit::Count, "Log lines accepted by POST .../lines."),
        (EDGE_FRAMES, Unit::Count, "Live chunks published to SSE viewers (one per attached viewer per chunk)."),
        (
            EDGE_VIEWERS_DROPPED,
            Unit::Count,
            "SSE viewers cut because their socket took nothing for stall_timeout_seconds.",
        ),
        (
            QUEUE_OFFSET_GAPS,
            Unit::Count,
            "Gaps a queue's read found in the offsets a broker answered: filled when read again, or skipped.",
        ),
        (
            QUEUE_UNREADABLE,
            Unit::Count,
            "Records or lines a queue could not read, sent to the dead-letter sink, by reason.",
        ),
        (EDGE_REBASES, Unit::Count, "Tailers re-based on the run log store after a gap in their run's stream."),
        (EDGE_STORE_READS, Unit::Count, "Reads the edge made from the run log store."),
    ];
    for (name, unit, help) in counters {
        describe_counter!(name, unit, help);
    }
    let gauges = [
        (CACHE_CONTAINERS, "Batches of events held in a queue's cache."),
        (CACHE_UNDER_PRESSURE, "1 while a queue's cache is under pressure and its agent does not read."),
        (AGENTS_RUNNING, "Pulling agents running on the node."),
        (LEASES_HELD, "Queue leases the node holds."),
        (EDGE_RUNS, "Runs with a tailer on this node (someone watches them)."),
        (EDGE_CONNECTIONS, "SSE viewers connected."),
        (TRANSPORT_LINKS, "Other nodes this node has an open link to now."),
        (QUEUE_DISK_FULL, "1 while a queue's writer finds its disk full and refuses appends."),
    ];
    for (name, help) in gauges {
        describe_gauge!(name, Unit::Count, help);
    }
}

/// Every name above, for tests that check each one is described.
pub const ALL: [&str; 37] = [
    AGENT_EVENTS_READ,
    AGENT_EVENTS_DELIVERED,
    AGENT_EVENTS_UNSUBSCRIBED,
    AGENT_DELIVERY_FAILURES,
    AGENT_DEAD_LETTERS,
    AGENT_READ_ERRORS,
    AGENT_CACHE_MISSES,
    CACHE_CONTAINERS,
    CACHE_UNDER_PRESSURE,
    AGENTS_RUNNING,
    AGENT_RESTARTS,
    LEASES_HELD,
    LEASES_LOST,
    NODES_EVICTED,
    CHECKPOINT_WRITES,
    FENCED_WRITES,
    TRANSPORT_CALLS,
    TRANSPORT_LINKS,
    FENCED_CALLS,
    FENCED_DELIVERIES,
    PURGED_SUBSCRIPTIONS,
    ARCHIVE_LINES,
    ARCHIVE_RUNS_PRUNED,
    ARCHIVE_BYTES_PRUNED,
    RECOVERED_FILES,
    RECOVERED_EVENTS,
    RECOVERED_TAIL_BYTES,
    EDGE_INGESTED_LINES,
    EDGE_RUNS,
    EDGE_CONNECTIONS,
    EDGE_FRAMES,
    EDGE_VIEWERS_DROPPED,
    EDGE_REBASES,
    EDGE_STORE_READS,
    QUEUE_DISK_FULL,
    QUEUE_OFFSET_GAPS,
    QUEUE_UNREADABLE,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics table of `docs/operations.md` names every metric.
    #[test]
    fn every_metric_is_in_the_operations_doc() {
        let doc = include_str!("../docs/operations.md");
        let missing: Vec<&str> = ALL.iter().copied().filter(|name| !doc.contains(&format!("`{name}`"))).collect();
        assert!(missing.is_empty(), "docs/operations.md does not list {missing:?}");
    }

    #[test]
    fn every_metric_has_help_text_in_the_exposition() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            describe();
            for name in ALL {
                if name.ends_with("_total") {
                    metrics::counter!(name).increment(1);
                } else {
                    metrics::gauge!(name).set(1.0);
                }
            }
        });
        let text = recorder.handle().render();
        for name in ALL {
            assert!(text.contains(&format!("# HELP {name} ")), "{name} has no help text:\n{text}");
        }
    }
}
