//! Acknowledgements and receivers coming and going: graceful restarts, acks
//! with gaps, harmless acks, `failed`, a crashed receiver, two receivers.

use std::sync::Arc;

use super::Failure;
use super::support::{Kit, check_increasing, events, fail, list, show, tokens};
use crate::stream::{BatchContainer, SequenceToken, StreamId};

/// Writes `count` one-event batches to `check/s` and reads them with a
/// first receiver.
async fn setup(
    kit: &Kit,
    check: &'static str,
    count: u64,
) -> Result<(StreamId, super::support::Reader, Vec<Arc<BatchContainer>>), Failure> {
    let stream = StreamId::new(check, "s");
    for i in 0..count {
        kit.write(check, &stream, events(&format!("{check}-"), i..i + 1)).await?;
    }
    let mut reader = kit.reader(check, kit.mapper.queue_for(&stream)).await?;
    let got = reader.read_n(check, count as usize).await?;
    check_increasing(check, reader.queue, &got)?;
    Ok((stream, reader, got))
}

/// After a restart: every token of `want` came back in order, nothing of
/// `never` did; others (acked past a gap) may.
fn judge_again(
    check: &'static str,
    queue: crate::stream::QueueId,
    again: &[Arc<BatchContainer>],
    want: &[SequenceToken],
    never: &[SequenceToken],
) -> Result<(), Failure> {
    check_increasing(check, queue, again)?;
    if let Some(back) = again.iter().find(|b| never.contains(&b.token)) {
        return Err(fail(
            check,
            format!(
                "queue {queue}: container {} (event {}) came back after it was acknowledged; read {}",
                back.token,
                back.events.first().map(|e| e.id.as_str()).unwrap_or(""),
                show(again)
            ),
        ));
    }
    let mine: Vec<SequenceToken> = tokens(again).into_iter().filter(|t| want.contains(t)).collect();
    if mine != want {
        return Err(fail(
            check,
            format!(
                "queue {queue}: the unacknowledged containers {} should come back in order, got {}",
                list(want),
                list(&mine)
            ),
        ));
    }
    Ok(())
}

/// Unacked containers come back to the next receiver; acked ones do not.
pub(super) async fn restart(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "restart";
    let (_, mut first, got) = setup(kit, CHECK, 6).await?;
    let all = tokens(&got);
    first.ack(&all[..2]).await?;
    first.shutdown().await?;
    drop(first);
    let mut second = kit.reader(CHECK, kit.mapper.queue_for(&got[0].stream)).await?;
    let again = second.read_tokens(CHECK, &all[2..]).await?;
    judge_again(CHECK, second.queue, &again, &all[2..], &all[..2])?;
    second.ack_everything().await?;
    let extra = second.read(64).await?;
    if let Some(back) = extra.iter().find(|b| all.contains(&b.token)) {
        return Err(fail(
            CHECK,
            format!(
                "queue {}: container {} came back after every container was acknowledged",
                second.queue, back.token
            ),
        ));
    }
    second.close().await
}

/// Acks out of order and with gaps, then a restart.
pub(super) async fn ack_gaps(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "ack_gaps";
    let (_, mut first, got) = setup(kit, CHECK, 8).await?;
    let t = tokens(&got);
    // Later tokens first, then earlier ones; 2, 4, 5 and 7 stay unacked.
    first.ack(&[t[3], t[6]]).await?;
    first.ack(&[t[0], t[1]]).await?;
    first.shutdown().await?;
    drop(first);
    let mut second = kit.reader(CHECK, kit.mapper.queue_for(&got[0].stream)).await?;
    let want = [t[2], t[4], t[5], t[7]];
    let again = second.read_tokens(CHECK, &want).await?;
    judge_again(CHECK, second.queue, &again, &want, &t[..2])?;
    second.close().await
}

