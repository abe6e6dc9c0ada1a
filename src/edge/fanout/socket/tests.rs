//! A [`Socket`]'s non-blocking I/O against real clients on loopback: a
//! plain one that leaves, and TLS sessions (a certificate of a test
//! authority, made with `openssl`; a raw copy of what the client's socket
//! read shows each record's size).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Context;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream as ClientTls;

use super::*;
use tailrace_testkit::tls_tap::{Seen, Tee};

struct Flag(AtomicBool);

impl futures::task::ArcWake for Flag {
    fn wake_by_ref(flag: &Arc<Self>) {
        flag.0.store(true, Ordering::SeqCst);
    }
}

/// A waker that raises a flag, and the flag.
fn flag() -> (Arc<Flag>, std::task::Waker) {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = futures::task::waker(flag.clone());
    (flag, waker)
}

/// Waits until `flag` is raised (5 s at most).
async fn raised(flag: &Flag) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while !flag.0.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    assert!(waited.await.is_ok(), "the waker was not woken");
}

async fn connected() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    (client, server)
}

/// A client that leaves wakes the waker its socket holds, and is then
/// seen; one that stays is not.
#[tokio::test]
async fn a_plain_client_that_left_wakes_the_waker_and_is_seen() {
    let (mut client, server) = connected().await;
    client.write_all(b"GET").await.unwrap();
    server.readable().await.unwrap();
    let mut socket = Socket::Plain(server);
    let (flag, waker) = flag();
    // (The request's bytes: a viewer's hand-over follows its request, and
    // a byte after it counts as the client leaving; here they are read.)
    let mut request = [0u8; 3];
    let Socket::Plain(server) = &socket else { unreachable!() };
    server.try_read(&mut request).unwrap();
    assert!(!socket.client_left(&mut Context::from_waker(&waker)), "open");
    drop(client);
    raised(&flag).await;
    assert!(socket.client_left(&mut Context::from_waker(&waker)), "closed: seen");
}

/// A TLS session between a server's [`Socket`] and a client, and the raw
/// bytes the client read since the handshake (from `handshaken` on). No
/// session tickets: every record after the handshake is the test's.
struct Pair {
    server: Socket,
    client: ClientTls<Tee>,
    seen: Seen,
    handshaken: usize,
    _dir: tempfile::TempDir,
}

async fn tls_pair() -> Pair {
    let dir = tempfile::tempdir().unwrap();
    tailrace_testkit::certs::authority(dir.path(), "ca", &["edge"]);
    let mut config =
        crate::tls::http_server("edge.tls", &dir.path().join("edge.pem"), &dir.path().join("edge.key")).unwrap();
    config.send_tls13_tickets = 0;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let roots = crate::tls::roots("ca", &dir.path().join("ca.pem")).unwrap();
    let client_config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
    let (client, server) = connected().await;
    let (tee, seen) = Tee::new(client);
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let (client, server) = tokio::join!(connector.connect(name, tee), acceptor.accept(server));
    let (mut client, server) = (client.unwrap(), server.unwrap());
    // The server's last handshake flight is read once the client read
    // something after it: a byte of data.
    let mut server = Socket::tls(Box::new(server));
    assert_eq!(server.write(&[IoSlice::new(b"!")]).unwrap(), 1);
    let mut one = [0u8; 1];
    client.read_exact(&mut one).await.unwrap();
    let handshaken = seen.len();
    Pair { server, client, seen, handshaken, _dir: dir }
}

/// Reads `count` bytes of plaintext from `client`.
async fn read_exactly(client: &mut ClientTls<Tee>, count: usize) -> Vec<u8> {
    let mut out = vec![0u8; count];
    tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut out)).await.unwrap().unwrap();
    out
}

