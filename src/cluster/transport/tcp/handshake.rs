//! The handshake that opens every connection between two nodes: each side
//! proves it holds the cluster cookie without sending it, and the dialer
//! learns that it reached the node it meant to.
//!
//! 1. The dialer sends `Hello { protocol, version, node, nonce }`.
//! 2. The listener answers with its own `Hello` (or `Refused` with the
//!    reason: another protocol version).
//! 3. The dialer sends `Proof`: HMAC-SHA256 keyed by the cookie over both
//!    hellos as sent, tagged with its role.
//! 4. The listener checks it (in constant time) and answers with its own
//!    `Proof` over the same bytes, tagged with the other role, or `Refused`.
//! 5. The dialer checks it, and that the listener is the node it dialed.
//!
//! Fresh random nonces on both sides make every proof good for one
//! connection only; the role tags keep one side's proof from being played
//! back as the other's. Under `[cluster.tls]` all of this runs inside
//! mutual TLS, where the cookie is a second factor. Frames are the
//! connection's own length-delimited frames, each a JSON object.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use crate::stream::NodeId;

/// Names the protocol in every hello (a peer that is not a tailrace node,
/// or an older build that spoke another transport, sends no such hello).
const PROTOCOL: &str = "tailrace-link";

/// The handshake's version: a peer that speaks another is refused with
/// both versions named.
pub(super) const VERSION: u32 = 1;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// One frame of the handshake.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "frame")]
enum Frame {
    Hello { protocol: String, version: u32, node: String, nonce: String },
    Proof { mac: String },
    Refused { reason: String },
}

/// Why a handshake failed.
#[derive(Clone, Debug)]
pub(super) enum Failed {
    /// The other side answered, and refused (or failed its proof): trying
    /// again will not help.
    Rejected(String),
    /// The connection broke or went quiet: worth another try.
    Broken(String),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Rejected(reason) | Failed::Broken(reason) => f.write_str(reason),
        }
    }
}

/// The two halves of a connection, as frames.
pub(super) type Reads<S> = FramedRead<ReadHalf<S>, LengthDelimitedCodec>;
pub(super) type Writes<S> = FramedWrite<WriteHalf<S>, LengthDelimitedCodec>;

/// What both sides need to run it.
pub(super) struct Credentials<'a> {
    /// This node.
    pub(super) me: &'a NodeId,
    /// The cluster cookie.
    pub(super) cookie: &'a str,
    /// How long the whole handshake may take.
    pub(super) within: Duration,
}

