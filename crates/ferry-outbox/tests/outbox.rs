//! Output commit on the real kernel: a TCP server in namespace A whose
//! address is held, a client in namespace B, joined by a veth pair.

use ferry_outbox::{Config, Hook, Outbox};
use ferry_testkit::{require_root, NetNs};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const SERVER: &str = "10.77.0.1";
const CLIENT: &str = "10.77.0.2";
const PORT: u16 = 7000;
const QUEUE: u16 = 3;

/// Two namespaces joined by a veth pair; both deleted on drop.
struct Net {
    a: NetNs,
    b: NetNs,
}

fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "ip {}", args.join(" "));
}

fn net(tag: &str) -> Net {
    let a = NetNs::new(&format!("{tag}a")).expect("ip netns add");
    let b = NetNs::new(&format!("{tag}b")).expect("ip netns add");
    ip(&["-n", &a.0, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &b.0]);
    for (ns, dev, addr) in [(&a, "va", SERVER), (&b, "vb", CLIENT)] {
        ip(&["-n", &ns.0, "addr", "add", &format!("{addr}/24"), "dev", dev]);
        ip(&["-n", &ns.0, "link", "set", dev, "up"]);
    }
    Net { a, b }
}

impl Net {
    fn path(&self) -> String {
        self.a.path()
    }

    /// An established connection: (server side in A, client side in B),
    /// both without Nagle so each write is a segment of its own.
    fn connect(&self) -> (TcpStream, TcpStream) {
        let listener = self
            .a
            .run(|| TcpListener::bind((SERVER, PORT)))
            .unwrap_or_else(|e| panic!("bind {SERVER}:{PORT}: {e}"));
        let client = self.b.run(|| TcpStream::connect((SERVER, PORT))).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        for s in [&server, &client] {
            s.set_nodelay(true).expect("TCP_NODELAY");
        }
        client.set_read_timeout(Some(Duration::from_millis(20))).expect("SO_RCVTIMEO");
        (server, client)
    }

    fn hold(&self, queue: u16) -> Outbox {
        let addr: IpAddr = SERVER.parse().expect("address");
        Outbox::hold(Some(Path::new(&self.path())), addr, queue).expect("hold")
    }

    fn mangle_rules(&self) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.a.0, "iptables", "-t", "mangle", "-S", "OUTPUT"])
            .output()
            .expect("iptables -S");
        assert!(out.status.success(), "iptables -S: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Everything the client receives within `dur`.
fn read_for(client: &mut TcpStream, dur: Duration) -> Vec<u8> {
    let end = Instant::now() + dur;
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while Instant::now() < end {
        match client.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("client read: {e}"),
        }
    }
    got
}

/// Reads until `want` bytes came or `limit` passed.
fn read_until(client: &mut TcpStream, want: usize, limit: Duration) -> Vec<u8> {
    let end = Instant::now() + limit;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < end {
        got.extend(read_for(client, Duration::from_millis(20)));
    }
    got
}

