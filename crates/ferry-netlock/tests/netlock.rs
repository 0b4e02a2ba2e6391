//! Network lock tests (root). Each test builds its own namespaces
//! (`ferry-nl-<pid>-<n>`): A (the "checkpointed" side, where the lock goes)
//! and B (the peer), joined by a veth pair with 192.0.2.0/24 and fd00:2::/64
//! addresses; traffic only goes over that pair or a namespace's loopback.
//! `Lab` removes namespaces, locks and helper processes on drop, also when a
//! test fails.

use ferry_netlock::{LockState, Method, Netns, NetworkLock, Tuple};
use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const HELPER_ENV: &str = "FERRY_NL_TEST_HELPER";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn must(args: &[&str]) -> String {
    run(args).unwrap_or_else(|e| panic!("{e}"))
}

static NEXT_NS: AtomicU32 = AtomicU32::new(0);

/// Namespaces, locks and processes of one test, removed on drop.
struct Lab {
    a: String,
    b: String,
    locks: Vec<String>,
    children: Vec<Child>,
}

impl Lab {
    fn new() -> Lab {
        let n = NEXT_NS.fetch_add(1, Ordering::Relaxed);
        let a = format!("ferry-nl-{}-{n}a", std::process::id());
        let b = format!("ferry-nl-{}-{n}b", std::process::id());
        let lab = Lab { a: a.clone(), b: b.clone(), locks: Vec::new(), children: Vec::new() };
        must(&["ip", "netns", "add", &a]);
        must(&["ip", "netns", "add", &b]);
        // veth names are per namespace once moved; create them inside A.
        must(&["ip", "-n", &a, "link", "add", "nl-a", "type", "veth", "peer", "name", "nl-b", "netns", &b]);
        for (ns, dev, v4, v6) in [(&a, "nl-a", "192.0.2.1/24", "fd00:2::1/64"), (&b, "nl-b", "192.0.2.2/24", "fd00:2::2/64")] {
            must(&["ip", "-n", ns, "addr", "add", v4, "dev", dev]);
            must(&["ip", "-n", ns, "addr", "add", v6, "dev", dev, "nodad"]);
            must(&["ip", "-n", ns, "link", "set", dev, "up"]);
            must(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        lab
    }

    fn path(ns: &str) -> Netns {
        Netns::Path(format!("/run/netns/{ns}").into())
    }

    /// Runs `f` on a thread inside namespace `ns` (sockets it creates stay there).
    fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
        let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
        std::thread::scope(|s| {
            s.spawn(move || {
                ferry_sys::netns::enter_net_namespace(file.as_fd()).expect("setns");
                f()
            })
            .join()
            .expect("thread in netns panicked")
        })
    }

    /// Nothing of lock `name` is left: record, pins, nft table, iptables chains.
    fn assert_gone(&self, name: &str) {
        assert!(ferry_netlock::is_gone(name), "record or pins of {name} left behind");
        let (table, chain) = ferry_netlock::kernel_object_names(name);
        assert!(run(&["ip", "netns", "exec", &self.a, "nft", "list", "table", "inet", &table]).is_err(), "nft table {table} left behind");
        for tool in ["iptables", "ip6tables"] {
            assert!(run(&["ip", "netns", "exec", &self.a, tool, "-w", "5", "-S", &chain]).is_err(), "{tool} chain {chain} left behind");
        }
        assert!(!ferry_netlock::status().iter().any(|s| s.name == name), "{name} still in status()");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for name in &self.locks {
            let _ = ferry_netlock::release(name);
        }
        let _ = run(&["ip", "netns", "del", &self.a]);
        let _ = run(&["ip", "netns", "del", &self.b]);
    }
}

/// Tcp OutRsts of a namespace (/proc/net/snmp).
fn out_resets(ns: &str) -> u64 {
    let snmp = must(&["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]);
    let tcp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Tcp:")).collect();
    let (names, values) = (tcp[0].split_whitespace(), tcp[1].split_whitespace());
    names.zip(values).find(|(n, _)| *n == "OutRsts").and_then(|(_, v)| v.parse().ok()).unwrap_or(0)
}

fn established(ns: &str, addr: SocketAddr) -> bool {
    must(&["ip", "netns", "exec", ns, "ss", "-Htn", "state", "established"]).contains(&addr.to_string())
}

#[derive(Clone, Copy, Debug)]
enum Link {
    Veth,
    Loopback,
}

/// A connection from `client_ns` to a listener in A; returns (server side in A, client).
fn connect(lab: &Lab, link: Link, v6: bool) -> (TcpListener, TcpStream, TcpStream, &str) {
    let (server_ip, client_ns): (IpAddr, &str) = match (link, v6) {
        (Link::Veth, false) => ("192.0.2.1".parse().expect("ip"), &lab.b),
        (Link::Veth, true) => ("fd00:2::1".parse().expect("ip"), &lab.b),
        (Link::Loopback, false) => (IpAddr::V4(Ipv4Addr::LOCALHOST), &lab.a),
        (Link::Loopback, true) => ("::1".parse().expect("ip"), &lab.a),
    };
    let listener = Lab::in_ns(&lab.a, || TcpListener::bind(SocketAddr::new(server_ip, 0)).expect("bind"));
    let target = listener.local_addr().expect("local_addr");
    let client = Lab::in_ns(client_ns, || TcpStream::connect_timeout(&target, Duration::from_secs(5)).expect("connect"));
    let (server, _) = listener.accept().expect("accept");
    (listener, server, client, client_ns)
}

fn tuple_of(server: &TcpStream) -> Tuple {
    Tuple { local: server.local_addr().expect("local"), remote: server.peer_addr().expect("peer") }
}

fn read_exact_within(stream: &mut TcpStream, len: usize, limit: Duration) -> Vec<u8> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::with_capacity(len);
    let mut buf = [0u8; 4096];
    stream.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    while got.len() < len && Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    got
}

/// The whole scenario for one method and link: a frozen connection whose
/// peer keeps sending (nothing arrives, no reset, still ESTABLISHED), an
/// unfrozen connection that keeps working, then thaw and every byte in order.
fn frozen_connection(method: Method, link: Link, v6: bool) {
    let mut lab = Lab::new();
    let (listener, mut server, mut client, client_ns) = connect(&lab, link, v6);
    let client_ns = client_ns.to_string();
    let target = listener.local_addr().expect("addr");
    let other_client = Lab::in_ns(&client_ns, || TcpStream::connect_timeout(&target, Duration::from_secs(5)).expect("connect other"));
    let (mut other_server, _) = listener.accept().expect("accept other");

    let resets_before = out_resets(&lab.a) + out_resets(&lab.b);
    let lock = NetworkLock::freeze(method, &Lab::path(&lab.a), &[tuple_of(&server)], "test").expect("freeze");
    lab.locks.push(lock.name().to_string());

    // The peer keeps sending while frozen; the receiver must see nothing.
    let pattern: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    server.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
    let mut sent = 0;
    for chunk in pattern.chunks(2_000) {
        client.write_all(chunk).expect("client write during freeze");
        sent += chunk.len();
        let mut buf = [0u8; 4096];
        match server.read(&mut buf) {
            Ok(n) => panic!("{method}/{link:?}: {n} bytes arrived through the lock"),
            Err(e) => assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "read: {e}"),
        }
    }
    // The server's own data must not leave either.
    server.write_all(b"from-server").expect("server write during freeze");
    let mut tmp = [0u8; 64];
    client.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    assert!(client.read(&mut tmp).is_err(), "{method}/{link:?}: server data left through the lock");

    // An unfrozen connection to the same listener works meanwhile.
    let mut other_client = other_client;
    other_client.write_all(b"ping").expect("other write");
    let got = read_exact_within(&mut other_server, 4, Duration::from_secs(5));
    assert_eq!(got, b"ping", "{method}/{link:?}: unfrozen connection blocked");

    // No reset anywhere, the sender is still ESTABLISHED.
    assert!(client.take_error().expect("SO_ERROR").is_none(), "client socket got an error");
    assert!(established(&client_ns, client.local_addr().expect("addr")), "{method}/{link:?}: client not ESTABLISHED");
    assert_eq!(out_resets(&lab.a) + out_resets(&lab.b), resets_before, "{method}/{link:?}: a reset was sent");

    let name = lock.name().to_string();
    lock.thaw().expect("thaw");
    lab.assert_gone(&name);

    // TCP retransmits: everything arrives, in order.
    let got = read_exact_within(&mut server, sent, Duration::from_secs(15));
    assert_eq!(got.len(), sent, "{method}/{link:?}: only {} of {sent} bytes after thaw", got.len());
    assert!(got == pattern[..sent], "{method}/{link:?}: bytes out of order");
    let got = read_exact_within(&mut client, 11, Duration::from_secs(15));
    assert_eq!(got, b"from-server");
}

#[test]
fn ebpf_veth() {
    require_root!();
    frozen_connection(Method::Ebpf, Link::Veth, false);
}
#[test]
fn ebpf_loopback() {
    require_root!();
    frozen_connection(Method::Ebpf, Link::Loopback, false);
}
#[test]
fn ebpf_veth_ipv6() {
    require_root!();
    frozen_connection(Method::Ebpf, Link::Veth, true);
}
#[test]
fn ebpf_loopback_ipv6() {
    require_root!();
    frozen_connection(Method::Ebpf, Link::Loopback, true);
}
#[test]
fn nftables_veth() {
    require_root!();
    frozen_connection(Method::Nftables, Link::Veth, false);
}
#[test]
fn nftables_loopback_ipv6() {
    require_root!();
    frozen_connection(Method::Nftables, Link::Loopback, true);
}
#[test]
fn nftables_loopback() {
    require_root!();
    frozen_connection(Method::Nftables, Link::Loopback, false);
}
#[test]
fn iptables_veth() {
    require_root!();
    frozen_connection(Method::Iptables, Link::Veth, false);
}
#[test]
fn iptables_loopback() {
    require_root!();
    frozen_connection(Method::Iptables, Link::Loopback, false);
}
#[test]
fn iptables_veth_ipv6() {
    require_root!();
    frozen_connection(Method::Iptables, Link::Veth, true);
}

/// Synthetic tuples in documentation ranges; every 10th is IPv6.
fn synthetic(n: usize) -> Vec<Tuple> {
    (0..n)
        .map(|i| {
            let (local, remote): (IpAddr, IpAddr) = if i % 10 == 9 {
                ("fd00:2::1".parse().expect("ip"), "fd00:2::2".parse().expect("ip"))
            } else {
                (IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1 + (i % 250) as u8)), IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7)))
            };
            Tuple { local: SocketAddr::new(local, 10_000 + (i / 250) as u16), remote: SocketAddr::new(remote, 40_000 + (i % 20_000) as u16) }
        })
        .collect()
}

