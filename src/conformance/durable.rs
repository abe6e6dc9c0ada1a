//! Rewinds, retention and durability across a fresh factory.

use std::future::Future;
use std::sync::Arc;

use super::Failure;
use super::support::{Kit, events, fail, list, show, tokens, within};
use crate::queue::{QueueAdapterFactory, QueueError};
use crate::stream::StreamId;

/// Rewind serves past positions without moving the live one, or refuses.
pub(super) async fn rewind(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "rewind";
    if kit.claims.rewindable != kit.adapter.is_rewindable() {
        return Err(fail(
            CHECK,
            format!(
                "the claims say rewindable = {} but is_rewindable() answers {}",
                kit.claims.rewindable,
                kit.adapter.is_rewindable()
            ),
        ));
    }
    let stream = StreamId::new(CHECK, "s");
    let queue = kit.mapper.queue_for(&stream);
    let mut sent = Vec::new();
    for i in 0..3u64 {
        let batch = events("w", i..i + 1);
        sent.push(batch.clone());
        kit.write(CHECK, &stream, batch).await?;
    }
    let mut reader = kit.reader(CHECK, queue).await?;
    let got = reader.read_n(CHECK, 3).await?;
    reader.ack(&[got[0].token]).await?;
    let from = got[1].token;
    let rewound = tokio::time::timeout(super::support::CALL_LIMIT, reader.inner.rewind(from, 64)).await;
    let Ok(rewound) = rewound else {
        return Err(fail(CHECK, format!("queue {queue}: rewind({from}) did not answer")));
    };
    match (kit.adapter.is_rewindable(), rewound) {
        (true, Ok(batch)) => {
            let mine: Vec<_> = batch.iter().filter(|b| b.stream == stream).cloned().collect();
            let want = vec![got[1].token, got[2].token];
            if tokens(&mine) != want {
                return Err(fail(
                    CHECK,
                    format!("queue {queue}: rewind({from}) returned {}, expected {}", show(&mine), list(&want)),
                ));
            }
            if let Some(bad) = mine.iter().zip(&sent[1..]).find(|(b, s)| b.events != **s) {
                return Err(fail(
                    CHECK,
                    format!("queue {queue}: rewind returned token {} with other events", bad.0.token),
                ));
            }
            if let Some(first) = batch.first().filter(|b| b.token < from) {
                return Err(fail(
                    CHECK,
                    format!("queue {queue}: rewind({from}) returned {} from before it", first.token),
                ));
            }
            let after = reader.read(64).await?;
            if let Some(back) = after.iter().find(|b| b.stream == stream) {
                return Err(fail(
                    CHECK,
                    format!(
                        "queue {queue}: after rewind({from}) the live read position went back: read {} again",
                        back.token
                    ),
                ));
            }
        }
        (true, Err(e)) => {
            return Err(fail(
                CHECK,
                format!("queue {queue}: a rewindable adapter refused the recent token {from}: {e}"),
            ));
        }
        (false, Ok(_)) => {
            return Err(fail(CHECK, format!("queue {queue}: a non-rewindable adapter served rewind({from})")));
        }
        (false, Err(QueueError::NotRewindable { .. } | QueueError::CannotRewind { .. })) => {}
        (false, Err(other)) => {
            return Err(fail(CHECK, format!("queue {queue}: the refusal should say it cannot rewind, said: {other}")));
        }
    }
    reader.close().await
}

/// A rewind past retention is refused, never served from later data.
pub(super) async fn retention(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "retention";
    const MOST_FILLERS: u64 = 10_000;
    let patience = kit.read_deadline * 2;
    let stream = StreamId::new(CHECK, "s");
    let queue = kit.mapper.queue_for(&stream);
    let old = kit.write(CHECK, &stream, events("old", 0..1)).await?;
    let mut reader = kit.reader(CHECK, queue).await?;
    reader.read_tokens(CHECK, &[old]).await?;
    let deadline = tokio::time::Instant::now() + patience;
    let mut fillers = 0u64;
    loop {
        // Newer containers, read, acked and checkpointed, move retention on.
        let filler = kit.write(CHECK, &stream, events("filler", fillers..fillers + 1)).await?;
        fillers += 1;
        reader.read_tokens(CHECK, &[filler]).await?;
        reader.ack_everything().await?;
        reader.save_checkpoint().await?;
        let answer = within(CHECK, || format!("rewind({old}) on queue {queue}"), async {
            Ok::<_, QueueError>(reader.inner.rewind(old, 1).await)
        })
        .await?;
        match answer {
            Err(QueueError::CannotRewind { oldest, .. }) => {
                check_oldest(&mut reader, old, oldest).await?;
                break;
            }
            Err(other) => {
                return Err(fail(
                    CHECK,
                    format!("queue {queue}: rewind({old}) past retention must be CannotRewind, said: {other}"),
                ));
            }
            Ok(batch) if batch.first().is_some_and(|b| b.token == old) => {}
            Ok(batch) => {
                return Err(fail(
                    CHECK,
                    format!(
                        "queue {queue}: rewind({old}) returned {} though {old} is no longer held; it must be refused with CannotRewind",
                        show(&batch)
                    ),
                ));
            }
        }
        if tokio::time::Instant::now() >= deadline || fillers >= MOST_FILLERS {
            return Err(fail(
                CHECK,
                format!(
                    "queue {queue}: {old} was still served after {fillers} newer containers were acknowledged and checkpointed ({patience:?})"
                ),
            ));
        }
        if fillers.is_multiple_of(16) {
            // Retention may run on a timer: give it a moment, reading.
            reader.read(1).await?;
        }
        // An in-memory adapter answers at once: let other tasks run.
        tokio::task::yield_now().await;
    }
    reader.close().await
}