/// Waits (bounded) until the outbox holds at least `n` packets.
fn wait_held(outbox: &Outbox, n: usize) {
    let end = Instant::now() + Duration::from_secs(2);
    while outbox.held().expect("held") < n {
        assert!(Instant::now() < end, "fewer than {n} packets held after 2 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn unacked(client: &TcpStream) -> u8 {
    ferry_sys::socket::tcp_info(client.as_raw_fd()).expect("TCP_INFO").tcpi_unacked as u8
}

#[test]
fn output_is_held_until_released_pure_acks_included() {
    require_root!();
    let net = net("obx1");
    let (mut server, mut client) = net.connect();
    let outbox = net.hold(QUEUE);
    server.write_all(b"hello").expect("server write");
    assert_eq!(read_for(&mut client, Duration::from_millis(200)), b"");
    wait_held(&outbox, 1);
    let released = outbox.release_through(outbox.mark().expect("mark")).expect("release");
    assert!(released >= 1, "released {released}");
    assert_eq!(read_until(&mut client, 5, Duration::from_secs(2)), b"hello");

    // The server's kernel acknowledges the client's bytes: that ACK is
    // output too, and the client keeps its segment unacknowledged.
    client.write_all(b"ping").expect("client write");
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).expect("server read");
    let end = Instant::now() + Duration::from_millis(200);
    while Instant::now() < end {
        assert_eq!(unacked(&client), 1, "the server's ACK went out while held");
        std::thread::sleep(Duration::from_millis(10));
    }
    outbox.release_through(outbox.mark().expect("mark")).expect("release");
    let end = Instant::now() + Duration::from_secs(2);
    while unacked(&client) != 0 {
        assert!(Instant::now() < end, "the ACK did not arrive after the release");
        std::thread::sleep(Duration::from_millis(2));
    }
    let stats = outbox.stats();
    assert!(stats.released >= 2 && stats.releases == 2, "{stats:?}");
}

#[test]
fn packets_queued_after_the_mark_stay_held() {
    require_root!();
    let net = net("obx2");
    let (mut server, mut client) = net.connect();
    let outbox = net.hold(QUEUE);
    server.write_all(b"one").expect("server write");
    wait_held(&outbox, 1);
    let first = outbox.mark().expect("mark");
    let before = outbox.held().expect("held");
    server.write_all(b"two").expect("server write");
    wait_held(&outbox, before + 1);
    assert_eq!(outbox.release_through(first).expect("release"), before);
    assert_eq!(read_for(&mut client, Duration::from_millis(200)), b"one");
    assert!(outbox.held().expect("held") >= 1);
    // Releasing the same mark again lets nothing more out.
    assert_eq!(outbox.release_through(first).expect("release"), 0);
    assert_eq!(read_for(&mut client, Duration::from_millis(100)), b"");
    outbox.release_through(outbox.mark().expect("mark")).expect("release");
    assert_eq!(read_until(&mut client, 3, Duration::from_secs(2)), b"two");
}

#[test]
fn wait_output_wakes_on_new_output_and_times_out_without() {
    require_root!();
    let net = net("obx3");
    let (server, _client) = net.connect();
    let outbox = net.hold(QUEUE);
    wakes_and_times_out(server, &outbox);
}

/// Without its reader thread (ferry replicate's capture forks, which a
/// process with threads must not), the outbox reads the queue itself.
#[test]
fn without_a_reader_thread_the_outbox_holds_wakes_and_releases() {
    require_root!();
    let net = net("obx7");
    let (server, _client) = net.connect();
    let addr: IpAddr = SERVER.parse().expect("address");
    let config = Config { reader_thread: false, ..Config::default() };
    let outbox =
        Outbox::hold_with(Some(Path::new(&net.path())), addr, QUEUE, config).expect("hold");
    wakes_and_times_out(server, &outbox);
    assert!(outbox.held().expect("held") >= 1, "the byte is not held");
    outbox.release_through(outbox.mark().expect("mark")).expect("release");
}

fn wakes_and_times_out(mut server: TcpStream, outbox: &Outbox) {
    outbox.mark().expect("mark");
    let t = Instant::now();
    assert!(!outbox.wait_output(Duration::from_millis(100)));
    assert!(t.elapsed() >= Duration::from_millis(100));
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        server.write_all(b"x").expect("server write");
        server
    });
    let t = Instant::now();
    assert!(outbox.wait_output(Duration::from_secs(2)));
    let waited = t.elapsed();
    assert!(waited < Duration::from_secs(1), "woke after {waited:?}");
    let _server = writer.join().expect("writer");
    // Already newer than the last mark: true at once, until the next mark.
    assert!(outbox.wait_output(Duration::ZERO));
    outbox.mark().expect("mark");
    assert!(!outbox.wait_output(Duration::from_millis(50)));
}

