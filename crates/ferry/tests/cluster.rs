//! The test-host harness (tests/common/cluster.rs) itself: hosts are
//! separate machines as far as PIDs, /proc and the network go, they reach
//! each other over their bridge, and a dropped cluster leaves nothing.
//! The inits here are shell loops that reap orphans, not ferryd.

mod common;

use common::cluster::Cluster;
use ferry_testkit::require_root;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// A PID 1 that reaps orphans and ignores SIGTERM, as ferryd will.
const INIT: &[&str] = &["sh", "-c", "trap : TERM; while :; do wait; sleep 0.2; done"];

fn output(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run command in host");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn netns_list() -> String {
    output(Command::new("ip").args(["netns", "list"]))
}

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn hosts_have_their_own_pids_and_proc() {
    require_root!();
    let c = Cluster::new(&["a", "b"]);
    let (a, b) = (c.host("a"), c.host("b"));
    let a_init = a.start_init(INIT);
    let b_init = b.start_init(INIT);
    assert_ne!(a_init, b_init);
    assert_eq!(common::innermost_pid(a_init), Some(1), "a's init is PID 1 inside");

    // A long-running process in b, found from the root namespace.
    let mut sleeper =
        b.command(&["sleep", "4242"]).stdin(Stdio::null()).spawn().expect("spawn in b");
    let (root_pid, inner_pid) = b.wait_spawned_pid(&sleeper);
    assert!(inner_pid < 10, "small PID inside b: {inner_pid}");
    assert_eq!(b.root_pid(inner_pid), Some(root_pid));
    // a's init forks a `sleep` every 0.2 s, which may hold the same small
    // PID inside a at this moment: what matters is that it is not b's.
    assert_ne!(a.root_pid(inner_pid), Some(root_pid), "b's process is not a's");

    // Inside a: a small PID of its own, a's init as PID 1 in a's /proc, and
    // nothing of b's (nor of the root namespace's).
    let text = output(&mut a.command(&[
        "sh",
        "-c",
        "echo $$; cat /proc/1/cmdline | tr '\\0' ' '; echo; ps -eo pid=,args=",
    ]));
    let mut lines = text.lines();
    let own: i32 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no PID in {text}"));
    assert!(own > 1 && own < 10, "a process in a has a small PID: {own}\n{text}");
    assert_eq!(
        lines.next().map(str::trim),
        Some(INIT.join(" ").as_str()),
        "a's PID 1 is its init\n{text}"
    );
    let ps: Vec<&str> = lines.collect();
    assert!(ps.len() < 6, "a sees only its own few processes:\n{text}");
    assert!(!text.contains("sleep 4242"), "a sees b's process:\n{text}");

    // b does see it, under its in-host PID.
    let text = output(&mut b.command(&["ps", "-eo", "pid=,args="]));
    assert!(
        text.lines().any(|l| l.trim() == format!("{inner_pid} sleep 4242")),
        "b's own process:\n{text}"
    );

    // The root namespace's /proc is not touched by the hosts' own.
    assert!(std::path::Path::new(&format!("/proc/{}", std::process::id())).exists());

    // restart_init ends everything in the host and starts a fresh init.
    let b_init2 = b.restart_init(INIT);
    assert!(!alive(b_init), "old init of b is gone");
    assert!(!alive(root_pid), "b's sleeper ended with its init");
    assert_ne!(b_init2, b_init);
    // nsenter passes on how its child ended.
    let status = sleeper.wait().expect("wait nsenter");
    assert!(!status.success());

    let names = (c.tag.clone(), [a_init, b_init2]);
    drop(c);
    let list = netns_list();
    assert!(!list.contains(&names.0), "namespaces left after drop:\n{list}");
    for pid in names.1 {
        assert!(!alive(pid), "init {pid} left after drop");
    }
}

#[test]
fn hosts_talk_over_the_bridge() {
    require_root!();
    let c = Cluster::new(&["a", "b", "c"]);
    let (a, host_c) = (c.host("a"), c.host("c"));
    assert_eq!(a.ip, c.subnet_addr(1));
    assert_eq!(host_c.ip, c.subnet_addr(3));
    a.start_init(INIT);
    host_c.start_init(INIT);

    // A listener in a on its own address: it prints its port, then answers
    // one connection with what it read, upper-cased.
    let server = "import socket,sys\n\
        s=socket.socket(); s.bind((sys.argv[1],0)); s.listen(1)\n\
        print(s.getsockname()[1], flush=True)\n\
        conn,peer=s.accept(); conn.sendall(conn.recv(100).upper()+b' from '+peer[0].encode()); conn.close()\n";
    let mut listener = a
        .command(&["python3", "-c", server, &a.ip.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("listener in a");
    let mut port = String::new();
    BufReader::new(listener.stdout.take().expect("listener stdout"))
        .read_line(&mut port)
        .expect("listener port");
    let port = port.trim().to_string();
    assert!(port.parse::<u16>().is_ok(), "listener port: {port:?}");

    let client = "import socket,sys\n\
        s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5); s.sendall(b'hello'); print(s.recv(100).decode())\n";
    let reply = output(&mut host_c.command(&["python3", "-c", client, &a.ip.to_string(), &port]));
    assert_eq!(reply.trim(), format!("HELLO from {}", host_c.ip));
    assert!(listener.wait().expect("listener").success());

    // c resolved a over the bridge.
    assert_eq!(host_c.neighbour_mac(a.ip.into()), Some(a.mac()));
    assert_ne!(a.mac(), host_c.mac());

    // The root namespace cannot reach the cluster: nothing of it is there.
    let links = output(Command::new("ip").args(["-o", "link", "show"]));
    assert!(!links.contains(&c.tag), "cluster interface in the root namespace:\n{links}");

    let (tag, br) = (c.tag.clone(), c.bridge_netns.clone());
    let inits = [a.init_pid(), host_c.init_pid()];
    drop(c);
    let list = netns_list();
    assert!(!list.contains(&tag) && !list.contains(&br), "namespaces left after drop:\n{list}");
    for pid in inits {
        assert!(!alive(pid), "init {pid} left after drop");
    }
}

/// A panic in the middle of a test still removes everything.
#[test]
fn a_failing_test_leaves_nothing() {
    require_root!();
    let (tx, rx) = std::sync::mpsc::channel();
    let r = std::thread::spawn(move || {
        let c = Cluster::new(&["a", "b"]);
        let pid = c.host("a").start_init(INIT);
        let b_pid = c.host("b").start_init(INIT);
        tx.send((c.tag.clone(), pid, b_pid)).expect("send");
        panic!("deliberate failure with a live cluster");
    })
    .join();
    assert!(r.is_err());
    let (tag, a_init, b_init) = rx.recv().expect("cluster made");
    assert!(!netns_list().contains(&tag), "namespaces left after a panic");
    assert!(!alive(a_init) && !alive(b_init), "inits left after a panic");
}
