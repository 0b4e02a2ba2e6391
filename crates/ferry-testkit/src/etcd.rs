//! An etcd server of one test: the witness that replication's fence asks
//! which host owns a service.

use crate::{NetNs, TempDir};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a start may take before the test fails (a loaded machine
/// makes etcd's first fsyncs slow).
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Whether the `etcd` program is installed (Debian's etcd-server).
pub fn etcd_available() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A one-member etcd cluster with a unique name, data directory and
/// ports, on loopback or inside a test network namespace. Killed by PID,
/// reaped and its directory removed on drop, also when the test fails.
/// [`stop`](Self::stop)/[`start`](Self::start) take it down and bring it
/// back (same data, same address); [`pause`](Self::pause)/
/// [`resume`](Self::resume) freeze it, so that connections stay open and
/// get no answer.
pub struct EtcdWitness {
    name: String,
    dir: TempDir,
    netns: Option<PathBuf>,
    listen: IpAddr,
    host: IpAddr,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl EtcdWitness {
    /// etcd on 127.0.0.1 of the test's own network namespace.
    pub fn on_loopback(tag: &str) -> EtcdWitness {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        Self::launch(tag, None, lo, lo)
    }

    /// etcd inside `netns`, listening on all its addresses; clients reach
    /// it at `addr` (an address of one of the namespace's interfaces).
    pub fn in_netns(tag: &str, netns: &NetNs, addr: IpAddr) -> EtcdWitness {
        Self::launch(
            tag,
            Some(PathBuf::from(netns.path())),
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            addr,
        )
    }

    fn launch(tag: &str, netns: Option<PathBuf>, listen: IpAddr, host: IpAddr) -> EtcdWitness {
        let dir = TempDir::new("ferry-etcd", tag);
        let name = dir.path().file_name().map(|n| n.to_string_lossy().into_owned());
        let mut w = EtcdWitness {
            name: name.unwrap_or_else(|| tag.to_string()),
            dir,
            netns,
            listen,
            host,
            client_port: 0,
            peer_port: 0,
            child: None,
        };
        // Free ports are chosen by binding port 0 and closing: another
        // process may take one before etcd binds it, so try a few times.
        for attempt in 1..=3 {
            (w.client_port, w.peer_port) = w.free_ports();
            match w.spawn_and_wait() {
                Ok(()) => return w,
                Err(e) if attempt < 3 && e.contains("address already in use") => continue,
                Err(e) => panic!("etcd witness {}: {e}", w.name),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        match self.host {
            IpAddr::V6(a) => format!("http://[{a}]:{}", self.client_port),
            IpAddr::V4(a) => format!("http://{a}:{}", self.client_port),
        }
    }

    /// The PID of the running etcd, None while stopped.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Its data directory and log (`etcd.log`) are under this directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills etcd (SIGKILL, as a crash) and reaps it; its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again after [`stop`](Self::stop), on the same data and
    /// ports, and waits until it answers. Panics if it does not.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "etcd witness {} is already running", self.name);
        if let Err(e) = self.spawn_and_wait() {
            panic!("etcd witness {}: restart: {e}", self.name);
        }
    }

    /// Freezes etcd (SIGSTOP): it keeps its sockets and answers nothing.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            assert!(crate::kill(pid, libc::SIGSTOP), "SIGSTOP to etcd {pid}");
        }
    }

    /// Lets a paused etcd run again (SIGCONT).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            assert!(crate::kill(pid, libc::SIGCONT), "SIGCONT to etcd {pid}");
        }
    }

    fn url(&self, port: u16, listen: bool) -> String {
        let ip = if listen { self.listen } else { self.host };
        match ip {
            IpAddr::V6(a) => format!("http://[{a}]:{port}"),
            IpAddr::V4(a) => format!("http://{a}:{port}"),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn command(&self) -> Command {
        let peer = self.url(self.peer_port, false);
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(self.url(self.client_port, true))
            .arg("--advertise-client-urls")
            .arg(self.endpoint())
            .arg("--listen-peer-urls")
            .arg(self.url(self.peer_port, true))
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("{}={peer}", self.name))
            .arg("--initial-cluster-token")
            .arg(&self.name)
            .args(["--initial-cluster-state", "new", "--logger", "zap", "--log-outputs", "stderr"]);
        // A caller's ETCD_* variables would override these flags.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        cmd
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("{}: {e}", self.log_path().display()))?;
        let err_log = log.try_clone().map_err(|e| format!("dup log: {e}"))?;
        let mut cmd = self.command();
        cmd.stdin(Stdio::null()).stdout(log).stderr(err_log);
        match &self.netns {
            Some(ns) => crate::own_session_in_netns(&mut cmd, ns),
            None => crate::own_session(&mut cmd),
        };
        let child = cmd.spawn().map_err(|e| format!("spawning etcd: {e}"))?;
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < READY_WITHIN {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("etcd exited ({status}): {}", self.log_tail()));
            }
            if self.healthy() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        Err(format!("not healthy within {READY_WITHIN:?}: {}", self.log_tail()))
    }

    /// Whether etcd's /health says true (asked from its namespace).
    fn healthy(&self) -> bool {
        let addr = SocketAddr::new(self.host, self.client_port);
        let ask = move || -> Option<String> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            s.write_all(b"GET /health HTTP/1.0\r\n\r\n").ok()?;
            let mut answer = String::new();
            s.read_to_string(&mut answer).ok()?;
            Some(answer)
        };
        let answer = match &self.netns {
            Some(ns) => crate::run_in_netns(ns, ask),
            None => ask(),
        };
        answer.is_some_and(|a| a.contains("\"health\":\"true\""))
    }

    /// Two ports free on the listen address now (inside the namespace).
    fn free_ports(&self) -> (u16, u16) {
        let listen = self.listen;
        let pick = move || {
            let bind = || {
                TcpListener::bind((listen, 0))
                    .unwrap_or_else(|e| panic!("binding {listen}:0 for a free port: {e}"))
            };
            let (a, b) = (bind(), bind());
            let port = |l: &TcpListener| l.local_addr().map(|a| a.port()).unwrap_or(0);
            (port(&a), port(&b))
        };
        match &self.netns {
            Some(ns) => crate::run_in_netns(ns, pick),
            None => pick(),
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for EtcdWitness {
    fn drop(&mut self) {
        // A paused etcd dies of SIGKILL as well; the TempDir goes after.
        self.stop();
    }
}