/// One pass's frames go to rustls as one vectored write: small frames
/// share records (a record per frame would be 200 records here), and no
/// record carries more than 16 KiB.
#[tokio::test]
async fn small_frames_share_tls_records_and_none_carries_more_than_16_kib() {
    let mut pair = tls_pair().await;
    let frames: Vec<Vec<u8>> =
        (0..200).map(|i| format!("data: frame {i:04}{}\n\n", "x".repeat(200)).into_bytes()).collect();
    let total: usize = frames.iter().map(Vec::len).sum();
    let mut sent = 0;
    let mut writes = 0;
    for batch in frames.chunks(MAX_SOURCES) {
        let slices: Vec<IoSlice<'_>> = batch.iter().map(|f| IoSlice::new(f)).collect();
        let taken = pair.server.write(&slices).unwrap();
        assert_eq!(taken, batch.iter().map(Vec::len).sum::<usize>(), "small writes are taken whole");
        sent += taken;
        writes += 1;
    }
    let got = read_exactly(&mut pair.client, total).await;
    assert_eq!(got, frames.concat(), "every byte once, in order");
    assert_eq!(sent, total);
    let records = pair.seen.records(pair.handshaken);
    assert_eq!(records.len(), writes, "one record per write of small frames: {records:?}");
    // One pass's worth: four full records.
    let big: Vec<Vec<u8>> = (0..8).map(|i| vec![b'a' + i as u8; COALESCE_BYTES / 8]).collect();
    let slices: Vec<IoSlice<'_>> = big.iter().map(|f| IoSlice::new(f)).collect();
    let from = pair.seen.len();
    assert_eq!(pair.server.write(&slices).unwrap(), COALESCE_BYTES);
    while pair.server.holds() {
        pair.server.tcp().writable().await.unwrap();
        pair.server.send_held().unwrap();
    }
    assert_eq!(read_exactly(&mut pair.client, COALESCE_BYTES).await, big.concat());
    let records = pair.seen.records(from);
    // (TLS 1.3 adds 17 bytes to a record: its type and its tag.)
    assert_eq!(records.len(), COALESCE_BYTES / TLS_RECORD_BYTES, "{records:?}");
    assert!(records.iter().all(|r| *r > TLS_RECORD_BYTES && *r <= TLS_RECORD_BYTES + 256), "{records:?}");
}

/// Buffers the vectored writes of these tests hold (a pass's at most).
const MAX_SOURCES: usize = 9;

/// A session at its buffer limit takes part of a buffer, or nothing: what
/// it took, counted from the caller's buffers, arrives once and in order,
/// whatever the socket took meanwhile.
#[tokio::test]
async fn a_tls_session_at_its_limit_takes_part_and_nothing_is_lost_or_repeated() {
    let mut pair = tls_pair().await;
    let Socket::Tls(stream) = &mut pair.server else { unreachable!() };
    stream.get_mut().1.set_buffer_limit(Some(3000));
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let reading = tokio::spawn(async move {
        let mut client = pair.client;
        // Slow at first, so that the socket's buffers fill.
        tokio::time::sleep(Duration::from_millis(50)).await;
        read_exactly(&mut client, 200_000).await
    });
    let (mut at, mut partial) = (0, 0);
    while at < payload.len() {
        // The rest in pieces of 7 000 bytes (more than the limit).
        let pieces: Vec<IoSlice<'_>> = payload[at..].chunks(7_000).take(MAX_SOURCES).map(IoSlice::new).collect();
        let offered: usize = pieces.iter().map(|p| p.len()).sum();
        match pair.server.write(&pieces) {
            Ok(taken) => {
                assert!(taken <= offered);
                partial += usize::from(taken < offered);
                at += taken;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        while pair.server.holds() {
            pair.server.tcp().writable().await.unwrap();
            pair.server.send_held().unwrap();
        }
    }
    assert!(partial > 0, "the limit took part of a write");
    assert_eq!(reading.await.unwrap(), payload, "every byte once, in order");
}

/// The end of a response over TLS: its last bytes, then `close_notify`,
/// which the client reads as a clean end (not a cut connection).
#[tokio::test]
async fn a_closed_tls_session_ends_with_close_notify_after_its_last_bytes() {
    let mut pair = tls_pair().await;
    assert_eq!(pair.server.write(&[IoSlice::new(b"0\r\n\r\n")]).unwrap(), 5);
    pair.server.close();
    while pair.server.holds() {
        pair.server.tcp().writable().await.unwrap();
        pair.server.send_held().unwrap();
    }
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), pair.client.read_to_end(&mut rest)).await.unwrap();
    assert!(read.is_ok(), "a clean end: {read:?}");
    assert_eq!(rest, b"0\r\n\r\n");
}

/// A TLS client that says `close_notify`, or sends data, or whose socket
/// closes, has left; one that stays quiet has not.
#[tokio::test]
async fn a_tls_client_that_leaves_or_sends_data_is_seen() {
    for how in ["close_notify", "data", "eof"] {
        let mut pair = tls_pair().await;
        let (flag, waker) = flag();
        assert!(!pair.server.client_left(&mut Context::from_waker(&waker)), "{how}: open");
        match how {
            "close_notify" => pair.client.shutdown().await.unwrap(),
            "data" => {
                pair.client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
                pair.client.flush().await.unwrap();
            }
            _ => drop(pair.client),
        }
        raised(&flag).await;
        assert!(pair.server.client_left(&mut Context::from_waker(&waker)), "{how}: seen");
    }
}
