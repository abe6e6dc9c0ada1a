//! The handshake between two ends of an in-memory pipe: the same cookie
//! opens, another cookie is refused on both sides with the reason, the
//! wrong node is refused by the dialer, something that is not a tailrace
//! node (an older build's transport) and another version are named.

use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt;
use tokio::io::DuplexStream;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use super::*;

const COOKIE: &str = "a-cluster-cookie-of-at-least-32-characters";

fn ends(stream: DuplexStream) -> (Reads<DuplexStream>, Writes<DuplexStream>) {
    let (read, write) = tokio::io::split(stream);
    (FramedRead::new(read, LengthDelimitedCodec::new()), FramedWrite::new(write, LengthDelimitedCodec::new()))
}

/// Runs both sides: the dialer `a` (with `a_cookie`) expecting `expected`,
/// the listener `b` (with `b_cookie`).
async fn meet(a_cookie: &str, b_cookie: &str, expected: &str) -> (Result<(), Failed>, Result<String, Failed>) {
    let (near, far) = tokio::io::duplex(64 * 1024);
    let (a, b) = (NodeId::new("a"), NodeId::new("b"));
    let dialer = Credentials { me: &a, cookie: a_cookie, within: Duration::from_secs(5) };
    let listener = Credentials { me: &b, cookie: b_cookie, within: Duration::from_secs(5) };
    let ((mut ar, mut aw), (mut br, mut bw)) = (ends(near), ends(far));
    let expected = NodeId::new(expected);
    // The dialer's end closes once it is done, as a dialer's connection does.
    let dialing = async move {
        let dialed = dialer.dial(&mut ar, &mut aw, &expected).await;
        drop((ar, aw));
        dialed
    };
    tokio::join!(dialing, listener.accept(&mut br, &mut bw))
}

fn rejected<T: std::fmt::Debug>(result: Result<T, Failed>) -> String {
    match result {
        Err(Failed::Rejected(reason)) => reason,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn nodes_with_the_same_cookie_meet_and_the_listener_learns_the_dialer() {
    let (dialed, accepted) = meet(COOKIE, COOKIE, "b").await;
    dialed.unwrap();
    assert_eq!(accepted.unwrap(), "a");
}

#[tokio::test]
async fn another_cookie_is_refused_on_both_sides_with_the_reason() {
    let (dialed, accepted) = meet(COOKIE, "another-cookie-of-at-least-32-characters!", "b").await;
    assert_eq!(rejected(dialed), "the cluster cookie differs");
    assert_eq!(rejected(accepted), "the cluster cookie differs");
}

#[tokio::test]
async fn a_dialer_refuses_a_listener_that_is_not_the_node_it_dialed() {
    let (dialed, _) = meet(COOKIE, COOKIE, "c").await;
    assert_eq!(rejected(dialed), "the node listening there is `b`, not `c`");
}

#[tokio::test]
async fn a_peer_that_is_not_a_tailrace_node_is_named_as_such() {
    let (near, far) = tokio::io::duplex(1024);
    let me = NodeId::new("a");
    let dialer = Credentials { me: &me, cookie: COOKIE, within: Duration::from_secs(5) };
    let (mut reads, mut writes) = ends(near);
    let (_, mut other) = ends(far);
    let b = NodeId::new("b");
    let (dialed, _) =
        tokio::join!(dialer.dial(&mut reads, &mut writes, &b), other.send(Bytes::from_static(b"\x00\x01 not json")));
    assert!(rejected(dialed).contains("did not answer as a tailrace node"));
}

#[tokio::test]
async fn another_handshake_version_is_refused_with_both_versions() {
    let (near, far) = tokio::io::duplex(1024);
    let me = NodeId::new("b");
    let listener = Credentials { me: &me, cookie: COOKIE, within: Duration::from_secs(5) };
    let (mut reads, mut writes) = ends(near);
    let (_, mut other) = ends(far);
    let hello = Frame::Hello { protocol: PROTOCOL.into(), version: VERSION + 1, node: "a".into(), nonce: "0".into() };
    let (accepted, _) = tokio::join!(listener.accept(&mut reads, &mut writes), other.send(encode(&hello).unwrap()));
    assert_eq!(rejected(accepted), format!("it speaks handshake version {VERSION}, the dialer {}", VERSION + 1));
}

#[tokio::test(start_paused = true)]
async fn a_silent_peer_breaks_the_handshake_after_its_limit() {
    let (near, _far) = tokio::io::duplex(1024);
    let me = NodeId::new("a");
    let dialer = Credentials { me: &me, cookie: COOKIE, within: Duration::from_secs(5) };
    let (mut reads, mut writes) = ends(near);
    match dialer.dial(&mut reads, &mut writes, &NodeId::new("b")).await {
        Err(Failed::Broken(reason)) => assert_eq!(reason, "the handshake took longer than 5s"),
        other => panic!("expected a broken handshake, got {other:?}"),
    }
}