/// Acking twice, an unknown token or nothing acknowledges nothing else.
pub(super) async fn acks(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "acks";
    let (_, mut first, got) = setup(kit, CHECK, 3).await?;
    let t = tokens(&got);
    first.ack(&t[..1]).await?;
    first
        .ack(&t[..1])
        .await
        .map_err(|f| fail(CHECK, format!("acking {} a second time failed: {}", t[0], f.message)))?;
    let unknown = SequenceToken::new(u64::MAX - 7, 3);
    let queue = first.queue;
    super::support::within(
        CHECK,
        || format!("ack of the unknown token {unknown} on queue {queue}"),
        first.inner.delivered(&[unknown]),
    )
    .await?;
    super::support::within(CHECK, || format!("an empty ack on queue {queue}"), first.inner.delivered(&[])).await?;
    first.shutdown().await?;
    drop(first);
    let mut second = kit.reader(CHECK, queue).await?;
    let again = second.read_tokens(CHECK, &t[1..]).await.map_err(|f| {
        fail(CHECK, format!("after acking {} twice and the unknown token {unknown}: {}", t[0], f.message))
    })?;
    judge_again(CHECK, queue, &again, &t[1..], &t[..1])?;
    second.close().await
}

/// `failed` touches only the containers it names; the queue goes on.
pub(super) async fn failed(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "failed";
    let (stream, mut first, got) = setup(kit, CHECK, 4).await?;
    let t = tokens(&got);
    first.ack(&t[..1]).await?;
    first.fail_tokens(&t[1..2]).await?;
    let later = kit.write(CHECK, &stream, events("failed-", 4..5)).await?;
    first
        .read_tokens(CHECK, &[later])
        .await
        .map_err(|f| fail(CHECK, format!("after failed({}) the queue did not go on: {}", t[1], f.message)))?;
    first.shutdown().await?;
    drop(first);
    let mut second = kit.reader(CHECK, kit.mapper.queue_for(&stream)).await?;
    let want = [t[2], t[3], later];
    let again = second
        .read_tokens(CHECK, &want)
        .await
        .map_err(|f| fail(CHECK, format!("failed({}) released containers it was not given: {}", t[1], f.message)))?;
    judge_again(CHECK, second.queue, &again, &want, &t[..1])?;
    second.close().await
}

/// A receiver dropped without shutdown: the next one gets what it had not
/// acknowledged.
pub(super) async fn takeover(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "takeover";
    let (stream, mut first, got) = setup(kit, CHECK, 4).await?;
    let t = tokens(&got);
    first.ack(&t[..1]).await?;
    drop(first); // a crash: no checkpoint, no shutdown
    let mut second = kit.reader(CHECK, kit.mapper.queue_for(&stream)).await?;
    let again = second
        .read_tokens(CHECK, &t[1..])
        .await
        .map_err(|f| fail(CHECK, format!("after the receiver holding {} crashed: {}", list(&t[1..]), f.message)))?;
    // The acked container may come back after a crash (at least once).
    judge_again(CHECK, second.queue, &again, &t[1..], &[])?;
    second.close().await
}

/// A second receiver fences the first.
pub(super) async fn exclusive(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "exclusive";
    let (stream, mut first, got) = setup(kit, CHECK, 2).await?;
    let queue = kit.mapper.queue_for(&stream);
    let mut second = kit.reader(CHECK, queue).await?;
    kit.write(CHECK, &stream, events("exclusive-", 2..3)).await?;
    match tokio::time::timeout(super::support::CALL_LIMIT, first.inner.read(64)).await {
        Ok(Err(_)) => {}
        Ok(Ok(batch)) => {
            return Err(fail(
                CHECK,
                format!(
                    "queue {queue}: the first receiver still read after a second one took the queue: {}",
                    show(&batch)
                ),
            ));
        }
        Err(_) => return Err(fail(CHECK, format!("queue {queue}: a read of the fenced receiver hung"))),
    }
    let again = second.read_tokens(CHECK, &tokens(&got)).await?;
    check_increasing(CHECK, queue, &again)?;
    let _ =
        tokio::time::timeout(super::support::CALL_LIMIT, first.inner.shutdown(std::time::Duration::from_secs(5))).await;
    second.close().await
}