#[test]
fn removal_lets_output_flow_and_stale_rules_are_removed() {
    require_root!();
    let net = net("obx4");
    let (mut server, mut client) = net.connect();
    let outbox = net.hold(QUEUE);
    assert!(net.mangle_rules().contains("ferry-outbox:"), "{}", net.mangle_rules());
    server.write_all(b"dropped").expect("server write");
    wait_held(&outbox, 1);
    outbox.remove().expect("remove");
    assert!(!net.mangle_rules().contains("ferry-outbox"), "{}", net.mangle_rules());
    // What was held is dropped with the queue; TCP sends it again.
    assert_eq!(read_until(&mut client, 7, Duration::from_secs(5)), b"dropped");
    server.write_all(b"free").expect("server write");
    assert_eq!(read_until(&mut client, 4, Duration::from_millis(500)), b"free");

    // A rule of a ferry that is gone (no such PID): nobody reads its
    // queue, so the service's output is dropped until it is removed.
    let stale = "ferry-outbox:999999999:1:9";
    let insert_stale = || {
        Command::new("ip")
            .args(["netns", "exec", &net.a.0, "iptables", "-t", "mangle", "-I", "OUTPUT", "-s"])
            .args([&format!("{SERVER}/32"), "-m", "comment", "--comment", stale])
            .args(["-j", "NFQUEUE", "--queue-num", "9"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    assert!(insert_stale(), "inserting the stale rule");
    server.write_all(b"late").expect("server write");
    assert_eq!(read_for(&mut client, Duration::from_millis(200)), b"");
    let outbox = net.hold(QUEUE + 1);
    let rules = net.mangle_rules();
    assert!(!rules.contains(stale) && rules.contains("ferry-outbox:"), "{rules}");
    // TCP sends it again (backing off), now into the new outbox's queue.
    let end = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < 4 && Instant::now() < end {
        outbox.release_through(outbox.mark().expect("mark")).expect("release");
        got.extend(read_for(&mut client, Duration::from_millis(10)));
    }
    assert_eq!(got, b"late");
    // Counted: the stale rule removed, the live outbox's left.
    assert!(insert_stale(), "inserting the stale rule again");
    let counted = Outbox::remove_stale_counting(Some(Path::new(&net.path())));
    assert_eq!(counted.expect("remove_stale_counting"), (1, 1), "{}", net.mangle_rules());
    drop(outbox);
    assert!(!net.mangle_rules().contains("ferry-outbox"));
}

#[test]
fn a_long_hold_delivers_everything_in_order() {
    require_root!();
    let net = net("obx5");
    let (mut server, mut client) = net.connect();
    let outbox = net.hold(QUEUE);
    let sent: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + i / 1000) as u8).collect();
    // More than the window: the writer blocks until releases let the
    // client's ACKs in. Bounded, so a failure cannot hang the test.
    server.set_write_timeout(Some(Duration::from_secs(10))).expect("SO_SNDTIMEO");
    let data = sent.clone();
    let writer = std::thread::spawn(move || server.write_all(&data).map(|()| server));
    assert_eq!(read_for(&mut client, Duration::from_secs(1)), b"");
    let stats = outbox.stats();
    assert!(stats.held > 0, "{stats:?}");
    // Release as a replication loop would, until everything arrived.
    let end = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < sent.len() && Instant::now() < end {
        outbox.release_through(outbox.mark().expect("mark")).expect("release");
        got.extend(read_for(&mut client, Duration::from_millis(5)));
    }
    assert_eq!(got.len(), sent.len());
    let _server = writer.join().expect("writer").expect("server write");
    assert!(got == sent, "bytes arrived out of order or changed");
    let stats = outbox.stats();
    assert!(stats.longest_hold >= Duration::from_secs(1), "{stats:?}");
    assert_eq!(stats.overruns, 0);
}

#[test]
fn prerouting_at_the_far_end_of_the_veth_holds_the_same_way() {
    require_root!();
    let net = net("obx6");
    let (mut server, mut client) = net.connect();
    let addr: IpAddr = SERVER.parse().expect("address");
    let config = Config { hook: Hook::Prerouting, ..Config::default() };
    let outbox =
        Outbox::hold_with(Some(Path::new(&net.b.path())), addr, QUEUE, config).expect("hold");
    server.write_all(b"far").expect("server write");
    assert_eq!(read_for(&mut client, Duration::from_millis(200)), b"");
    wait_held(&outbox, 1);
    outbox.release_through(outbox.mark().expect("mark")).expect("release");
    assert_eq!(read_until(&mut client, 3, Duration::from_secs(2)), b"far");
    outbox.remove().expect("remove");
    server.write_all(b"free").expect("server write");
    assert_eq!(read_until(&mut client, 4, Duration::from_millis(500)), b"free");
}
