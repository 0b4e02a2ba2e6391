//! Test hosts for migration tests: each host is a network namespace plus,
//! once its init is started, a PID, mount and IPC (SysV) namespace of its
//! own with its own /proc, as a second machine would be. The hosts share one bridge,
//! which lives in a network namespace of its own so that nothing of a
//! cluster is ever in the root namespace and clusters of parallel tests
//! cannot meet.
//!
//! Dropping the `Cluster` kills each host's PID 1 (the kernel then kills
//! everything else in that PID namespace), reaps it, and deletes the
//! namespaces; deleting a network namespace deletes its veth ends (and so
//! their peers) and the bridge.
//!
//! Finding processes: a `Command` from `Host::command` runs under
//! `nsenter`, which forks, so the `Child` you get is nsenter (root
//! namespace, it waits for the real process and passes its exit status
//! on). `Host::spawned_pid` gives the real process's PID as seen from the
//! root namespace and inside the host; `Host::root_pid` maps an in-host PID
//! to the root one. Killing the nsenter `Child` does NOT kill the process
//! inside: kill the root PID, or let the cluster's drop end it.

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The PIDs (root namespace) of the children of `pid` (CONFIG_PROC_CHILDREN).
pub fn children_of(pid: u32) -> Vec<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The PID namespace of `pid` ("pid:[inode]"), None when it is gone.
pub fn pid_ns_of(pid: i32) -> Option<String> {
    fs::read_link(format!("/proc/{pid}/ns/pid")).ok().map(|p| p.to_string_lossy().into_owned())
}

/// The PID of `pid` in the innermost PID namespace it is in.
pub fn innermost(pid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// Every PID of `pid`, from the root namespace's to the innermost one's.
fn nspids(pid: i32) -> Option<Vec<i32>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| l.split_whitespace().filter_map(|p| p.parse().ok()).collect())
}

/// The start time (clock ticks since boot) in a /proc/PID/stat file.
fn start_time(stat_path: &str) -> Option<u64> {
    let stat = fs::read_to_string(stat_path).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(19)?.parse().ok()
}

/// A host's PID 1: the `unshare` process (root namespace, our child) and
/// the init it forked, which is PID 1 inside.
struct Init {
    unshare: Child,
    pid: i32,
}

impl Init {
    /// Kills the init and reaps `unshare`. SIGKILL to a PID namespace's
    /// init kills every process in the namespace, and the init is only
    /// reaped once they are all gone, so when `unshare` (which waits for
    /// it) has exited, nothing of the host's processes is left. The PID
    /// cannot have been reused before this: the init is unshare's child
    /// and unshare, alive until we reap it, has not reaped it yet, or has
    /// and then exits itself.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.unshare.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() > deadline => {
                    // unshare --kill-child kills the init when unshare dies.
                    let _ = self.unshare.kill();
                    let _ = self.unshare.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

pub struct Host {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    pub ifname: String,
    init: Mutex<Option<Init>>,
}

impl Host {
    /// Starts `argv` as PID 1 of a new PID + mount namespace (with its own
    /// /proc) inside this host's network namespace, and returns the init's
    /// PID as seen from the root namespace. It returns once the init has
    /// exec'd `argv`, so /proc is mounted and `command` works. The init
    /// must reap orphans (ferryd does; in tests of the harness a shell loop
    /// does). Panics when the host already has an init (see `restart_init`).
    pub fn start_init(&self, argv: &[&str]) -> i32 {
        let mut slot = self.init.lock().expect("init lock");
        assert!(slot.is_none(), "host {} already has an init (use restart_init)", self.name);
        // `ip netns exec` execs unshare in place (no fork), so the child
        // we hold is unshare; --kill-child makes the init die with it.
        let mut unshare = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "unshare",
                "--pid",
                "--ipc",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "--",
            ])
            .args(argv)
            .stdin(Stdio::null())
            .spawn()
            .expect("start ip netns exec unshare");
        let unshare_pid = unshare.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            // The init is unshare's only child. Until it has exec'd it is
            // a copy of unshare (same cmdline) and /proc may not be
            // mounted yet; after exec its cmdline is argv's.
            let own = fs::read(format!("/proc/{unshare_pid}/cmdline")).unwrap_or_default();
            if let Some(&child) = children_of(unshare_pid).first() {
                let cmdline = fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
                if !cmdline.is_empty() && cmdline != own {
                    break child;
                }
            }
            if let Ok(Some(status)) = unshare.try_wait() {
                panic!("init {argv:?} of host {} ended at once: {status}", self.name);
            }
            if Instant::now() > deadline {
                let _ = unshare.kill();
                let _ = unshare.wait();
                panic!("init {argv:?} of host {} did not start", self.name);
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        *slot = Some(Init { unshare, pid });
        pid
    }

