//! Order, tokens and payloads under concurrent producers, and `read(max)`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use super::Failure;
use super::support::{Kit, check_increasing, events, fail, show};
use crate::stream::{BatchContainer, Event, EventId, SequenceToken, StreamId};

const PRODUCERS: u64 = 4;
const BATCHES: u64 = 8;

/// One batch as a producer sent it.
struct Sent {
    producer: u64,
    stream: StreamId,
    token: SequenceToken,
    events: Vec<Event>,
}

/// Payloads that break naive encodings.
fn payload(n: u64) -> Bytes {
    match n % 6 {
        0 => Bytes::from_static(b"plain text"),
        1 => Bytes::new(),
        2 => Bytes::from_static(b"quotes \" backslash \\ newline \n tab \t and {\"json\": 1}"),
        3 => Bytes::from("unicode: h\u{e9}t\u{e9}rog\u{e8}ne \u{2713} \u{1f30a}"),
        4 => Bytes::from_static(&[0xff, 0x00, 0xfe, 0x80, b'\n', 0x01]),
        _ => Bytes::from((0..4096u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>()),
    }
}

/// Producer `p`'s batch `b`: 1 to 3 events; producers 0 and 2 share
/// streams 0-2, producers 1 and 3 share streams 3-5.
fn batch(p: u64, b: u64) -> (StreamId, Vec<Event>) {
    let stream = StreamId::new("ordering", format!("s{}", b % 3 + (p % 2) * 3));
    let events = (0..1 + (p + b) % 3)
        .map(|k| Event {
            id: EventId::new(format!("p{p}-b{b}-e{k}")),
            timestamp_ms: 1_700_000_000_000 + p * 1000 + b * 10 + k,
            payload: payload(p + b + k),
        })
        .collect();
    (stream, events)
}

/// Writes from concurrent producers and reads everything back; answers
/// the `ordering`, `tokens` and `payloads` checks.
pub(super) async fn ordering(kit: &Kit) -> Vec<(&'static str, Result<(), Failure>)> {
    match scenario(kit).await {
        Ok((sent, read)) => vec![
            ("ordering", judge_order(&sent, &read)),
            ("tokens", judge_tokens(&sent, &read)),
            ("payloads", judge_payloads(&sent, &read)),
        ],
        Err(failure) => {
            let skipped = |check| fail(check, format!("not judged: {}", failure.message));
            vec![
                ("ordering", Err(failure.clone())),
                ("tokens", Err(skipped("tokens"))),
                ("payloads", Err(skipped("payloads"))),
            ]
        }
    }
}

type Read = BTreeMap<crate::stream::QueueId, Vec<Arc<BatchContainer>>>;

async fn scenario(kit: &Kit) -> Result<(Vec<Sent>, Read), Failure> {
    const CHECK: &str = "ordering";
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let adapter = kit.adapter.clone();
        let mapper = kit.mapper;
        producers.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            for b in 0..BATCHES {
                let (stream, events) = batch(p, b);
                let queue = mapper.queue_for(&stream);
                let call = adapter.enqueue(&stream, events.clone());
                let token = match tokio::time::timeout(super::support::CALL_LIMIT, call).await {
                    Ok(Ok(token)) => token,
                    Ok(Err(e)) => {
                        return Err(fail(CHECK, format!("enqueue of p{p}-b{b} to {stream} (queue {queue}): {e}")));
                    }
                    Err(_) => {
                        return Err(fail(CHECK, format!("enqueue of p{p}-b{b} to {stream} (queue {queue}) hung")));
                    }
                };
                sent.push(Sent { producer: p, stream, token, events });
            }
            Ok(sent)
        }));
    }
    let mut sent = Vec::new();
    for producer in producers {
        let batches = producer.await.map_err(|e| fail(CHECK, format!("a producer panicked: {e}")))??;
        sent.extend(batches);
    }
    let mut read = Read::new();
    for queue in kit.mapper.all_queues() {
        let want = sent.iter().filter(|s| kit.mapper.queue_for(&s.stream) == queue).count();
        if want == 0 {
            continue;
        }
        let mut reader = kit.reader(CHECK, queue).await?;
        let got = reader.read_n(CHECK, want).await?;
        reader.close().await?;
        read.insert(queue, got);
    }
    Ok((sent, read))
}

fn first_id(events: &[Event]) -> &str {
    events.first().map(|e| e.id.as_str()).unwrap_or("")
}