/// Re-executes this test binary as a helper process running `helper_entry`.
fn spawn_helper(args: &str) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    Command::new(exe)
        .args(["--exact", "helper_entry", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn helper")
}

/// Reads the helper's "LOCK <name>" line (bounded by the helper's own exit).
fn helper_lock_name(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("helper stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    while let Some(line) = lines.next() {
        let line = line.expect("helper output");
        // The harness may print "test helper_entry ... " on the same line.
        if let Some(at) = line.find("LOCK ") {
            // Keep draining so the helper's later output meets no broken pipe;
            // the thread ends when the helper exits.
            std::thread::spawn(move || lines.for_each(drop));
            return line[at + 5..].trim().to_string();
        }
        if let Some(at) = line.find("ERROR ") {
            panic!("helper: {}", &line[at..]);
        }
    }
    panic!("helper exited without naming a lock");
}

/// Not a test by itself: the body of helper processes (does nothing unless
/// FERRY_NL_TEST_HELPER is set). "freeze METHOD NETNS_PATH": freeze, print
/// the name, wait to be killed (at most 60 s). "adopt NAME": adopt and thaw.
#[test]
fn helper_entry() {
    let Ok(spec) = std::env::var(HELPER_ENV) else {
        return;
    };
    let words: Vec<&str> = spec.split_whitespace().collect();
    match words.as_slice() {
        ["freeze", method, path] => {
            let method: Method = method.parse().expect("method");
            match NetworkLock::freeze(method, &Netns::Path(path.into()), &synthetic(100), "killme") {
                Ok(lock) => {
                    println!("LOCK {}", lock.name());
                    std::io::stdout().flush().expect("flush");
                    std::thread::sleep(Duration::from_secs(60));
                    drop(lock);
                }
                Err(e) => println!("ERROR {e}"),
            }
        }
        ["adopt", name] => {
            let lock = NetworkLock::adopt(name).expect("adopt");
            assert_eq!(ferry_netlock::status().iter().find(|s| s.name == *name).and_then(|s| s.owner).map(|o| o.pid), Some(std::process::id() as i32));
            lock.thaw().expect("thaw adopted lock");
            println!("LOCK {name}");
        }
        other => panic!("unknown helper command {other:?}"),
    }
}

fn handover_then_adopt(method: Method) {
    let mut lab = Lab::new();
    let lock = NetworkLock::freeze(method, &Lab::path(&lab.a), &synthetic(10), "ckpt").expect("freeze");
    let name = lock.hand_over();
    lab.locks.push(name.clone());
    let st = ferry_netlock::status().into_iter().find(|s| s.name == name).expect("handed-over lock in status");
    assert_eq!(st.state, Some(LockState::HandedOver));
    assert_eq!(st.method, Some(method));
    assert_eq!(st.tuples, 10);
    assert!(!st.stale, "a handed-over lock is never stale");
    // Still in force after hand-over: nothing was removed.
    assert!(!ferry_netlock::is_gone(&name));

    let mut adopter = spawn_helper(&format!("adopt {name}"));
    assert_eq!(helper_lock_name(&mut adopter), name);
    let status = adopter.wait().expect("wait adopter");
    assert!(status.success(), "adopting process failed: {status}");
    lab.assert_gone(&name);
}

#[test]
fn handover_adopt_ebpf() {
    require_root!();
    handover_then_adopt(Method::Ebpf);
}
#[test]
fn handover_adopt_nftables() {
    require_root!();
    handover_then_adopt(Method::Nftables);
}
#[test]
fn handover_adopt_iptables() {
    require_root!();
    handover_then_adopt(Method::Iptables);
}

/// The owner is SIGKILLed while owning the lock: it is reported stale and
/// release_stale removes everything. The namespace is given as
/// /proc/PID/ns/net of a process that dies too, so the lock must have kept
/// its own way into it (a bind mount) for nftables and iptables.
fn killed_owner(method: Method) {
    let mut lab = Lab::new();
    let holder = Command::new("ip").args(["netns", "exec", &lab.a, "sleep", "60"]).spawn().expect("spawn namespace holder");
    let holder_pid = holder.id();
    lab.children.push(holder);
    // Wait (bounded) until the holder has entered the namespace.
    let a_ino = std::fs::metadata(format!("/run/netns/{}", lab.a)).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).expect("netns inode");
    let ns_path = format!("/proc/{holder_pid}/ns/net");
    for _ in 0..200 {
        if std::fs::metadata(&ns_path).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).ok() == Some(a_ino) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut owner = spawn_helper(&format!("freeze {method} {ns_path}"));
    let name = helper_lock_name(&mut owner);
    lab.locks.push(name.clone());
    let before = ferry_netlock::status().into_iter().find(|s| s.name == name).expect("lock in status");
    assert!(!before.stale, "lock of a live owner reported stale");
    assert_eq!(before.owner.map(|o| o.pid), Some(owner.id() as i32));

    owner.kill().expect("SIGKILL owner");
    owner.wait().expect("reap owner");
    for child in &mut lab.children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let after = ferry_netlock::status().into_iter().find(|s| s.name == name).expect("lock still recorded");
    assert!(after.stale, "lock of a killed owner not reported stale");
    let released = ferry_netlock::release_stale();
    assert!(released.contains(&name), "release_stale did not release {name}: {released:?}");
    lab.assert_gone(&name);
}

