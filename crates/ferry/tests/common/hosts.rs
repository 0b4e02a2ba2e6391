//! Test hosts with ferryd (tests/common/cluster.rs): the environment the
//! migration and replication tests share, and the small helpers to run
//! commands inside a host and read how they ended.

use super::cluster::{Cluster, Host};
use ferry_testkit::{is_root, TempDir};
use std::fs::{self, File};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
pub const FERRYD: &str = env!("CARGO_BIN_EXE_ferryd");
pub const AGENT_PORT: u16 = 7070;
/// A PID 1 that reaps orphans and ignores SIGTERM, as ferryd does.
pub const PLAIN_INIT: &[&str] = &["sh", "-c", "trap : TERM; while :; do wait; sleep 0.2; done"];

pub fn have(test: &str, programs: &[&str]) -> bool {
    if !is_root() {
        eprintln!("[{test}] skipped: needs root");
        return false;
    }
    for p in programs {
        let found = if p.starts_with('/') {
            Path::new(p).exists()
        } else {
            Command::new("sh")
                .args(["-c", &format!("command -v {p}")])
                .stdout(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        if !found {
            eprintln!("[{test}] skipped: {p} is not installed");
            return false;
        }
    }
    true
}

pub fn alive(pid: i32) -> bool {
    // A zombie is not alive: its init reaps it soon.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|r| !r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// The state letter of `pid` (R, S, T, ...), None when gone.
pub fn state(pid: i32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The child starts with only fds 0-2 (cargo's jobserver pipe and the
/// test harness's fds stay out of the programs, and so out of the images).
pub fn only_stdio(cmd: &mut Command) -> &mut Command {
    ferry_testkit::only_stdio(cmd)
}

pub fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => format!("{st}"),
    }
}

/// How a command run inside a host ended.
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn show(&self) -> String {
        format!(
            "{}\n--- stdout ---\n{}--- stderr ---\n{}",
            describe(&self.status),
            self.stdout,
            self.stderr
        )
    }
}

pub fn output(mut cmd: Command) -> Out {
    let o = only_stdio(&mut cmd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    Out {
        status: o.status,
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `argv` in `host`, killed after `limit_s` seconds.
pub fn run_in(host: &Host, limit_s: u32, argv: &[&str]) -> Out {
    let limit = limit_s.to_string();
    let mut full = vec!["timeout", "-s", "KILL", limit.as_str()];
    full.extend_from_slice(argv);
    output(host.command(&full))
}

pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The IPv4 addresses (with prefix) on `host`'s eth0.
pub fn addresses(host: &Host) -> Vec<String> {
    let out = Command::new("ip")
        .args(["-n", &host.netns, "-o", "-4", "addr", "show", "dev", &host.ifname])
        .output()
        .expect("ip addr");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .filter(|w| w.contains('/'))
        .map(String::from)
        .collect()
}

/// (name, owner) of every network lock `ferry network-lock --status` lists
/// inside `host` (its own /run/ferry).
pub fn host_locks(host: &Host) -> Vec<(String, String)> {
    let out = run_in(host, 20, &[FERRY, "network-lock", "--status"]);
    assert!(out.status.success(), "ferry network-lock --status in {}: {}", host.name, out.show());
    super::parse_network_locks(&out.stdout)
}

// ---------------------------------------------------------------------------
// A cluster with ferryd on some hosts

pub struct Env {
    pub c: Cluster,
    pub dir: TempDir,
    pub key: PathBuf,
}

impl Env {
    /// Hosts `names`; ferryd is started on none yet.
    pub fn new(tag: &str, names: &[&str]) -> Env {
        let dir = TempDir::new("ferry-mig", tag);
        let key = dir.0.join("key");
        let out = output({
            let mut c = Command::new(FERRY);
            c.arg("keygen").arg(&key);
            c
        });
        assert!(out.status.success(), "ferry keygen: {}", out.show());
        Env { c: Cluster::new(names), dir, key }
    }

    pub fn host(&self, name: &str) -> &Host {
        self.c.host(name)
    }

    pub fn agent(&self, name: &str) -> SocketAddr {
        SocketAddr::new(self.host(name).ip.into(), AGENT_PORT)
    }

    pub fn ferryd_log(&self, name: &str) -> PathBuf {
        self.dir.0.join(format!("ferryd-{name}.log"))
    }

    /// (Re)starts ferryd as the init of host `name`, with `env` in its
    /// environment and `args` after the usual ones; waits until it listens.
    pub fn start_ferryd(&self, name: &str, env: &[(&str, &str)], args: &[&str]) {
        let listen = self.agent(name).to_string();
        self.host(name).start_ferryd(FERRYD, &listen, &self.key, &self.ferryd_log(name), env, args);
    }

    pub fn start_plain(&self, name: &str) {
        self.host(name).start_init(PLAIN_INIT);
    }
}

/// A process started inside a host: the nsenter `Child` and its PIDs.
pub struct Started {
    pub nsenter: Child,
    pub root: i32,
    pub inner: i32,
}

pub fn start_in(
    host: &Host,
    argv: &[&str],
    cwd: &Path,
    log: &Path,
    env: &[(&str, &str)],
) -> Started {
    let logf = File::create(log).expect("program log");
    let mut cmd = host.command(argv);
    cmd.current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(logf.try_clone().expect("dup log"))
        .stderr(logf);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let nsenter = only_stdio(&mut cmd)
        .spawn()
        .unwrap_or_else(|e| panic!("start {argv:?} in {}: {e}", host.name));
    let (root, inner) = host.wait_spawned_pid(&nsenter);
    Started { nsenter, root, inner }
}

/// A proxy from LISTEN_IP:PORT to TO_IP:PORT (argv 1-4) for one connection
/// that flips one byte, at offset argv[5] of what the connecting side sends.
pub const CORRUPTING_PROXY: &str = r#"import socket,sys,threading
l=socket.socket(); l.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); l.bind((sys.argv[1],int(sys.argv[2]))); l.listen(1)
print('listening',flush=True)
a,_=l.accept(); b=socket.create_connection((sys.argv[3],int(sys.argv[4])))
def pump(src,dst,flip):
    n=0
    while True:
        try: d=src.recv(65536)
        except OSError: d=b''
        if not d: break
        if flip is not None and n<=flip<n+len(d):
            d=bytearray(d); d[flip-n]^=0x5a; d=bytes(d); print('flipped',flush=True)
        n+=len(d)
        try: dst.sendall(d)
        except OSError: break
    for s in (src,dst):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
t=threading.Thread(target=pump,args=(b,a,None),daemon=True); t.start()
pump(a,b,int(sys.argv[5])); t.join(10)
"#;

/// nginx (master and 2 workers as nobody) started in `host`, serving
/// `dir`/www on `listen`:8080 with `types` (an nginx `types` entry, e.g.
/// "text/plain txt"); its configuration, pid, logs and temporary paths
/// all under `dir`.
pub fn start_nginx(host: &Host, dir: &Path, listen: &str, types: &str) -> Started {
    let d = dir.display();
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes 2;\nuser nobody nogroup;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log notice;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n access_log off;\n client_body_temp_path {d}/client_body;\n\
         proxy_temp_path {d}/proxy;\n fastcgi_temp_path {d}/fastcgi;\n\
         uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
         types {{ {types}; }}\n\
         server {{ listen {listen}:8080; root {d}/www; location / {{ }} }}\n}}\n"
    );
    fs::write(dir.join("nginx.conf"), conf).expect("write nginx.conf");
    let (prefix, conf, errors) =
        (format!("{d}/"), format!("{d}/nginx.conf"), format!("{d}/error.log"));
    let argv = ["/usr/sbin/nginx", "-p", &prefix, "-c", &conf, "-e", &errors];
    start_in(host, &argv, dir, &dir.join("nginx.stdio"), &[])
}
