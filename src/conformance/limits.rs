//! The edges of the contract: direction, shutdown, bad input and
//! back-pressure on a full queue.

use std::time::Duration;

use super::Failure;
use super::support::{CALL_LIMIT, Kit, events, fail, within};
use crate::queue::{Direction, Fence, QueueError};
use crate::stream::{QueueId, SequenceToken, StreamId};

/// Write-only refuses receivers, read-only refuses writes, read-write does
/// both on every queue.
pub(super) async fn direction(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "direction";
    let probe = StreamId::new(CHECK, "probe");
    match kit.adapter.direction() {
        Direction::WriteOnly => {
            if let Ok(Ok(_)) =
                tokio::time::timeout(CALL_LIMIT, kit.adapter.create_receiver(QueueId(0), Fence::NONE)).await
            {
                return Err(fail(CHECK, "a write-only adapter handed out a receiver of queue q0"));
            }
        }
        Direction::ReadOnly => {
            if let Ok(Ok(_)) = tokio::time::timeout(CALL_LIMIT, kit.adapter.enqueue(&probe, events("d", 0..1))).await {
                return Err(fail(CHECK, format!("a read-only adapter accepted a write to {probe}")));
            }
        }
        Direction::ReadWrite => {
            kit.write(CHECK, &probe, events("d", 0..1)).await?;
            for queue in kit.mapper.all_queues() {
                let mut reader = kit.reader(CHECK, queue).await?;
                if queue == kit.mapper.queue_for(&probe) {
                    reader.read_n(CHECK, 1).await?;
                }
                reader.close().await?;
            }
        }
    }
    Ok(())
}

/// Shutdown twice is fine and a read after it fails, on every queue.
pub(super) async fn shutdown(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "shutdown";
    for queue in kit.mapper.all_queues() {
        let mut reader = kit.reader(CHECK, queue).await?;
        for attempt in ["first", "second"] {
            within(
                CHECK,
                || format!("{attempt} shutdown of queue {queue}"),
                reader.inner.shutdown(Duration::from_secs(5)),
            )
            .await?;
        }
        match tokio::time::timeout(CALL_LIMIT, reader.inner.read(1)).await {
            Ok(Err(_)) => {}
            Ok(Ok(_)) => return Err(fail(CHECK, format!("queue {queue}: a receiver still read after shutdown"))),
            Err(_) => return Err(fail(CHECK, format!("queue {queue}: a read after shutdown hung instead of failing"))),
        }
    }
    Ok(())
}

/// An empty batch and an unknown queue are refused; nothing around them is
/// lost.
pub(super) async fn bad_input(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "bad_input";
    let stream = StreamId::new(CHECK, "s");
    let queue = kit.mapper.queue_for(&stream);
    kit.write(CHECK, &stream, events("b", 0..1)).await?;
    match tokio::time::timeout(CALL_LIMIT, kit.adapter.enqueue(&stream, Vec::new())).await {
        Ok(Err(QueueError::EmptyBatch(_))) => {}
        Ok(Err(other)) => {
            return Err(fail(CHECK, format!("an empty batch for {stream} should be EmptyBatch, got: {other}")));
        }
        Ok(Ok(token)) => return Err(fail(CHECK, format!("an empty batch for {stream} was accepted as {token}"))),
        Err(_) => return Err(fail(CHECK, format!("an empty batch for {stream} hung"))),
    }
    let outside = QueueId(kit.mapper.queue_count());
    if let Ok(Ok(_)) = tokio::time::timeout(CALL_LIMIT, kit.adapter.create_receiver(outside, Fence::NONE)).await {
        return Err(fail(
            CHECK,
            format!("a receiver of queue {outside} was handed out, but there are {} queues", kit.mapper.queue_count()),
        ));
    }
    kit.write(CHECK, &stream, events("b", 1..2)).await?;
    let mut reader = kit.reader(CHECK, queue).await?;
    let got = reader.read_n(CHECK, 2).await?;
    let ids: Vec<&str> = got.iter().flat_map(|b| b.events.iter().map(|e| e.id.as_str())).collect();
    if ids != ["b0", "b1"] {
        return Err(fail(
            CHECK,
            format!("queue {queue}: the events accepted around the refused batch should be [b0, b1], read {ids:?}"),
        ));
    }
    reader.close().await
}

/// How a producer felt the queue was full.
enum Pressure {
    /// `enqueue` did not answer: it waits for room.
    Waiting(tokio::task::JoinHandle<Result<SequenceToken, QueueError>>),
    /// `enqueue` answered that the queue is full.
    Refused,
}

