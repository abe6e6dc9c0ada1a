//! The receiver's decisions, without a broker: gaps in an answer, the
//! patience with one, a rewind past retention.

use super::*;

fn answer(offsets: &[i64]) -> Vec<RecordAndOffset> {
    let record = rskafka::record::Record {
        key: None,
        value: None,
        headers: Default::default(),
        timestamp: connect::timestamp(0),
    };
    offsets.iter().map(|&offset| RecordAndOffset { record: record.clone(), offset }).collect()
}

fn offsets(records: &[RecordAndOffset]) -> Vec<i64> {
    records.iter().map(|r| r.offset).collect()
}

/// A gap is read again while it may still fill, then passed once it
/// stayed for `GAP_PATIENCE`; an empty answer changes nothing.
#[tokio::test(start_paused = true)]
async fn a_gap_is_waited_for_then_passed_after_its_patience() {
    let checkpoints = Arc::new(crate::checkpoint::MemoryCheckpointer::new());
    let reading = Reading {
        records: Arc::new(Records::Tailrace),
        mapper: QueueMapper::new(1),
        dead_letters: Arc::new(crate::failure::LogDeadLetters),
    };
    let mut receiver = KafkaReceiver::new(QueueId(0), KafkaOptions::default(), checkpoints, Arc::default(), reading);
    receiver.next = 12;
    let gap = Some(Gap { missing: 12, resumes: 13 });
    receiver.gap(gap, false);
    tokio::time::advance(GAP_PATIENCE / 2).await;
    receiver.gap(None, false);
    receiver.gap(gap, false);
    assert_eq!(receiver.next, 12, "still read again");
    receiver.gap(None, true);
    assert_eq!(receiver.gap_since, None, "it filled");

    receiver.gap(gap, false);
    tokio::time::advance(GAP_PATIENCE).await;
    receiver.gap(gap, false);
    assert_eq!(receiver.next, 13, "passed after its patience");
    assert_eq!(receiver.gap_since, None);
}

/// What the test broker answered in the life that lost a batch: a
/// fetch from 1441 came back with 1442 alone (high watermark 1443),
/// and 1441 showed later. Nothing past a missing offset is handed out.
#[test]
fn an_answer_is_kept_up_to_its_first_missing_offset() {
    let mut records = answer(&[1442]);
    assert_eq!(contiguous(1441, &mut records), Some(Gap { missing: 1441, resumes: 1442 }));
    assert!(records.is_empty(), "nothing past the gap");

    let mut records = answer(&[10, 11, 13, 14]);
    assert_eq!(contiguous(10, &mut records), Some(Gap { missing: 12, resumes: 13 }));
    assert_eq!(offsets(&records), [10, 11]);

    let mut records = answer(&[8, 9, 10, 11]);
    assert_eq!(contiguous(10, &mut records), None, "the start of a whole batch below `from` is dropped");
    assert_eq!(offsets(&records), [10, 11]);

    let mut records = answer(&[]);
    assert_eq!(contiguous(10, &mut records), None);
}

/// The decision a broker whose retention removed records leads to
/// (the Tansu test broker removes none, so the Kafka tests cannot
/// reach it there): below the partition's start, refused naming the
/// start; at or past it, served.
#[test]
fn a_rewind_below_the_partitions_start_is_refused_naming_it() {
    let queue = QueueId(3);
    let refusal = past_retention(queue, SequenceToken::new(10, 0), 1_200).expect("refused");
    assert_eq!(refusal.oldest_held(), Some(SequenceToken::new(1_200, 0)));
    let text = refusal.to_string();
    assert!(text.contains("below offset 1200") && text.contains("the oldest position it holds is 1200-0"), "{text}");
    assert!(past_retention(queue, SequenceToken::new(1_200, 0), 1_200).is_none());
    assert!(past_retention(queue, SequenceToken::new(5_000, 0), 1_200).is_none());
}
