//! The service address moves from host A to host B: hosts A, B and a
//! client C are network namespaces this test makes, on one bridge in a
//! namespace of its own. After the move and B's announcement, C's
//! neighbour entry names B's MAC before C sends anything, and C reaches a
//! listener in B. Every namespace (and so every veth and the bridge) is
//! removed on drop, also when an assertion fails.

use ferry_sys::address::{
    add_address, del_address, find_address, interface_hwaddr, interface_index, set_link_up,
};
use ferry_sys::announce::{announce, gratuitous_arp};
use ferry_testkit::require_root;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Namespaces made by one test; deleting a namespace also deletes the
/// veths and the bridge in it (and a veth's peer with it).
struct Lab {
    tag: String,
    made: Vec<String>,
    /// The third octet of this lab's subnet, unique in this process.
    n: u8,
}

impl Lab {
    fn new() -> Lab {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        Lab {
            tag: format!("fsa{}-{n}", std::process::id()),
            made: Vec::new(),
            n: (n % 250) as u8 + 1,
        }
    }

    fn ns(&self, host: &str) -> String {
        format!("{}-{host}", self.tag)
    }

    fn add_ns(&mut self, host: &str) -> String {
        let name = self.ns(host);
        ip(&["netns", "add", &name]);
        self.made.push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        name
    }

    /// A bridge namespace "br" and hosts `hosts`, each with "eth0" on the
    /// bridge (IPv4 address 10.77.n.(i+1)/24 and IPv6 fd00:77:n::(i+1)/64
    /// without DAD).
    fn hosts(hosts: &[&str]) -> Lab {
        let mut lab = Lab::new();
        let br = lab.add_ns("br");
        // No multicast snooping: the bridge floods multicast (ff02::1) to
        // every port, as a plain switch does.
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"]);
        ip(&["-n", &br, "link", "set", "br0", "up"]);
        for (i, h) in hosts.iter().enumerate() {
            let ns = lab.add_ns(h);
            let port = format!("p{i}");
            ip(&[
                "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            ip(&["-n", &br, "link", "set", &port, "master", "br0", "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.77.{}.{}/24", lab.n, i + 1),
                "dev",
                "eth0",
            ]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("fd00:77:{}::{}/64", lab.n, i + 1),
                "dev",
                "eth0",
                "nodad",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        lab
    }

    /// Runs `f` on a thread that joined host `host`'s network namespace.
    fn run<T: Send + 'static>(&self, host: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        ferry_testkit::run_in_netns(format!("/run/netns/{}", self.ns(host)), f)
    }

    fn mac(&self, host: &str) -> String {
        let out = Command::new("ip")
            .args(["-n", &self.ns(host), "link", "show", "eth0"])
            .output()
            .expect("ip link show");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mac = text
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap_or_else(|| panic!("no MAC in {text}"));
        mac.to_string()
    }

    /// The MAC host `host` has in its neighbour table for `addr`.
    fn neighbour_mac(&self, host: &str, addr: IpAddr) -> Option<String> {
        let out = Command::new("ip")
            .args(["-n", &self.ns(host), "neigh", "show", &addr.to_string()])
            .output()
            .expect("ip neigh show");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().skip_while(|w| *w != "lladdr").nth(1).map(String::from)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

fn eth0(lab: &Lab, host: &str) -> u32 {
    lab.run(host, || interface_index("eth0")).expect("eth0's index")
}

/// The whole move of `service` from A to B, seen from client C.
fn move_address(lab: &Lab, service: IpAddr, prefix: u8) {
    let (a_if, b_if) = (eth0(lab, "a"), eth0(lab, "b"));
    let (a_mac, b_mac) = (lab.mac("a"), lab.mac("b"));
    assert_ne!(a_mac, b_mac);

    lab.run("a", move || add_address(a_if, service, prefix)).expect("add the service address on A");
    assert_eq!(
        lab.run("a", move || find_address(service)).expect("find on A"),
        Some((a_if, prefix))
    );
    // C talks to the service on A, and so caches A's MAC for it.
    exchange(lab, "a", "c", service);
    assert_eq!(
        lab.neighbour_mac("c", service).as_deref(),
        Some(a_mac.as_str()),
        "C learned A's MAC"
    );

    // The freeze: off A, onto B, then B announces it.
    lab.run("a", move || del_address(a_if, service, prefix))
        .expect("remove the service address from A");
    assert_eq!(lab.run("a", move || find_address(service)).expect("find on A"), None);
    lab.run("b", move || add_address(b_if, service, prefix)).expect("add the service address on B");
    assert_eq!(
        lab.run("b", move || find_address(service)).expect("find on B"),
        Some((b_if, prefix))
    );
    // Nothing told C yet: the move alone does not change C's cache, so
    // what changes it below is the announcement.
    assert_eq!(
        lab.neighbour_mac("c", service).as_deref(),
        Some(a_mac.as_str()),
        "C still has A's MAC before the announcement"
    );
    lab.run("b", move || announce(b_if, service)).expect("announce from B");

    let mut seen = None;
    for _ in 0..50 {
        seen = lab.neighbour_mac("c", service);
        if seen.as_deref() == Some(b_mac.as_str()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(seen.as_deref(), Some(b_mac.as_str()), "C's neighbour entry for {service} names B after the announcement, without C sending anything");

    // A listener in B, reached from C over the bridge.
    exchange(lab, "b", "c", service);
}

/// A TCP round trip from a client in `client` to a listener in `server`
/// bound to `service`.
fn exchange(lab: &Lab, server: &str, client: &str, service: IpAddr) {
    let listener = lab
        .run(server, move || TcpListener::bind(SocketAddr::new(service, 0)))
        .expect("listen on the service address");
    let port = listener.local_addr().expect("listener address").port();
    let accepted = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut b = [0u8; 4];
        s.read_exact(&mut b).expect("read");
        s.write_all(b"pong").expect("write");
        b
    });
    let reply = lab.run(client, move || {
        // Short enough that a SYN still sent to A's MAC (which would only
        // be corrected by C's own re-resolution after ~5 s) fails the test.
        let mut s =
            TcpStream::connect_timeout(&SocketAddr::new(service, port), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"ping")?;
        let mut b = [0u8; 4];
        s.read_exact(&mut b)?;
        Ok::<_, std::io::Error>(b)
    });
    assert_eq!(
        &reply.unwrap_or_else(|e| panic!(
            "{client} connects to {server}'s listener on {service}: {e}"
        )),
        b"pong"
    );
    assert_eq!(&accepted.join().expect("server thread"), b"ping");
}

#[test]
fn ipv4_address_moves_with_a_gratuitous_arp() {
    require_root!();
    let lab = Lab::hosts(&["a", "b", "c"]);
    let service = IpAddr::V4(Ipv4Addr::new(10, 77, lab.n, 100));
    move_address(&lab, service, 24);
}

#[test]
fn ipv6_address_moves_with_an_unsolicited_neighbour_advertisement() {
    require_root!();
    let lab = Lab::hosts(&["a", "b", "c"]);
    let service = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x77, lab.n as u16, 0, 0, 0, 0, 0x100));
    move_address(&lab, service, 64);
}

#[test]
fn refusals_carry_the_kernels_errno() {
    require_root!();
    let lab = Lab::hosts(&["a"]);
    let a_if = eth0(&lab, "a");
    let n = lab.n;
    lab.run("a", move || {
        let absent4 = IpAddr::V4(Ipv4Addr::new(10, 77, n, 200));
        let absent6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x77, n as u16, 0, 0, 0, 0, 0x200));
        for absent in [absent4, absent6] {
            let prefix = if absent.is_ipv4() { 24 } else { 64 };
            let e = del_address(a_if, absent, prefix).expect_err("deleting an absent address");
            assert_eq!(e.errno, libc::EADDRNOTAVAIL, "{e}");
            assert!(e.to_string().contains("RTM_DELADDR"), "{e}");
            assert_eq!(find_address(absent).expect("find"), None);

            let e = add_address(999_999, absent, prefix)
                .expect_err("adding to an interface that does not exist");
            assert_eq!(e.errno, libc::ENODEV, "{e}");
            assert!(e.to_string().contains("RTM_NEWADDR"), "{e}");
        }

        // Adding twice is refused, not silently accepted.
        let present = IpAddr::V4(Ipv4Addr::new(10, 77, n, 1));
        let e = add_address(a_if, present, 24).expect_err("adding an address already there");
        assert_eq!(e.errno, libc::EEXIST, "{e}");

        let e = add_address(a_if, present, 33).expect_err("an IPv4 prefix longer than 32");
        assert_eq!(e.errno, libc::EINVAL, "{e}");

        let e = interface_index("no-such-if").expect_err("an unknown interface name");
        assert_eq!(e.errno, libc::ENODEV, "{e}");
        let e = interface_hwaddr(999_999).expect_err("an unknown interface index");
        assert_eq!(e.errno, libc::ENODEV, "{e}");

        // Loopback has no Ethernet address to announce.
        let lo = interface_index("lo").expect("lo");
        let e =
            gratuitous_arp(lo, Ipv4Addr::new(127, 0, 0, 1)).expect_err("announcing on loopback");
        assert_eq!(e.errno, libc::EOPNOTSUPP, "{e}");
    });
}

