//! The demo's clients: threads that join the client host's network
//! namespace and speak RESP to redis over std's TcpStream. Each keeps one
//! connection open for the whole demo and INCRs a counter of its own at a
//! bounded rate; every reply is checked (the counter must go up by exactly
//! one), every request counted as done or failed. A connection that
//! breaks counts as failed and is opened again.

use anyhow::{anyhow, bail, Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest a request may take before it counts as failed. A migration's
/// pause is far below this; a connection that is lost shows as a reset.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
}

/// One RESP connection.
pub struct Conn {
    out: TcpStream,
    input: BufReader<TcpStream>,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        s.set_write_timeout(Some(REQUEST_TIMEOUT))?;
        Ok(Conn { input: BufReader::new(s.try_clone()?), out: s })
    }

    fn encode(buf: &mut Vec<u8>, args: &[&[u8]]) {
        buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
    }

    fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        if self.input.read_line(&mut l)? == 0 {
            bail!("connection closed by the server");
        }
        Ok(l.trim_end_matches(['\r', '\n']).to_string())
    }

    fn reply(&mut self) -> Result<Reply> {
        let l = self.line()?;
        let (kind, rest) = l.split_at(l.len().min(1));
        Ok(match kind {
            "+" => Reply::Status(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(rest.parse().map_err(|_| anyhow!("bad integer reply {l:?}"))?),
            "$" => {
                let n: i64 = rest.parse().map_err(|_| anyhow!("bad bulk length {l:?}"))?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut data = vec![0; n as usize + 2];
                    std::io::Read::read_exact(&mut self.input, &mut data)?;
                    data.truncate(n as usize);
                    Reply::Bulk(Some(data))
                }
            }
            _ => bail!("unexpected reply {l:?}"),
        })
    }

    fn call(&mut self, args: &[&[u8]]) -> Result<Reply> {
        let mut buf = Vec::new();
        Self::encode(&mut buf, args);
        self.out.write_all(&buf)?;
        match self.reply()? {
            Reply::Error(e) => bail!("redis: {e}"),
            r => Ok(r),
        }
    }

    pub fn int(&mut self, args: &[&[u8]]) -> Result<i64> {
        match self.call(args)? {
            Reply::Int(n) => Ok(n),
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(&b)
                .parse()
                .map_err(|_| anyhow!("not a number: {:?}", String::from_utf8_lossy(&b))),
            Reply::Bulk(None) => Ok(0),
            Reply::Status(s) => bail!("unexpected status {s:?}"),
            Reply::Error(e) => bail!("redis: {e}"),
        }
    }

    pub fn ok(&mut self, args: &[&[u8]]) -> Result<()> {
        match self.call(args)? {
            Reply::Status(_) => Ok(()),
            _ => bail!("unexpected reply to {}", String::from_utf8_lossy(args[0])),
        }
    }

    /// SET `n` keys of `size` bytes, pipelined in batches.
    pub fn populate(&mut self, n: usize, size: usize) -> Result<()> {
        let value = vec![b'x'; size];
        let mut i = 0;
        while i < n {
            let batch = (n - i).min(1000);
            let mut buf = Vec::new();
            for k in i..i + batch {
                Self::encode(&mut buf, &[b"SET", format!("demo:key:{k}").as_bytes(), &value]);
            }
            self.out.write_all(&buf)?;
            for _ in 0..batch {
                match self.reply()? {
                    Reply::Status(_) => {}
                    _ => bail!("SET did not answer OK"),
                }
            }
            i += batch;
        }
        Ok(())
    }
}

/// Runs `f` on a thread that has joined the network namespace at `netns`.
pub fn in_netns<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let netns = netns.to_path_buf();
    std::thread::spawn(move || {
        enter(&netns)?;
        f()
    })
    .join()
    .map_err(|_| anyhow!("client thread panicked"))?
}

fn enter(netns: &Path) -> Result<()> {
    let f = File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
    ferry_sys::netns::enter_net_namespace(f.as_fd())
        .map_err(|e| anyhow!("entering {}: {e}", netns.display()))
}

#[derive(Default)]
pub struct Counters {
    pub done: AtomicU64,
    pub failed: AtomicU64,
    pub connects: AtomicU64,
    pub max_latency_us: AtomicU64,
    /// The longest request since [`Load::take_window_max_ms`] last read it.
    pub window_max_latency_us: AtomicU64,
    pub first_error: Mutex<Option<String>>,
}

impl Counters {
    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut e = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        e.get_or_insert(what);
    }
}