fn judge_order(sent: &[Sent], read: &Read) -> Result<(), Failure> {
    const CHECK: &str = "ordering";
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (queue, batches) in read {
        check_increasing(CHECK, *queue, batches)?;
        for batch in batches {
            *seen.entry(first_id(&batch.events)).or_default() += 1;
        }
        // Each producer's batches to a stream, in the order it sent them.
        for p in 0..PRODUCERS {
            let mut expected: BTreeMap<&StreamId, Vec<&str>> = BTreeMap::new();
            for s in sent.iter().filter(|s| s.producer == p) {
                expected.entry(&s.stream).or_default().push(first_id(&s.events));
            }
            for (stream, want) in expected {
                let prefix = format!("p{p}-");
                let got: Vec<&str> = batches
                    .iter()
                    .filter(|b| &b.stream == stream && first_id(&b.events).starts_with(&prefix))
                    .map(|b| first_id(&b.events))
                    .collect();
                if got.len() == want.len() && got != want {
                    return Err(fail(
                        CHECK,
                        format!(
                            "queue {queue}, stream {stream}: producer p{p} sent {want:?} but they came back as {got:?}"
                        ),
                    ));
                }
            }
        }
    }
    for s in sent {
        let id = first_id(&s.events);
        match seen.get(id).copied().unwrap_or(0) {
            1 => {}
            0 => {
                return Err(fail(
                    CHECK,
                    format!("batch {id} of stream {} (token {}) never came back", s.stream, s.token),
                ));
            }
            n => return Err(fail(CHECK, format!("batch {id} of stream {} came back {n} times", s.stream))),
        }
    }
    Ok(())
}

fn find<'r>(read: &'r Read, id: &str) -> Option<(crate::stream::QueueId, &'r Arc<BatchContainer>)> {
    read.iter().find_map(|(q, batches)| batches.iter().find(|b| first_id(&b.events) == id).map(|b| (*q, b)))
}

fn judge_tokens(sent: &[Sent], read: &Read) -> Result<(), Failure> {
    const CHECK: &str = "tokens";
    for s in sent {
        let id = first_id(&s.events);
        let Some((queue, batch)) = find(read, id) else {
            return Err(fail(CHECK, format!("batch {id} (enqueue answered {}) never came back", s.token)));
        };
        if batch.token != s.token {
            return Err(fail(
                CHECK,
                format!(
                    "queue {queue}, stream {}: enqueue answered token {} for batch {id} but it was read back as {}",
                    s.stream, s.token, batch.token
                ),
            ));
        }
    }
    Ok(())
}

fn judge_payloads(sent: &[Sent], read: &Read) -> Result<(), Failure> {
    const CHECK: &str = "payloads";
    for s in sent {
        let id = first_id(&s.events);
        let Some((queue, batch)) = find(read, id) else {
            return Err(fail(CHECK, format!("batch {id} never came back")));
        };
        let at = format!("queue {queue}, token {}", batch.token);
        if batch.stream != s.stream {
            return Err(fail(
                CHECK,
                format!("{at}: batch {id} was sent to stream {} but read as {}", s.stream, batch.stream),
            ));
        }
        if batch.events.len() != s.events.len() {
            return Err(fail(
                CHECK,
                format!("{at}: batch {id} had {} events, read back {}", s.events.len(), batch.events.len()),
            ));
        }
        for (want, got) in s.events.iter().zip(&batch.events) {
            if want.id != got.id {
                return Err(fail(CHECK, format!("{at}: event {} was read back as {}", want.id, got.id)));
            }
            if want.timestamp_ms != got.timestamp_ms {
                return Err(fail(
                    CHECK,
                    format!("{at}: event {} had timestamp {}, read {}", want.id, want.timestamp_ms, got.timestamp_ms),
                ));
            }
            if want.payload != got.payload {
                let offset = want.payload.iter().zip(got.payload.iter()).position(|(a, b)| a != b);
                let offset = offset.unwrap_or(want.payload.len().min(got.payload.len()));
                return Err(fail(
                    CHECK,
                    format!(
                        "{at}: event {}'s payload of {} bytes came back as {} bytes, first difference at byte {offset}",
                        want.id,
                        want.payload.len(),
                        got.payload.len()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `read(max)` never returns more than `max`.
pub(super) async fn read_max(kit: &Kit) -> Result<(), Failure> {
    const CHECK: &str = "read_max";
    const COUNT: u64 = 12;
    let stream = StreamId::new(CHECK, "s");
    let queue = kit.mapper.queue_for(&stream);
    for i in 0..COUNT {
        kit.write(CHECK, &stream, events("m", i..i + 1)).await?;
    }
    let mut reader = kit.reader(CHECK, queue).await?;
    let deadline = tokio::time::Instant::now() + kit.read_deadline;
    let mut mine = 0;
    for max in [1usize, 2, 3].into_iter().cycle() {
        if mine >= COUNT as usize {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(fail(CHECK, format!("queue {queue}: only {mine} of {COUNT} containers came back")));
        }
        let batch = reader.read(max).await?;
        if batch.len() > max {
            return Err(fail(
                CHECK,
                format!("queue {queue}: read({max}) returned {} containers: {}", batch.len(), show(&batch)),
            ));
        }
        if batch.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        mine += batch.iter().filter(|b| b.stream == stream).count();
    }
    reader.close().await
}