impl Credentials<'_> {
    fn hello(&self) -> Frame {
        Frame::Hello {
            protocol: PROTOCOL.into(),
            version: VERSION,
            node: self.me.to_string(),
            nonce: format!("{:032x}", rand::random::<u128>()),
        }
    }

    /// The proof of `role` over the two hellos as sent.
    fn mac(&self, role: &str, dialer: &[u8], listener: &[u8]) -> HmacSha256 {
        // Any key length is valid for HMAC; `new_from_slice` cannot fail.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(self.cookie.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        for part in [role.as_bytes(), dialer, listener] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    /// The dialer's side: returns once `expected` (the node dialed) proved
    /// it holds the cookie.
    pub(super) async fn dial<S: AsyncRead + AsyncWrite>(
        &self,
        reads: &mut Reads<S>,
        writes: &mut Writes<S>,
        expected: &NodeId,
    ) -> Result<(), Failed> {
        let within = self.within;
        let run = async {
            let hello = encode(&self.hello())?;
            send(writes, hello.clone()).await?;
            let (answer, theirs) = receive(reads).await?;
            let node = match answer {
                Frame::Hello { protocol, version, node, .. } if protocol == PROTOCOL && version == VERSION => node,
                Frame::Hello { protocol, version, .. } if protocol == PROTOCOL => {
                    return Err(Failed::Rejected(format!(
                        "it speaks handshake version {version}, this node {VERSION} (see docs/upgrading.md)"
                    )));
                }
                Frame::Refused { reason } => return Err(Failed::Rejected(reason)),
                _ => return Err(Failed::Rejected(not_a_node())),
            };
            if node != expected.as_str() {
                return Err(Failed::Rejected(format!("the node listening there is `{node}`, not `{expected}`")));
            }
            let proof = self.mac("dialer", &hello, &theirs).finalize().into_bytes();
            send(writes, encode(&Frame::Proof { mac: mac_text(&proof) })?).await?;
            match receive(reads).await? {
                (Frame::Proof { mac }, _) => {
                    let check = self.mac("listener", &hello, &theirs);
                    match mac_bytes(&mac).is_some_and(|mac| check.verify_slice(&mac).is_ok()) {
                        true => Ok(()),
                        false => Err(Failed::Rejected("its proof of the cluster cookie is wrong".into())),
                    }
                }
                (Frame::Refused { reason }, _) => Err(Failed::Rejected(reason)),
                _ => Err(Failed::Rejected(not_a_node())),
            }
        };
        tokio::time::timeout(within, run)
            .await
            .unwrap_or_else(|_| Err(Failed::Broken(format!("the handshake took longer than {within:?}"))))
    }

    /// The listener's side: returns the dialer's name once it proved it
    /// holds the cookie (a dialer that did not is told why, and refused).
    pub(super) async fn accept<S: AsyncRead + AsyncWrite>(
        &self,
        reads: &mut Reads<S>,
        writes: &mut Writes<S>,
    ) -> Result<String, Failed> {
        let within = self.within;
        let run = async {
            let (hello, theirs) = receive(reads).await?;
            let node = match hello {
                Frame::Hello { protocol, version, node, .. } if protocol == PROTOCOL && version == VERSION => node,
                Frame::Hello { protocol, version, .. } if protocol == PROTOCOL => {
                    let reason = format!("it speaks handshake version {VERSION}, the dialer {version}");
                    return Err(refuse(writes, reason).await);
                }
                _ => return Err(Failed::Rejected(not_a_node())),
            };
            let ours = encode(&self.hello())?;
            send(writes, ours.clone()).await?;
            let proven = match receive(reads).await? {
                (Frame::Proof { mac }, _) => {
                    let check = self.mac("dialer", &theirs, &ours);
                    mac_bytes(&mac).is_some_and(|mac| check.verify_slice(&mac).is_ok())
                }
                _ => false,
            };
            if !proven {
                return Err(refuse(writes, "the cluster cookie differs".into()).await);
            }
            let proof = self.mac("listener", &theirs, &ours).finalize().into_bytes();
            send(writes, encode(&Frame::Proof { mac: mac_text(&proof) })?).await?;
            Ok(node)
        };
        tokio::time::timeout(within, run)
            .await
            .unwrap_or_else(|_| Err(Failed::Broken(format!("the handshake took longer than {within:?}"))))
    }
}

fn not_a_node() -> String {
    "it did not answer as a tailrace node of this release (an older build speaking the previous transport? \
     see docs/upgrading.md)"
        .into()
}

async fn refuse<S: AsyncRead + AsyncWrite>(writes: &mut Writes<S>, reason: String) -> Failed {
    if let Ok(frame) = encode(&Frame::Refused { reason: reason.clone() }) {
        let _ = send(writes, frame).await;
    }
    Failed::Rejected(reason)
}

fn encode(frame: &Frame) -> Result<Bytes, Failed> {
    serde_json::to_vec(frame).map(Bytes::from).map_err(|e| Failed::Broken(e.to_string()))
}

async fn send<S: AsyncRead + AsyncWrite>(writes: &mut Writes<S>, frame: Bytes) -> Result<(), Failed> {
    writes.send(frame).await.map_err(|e| Failed::Broken(e.to_string()))
}

/// The next frame, and its bytes as received.
async fn receive<S: AsyncRead + AsyncWrite>(reads: &mut Reads<S>) -> Result<(Frame, Bytes), Failed> {
    match reads.next().await {
        Some(Ok(bytes)) => {
            let bytes = bytes.freeze();
            let frame = serde_json::from_slice(&bytes).map_err(|_| Failed::Rejected(not_a_node()))?;
            Ok((frame, bytes))
        }
        Some(Err(error)) => Err(Failed::Rejected(format!("{}: {error}", not_a_node()))),
        None => Err(Failed::Broken(
            "the connection closed during the handshake (a node of an older release closes it: see docs/upgrading.md)"
                .into(),
        )),
    }
}

fn mac_text(mac: &[u8]) -> String {
    BASE64.encode(mac)
}

fn mac_bytes(text: &str) -> Option<Vec<u8>> {
    BASE64.decode(text).ok()
}

#[cfg(test)]
mod tests;
