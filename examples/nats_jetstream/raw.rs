//! The baseline: the same batches through a hand-written `async-nats` loop
//! (concurrent producers awaiting each publish ack, one pull consumer
//! fetching and acking), with no runtime in between.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;

use crate::PRODUCERS;

/// Moves `batches` messages of `events_per_batch` small events through a
/// stream called `name` and returns how long it took from the first
/// publish to the last ack.
pub async fn run(
    url: &str,
    name: &str,
    batches: usize,
    events_per_batch: usize,
) -> Result<Duration, async_nats::Error> {
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client.clone());
    let stream = js
        .get_or_create_stream(stream::Config {
            name: name.into(),
            subjects: vec![format!("{name}.q0")],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(name.into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let body: String = (0..events_per_batch)
        .map(|n| format!("{{\"id\":\"{n}\",\"ts\":1764460800000,\"p\":\"order {n} of orders/region-0\"}}"))
        .collect::<Vec<_>>()
        .join(",");
    let body = bytes::Bytes::from(format!("{{\"namespace\":\"orders\",\"key\":\"region-0\",\"events\":[{body}]}}"));
    let subject = format!("{name}.q0");
    let started = Instant::now();
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let js = js.clone();
        let body = body.clone();
        let subject = subject.clone();
        let mine = batches / PRODUCERS + usize::from(p < batches % PRODUCERS);
        producers.push(tokio::spawn(async move {
            for _ in 0..mine {
                js.publish(subject.clone(), body.clone()).await?.await?;
            }
            Ok::<_, async_nats::Error>(())
        }));
    }
    let mut acked = 0;
    while acked < batches {
        let mut messages = consumer.batch().max_messages(64).expires(Duration::from_millis(100)).messages().await?;
        while let Some(message) = messages.next().await {
            message?.ack().await?;
            acked += 1;
        }
    }
    for producer in producers {
        producer.await??;
    }
    let took = started.elapsed();
    client.flush().await?;
    Ok(took)
}