#[test]
fn killed_owner_ebpf() {
    require_root!();
    killed_owner(Method::Ebpf);
}
#[test]
fn killed_owner_nftables() {
    require_root!();
    killed_owner(Method::Nftables);
}
#[test]
fn killed_owner_iptables() {
    require_root!();
    killed_owner(Method::Iptables);
}

#[test]
fn freeze_cost_is_flat_in_tuples() {
    require_root!();
    let lab = Lab::new();
    let netns = Lab::path(&lab.a);
    let cost = |n: usize| {
        let tuples = synthetic(n);
        let mut runs: Vec<Duration> = (0..3)
            .map(|_| {
                let start = Instant::now();
                let lock = NetworkLock::freeze(Method::Ebpf, &netns, &tuples, "cost").expect("freeze");
                lock.thaw().expect("thaw");
                start.elapsed()
            })
            .collect();
        runs.sort();
        runs[1]
    };
    let one = cost(1);
    let many = cost(10_000);
    println!("ebpf freeze+thaw (median of 3, veth + lo): N=1 {:.2} ms, N=10000 {:.2} ms", one.as_secs_f64() * 1e3, many.as_secs_f64() * 1e3);
    assert!(many < one + Duration::from_millis(50), "10,000 tuples cost {many:?} vs {one:?} for one");
    drop(lab);
}

#[test]
fn method_names_round_trip() {
    for m in [Method::Ebpf, Method::Nftables, Method::Iptables] {
        assert_eq!(m.to_string().parse::<Method>().expect("parse"), m);
    }
    assert!("pf".parse::<Method>().is_err());
    assert_eq!(Method::default(), Method::Ebpf);
}
