//! A TCP proxy a test controls, the fault layer between a node and Redis
//! or between nodes (their advertised addresses point at it). It passes
//! bytes on ([`Fault::Pass`]), late ([`Fault::Delay`]: each chunk leaves
//! this long after it came, so a pipelined connection keeps its throughput
//! and only its latency grows), not at all while connections stay open
//! ([`Fault::Drop`]: packets dropped by a firewall, nobody told; the bytes
//! move on once it is lifted, as TCP sends them again), or it refuses new
//! connections ([`Fault::Refuse`]: each is accepted, then closed).
//! [`TcpProxy::cut`] closes every connection at once and keeps closing new
//! ones until [`TcpProxy::mend`]; [`TcpProxy::reject`] closes them and
//! stops listening, so that a dial is refused by the kernel, as a firewall
//! that rejects the port answers (until [`TcpProxy::mend`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// What the proxy does to the traffic now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Passes every byte on at once.
    Pass,
    /// Passes every byte on this long after it came.
    Delay(Duration),
    /// Keeps connections open and accepts new ones, but passes nothing
    /// (until the fault is lifted: TCP would send the packets again).
    Drop,
    /// Keeps the open connections as they are; closes new ones at once.
    Refuse,
}

/// The fault, shared by the proxy's tasks: `u64::MAX` drop, `u64::MAX - 1`
/// refuse, otherwise a delay in milliseconds (0: pass).
#[derive(Default)]
struct Mode(AtomicU64);

const DROP: u64 = u64::MAX;
const REFUSE: u64 = u64::MAX - 1;

impl Mode {
    fn set(&self, fault: Fault) {
        let raw = match fault {
            Fault::Pass => 0,
            Fault::Delay(by) => (by.as_millis() as u64).min(REFUSE - 1),
            Fault::Drop => DROP,
            Fault::Refuse => REFUSE,
        };
        self.0.store(raw, Ordering::SeqCst);
    }

    fn get(&self) -> Fault {
        match self.0.load(Ordering::SeqCst) {
            0 => Fault::Pass,
            DROP => Fault::Drop,
            REFUSE => Fault::Refuse,
            ms => Fault::Delay(Duration::from_millis(ms)),
        }
    }
}

pub struct TcpProxy {
    pub port: u16,
    at: SocketAddr,
    target: u16,
    open: Arc<AtomicBool>,
    mode: Arc<Mode>,
    links: Arc<tokio::sync::Mutex<JoinSet<()>>>,
    /// The accepting task, `None` while rejecting (nothing listens).
    accept: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A listener on `at` (port 0: a free one) that may take a port whose
/// connections just closed (they linger in TIME_WAIT).
fn listen(at: SocketAddr) -> TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(at).unwrap();
    socket.listen(1024).unwrap()
}

impl TcpProxy {
    /// Forwards a free loopback port to `127.0.0.1:target`.
    pub async fn start(target: u16) -> Self {
        Self::start_at(([127, 0, 0, 1], 0).into(), target).await
    }

    /// Forwards `at` (another loopback address, say, with the target's
    /// port) to `127.0.0.1:target`.
    pub async fn start_at(at: SocketAddr, target: u16) -> Self {
        let listener = listen(at);
        let at = listener.local_addr().unwrap();
        let proxy = Self {
            port: at.port(),
            at,
            target,
            open: Arc::new(AtomicBool::new(true)),
            mode: Arc::new(Mode::default()),
            links: Arc::default(),
            accept: std::sync::Mutex::new(None),
        };
        proxy.serve(listener);
        proxy
    }