    /// Kills the host's init (and so every process in the host) and
    /// starts `argv` as the new one; returns its root-namespace PID.
    pub fn restart_init(&self, argv: &[&str]) -> i32 {
        self.stop_init();
        self.start_init(argv)
    }

    /// Kills the host's init and every process in the host, if it has one.
    /// (Re)starts the host's init as ferryd listening on `listen` with
    /// `key`, under `env` and with `args`, logging to `log`, and waits until
    /// it listens. Before ferryd the init mounts what a machine has of its
    /// own: a tmpfs on /run/ferry, a bpffs, and a devpts instance (pty
    /// numbers are per host: the frozen source still holds /dev/pts/N when
    /// the destination makes it again).
    pub fn start_ferryd(
        &self,
        ferryd: &str,
        listen: &str,
        key: &std::path::Path,
        log: &std::path::Path,
        env: &[(&str, &str)],
        args: &[&str],
    ) {
        use super::{path_str, read_lossy, wait_for};
        let script = "mkdir -p /run/ferry && mount -t tmpfs tmpfs /run/ferry && mount -t bpf bpf /sys/fs/bpf && mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts && mount --bind /dev/pts/ptmx /dev/ptmx && log=$1 && shift && exec \"$@\" >>\"$log\" 2>&1";
        let mut argv: Vec<String> =
            ["sh", "-c", script, "ferryd-init", path_str(log), "env"].map(String::from).to_vec();
        argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        argv.extend([ferryd, "--listen", listen, "--key", path_str(key)].map(String::from));
        argv.extend(args.iter().map(|s| s.to_string()));
        let before = read_lossy(log).matches("ferryd listening").count();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.stop_init();
        self.start_init(&argv);
        let listening = wait_for(Duration::from_secs(15), || {
            read_lossy(log).matches("ferryd listening").count() > before
        });
        assert!(listening, "ferryd on {} does not listen:\n{}", self.name, read_lossy(log));
    }

    pub fn stop_init(&self) {
        let init = self.init.lock().expect("init lock").take();
        if let Some(init) = init {
            init.stop();
        }
    }

    /// Whether the host has an init (it was not stopped, or started again).
    pub fn has_init(&self) -> bool {
        self.init.lock().expect("init lock").is_some()
    }

    /// The PID (root namespace) of the host's init. Panics without one.
    pub fn init_pid(&self) -> i32 {
        self.init
            .lock()
            .expect("init lock")
            .as_ref()
            .map(|i| i.pid)
            .unwrap_or_else(|| panic!("host {} has no init (start_init first)", self.name))
    }

    /// A command to run inside the host: network, PID, mount and IPC
    /// namespaces of its init (`nsenter -t INIT -n -p -m -i --`). nsenter forks to enter
    /// the PID namespace; see the module comment for what that means for
    /// the `Child` and `spawned_pid` for the real process's PID.
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.init_pid().to_string(), "-n", "-p", "-m", "-i", "--"]).args(argv);
        cmd
    }

    /// Makes the next process started in the host get a PID above `last`
    /// (the host's ns_last_pid), as on a host that has run for a while: a
    /// fresh host's PIDs come right after its init's, and two fresh hosts
    /// hand out the same ones.
    pub fn set_next_pid(&self, last: i32) {
        let st = self
            .command(&["sh", "-c", &format!("echo {last} > /proc/sys/kernel/ns_last_pid")])
            .status()
            .unwrap_or_else(|e| panic!("set ns_last_pid in host {}: {e}", self.name));
        assert!(st.success(), "set ns_last_pid in host {}: {st}", self.name);
    }

    /// A command in the host's network namespace only (`ip netns exec`),
    /// usable before the host has an init, e.g. for `ip` or `sysctl`.
    pub fn net_command(&self, argv: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns]).args(argv);
        cmd
    }

    /// The process `child` (a `command(..).spawn()`) runs inside the host,
    /// as (PID in the root namespace, PID inside the host), once nsenter
    /// has forked it; None if it has not (yet) or has already ended.
    pub fn spawned_pid(&self, child: &Child) -> Option<(i32, i32)> {
        let root = *children_of(child.id()).first()?;
        Some((root, innermost(root)?))
    }

    /// Like `spawned_pid`, waiting up to 5 s for nsenter to fork.
    pub fn wait_spawned_pid(&self, child: &Child) -> (i32, i32) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(p) = self.spawned_pid(child) {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "process spawned in host {} did not appear",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The root-namespace PID of the process that is `inner` inside the
    /// host, also when it is in a PID namespace nested in the host's (as a
    /// tree ferryd restored is): its NSpid entry at the host's level is
    /// `inner`, and its start time is that of `inner` in the host's /proc.
    pub fn root_pid(&self, inner: i32) -> Option<i32> {
        let init = self.init_pid();
        let ns = pid_ns_of(init)?;
        let level = nspids(init)?.len().checked_sub(1)?;
        let start = start_time(&format!("/proc/{init}/root/proc/{inner}/stat"));
        fs::read_dir("/proc")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .find(|&p| {
                if innermost(p) == Some(inner) && pid_ns_of(p).as_deref() == Some(ns.as_str()) {
                    return true;
                }
                start.is_some()
                    && nspids(p).is_some_and(|v| v.len() > level + 1 && v[level] == inner)
                    && start_time(&format!("/proc/{p}/stat")) == start
            })
    }

    /// The MAC of the host's interface (`ifname`).
    pub fn mac(&self) -> String {
        let out = Command::new("ip")
            .args(["-n", &self.netns, "link", "show", &self.ifname])
            .output()
            .expect("ip link show");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap_or_else(|| panic!("no MAC for {} in {text}", self.name))
            .to_string()
    }

    /// The MAC in the host's neighbour entry for `addr` (IPv4 or IPv6), if
    /// it has one with a link-layer address (not INCOMPLETE or FAILED).
    pub fn neighbour_mac(&self, addr: IpAddr) -> Option<String> {
        let out = Command::new("ip")
            .args(["-n", &self.netns, "neigh", "show", &addr.to_string()])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().skip_while(|w| *w != "lladdr").nth(1).map(String::from)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop_init();
    }
}

