//! The queue mapper: stream id -> queue, the same in every process and every
//! release. It hashes the id's bytes with xxh3-64 (see
//! [`StreamId::stable_hash`]) and spreads hashes over the queues with jump
//! consistent hashing (Lamping & Veach), so growing the queue count moves only
//! `1/n` of the streams. Golden vectors in the tests pin the mapping.

use crate::stream::{QueueId, StreamId};

/// Maps streams to a fixed number of queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueMapper {
    queue_count: u32,
}

impl QueueMapper {
    /// A mapper over `queue_count` queues (at least 1).
    pub fn new(queue_count: u32) -> Self {
        Self { queue_count: queue_count.max(1) }
    }

    /// How many queues there are.
    pub fn queue_count(&self) -> u32 {
        self.queue_count
    }

    /// Every queue, in order.
    pub fn all_queues(&self) -> Vec<QueueId> {
        (0..self.queue_count).map(QueueId).collect()
    }

    /// The queue that holds `stream`: a jump consistent hash of its stable
    /// hash, the same in every process and release.
    ///
    /// ```
    /// use tailrace::queue::QueueMapper;
    /// use tailrace::StreamId;
    ///
    /// let stream = StreamId::new("logs", "etl.daily/run-7");
    /// let eight = QueueMapper::new(8);
    /// assert!(eight.queue_for(&stream).0 < 8);
    /// assert_eq!(eight.queue_for(&stream), QueueMapper::new(8).queue_for(&stream));
    /// assert_eq!(QueueMapper::new(1).queue_for(&stream).0, 0);
    /// ```
    pub fn queue_for(&self, stream: &StreamId) -> QueueId {
        QueueId(jump_consistent_hash(stream.stable_hash(), self.queue_count))
    }
}

/// Jump consistent hash: a bucket in `0..buckets` for `key`.
fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned forever: changing any of these breaks every deployed cluster
    /// (producers and agents of different releases would disagree). The
    /// values were cross-checked against Python's `xxhash` package and a
    /// transcription of the published jump-hash algorithm.
    #[test]
    fn golden_vectors() {
        let cases: &[(&str, &str, u64, u32, u32)] = &[
            ("logs", "svc.pipe/run-1", 0xe7d4f42d92cd6cfb, 8, 0),
            ("logs", "svc.pipe/run-2", 0x8dffceb841d51f38, 8, 7),
            ("orders", "42", 0xd5fba70e706e21af, 8, 0),
            ("", "", 0xd6bcec3c6b29d72e, 8, 2),
            ("logs", "a/b", 0xa094b1805002f3e4, 64, 37),
        ];
        let mut report = String::new();
        for (ns, key, _, n, _) in cases {
            let s = StreamId::new(ns, key);
            report.push_str(&format!(
                "(\"{ns}\", \"{key}\", {:#x}, {n}, {}),\n",
                s.stable_hash(),
                QueueMapper::new(*n).queue_for(&s).0
            ));
        }
        for (ns, key, hash, n, queue) in cases {
            let s = StreamId::new(ns, key);
            assert_eq!(s.stable_hash(), *hash, "hash of {ns}/{key}; all:\n{report}");
            assert_eq!(QueueMapper::new(*n).queue_for(&s).0, *queue, "queue of {ns}/{key}");
        }
    }

    #[test]
    fn spreads_streams_evenly_and_moves_few_when_growing() {
        let streams: Vec<StreamId> = (0..10_000).map(|i| StreamId::new("s", i.to_string())).collect();
        let eight = QueueMapper::new(8);
        let mut counts = [0usize; 8];
        for s in &streams {
            counts[eight.queue_for(s).0 as usize] += 1;
        }
        for c in counts {
            assert!((1_000..1_500).contains(&c), "uneven: {counts:?}");
        }
        let nine = QueueMapper::new(9);
        let moved = streams.iter().filter(|s| eight.queue_for(s) != nine.queue_for(s)).count();
        // Ideal is 1/9 of the streams.
        assert!(moved < 1_400, "moved {moved}");
        assert!(streams.iter().all(|s| nine.queue_for(s) == eight.queue_for(s) || nine.queue_for(s).0 == 8));
    }

    #[test]
    fn one_queue_takes_everything() {
        let m = QueueMapper::new(0);
        assert_eq!(m.queue_count(), 1);
        assert_eq!(m.queue_for(&StreamId::new("a", "b")), QueueId(0));
    }
}