/// A new namespace's loopback is down, without 127.0.0.1; `set_link_up`
/// brings it up (the trial restore's scratch namespace needs it), and a
/// host address added to it can then be bound and reached.
#[test]
fn loopback_comes_up_and_takes_host_addresses() {
    require_root!();
    let mut lab = Lab::new();
    let name = lab.ns("lo");
    ip(&["netns", "add", &name]);
    lab.made.push(name);
    let n = lab.n;
    let flags = |lab: &Lab| {
        let out = Command::new("ip")
            .args(["-n", &lab.ns("lo"), "link", "show", "lo"])
            .output()
            .expect("ip link show lo");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().find(|w| w.starts_with('<')).unwrap_or_default().to_string()
    };
    assert!(!flags(&lab).contains(",UP"), "a new namespace's loopback is up: {}", flags(&lab));
    lab.run("lo", move || {
        let lo = interface_index("lo").expect("lo");
        set_link_up(lo).expect("loopback up");
        let e = set_link_up(999_999).expect_err("an interface that does not exist");
        assert_eq!(e.errno, libc::ENODEV, "{e}");
        let host = IpAddr::V4(Ipv4Addr::new(10, 78, n, 9));
        add_address(lo, host, 32).expect("host address on loopback");
        let l = TcpListener::bind(SocketAddr::new(host, 0)).expect("bind the host address");
        TcpStream::connect_timeout(&l.local_addr().expect("addr"), Duration::from_secs(2))
            .expect("connect to it");
    });
    assert!(flags(&lab).contains(",UP"), "loopback is not up: {}", flags(&lab));
}
