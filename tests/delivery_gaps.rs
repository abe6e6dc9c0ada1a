//! A subscription that skips events says so, on the delivery that follows
//! the hole (`Delivery::gap`), never by silence: after a batch given up to
//! the dead-letter sink, and after a catch-up the queue could no longer
//! serve. Every other delivery carries no gap. (The edge's tailers re-base
//! on the run log store when they see one; `src/edge/tailer/tests.rs`.)

use tailrace_testkit as common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use tailrace::SequenceToken;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::failure::MemoryDeadLetters;
use tailrace::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StartPosition, StreamConsumer, SubscriptionInfo,
};

const WAIT: Duration = Duration::from_secs(30);

/// Records each delivery's first event id and its gap; fails every batch
/// holding `poison`; answers its handshake with `resume_after` if set.
#[derive(Default)]
struct GapRecorder {
    deliveries: Mutex<Vec<(String, Option<String>)>>,
    poison: Option<String>,
    resume_after: Option<SequenceToken>,
}

impl GapRecorder {
    fn seen(&self) -> Vec<(String, Option<String>)> {
        self.deliveries.lock().unwrap().clone()
    }

    fn ids(&self) -> Vec<String> {
        self.seen().into_iter().map(|(id, _)| id).collect()
    }
}

#[async_trait]
impl StreamConsumer for GapRecorder {
    async fn handshake(&self, _: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        Ok(self.resume_after.map(StartPosition::After))
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let first = delivery.events().next().map(|(e, _)| e.id.to_string()).unwrap_or_default();
        if self.poison.as_deref() == Some(first.as_str()) {
            return Err(ConsumerError::failed(format!("poison event {first}")));
        }
        self.deliveries.lock().unwrap().push((first, delivery.gap.clone()));
        Ok(DeliveryOutcome::Continue)
    }
}

fn memory(options: MemoryOptions) -> Arc<MemoryAdapterFactory> {
    Arc::new(MemoryAdapterFactory::new(4, options))
}

#[tokio::test(start_paused = true)]
async fn the_delivery_after_a_batch_given_up_says_what_was_skipped() {
    let consumer = Arc::new(GapRecorder { poison: Some("e3".into()), ..GapRecorder::default() });
    let letters = Arc::new(MemoryDeadLetters::new(10));
    let mut config = quick_config();
    config.agent.max_delivery_batch = 1;
    let node = TestNode::start_with(memory(MemoryOptions::default()), config, ImplicitSubscriptions::new(), |b| {
        b.dead_letters(letters.clone())
    })
    .await;
    let s = stream("gaps", "poison");
    node.agent(node.node.mapper().queue_for(&s).0).await;
    node.node.subscribe(&s, consumer.clone(), StartPosition::EarliestAvailable).await.unwrap();
    for i in 0..6 {
        node.node.produce(&s, events("e", i..i + 1)).await.unwrap();
    }
    assert!(eventually(WAIT, || consumer.seen().len() == 5).await, "{:?}", consumer.seen());
    assert_eq!(consumer.ids(), ["e0", "e1", "e2", "e4", "e5"]);
    for (id, gap) in consumer.seen() {
        match id.as_str() {
            "e4" => {
                let gap = gap.expect("the delivery after the given-up batch says so");
                assert!(gap.contains("a batch was given up") && gap.contains("poison event e3"), "{gap}");
            }
            _ => assert_eq!(gap, None, "{id} follows its predecessor without a hole"),
        }
    }
    assert_eq!(letters.letters().len(), 1);
}

#[tokio::test]
async fn a_catch_up_the_queue_can_no_longer_serve_is_a_gap_on_the_next_delivery() {
    let node = TestNode::start(
        memory(MemoryOptions { history: 2, ..MemoryOptions::default() }),
        quick_config(),
        ImplicitSubscriptions::new(),
    )
    .await;
    let s = stream("gaps", "trimmed");
    let queue = node.node.mapper().queue_for(&s).0;
    node.agent(queue).await;
    let mut tokens = Vec::new();
    for i in 0..10 {
        tokens.push(node.node.produce(&s, events("e", i..i + 1)).await.unwrap());
    }
    node.wait_status(queue, |s| s.acked >= 10).await;
    // The consumer continues after e0, which the queue no longer holds
    // (it keeps two acknowledged containers).
    let consumer = Arc::new(GapRecorder { resume_after: Some(tokens[0]), ..GapRecorder::default() });
    node.node.subscribe(&s, consumer.clone(), StartPosition::EarliestAvailable).await.unwrap();
    node.node.produce(&s, events("e", 10..11)).await.unwrap();
    assert!(eventually(WAIT, || consumer.ids().contains(&"e10".to_string())).await, "{:?}", consumer.seen());
    let seen = consumer.seen();
    let gap = seen[0].1.as_deref().expect("the first delivery after the lost catch-up says so");
    assert!(gap.contains("may be missing"), "{gap}");
    assert!(seen[1..].iter().all(|(_, gap)| gap.is_none()), "{seen:?}");
}
