//! `tailrace-bench transport`: deliveries from an agent to a consumer on
//! another node. Two cluster transports run in this process on loopback
//! ports (the first's lane to the second, the second's listener serving
//! it); callers deliver through the proxy an agent would use, each
//! delivery 16 containers of 4 log lines taken from the caller's cache of
//! containers, as an agent's cursor takes them (built before the clock
//! starts; each delivery holds `Arc` clones). The baseline sends the same
//! request bytes over plain TCP (a length prefix, one connection per
//! caller), and its server decodes them and answers the same reply: what
//! is measured is what the transport adds to a socket round trip (the
//! lane's connections, call ids and writer tasks, the proxy, the reply
//! routing). The transport's rounds start once the lane is open. Both run
//! the same callers in alternating rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_trait::async_trait;
use bytes::Bytes;
use tailrace::cluster::wire::{self, Reply, Request, WireDelivery};
use tailrace::cluster::{Member, Served, TcpTransport, TransportSettings};
use tailrace::pubsub::{
    ConsumerAddress, ConsumerError, ConsumerResolver, Delivery, DeliveryOutcome, Origin, SubscriptionId,
};
use tailrace::queue::Fence;
use tailrace::{BatchContainer, Event, EventId, NodeId, QueueId, SequenceToken, StreamId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const CONTAINERS: usize = 16;
const EVENTS_PER_CONTAINER: usize = 4;
const CALLERS: usize = 8;

/// Counts the events delivered to it.
struct Counter(Arc<AtomicU64>);

#[async_trait]
impl Served for Counter {
    async fn serve(&self, request: Request) -> Reply {
        answer(&self.0, request)
    }
}

/// What the consumer's side does with a request, in both runs.
fn answer(count: &AtomicU64, request: Request) -> Reply {
    match request {
        Request::Deliver { delivery, .. } => {
            let result = delivery.into_delivery().map_err(ConsumerError::Failed).map(|d| {
                count.fetch_add(d.event_count() as u64, Ordering::Relaxed);
                DeliveryOutcome::Continue
            });
            Reply::Delivered { result }
        }
        _ => Reply::Told,
    }
}

/// Containers one caller delivers from, as an agent delivers from its
/// cache: built once, each delivery an `Arc` clone of 16 of them.
const CACHED: usize = 64 * CONTAINERS;

/// What caller `caller` has cached: `CACHED` containers of 4 log lines.
fn cache(caller: u64) -> Vec<Arc<BatchContainer>> {
    let stream = StreamId::new("logs", "bench.pipeline/run-1");
    (0..CACHED as u64)
        .map(|c| {
            let events = (0..EVENTS_PER_CONTAINER)
                .map(|e| {
                    let line =
                        format!("2026-11-30T12:00:00Z INFO step {c} of caller {caller}: event {e} of a log line");
                    Event { id: EventId::new(format!("{caller}-{c}-{e}")), timestamp_ms: 0, payload: Bytes::from(line) }
                })
                .collect();
            Arc::new(BatchContainer { stream: stream.clone(), token: SequenceToken::new(caller, c), events })
        })
        .collect()
}

/// Delivery `n` from `cache`: the next 16 containers, as an agent's
/// cursor takes them (the containers stay cached; the delivery holds
/// clones).
fn delivery(cache: &[Arc<BatchContainer>], n: u64) -> Delivery {
    let first = (n as usize * CONTAINERS) % cache.len();
    let batches = cache[first..first + CONTAINERS].to_vec();
    Delivery::new(SubscriptionId(1), cache[first].stream.clone(), batches).fenced(Fence::lease(1))
}

fn free_addr() -> anyhow::Result<std::net::SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Two transports linked to each other; the consumer on the second.
async fn linked(cookie: &str) -> anyhow::Result<(TcpTransport, TcpTransport, Arc<AtomicU64>)> {
    let (a, b) = (free_addr()?, free_addr()?);
    let member = |name: &str, at: std::net::SocketAddr| Member {
        name: NodeId::new(name),
        incarnation: "1".into(),
        advertise: at.to_string(),
        agents_started: true,
    };
    let members = vec![member("bench-a", a), member("bench-b", b)];
    // A fixed view: the transports only read it.
    let (_, view) = watch::channel(members.clone());
    let settings = |me: &str, listen| TransportSettings {
        me: NodeId::new(me),
        listen,
        cookie: cookie.to_string(),
        call_timeout: Duration::from_secs(10),
        max_message_bytes: 16 * 1024 * 1024,
        max_inflight: 256,
        redial: Duration::from_millis(200),
        tls: None,
    };
    let first = TcpTransport::start(settings("bench-a", a), view.clone()).await?;
    let second = TcpTransport::start(settings("bench-b", b), view).await?;

    let count = Arc::new(AtomicU64::new(0));
    second.serve_with(Arc::new(Counter(count.clone())));
    first.authenticate(&members[1..], Duration::from_secs(10)).await.context("linking the two transports")?;
    Ok((first, second, count))
}

/// Deliveries per second through the transport's proxy.
async fn through_transport(transport: &TcpTransport, per_caller: u64) -> anyhow::Result<f64> {
    let address = ConsumerAddress { node: NodeId::new("bench-b"), name: "viewer".into() };
    let origin = Origin { queue: QueueId(0), fence: Some(1) };
    let caches: Vec<_> = (0..CALLERS as u64).map(cache).collect();
    let started = Instant::now();
    let mut callers = Vec::new();
    for cache in caches {
        let consumer = transport.resolve_from(&address, origin).context("no proxy")?;
        callers.push(tokio::spawn(async move {
            for n in 0..per_caller {
                let delivery = delivery(&cache, n);
                // As an agent does: a link that is down (the two nodes
                // dialing each other at once at the start) is retried.
                loop {
                    match consumer.deliver(&delivery).await {
                        Ok(_) => break,
                        Err(ConsumerError::Unreachable(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
                        Err(error) => return Err(error.into()),
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    for caller in callers {
        caller.await??;
    }
    Ok((CALLERS as u64 * per_caller) as f64 / started.elapsed().as_secs_f64())
}

/// `bytes` after their length, as one write.
fn framed(bytes: Vec<u8>) -> Vec<u8> {
    let mut frame = Vec::with_capacity(bytes.len() + 4);
    frame.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    frame.extend_from_slice(&bytes);
    frame
}

/// The same requests over plain TCP, answered by a server that decodes
/// each and replies with the same reply.
async fn through_sockets(per_caller: u64) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let at = listener.local_addr()?;
    let count = Arc::new(AtomicU64::new(0));
    let server = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.set_nodelay(true);
            let count = count.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                while let Ok(len) = socket.read_u32().await {
                    buffer.resize(len as usize, 0);
                    if socket.read_exact(&mut buffer).await.is_err() {
                        return;
                    }
                    let reply = match wire::decode::<Request>(&buffer) {
                        Ok(request) => answer(&count, request),
                        Err(refusal) => Reply::Refused { refusal },
                    };
                    if socket.write_all(&framed(wire::encode(&reply).unwrap_or_default())).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let caches: Vec<_> = (0..CALLERS as u64).map(cache).collect();
    let started = Instant::now();
    let mut callers = Vec::new();
    for cache in caches {
        callers.push(tokio::spawn(async move {
            let mut socket = TcpStream::connect(at).await?;
            socket.set_nodelay(true)?;
            let mut buffer = Vec::new();
            for n in 0..per_caller {
                let request = Request::Deliver {
                    from: Some(Origin { queue: QueueId(0), fence: Some(1) }),
                    consumer: "viewer".into(),
                    delivery: WireDelivery::from_delivery(&delivery(&cache, n)),
                };
                socket.write_all(&framed(wire::encode(&request).map_err(anyhow::Error::msg)?)).await?;
                let len = socket.read_u32().await?;
                buffer.resize(len as usize, 0);
                socket.read_exact(&mut buffer).await?;
                match wire::decode::<Reply>(&buffer) {
                    Ok(Reply::Delivered { result: Ok(_) }) => {}
                    other => anyhow::bail!("unexpected reply {other:?}"),
                }
            }
            anyhow::Ok(())
        }));
    }
    for caller in callers {
        caller.await??;
    }
    let rate = (CALLERS as u64 * per_caller) as f64 / started.elapsed().as_secs_f64();
    server.abort();
    Ok(rate)
}

pub async fn run(quick: bool) -> anyhow::Result<()> {
    let (rounds, per_caller) = if quick { (3, 100) } else { (5, 1_000) };
    let cookie = format!("{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>());
    let (first, second, count) = linked(&cookie).await?;
    println!(
        "transport: {CALLERS} callers, {per_caller} deliveries each per round, {CONTAINERS} containers of \
         {EVENTS_PER_CONTAINER} log lines per delivery; baseline: the same requests over plain TCP"
    );
    // Warm both paths once.
    through_transport(&first, 10).await?;
    through_sockets(10).await?;
    // TAILRACE_BENCH_ONLY=tailrace|baseline runs one side (for profiling).
    let only = std::env::var("TAILRACE_BENCH_ONLY").unwrap_or_default();
    let mut measured = Vec::new();
    for round in 1..=rounds {
        let transport = if only == "baseline" { 0.0 } else { through_transport(&first, per_caller).await? };
        let sockets = if only == "tailrace" { 0.0 } else { through_sockets(per_caller).await? };
        let events = (CONTAINERS * EVENTS_PER_CONTAINER) as f64;
        println!(
            "  round {round}/{rounds}: transport {:.0} deliveries/s ({:.0} events/s), plain TCP {:.0} deliveries/s",
            transport,
            transport * events,
            sockets
        );
        measured.push((transport * events, sockets * events));
    }
    let delivered = count.load(Ordering::Relaxed);
    let transport_rounds = if only == "baseline" { 0 } else { rounds as u64 };
    let expected = (transport_rounds * per_caller + 10) * CALLERS as u64 * (CONTAINERS * EVENTS_PER_CONTAINER) as u64;
    // At least once: a delivery whose reply was lost with its link is
    // sent again.
    anyhow::ensure!(delivered >= expected, "the consumer counted {delivered} events, {expected} were sent");
    first.shutdown().await;
    second.shutdown().await;
    println!("{}", super::median_line("transport", &measured, &[("callers", CALLERS.to_string())]));
    Ok(())
}
