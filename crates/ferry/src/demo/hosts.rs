//! The demo's test hosts: a bridge in a network namespace of its own, two
//! hosts that each run ferryd as PID 1 of their own PID + mount namespace
//! (with tmpfs /run/ferry and bpffs /sys/fs/bpf, so lock records and BPF
//! pins stay per host), and a client host that is only a network
//! namespace. Everything is named `ferry-demo-<pid>-...`, lives in those
//! namespaces, and is removed by `Lab`'s drop, also after a failure
//! halfway through `Lab::new`.

use super::interrupted;
use anyhow::{anyhow, bail, Context, Result};
use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// ferryd's port on every host.
pub const FERRYD_PORT: u16 = 7070;

/// Runs `ip ARGS`; its error output becomes the error.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The PIDs of the children of `pid` (CONFIG_PROC_CHILDREN).
fn children_of(pid: u32) -> Vec<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The last line of a log file, for error messages.
pub fn last_line(path: &Path) -> String {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.lines().rev().find(|l| !l.trim().is_empty()).map(|l| l.trim().to_string()))
        .unwrap_or_default()
}

/// Waits up to `limit` for `child` (our own child) to exit, then kills it
/// by its PID and reaps it.
pub fn reap(child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A host's PID 1: `unshare` (our child, in the root namespaces) and the
/// init it forked, which is PID 1 inside and execs ferryd.
struct Init {
    unshare: Child,
    pid: i32,
}

pub struct Host {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    init: Option<Init>,
}

impl Host {
    /// The PID (root namespace) of the host's ferryd, its PID 1.
    pub fn init_pid(&self) -> i32 {
        self.init.as_ref().map_or(0, |i| i.pid)
    }

    /// `nsenter` into the host's network, PID and mount namespaces. nsenter
    /// forks to enter the PID namespace: the child we get is nsenter, the
    /// process inside is its child. Each command gets a process group of
    /// its own, so a Ctrl-C at the terminal reaches only the demo, which
    /// then ends everything in order.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.init_pid().to_string(), "-n", "-p", "-m", "--"])
            .arg(program)
            .process_group(0);
        cmd
    }

    pub fn ferryd_addr(&self) -> String {
        format!("{}:{FERRYD_PORT}", self.ip)
    }

    /// Starts ferryd as PID 1 of a new PID + mount namespace in the host's
    /// network namespace, and waits until it listens.
    fn start_ferryd(&mut self, ferryd: &Path, key: &Path, log: &Path) -> Result<()> {
        let script = format!(
            "mkdir -p /run/ferry && mount -t tmpfs tmpfs /run/ferry && mount -t bpf bpf /sys/fs/bpf && exec {} --listen {} --key {}",
            shell_quote(ferryd),
            self.ferryd_addr(),
            shell_quote(key)
        );
        let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        // `ip netns exec` execs unshare in place, so our child is unshare;
        // --kill-child makes the init die with it.
        let unshare = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "sh",
                "-c",
                &script,
            ])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .context("starting ip netns exec unshare")?;
        let unshare_pid = unshare.id();
        self.init = Some(Init { unshare, pid: 0 });
        let deadline = Instant::now() + Duration::from_secs(20);
        let want = format!("ferryd listening on {}", self.ferryd_addr());
        loop {
            let init = self.init.as_mut().expect("just set");
            if init.pid == 0 {
                init.pid = children_of(unshare_pid).first().copied().unwrap_or(0);
            }
            if fs::read_to_string(log).unwrap_or_default().lines().any(|l| l.trim() == want) {
                if init.pid == 0 {
                    bail!("ferryd of {} listens, but its PID was not found", self.name);
                }
                return Ok(());
            }
            if let Ok(Some(status)) = init.unshare.try_wait() {
                bail!("ferryd of {} ended at once ({status}): {}", self.name, last_line(log));
            }
            if interrupted() {
                bail!("interrupted");
            }
            if Instant::now() > deadline {
                bail!(
                    "ferryd of {} did not report listening within 20 s: {}",
                    self.name,
                    last_line(log)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the host's init and reaps `unshare`. SIGKILL to a PID
    /// namespace's init kills every process in the namespace (the service,
    /// ferry migrate, restored trees), and the init is reaped only once
    /// they are all gone. The PID cannot have been reused: the init is the
    /// child of `unshare`, which is alive until we reap it.
    fn stop(&mut self) {
        if let Some(mut init) = self.init.take() {
            if init.pid > 0 && matches!(init.unshare.try_wait(), Ok(None)) {
                // The host init we started.
                let _ = ferry_sys::process::kill(init.pid, libc::SIGKILL);
            }
            reap(&mut init.unshare, Duration::from_secs(10));
        }
    }
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

pub struct Lab {
    pub tag: String,
    subnet: [u8; 3],
    bridge_netns: String,
    pub hosts: Vec<Host>,
    pub client_netns: String,
    pub client_ip: Ipv4Addr,
    /// Namespaces made so far, deleted on drop in reverse order.
    made: Vec<String>,
    /// Commands started in the hosts (nsenter, our children), reaped at
    /// teardown once the hosts' processes are gone.
    procs: Vec<Child>,
}

impl Lab {
    /// The bridge, `n_hosts` hosts (10.x: .1, .2, ...) and the client host
    /// (.200), all with their interface and lo up. Names and the /24 are
    /// derived from this process's PID, so demos never share anything.
    pub fn new(n_hosts: usize) -> Result<Lab> {
        let pid = std::process::id();
        let tag = format!("ferry-demo-{pid}");
        // 172.30.X.0/24: private, in no other part of ferry's tests or docs.
        let subnet = [172, 30, (pid % 256) as u8];
        let mut lab = Lab {
            bridge_netns: format!("{tag}-br"),
            client_netns: format!("{tag}-client"),
            client_ip: Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 200),
            tag,
            subnet,
            hosts: Vec::new(),
            made: Vec::new(),
            procs: Vec::new(),
        };
        let br = lab.bridge_netns.clone();
        lab.add_netns(&br)?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for i in 1..=n_hosts {
            let netns = format!("{}-host{i}", lab.tag);
            let addr = lab.addr(i as u8);
            lab.plug(&netns, &format!("p{i}"), addr)?;
            lab.hosts.push(Host { name: format!("host{i}"), netns, ip: addr, init: None });
        }
        let client = lab.client_netns.clone();
        lab.plug(&client, "pc", lab.client_ip)?;
        Ok(lab)
    }

    /// An address of the lab's /24.
    pub fn addr(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], last)
    }

    fn add_netns(&mut self, name: &str) -> Result<()> {
        ip(&["netns", "add", name])?;
        self.made.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    /// A network namespace with "eth0" at `addr`/24, its veth peer `port`
    /// on the bridge.
    fn plug(&mut self, netns: &str, port: &str, addr: Ipv4Addr) -> Result<()> {
        self.add_netns(netns)?;
        let br = self.bridge_netns.clone();
        ip(&[
            "-n", &br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns,
        ])?;
        ip(&["-n", &br, "link", "set", port, "master", "br0", "up"])?;
        ip(&["-n", netns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
        ip(&["-n", netns, "link", "set", "eth0", "up"])
    }

    /// Starts ferryd in every host; logs go to `dir`/ferryd-hostN.log.
    pub fn start_agents(&mut self, ferryd: &Path, key: &Path, dir: &Path) -> Result<()> {
        for h in &mut self.hosts {
            let log = dir.join(format!("ferryd-{}.log", h.name));
            h.start_ferryd(ferryd, key, &log)?;
        }
        Ok(())
    }

    /// Adds `addr`/24 to host `i`'s interface.
    pub fn add_address(&self, i: usize, addr: Ipv4Addr) -> Result<()> {
        ip(&["-n", &self.hosts[i].netns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])
    }

    pub fn client_netns_path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.client_netns)
    }

    /// Starts `cmd` (from `Host::command`) and keeps it for teardown;
    /// returns its index for `try_wait`.
    pub fn spawn(&mut self, cmd: &mut Command) -> Result<usize> {
        let child = cmd.spawn().with_context(|| format!("starting {:?}", cmd.get_program()))?;
        self.procs.push(child);
        Ok(self.procs.len() - 1)
    }

    /// The exit status of a command from `spawn`, once it has ended.
    pub fn try_wait(&mut self, i: usize) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.procs[i].try_wait()?)
    }

    /// How many namespaces were made (for the closing message).
    pub fn namespaces(&self) -> usize {
        self.made.len()
    }

    /// Ends every process of the hosts, then deletes the namespaces (which
    /// deletes the veths and the bridge with them). Returns what is left,
    /// if anything could not be removed.
    pub fn teardown(&mut self) -> Vec<String> {
        // Processes first: a namespace with a process in it outlives
        // `ip netns delete`, and with it its interfaces.
        for h in &mut self.hosts {
            h.stop();
        }
        // With their hosts' processes gone, the nsenters have exited too.
        for mut p in self.procs.drain(..) {
            reap(&mut p, Duration::from_secs(5));
        }
        for ns in self.made.drain(..).rev() {
            let _ = Command::new("ip")
                .args(["netns", "delete", &ns])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        leftover_namespaces(&self.tag)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The namespaces named `TAG-...` that still exist.
pub fn leftover_namespaces(tag: &str) -> Vec<String> {
    let prefix = format!("{tag}-");
    fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The PID a process started with `Host::command` has inside the host,
/// read from a pidfile it writes (as redis does with --pidfile).
pub fn read_pidfile(path: &Path) -> Result<i32> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.trim().parse().map_err(|_| anyhow!("{}: not a PID: {text:?}", path.display()))
}