/// What the clients did, once they stopped.
pub struct Summary {
    pub clients: usize,
    pub done: u64,
    pub failed: u64,
    /// Connections opened beyond the first of each client.
    pub reconnects: u64,
    pub max_latency_ms: f64,
    /// Clients whose counter on the server equals the INCRs it acknowledged.
    pub counters_ok: usize,
    pub first_error: Option<String>,
}

pub struct Load {
    stop: Arc<AtomicBool>,
    pub counters: Arc<Counters>,
    threads: Vec<JoinHandle<bool>>,
}

impl Load {
    /// Starts `clients` threads, each sending one INCR per `interval` on
    /// its own connection to `addr` from the namespace at `netns`. Returns
    /// once every client has connected (or failed to).
    pub fn start(
        netns: &Path,
        addr: SocketAddr,
        clients: usize,
        interval: Duration,
    ) -> Result<Load> {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let mut load = Load { stop: stop.clone(), counters: counters.clone(), threads: Vec::new() };
        for i in 0..clients {
            let (netns, stop, counters) = (netns.to_path_buf(), stop.clone(), counters.clone());
            let t = std::thread::Builder::new()
                .name(format!("demo-client-{i}"))
                .spawn(move || client(i, &netns, addr, interval, &stop, &counters))
                .context("starting a client thread")?;
            load.threads.push(t);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while counters.connects.load(Ordering::Relaxed) < clients as u64
            && Instant::now() < deadline
        {
            if counters.failed.load(Ordering::Relaxed) > 0 {
                let e = counters.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
                bail!("a client could not connect: {}", e.unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(load)
    }

    pub fn done(&self) -> u64 {
        self.counters.done.load(Ordering::Relaxed)
    }

    /// The longest request since the last call, and a new window from now.
    pub fn take_window_max_ms(&self) -> f64 {
        self.counters.window_max_latency_us.swap(0, Ordering::Relaxed) as f64 / 1000.0
    }

    pub fn failed(&self) -> u64 {
        self.counters.failed.load(Ordering::Relaxed)
    }

    /// Stops the clients; each checks its counter on the server first.
    pub fn stop(mut self) -> Summary {
        self.stop.store(true, Ordering::Relaxed);
        let clients = self.threads.len();
        let counters_ok =
            self.threads.drain(..).filter_map(|t| t.join().ok()).filter(|ok| *ok).count();
        let c = &self.counters;
        let connects = c.connects.load(Ordering::Relaxed);
        Summary {
            clients,
            done: c.done.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            reconnects: connects.saturating_sub(clients as u64),
            max_latency_ms: c.max_latency_us.load(Ordering::Relaxed) as f64 / 1000.0,
            counters_ok,
            first_error: c.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One client. Returns whether the server's counter equals the INCRs it
/// acknowledged, read on its own connection at the end.
fn client(
    i: usize,
    netns: &Path,
    addr: SocketAddr,
    interval: Duration,
    stop: &AtomicBool,
    c: &Counters,
) -> bool {
    if let Err(e) = enter(netns) {
        c.fail(format!("client {i}: {e:#}"));
        return false;
    }
    let key = format!("demo:client:{i}");
    let mut acked: i64 = 0;
    let mut conn: Option<Conn> = None;
    while !stop.load(Ordering::Relaxed) {
        if conn.is_none() {
            match Conn::connect(addr) {
                Ok(cn) => {
                    c.connects.fetch_add(1, Ordering::Relaxed);
                    conn = Some(cn);
                }
                Err(e) => {
                    c.fail(format!("client {i}: {e:#}"));
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            }
        }
        let cn = conn.as_mut().expect("connected above");
        let t = Instant::now();
        match cn.int(&[b"INCR", key.as_bytes()]) {
            Ok(v) if v == acked + 1 => {
                acked = v;
                c.done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(v) => {
                c.fail(format!("client {i}: INCR {key} returned {v}, expected {}", acked + 1));
                acked = v;
            }
            Err(e) => {
                c.fail(format!(
                    "client {i}: INCR after {:.0} ms: {e:#}",
                    t.elapsed().as_secs_f64() * 1e3
                ));
                conn = None;
            }
        }
        let took = t.elapsed().as_micros() as u64;
        c.max_latency_us.fetch_max(took, Ordering::Relaxed);
        c.window_max_latency_us.fetch_max(took, Ordering::Relaxed);
        std::thread::sleep(interval);
    }
    match conn.as_mut().map(|cn| cn.int(&[b"GET", key.as_bytes()])) {
        Some(Ok(v)) if v == acked => true,
        Some(Ok(v)) => {
            c.fail(format!(
                "client {i}: {key} is {v} on the server, {acked} INCRs were acknowledged"
            ));
            false
        }
        Some(Err(e)) => {
            c.fail(format!("client {i}: final GET: {e:#}"));
            false
        }
        None => false,
    }
}
