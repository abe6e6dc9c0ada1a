//! What `sse` reads from the kernel around a measured window: the server's
//! resident memory, the kernel's TCP socket memory, each process's CPU
//! time, and the server's socket write system calls (through `perf stat`).

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;

/// The socket write calls `perf stat` counts. A viewer's first frames are
/// written by its connection's task with `send(2)` (std's
/// `TcpStream::write`: the `sendto` system call), the live ones by the
/// fan-out with `writev`; hyper's answers to the producer use `writev`
/// too, the run log store `write`. (`/proc/self/io`'s `syscw` counts `write` and `writev` only,
/// not `send`, so it cannot count a socket's writes.)
const EVENTS: &str = "syscalls:sys_enter_sendto,syscalls:sys_enter_writev,syscalls:sys_enter_write";

/// This process's resident memory, in bytes.
pub(super) fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The memory the kernel holds for the data of all TCP sockets of the host
/// (queued buffers), in bytes: `/proc/net/sockstat`'s `TCP: … mem`,
/// counted in pages. Both ends of a loopback connection are in it.
pub(super) fn kernel_tcp_bytes() -> u64 {
    let sockstat = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    let pages = sockstat
        .lines()
        .find(|l| l.starts_with("TCP:"))
        .and_then(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.windows(2).find(|w| w[0] == "mem").and_then(|w| w[1].parse::<u64>().ok())
        })
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    pages * page
}

/// The kernel's slab memory, host-wide, in bytes (`/proc/meminfo`'s
/// `Slab:`): a connection's socket structures (`TCP`, `sock_inode_cache`,
/// `dentry`, `filp`, epoll items) at both of its ends, which the TCP
/// memory above does not count; other slab users move it too.
pub(super) fn kernel_slab_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("Slab:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU seconds (user + system) of a process, and of the whole host.
#[derive(Clone, Copy, Default)]
pub(super) struct CpuSample {
    server: f64,
    client: f64,
    host_busy: f64,
    host_total: f64,
}

/// How the two cores were shared over a window, in cores (1.0 = one core
/// busy the whole window).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CpuSplit {
    pub server: f64,
    pub client: f64,
    /// The host's busy share of all its cores (0–1).
    pub host_busy: f64,
    pub cores: usize,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64
}

/// utime + stime of `pid`, in seconds.
fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(14) + ticks(15)) / clock_ticks()
}

impl CpuSample {
    pub(super) fn take(client: Option<u32>) -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpu: Vec<f64> =
            stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest is in user).
        let total: f64 = cpu.iter().take(8).sum();
        let idle = cpu.get(3).copied().unwrap_or(0.0) + cpu.get(4).copied().unwrap_or(0.0);
        Self {
            server: process_cpu(std::process::id()),
            client: client.map_or(0.0, process_cpu),
            host_busy: (total - idle) / clock_ticks(),
            host_total: total / clock_ticks(),
        }
    }

    pub(super) fn since(self, before: Self, seconds: f64) -> CpuSplit {
        let seconds = seconds.max(1e-9);
        let total = self.host_total - before.host_total;
        CpuSplit {
            server: (self.server - before.server) / seconds,
            client: (self.client - before.client) / seconds,
            host_busy: if total > 0.0 { (self.host_busy - before.host_busy) / total } else { 0.0 },
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

impl std::fmt::Display for CpuSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "server {:.2} cores, clients {:.2} cores, host {:.0} % busy of {} cores",
            self.server,
            self.client,
            self.host_busy * 100.0,
            self.cores
        )
    }
}

/// The server's write system calls over a window, as `perf stat` counted
/// them on this process's threads.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Writes {
    /// `send` on sockets: the viewers' frames (and nothing else here).
    pub sendto: u64,
    pub writev: u64,
    pub write: u64,
}

/// A `perf stat` counting this process's write system calls.
pub(super) struct PerfCount {
    child: tokio::process::Child,
}

impl PerfCount {
    /// `None` when `perf` cannot be started, or `TAILRACE_BENCH_PERF=0`
    /// (then only the clients' reads are reported).
    pub(super) async fn start() -> Option<Self> {
        if std::env::var("TAILRACE_BENCH_PERF").as_deref() == Ok("0") {
            return None;
        }
        let child = tokio::process::Command::new("perf")
            .args(["stat", "--no-big-num", "-e", EVENTS, "-p", &std::process::id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .ok()?;
        // perf prints nothing once it counts: give it time to attach.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Some(Self { child })
    }

    /// Stops counting (SIGINT, as ^C) and reads the counts.
    pub(super) async fn stop(self) -> anyhow::Result<Writes> {
        let pid = self.child.id().context("perf already ended")?;
        // SAFETY: a signal to a child process this bench started.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
        let output = tokio::time::timeout(Duration::from_secs(10), self.child.wait_with_output())
            .await
            .context("perf did not stop")??;
        let text = String::from_utf8_lossy(&output.stderr);
        let count = |event: &str| -> anyhow::Result<u64> {
            text.lines()
                .find_map(|l| {
                    let mut fields = l.split_whitespace();
                    let value = fields.next()?;
                    (fields.next()? == event).then(|| value.parse::<u64>().ok())?
                })
                .with_context(|| format!("perf counted no {event}:\n{text}"))
        };
        Ok(Writes {
            sendto: count("syscalls:sys_enter_sendto")?,
            writev: count("syscalls:sys_enter_writev")?,
            write: count("syscalls:sys_enter_write")?,
        })
    }
}