/// A refusal names the oldest position the queue still holds: past the one
/// refused, and a rewind from it is served from there on (or refused in
/// turn, naming a newer one: retention moves on).
async fn check_oldest(
    reader: &mut super::support::Reader,
    refused: crate::stream::SequenceToken,
    oldest: Option<crate::stream::SequenceToken>,
) -> Result<(), Failure> {
    const CHECK: &str = "retention";
    let queue = reader.queue;
    let Some(oldest) = oldest else { return Ok(()) };
    if oldest <= refused {
        return Err(fail(
            CHECK,
            format!(
                "queue {queue}: rewind({refused}) was refused naming {oldest} as the oldest held, which is not newer"
            ),
        ));
    }
    let answer = within(CHECK, || format!("rewind({oldest}) on queue {queue}"), async {
        Ok::<_, QueueError>(reader.inner.rewind(oldest, 16).await)
    })
    .await?;
    match answer {
        Ok(batch) => match batch.iter().find(|b| b.token < oldest) {
            Some(early) => {
                Err(fail(CHECK, format!("queue {queue}: rewind({oldest}) returned {} from before it", early.token)))
            }
            None => Ok(()),
        },
        Err(QueueError::CannotRewind { oldest: Some(newer), .. }) if newer > oldest => Ok(()),
        Err(other) => Err(fail(
            CHECK,
            format!("queue {queue}: a refusal named {oldest} as the oldest held, but rewind({oldest}) said: {other}"),
        )),
    }
}

/// After `close` and a fresh factory, unacked containers come back and
/// acked ones do not. Replaces the kit's adapter with the fresh one.
pub(super) async fn durability<F, Fut>(kit: &mut Kit, open: &F) -> Result<(), Failure>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn QueueAdapterFactory>, QueueError>>,
{
    const CHECK: &str = "durability";
    let stream = StreamId::new(CHECK, "s");
    let queue = kit.mapper.queue_for(&stream);
    let mut sent = Vec::new();
    for i in 0..4u64 {
        let batch = events("d", i..i + 1);
        sent.push((kit.write(CHECK, &stream, batch.clone()).await?, batch));
    }
    let mut reader = kit.reader(CHECK, queue).await?;
    let got = reader.read_n(CHECK, 4).await?;
    let t = tokens(&got);
    reader.ack(&t[..2]).await?;
    reader.shutdown().await?;
    drop(reader);
    let last = events("d", 4..5);
    sent.push((kit.write(CHECK, &stream, last.clone()).await?, last));
    within(CHECK, || "close of the adapter".into(), kit.adapter.close()).await?;
    *kit = Kit::open(kit.claims, kit.read_deadline, open)
        .await
        .map_err(|f| fail(CHECK, format!("reopening: {}", f.message)))?;
    let mut reader = kit.reader(CHECK, queue).await?;
    let want: Vec<_> = sent[2..].iter().map(|(t, _)| *t).collect();
    let again = reader
        .read_tokens(CHECK, &want)
        .await
        .map_err(|f| fail(CHECK, format!("after close and a fresh factory: {}", f.message)))?;
    if let Some(back) = again.iter().find(|b| t[..2].contains(&b.token)) {
        return Err(fail(
            CHECK,
            format!(
                "queue {queue}: container {} came back after a fresh factory though it was acknowledged",
                back.token
            ),
        ));
    }
    for (token, batch) in &sent[2..] {
        if let Some(b) = again.iter().find(|b| b.token == *token).filter(|b| b.events != *batch) {
            return Err(fail(CHECK, format!("queue {queue}: token {} came back with other events", b.token)));
        }
    }
    reader.close().await
}