    /// Accepts on `listener` and links each connection to the target.
    fn serve(&self, listener: TcpListener) {
        let (open, mode, links, target) = (self.open.clone(), self.mode.clone(), self.links.clone(), self.target);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if !open.load(Ordering::SeqCst) || mode.get() == Fault::Refuse {
                    continue;
                }
                let mode = mode.clone();
                links.lock().await.spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await {
                        link(inbound, outbound, mode).await;
                    }
                });
            }
        });
        *self.accept.lock().unwrap() = Some(accept);
    }

    /// From now on, `fault`.
    pub fn set(&self, fault: Fault) {
        self.mode.set(fault);
    }

    /// Closes every connection and refuses new ones; how many it closed.
    pub async fn cut(&self) -> usize {
        self.open.store(false, Ordering::SeqCst);
        let mut links = self.links.lock().await;
        let cut = links.len();
        links.abort_all();
        while links.join_next().await.is_some() {}
        cut
    }

    /// Closes every connection and stops listening: a dial is refused
    /// until [`TcpProxy::mend`]. How many connections it closed.
    pub async fn reject(&self) -> usize {
        let accept = self.accept.lock().unwrap().take();
        if let Some(accept) = accept {
            accept.abort();
            // Ends once the task, and with it the listener, was dropped.
            let _ = accept.await;
        }
        self.cut().await
    }

    /// Accepts connections again (listening again after a
    /// [`TcpProxy::reject`]), and passes bytes on at once.
    pub fn mend(&self) {
        self.mode.set(Fault::Pass);
        self.open.store(true, Ordering::SeqCst);
        if self.accept.lock().unwrap().is_none() {
            self.serve(listen(self.at));
        }
    }
}

/// Both directions of one connection, until either side closes.
async fn link(inbound: TcpStream, outbound: TcpStream, mode: Arc<Mode>) {
    let (client_read, client_write) = inbound.into_split();
    let (server_read, server_write) = outbound.into_split();
    tokio::select! {
        () = pipe(client_read, server_write, mode.clone()) => {}
        () = pipe(server_read, client_write, mode) => {}
    }
}

/// One direction: each chunk read goes out when the fault says (a delay
/// line, so chunks keep their order and a delay is latency, not
/// throughput); while dropping, nothing moves, and what waits moves on once
/// the path heals.
async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, mode: Arc<Mode>) {
    // Unbounded: what is in flight is what arrives within one delay (a
    // test's traffic), and a bounded line would slow the reader down.
    let (line, mut out) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, chunk)) = out.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Dropped packets are sent again by TCP once the path heals: a
            // stream stalls, it does not lose bytes in its middle.
            while mode.get() == Fault::Drop {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let due = match mode.get() {
                Fault::Delay(by) => tokio::time::Instant::now() + by,
                _ => tokio::time::Instant::now(),
            };
            if line.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    // The reader's end (EOF) drops the line: the writer sends what is in
    // it, then ends.
    tokio::join!(writer, reader);
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(accept) = self.accept.lock().unwrap().take() {
            accept.abort();
        }
    }
}

/// A node's cluster address behind a proxy: the peers dial it on
/// `127.0.0.2` (what it advertises), and the proxy passes that on to where
/// it listens on `127.0.0.1`, so that a fault set here holds every byte
/// between it and the peers that dial it.
pub struct PeerLink {
    /// The body of the node's `[cluster]` section.
    pub cluster: String,
    proxy: TcpProxy,
}

impl PeerLink {
    pub async fn start() -> Self {
        let listen = super::free_port();
        let cluster = format!("listen = \"127.0.0.1:{listen}\"\nadvertise = \"127.0.0.2:{listen}\"\n");
        let proxy = TcpProxy::start_at(SocketAddr::from(([127, 0, 0, 2], listen)), listen).await;
        Self { cluster, proxy }
    }

    /// From now on, `fault`.
    pub fn set(&self, fault: Fault) {
        self.proxy.set(fault);
    }

    /// Closes every connection, and keeps accepting new ones.
    pub async fn reset(&self) -> usize {
        let closed = self.proxy.cut().await;
        self.mend();
        closed
    }

    /// Closes every connection and refuses every dial (see
    /// [`TcpProxy::reject`]).
    pub async fn reject(&self) -> usize {
        self.proxy.reject().await
    }

    /// Passes everything again.
    pub fn mend(&self) {
        self.proxy.mend();
    }
}