pub struct Cluster {
    /// Prefix of every namespace name of this cluster.
    pub tag: String,
    /// The network namespace holding the bridge.
    pub bridge_netns: String,
    /// First three octets of the cluster's /24.
    subnet: [u8; 3],
    hosts: Vec<Host>,
    /// Namespaces made so far, deleted on drop (also after a failure
    /// halfway through `new`).
    made: Vec<String>,
}

impl Cluster {
    /// A bridge and one host per name; host i gets 10.<u>.<v>.(i+1)/24 on
    /// "eth0" (its veth peer is on the bridge), and lo up. <u>.<v> differs
    /// between the clusters of one test process; clusters are on separate
    /// bridges anyway, so even equal subnets could not meet.
    pub fn new(hosts: &[&str]) -> Cluster {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("fcl{pid}-{n}");
        let subnet = [10, 100 + (pid % 100) as u8, (n % 256) as u8];
        let mut c = Cluster {
            bridge_netns: format!("{tag}-br"),
            tag,
            subnet,
            hosts: Vec::new(),
            made: Vec::new(),
        };
        let br = c.bridge_netns.clone();
        c.add_netns(&br);
        // No multicast snooping: the bridge floods multicast (such as an
        // IPv6 neighbour advertisement to ff02::1) to every port, as a
        // plain switch does; with snooping and no querier it may not.
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"]);
        ip(&["-n", &br, "link", "set", "br0", "up"]);
        for (i, name) in hosts.iter().enumerate() {
            assert!(!c.hosts.iter().any(|h| h.name == *name), "host {name} twice");
            let netns = format!("{}-{name}", c.tag);
            c.add_netns(&netns);
            let port = format!("p{i}");
            let ifname = "eth0".to_string();
            ip(&[
                "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", &ifname, "netns",
                &netns,
            ]);
            ip(&["-n", &br, "link", "set", &port, "master", "br0", "up"]);
            let host_ip = c.subnet_addr(u8::try_from(i + 1).expect("at most 254 hosts"));
            ip(&["-n", &netns, "addr", "add", &format!("{host_ip}/24"), "dev", &ifname]);
            ip(&["-n", &netns, "link", "set", &ifname, "up"]);
            c.hosts.push(Host {
                name: name.to_string(),
                netns,
                ip: host_ip,
                ifname,
                init: Mutex::new(None),
            });
        }
        c
    }

    fn add_netns(&mut self, name: &str) {
        ip(&["netns", "add", name]);
        self.made.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"]);
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name} in cluster {}", self.tag))
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// An address of the cluster's /24, e.g. `subnet_addr(100)` for a
    /// service address that is on no host yet.
    pub fn subnet_addr(&self, last_octet: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], last_octet)
    }

    /// The cluster's prefix length (24).
    pub fn prefix(&self) -> u8 {
        24
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Processes first: a namespace with a process in it would outlive
        // `ip netns delete`, and with it its veth.
        for h in &self.hosts {
            h.stop_init();
        }
        for ns in self.made.iter().rev() {
            let _ = Command::new("ip").args(["netns", "delete", ns]).stderr(Stdio::null()).status();
        }
    }
}
