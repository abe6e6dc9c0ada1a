//! The upgrade promise on the wire: node-to-node envelopes as release
//! 0.1.0 wrote them (`tests/golden/0.1.0/`, one per line) are read by
//! today's build, which writes each back byte for byte, so a node of either
//! build reads the other's.

use tailrace::cluster::wire::{self, Reply, Request};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/0.1.0");

/// Each line of `file`, decoded as `T` and encoded again.
fn round_trips<T: serde::Serialize + for<'de> serde::Deserialize<'de>>(file: &str) -> usize {
    let text = std::fs::read_to_string(format!("{GOLDEN}/{file}")).unwrap();
    let mut checked = 0;
    for (n, line) in text.lines().enumerate() {
        let message: T = wire::decode(line.as_bytes()).unwrap_or_else(|e| panic!("{file}:{}: {e}", n + 1));
        let again = String::from_utf8(wire::encode(&message).unwrap()).unwrap();
        assert_eq!(again, line, "{file}:{}", n + 1);
        checked += 1;
    }
    checked
}

#[test]
fn the_previous_releases_requests_are_read_and_written_the_same() {
    assert_eq!(round_trips::<Request>("wire-requests.jsonl"), 5);
}

#[test]
fn the_previous_releases_replies_are_read_and_written_the_same() {
    assert_eq!(round_trips::<Reply>("wire-replies.jsonl"), 5);
}