/// How long an `enqueue` that does not answer is taken as waiting for room.
const WAITING: Duration = Duration::from_secs(1);
const BATCH: u64 = 8;

/// A queue never holds more than `bound` unread events: producers wait or
/// are refused, and what was accepted is all read back once room returns.
pub(super) async fn back_pressure(kit: &Kit, bound: usize) -> Result<(), Failure> {
    const CHECK: &str = "back_pressure";
    let stream = StreamId::new(CHECK, "s");
    let queue = kit.mapper.queue_for(&stream);
    let mut accepted: Vec<String> = Vec::new();
    let mut next = 0u64;
    let pressure = loop {
        if accepted.len() > bound {
            return Err(fail(
                CHECK,
                format!(
                    "queue {queue} accepted {} unread events (last {}) without making the producer wait or refusing; the claimed bound is {bound}",
                    accepted.len(),
                    accepted.last().map(String::as_str).unwrap_or("")
                ),
            ));
        }
        let batch = events("bp", next..next + BATCH);
        let adapter = kit.adapter.clone();
        let target = stream.clone();
        let mut call = tokio::spawn(async move { adapter.enqueue(&target, batch).await });
        match tokio::time::timeout(WAITING, &mut call).await {
            Ok(Ok(Ok(_))) => {
                accepted.extend((next..next + BATCH).map(|i| format!("bp{i}")));
                next += BATCH;
            }
            Ok(Ok(Err(QueueError::Full { .. } | QueueError::Refused { .. }))) => break Pressure::Refused,
            Ok(Ok(Err(other))) => {
                return Err(fail(CHECK, format!("queue {queue}: enqueue of bp{next} failed: {other}")));
            }
            Ok(Err(panic)) => return Err(fail(CHECK, format!("queue {queue}: enqueue of bp{next} panicked: {panic}"))),
            Err(_) => break Pressure::Waiting(call),
        }
    };
    // Read, ack and checkpoint as an agent would until the producer gets in.
    let mut reader = kit.reader(CHECK, queue).await?;
    let mut read: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + CALL_LIMIT;
    let mut pressure = Some(pressure);
    while pressure.is_some() || read.len() < accepted.len() {
        if tokio::time::Instant::now() >= deadline {
            let state =
                if pressure.is_some() { "the producer never got room back" } else { "not everything came back" };
            return Err(fail(
                CHECK,
                format!(
                    "queue {queue}: {state}: accepted {} events, read {} (last {:?})",
                    accepted.len(),
                    read.len(),
                    read.last()
                ),
            ));
        }
        let batch = reader.read(64).await?;
        read.extend(
            batch.iter().filter(|b| b.stream == stream).flat_map(|b| b.events.iter().map(|e| e.id.to_string())),
        );
        reader.ack_everything().await?;
        reader.save_checkpoint().await?;
        pressure = match pressure.take() {
            Some(Pressure::Waiting(call)) if call.is_finished() => {
                match call.await {
                    Ok(Ok(_)) => accepted.extend((next..next + BATCH).map(|i| format!("bp{i}"))),
                    Ok(Err(e)) => {
                        return Err(fail(CHECK, format!("queue {queue}: the waiting enqueue of bp{next} failed: {e}")));
                    }
                    Err(e) => return Err(fail(CHECK, format!("queue {queue}: the waiting enqueue panicked: {e}"))),
                }
                None
            }
            Some(Pressure::Refused) => {
                match tokio::time::timeout(WAITING, kit.adapter.enqueue(&stream, events("bp", next..next + BATCH)))
                    .await
                {
                    Ok(Ok(_)) => {
                        accepted.extend((next..next + BATCH).map(|i| format!("bp{i}")));
                        None
                    }
                    Ok(Err(QueueError::Full { .. } | QueueError::Refused { .. })) | Err(_) => Some(Pressure::Refused),
                    Ok(Err(e)) => {
                        return Err(fail(CHECK, format!("queue {queue}: a retried enqueue of bp{next} failed: {e}")));
                    }
                }
            }
            other => other,
        };
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    if read != accepted {
        let lost: Vec<&String> = accepted.iter().filter(|id| !read.contains(id)).take(5).collect();
        return Err(fail(
            CHECK,
            format!(
                "queue {queue}: accepted {} events but read {} back; missing {lost:?}, out of order or duplicated otherwise",
                accepted.len(),
                read.len()
            ),
        ));
    }
    reader.close().await
}
