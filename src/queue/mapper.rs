//! The queue mapper: stream id -> queue, the same in every process and every
//! release. It hashes the id's bytes with xxh3-64 (see
//! [`StreamId::stable_hash`]) and spreads hashes over the queues with jump
//! consistent hashing (Lamping & Veach), so growing the queue count moves only
//! `1/n` of the streams. Golden vectors in the tests pin the mapping.
//!
//! A Kafka topic whose records others write (`records = "mapped"`) places
//! a stream as Kafka's default partitioner places a record keyed by the
//! stream's key (murmur2, as the Java client and kafka-python do), so that
//! a foreign producer's keyed records land on the partition tailrace reads
//! their stream from.

use crate::stream::{QueueId, StreamId};

/// Maps streams to a fixed number of queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueMapper {
    queue_count: u32,
    placement: Placement,
}

/// How a stream's queue is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// A jump consistent hash of the id's stable hash.
    Jump,
    /// Kafka's default partitioner on the stream's key.
    #[cfg(feature = "kafka")]
    KafkaKey,
}

impl QueueMapper {
    /// A mapper over `queue_count` queues (at least 1).
    pub fn new(queue_count: u32) -> Self {
        Self { queue_count: queue_count.max(1), placement: Placement::Jump }
    }

    /// A mapper that puts a stream where Kafka's default partitioner puts
    /// a record whose key is the stream's key: `murmur2(key) & 0x7fffffff
    /// mod queue_count`.
    #[cfg(feature = "kafka")]
    pub(crate) fn kafka_keys(queue_count: u32) -> Self {
        Self { queue_count: queue_count.max(1), placement: Placement::KafkaKey }
    }

    /// How many queues there are.
    pub fn queue_count(&self) -> u32 {
        self.queue_count
    }

    /// Every queue, in order.
    pub fn all_queues(&self) -> Vec<QueueId> {
        (0..self.queue_count).map(QueueId).collect()
    }

    /// The queue that holds `stream`, the same in every process and
    /// release: a jump consistent hash of its stable hash, or, for a Kafka
    /// topic of mapped records, where Kafka's default partitioner puts a
    /// record keyed by the stream's key.
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
        match self.placement {
            Placement::Jump => QueueId(jump_consistent_hash(stream.stable_hash(), self.queue_count)),
            #[cfg(feature = "kafka")]
            Placement::KafkaKey => QueueId((murmur2(stream.key().as_bytes()) & 0x7fff_ffff) % self.queue_count),
        }
    }
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), which
/// its default partitioner hashes a record's key with.
#[cfg(feature = "kafka")]
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h = 0x9747_b28c_u32 ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        for (i, byte) in rest.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
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

    /// Kafka's own test vectors (`UtilsTest.testMurmur2`, as unsigned) and
    /// what kafka-python's default partitioner computes: a record keyed by
    /// a stream's key lands on the partition tailrace reads it from.
    #[cfg(feature = "kafka")]
    #[test]
    fn kafka_placement_is_kafkas_default_partitioner() {
        for (key, hash) in [
            ("", 275_646_681),
            ("a", 2_731_586_172),
            ("ab", 316_155_434),
            ("abc", 479_470_107),
            ("21", 3_321_034_988),
            ("foobar", 3_504_634_814),
            ("a-little-bit-long-string", 3_308_985_760),
            ("svc.a/r-1", 3_655_838_945),
            ("ünï", 3_724_512_787),
        ] {
            assert_eq!(murmur2(key.as_bytes()), hash, "murmur2({key:?})");
        }
        let three = QueueMapper::kafka_keys(3);
        // 1508355297 % 3: kafka-python put the record keyed `svc.a/r-1` on partition 0.
        assert_eq!(three.queue_for(&StreamId::new("logs", "svc.a/r-1")), QueueId(0));
        assert_eq!(three.queue_for(&StreamId::new("other", "svc.a/r-1")), QueueId(0), "the key alone places");
        assert_eq!(QueueMapper::kafka_keys(7).queue_for(&StreamId::new("x", "21")), QueueId(1_173_551_340 % 7));
        assert_ne!(three, QueueMapper::new(3));
    }

    #[test]
    fn one_queue_takes_everything() {
        let m = QueueMapper::new(0);
        assert_eq!(m.queue_count(), 1);
        assert_eq!(m.queue_for(&StreamId::new("a", "b")), QueueId(0));
    }
}
