//! What only the destination can refuse, checked in the hello while the
//! tree still runs at the source: every reason the restore would fail
//! here, each naming the object and the remedy, so that a migration that
//! cannot succeed never freezes the service.
//!
//! - addresses: a socket bound to a local address this host does not
//!   have (the service address, which the migration moves, excepted);
//! - ports: a listener or bound socket whose address and port a socket
//!   of this host takes (tried with a bind, as the restore binds);
//! - PIDs: an ID at or above this host's kernel.pid_max (the restore
//!   gives each process and thread its ID); a taken ID is only a note,
//!   the tree then gets a PID namespace of its own (Placement);
//! - IPv6: IPv6 sockets on a kernel without IPv6, an IPv6 service
//!   address for an interface that has IPv6 disabled;
//! - loopback: a TCP connection over loopback whose other end is not in
//!   the tree (a process or a closed socket that stays on the source
//!   host): at the destination nothing answers it, and its first
//!   segment would meet a reset.
//! - files: a regular file the tree maps or holds open by path that this
//!   host lacks (the restore opens it again by its path), or a mapped one
//!   of another size here (the process would run another file's code or
//!   read another's data); a mapped file of the same size with another
//!   modification time is a note.
//!
//! The negotiated TCP options (timestamps, SACK, window scaling, MSS)
//! need no check: repair mode sets them on each socket whatever this
//! host's sysctls say.

use super::DestinationConfig;
use crate::protocol::{Hello, Problem, RunningSocket, SocketRole};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

const IPV6_FREEBIND: i32 = 78;
/// How many objects one problem names before "and N more".
const NAMED: usize = 4;

#[derive(Debug, Default)]
pub(super) struct Verdict {
    pub problems: Vec<Problem>,
    pub notes: Vec<String>,
}

pub(super) fn check(h: &Hello, cfg: &DestinationConfig) -> Verdict {
    let mut v = Verdict::default();
    addresses(h, &mut v.problems);
    ports(h, &mut v.problems);
    ids(h, &mut v);
    ipv6(h, cfg, &mut v.problems);
    loopback_peers(h, &mut v.problems);
    files(&h.tree.files, &mut v);
    v
}

fn files(list: &[ferry_engine::running_files::RunningFile], v: &mut Verdict) {
    use std::os::unix::fs::MetadataExt;
    let mut missing = Vec::new();
    let mut resized = Vec::new();
    let mut touched = Vec::new();
    for f in list {
        let named = format!("{} ({})", f.path, f.holder);
        match std::fs::metadata(&f.path) {
            Ok(here) if !here.is_file() => missing.push(named),
            Err(_) => missing.push(named),
            Ok(here) if f.mapped && here.size() != f.size => {
                resized.push(format!("{named}: {} bytes there, {} here", f.size, here.size()))
            }
            Ok(here) if f.mapped && (here.mtime(), here.mtime_nsec()) != f.mtime => {
                touched.push(f.path.clone())
            }
            Ok(_) => {}
        }
    }
    if !missing.is_empty() {
        v.problems.push(Problem {
            object: some_of(&missing),
            problem: "no such regular file at the destination: the restore opens it again by its \
                      path"
                .into(),
            remedy: "copy it to the destination (same path), or keep it on storage both hosts \
                     mount at the same place"
                .into(),
        });
    }
    if !resized.is_empty() {
        v.problems.push(Problem {
            object: some_of(&resized),
            problem: "a mapped file differs at the destination: the process would run another \
                      file's code or read another file's data"
                .into(),
            remedy: "make the file at the destination the same as at the source (the same \
                     package version, or a copy)"
                .into(),
        });
    }
    if !touched.is_empty() {
        v.notes.push(format!(
            "mapped files of the same size but another modification time here (make sure they \
             are the same files): {}",
            some_of(&touched)
        ));
    }
}

fn loopback_peers(h: &Hello, out: &mut Vec<Problem>) {
    let canonical = |a: std::net::SocketAddr| (a.ip().to_canonical(), a.port());
    let ends: std::collections::HashSet<_> = h
        .tree
        .sockets
        .iter()
        .filter(|s| s.tcp && s.role == SocketRole::Connection)
        .map(|s| canonical(s.local))
        .collect();
    let lonely: Vec<String> = h
        .tree
        .sockets
        .iter()
        .filter(|s| {
            s.tcp && s.role == SocketRole::Connection && s.local.ip().to_canonical().is_loopback()
        })
        .filter(|s| s.peer.is_some_and(|p| !ends.contains(&canonical(p))))
        .map(describe)
        .collect();
    if !lonely.is_empty() {
        out.push(Problem {
            object: some_of(&lonely),
            problem:
                "a loopback connection whose other end is outside the tree stays on this host: \
                      at the destination nothing would answer it"
                    .into(),
            remedy: "migrate the process at the other end with it (a tree both belong to), or \
                     have it connect over the service address"
                .into(),
        });
    }
}

fn sysctl(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn describe(s: &RunningSocket) -> String {
    let proto = if s.tcp { "TCP" } else { "UDP" };
    let at = format!("(pid {} fd {})", s.pid, s.fd);
    match (s.role, s.peer) {
        (SocketRole::Listener, _) => format!("TCP listener {} {at}", s.local),
        (SocketRole::Connection, Some(p)) => format!("TCP {} -> {p} {at}", s.local),
        (_, Some(p)) => format!("{proto} socket {} -> {p} {at}", s.local),
        _ => format!("{proto} socket bound to {} {at}", s.local),
    }
}

/// "a, b, c and 3 more".
fn some_of(names: &[String]) -> String {
    let mut out = names.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > NAMED {
        out.push_str(&format!(" and {} more", names.len() - NAMED));
    }
    out
}

/// How a socket uses its local address, which decides the remedy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Use {
    /// A connection the tree opened: its source address.
    Outbound,
    /// A connection a client opened to one of the tree's listeners.
    Inbound,
    /// A listener or bound socket.
    Bound,
}

fn use_of(s: &RunningSocket, all: &[RunningSocket]) -> Use {
    if s.role != SocketRole::Connection {
        return Use::Bound;
    }
    let accepted = all.iter().any(|l| {
        l.role == SocketRole::Listener
            && l.local.port() == s.local.port()
            && (l.local.ip().is_unspecified() || l.local.ip() == s.local.ip())
    });
    if accepted {
        Use::Inbound
    } else {
        Use::Outbound
    }
}

fn addresses(h: &Hello, out: &mut Vec<Problem>) {
    let service = h.address.map(|(a, _)| a.to_canonical());
    let mut lacking: BTreeMap<(IpAddr, Use), Vec<String>> = BTreeMap::new();
    let mut here: BTreeMap<IpAddr, bool> = BTreeMap::new();
    for s in &h.tree.sockets {
        let ip = s.local.ip().to_canonical();
        if ip.is_unspecified() || Some(ip) == service || s.nonlocal {
            continue;
        }
        let present = *here.entry(ip).or_insert_with(|| address_usable(ip));
        if !present {
            lacking.entry((ip, use_of(s, &h.tree.sockets))).or_default().push(describe(s));
        }
    }
    for ((ip, how), names) in lacking {
        let (problem, remedy) = address_remedy(ip, how, service);
        out.push(Problem { object: some_of(&names), problem, remedy });
    }
}

/// Whether a socket can bind `ip` here: the address is on an interface,
/// or the namespace lets any address be bound (ip_nonlocal_bind). A
/// lookup that fails counts as present: the restore will say.
fn address_usable(ip: IpAddr) -> bool {
    let nonlocal = match ip {
        IpAddr::V4(_) => "/proc/sys/net/ipv4/ip_nonlocal_bind",
        IpAddr::V6(_) => "/proc/sys/net/ipv6/ip_nonlocal_bind",
    };
    sysctl(nonlocal) == Some(1)
        || ferry_sys::address::find_address(ip).map_or(true, |f| f.is_some())
}

fn address_remedy(ip: IpAddr, how: Use, service: Option<IpAddr>) -> (String, String) {
    let missing = format!("local address {ip} is not on the destination");
    if ip.is_ipv6() {
        let conf = if ip.is_loopback() { "lo" } else { "all" };
        if sysctl(&format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6")) == Some(1) {
            return (
                format!("{missing}: IPv6 is disabled there (net.ipv6.conf.{conf}.disable_ipv6=1)"),
                format!(
                    "enable IPv6 at the destination: sysctl -w net.ipv6.conf.{conf}.disable_ipv6=0"
                ),
            );
        }
    }
    if ip.is_loopback() {
        return (
            missing,
            "bring up the loopback interface at the destination (ip link set lo up)".into(),
        );
    }
    let put = format!("or put {ip} on an interface of the destination");
    let remedy = match (how, service) {
        (Use::Outbound, Some(svc)) => format!(
            "source outbound connections from the service address {svc} (e.g. haproxy `source {svc}`, nginx `proxy_bind {svc}`), {put}"
        ),
        (Use::Outbound, None) => format!(
            "migrate with --address and source outbound connections from the service address, {put}"
        ),
        (Use::Inbound, Some(svc)) => {
            format!("have clients connect to the service address {svc}, not to this host's own, {put}")
        }
        (Use::Inbound, None) => format!(
            "give the service an address of its own (--address) and have clients connect to it, {put}"
        ),
        (Use::Bound, Some(svc)) => {
            format!("bind to the service address {svc} or to a wildcard address, {put}")
        }
        (Use::Bound, None) => format!("bind to a wildcard address or to a service address moved with --address, {put}"),
    };
    (missing, remedy)
}

fn ports(h: &Hello, out: &mut Vec<Problem>) {
    let mut seen = std::collections::BTreeSet::new();
    for s in h.tree.sockets.iter().filter(|s| s.role != SocketRole::Connection) {
        if !seen.insert((s.tcp, s.local)) || !taken_here(s) {
            continue;
        }
        let holders = ferry_engine::running_sockets::port_holders(s.tcp, s.local.port());
        let by = if holders.is_empty() {
            String::new()
        } else {
            let names: Vec<String> =
                holders.iter().map(|(pid, comm)| format!("pid {pid} ({comm})")).collect();
            format!(" by {}", some_of(&names))
        };
        let proto = if s.tcp { "TCP" } else { "UDP" };
        out.push(Problem {
            object: describe(s),
            problem: format!("{proto} port {} is taken at the destination{by}", s.local.port()),
            remedy: format!(
                "stop what holds {proto} port {} at the destination or move it to another port",
                s.local.port()
            ),
        });
    }
}

/// Binds a socket like the one the restore will make (SO_REUSEADDR, as
/// the restore binds; freebind, since the service address is not here
/// yet): EADDRINUSE is the restore's own failure, met now.
fn taken_here(s: &RunningSocket) -> bool {
    let family = if s.ipv6 { libc::AF_INET6 } else { libc::AF_INET };
    let ty = if s.tcp { libc::SOCK_STREAM } else { libc::SOCK_DGRAM };
    let Ok(sock) = ferry_sys::socket::socket(family, ty, 0) else { return false };
    let fd = sock.as_raw_fd();
    let set = |level, name, v| ferry_sys::socket::setsockopt_int(fd, level, name, v);
    let _ = set(libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
    if s.ipv6 {
        let _ = set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, s.v6only as i32);
        let _ = set(libc::IPPROTO_IPV6, IPV6_FREEBIND, 1);
    } else {
        let _ = set(libc::IPPROTO_IP, libc::IP_FREEBIND, 1);
    }
    matches!(ferry_sys::socket::bind(fd, family, &s.local), Err(e) if e.errno == libc::EADDRINUSE)
}

fn ids(h: &Hello, v: &mut Verdict) {
    let Some(pid_max) = sysctl("/proc/sys/kernel/pid_max") else { return };
    let mut over: Vec<i32> =
        h.tree.ids.iter().copied().filter(|&id| id as i64 >= pid_max).collect();
    over.sort_unstable();
    if let Some(&highest) = over.last() {
        let names: Vec<String> = over.iter().map(|id| id.to_string()).collect();
        v.problems.push(Problem {
            object: format!("PID {}", some_of(&names)),
            problem: format!(
                "at or above kernel.pid_max of the destination ({pid_max}); the restore gives every process and thread its own ID back"
            ),
            remedy: format!("raise it at the destination: sysctl -w kernel.pid_max={}", highest as i64 + 1),
        });
    }
    if h.tree.own_pid_namespace {
        return;
    }
    let taken: Vec<String> = h
        .tree
        .ids
        .iter()
        .filter(|id| std::path::Path::new(&format!("/proc/{id}")).exists())
        .map(|id| id.to_string())
        .collect();
    if !taken.is_empty() {
        v.notes.push(format!(
            "PID {} taken at the destination: the tree gets a PID namespace of its own there",
            some_of(&taken)
        ));
    }
}

fn ipv6(h: &Hello, cfg: &DestinationConfig, out: &mut Vec<Problem>) {
    let users: Vec<String> = h.tree.sockets.iter().filter(|s| s.ipv6).map(describe).collect();
    if !users.is_empty() {
        if let Err(e) = ferry_sys::socket::socket(libc::AF_INET6, libc::SOCK_DGRAM, 0) {
            if e.errno == libc::EAFNOSUPPORT {
                out.push(Problem {
                    object: some_of(&users),
                    problem: "the destination's kernel has no IPv6 (booted with ipv6.disable=1?)"
                        .into(),
                    remedy:
                        "migrate to a host with IPv6, or have the service use IPv4 sockets only"
                            .into(),
                });
            }
        }
    }
    let (Some((IpAddr::V6(addr), _)), Some(ifindex)) = (h.address, cfg.interface) else { return };
    let Some(name) = interface_name(ifindex) else { return };
    if sysctl(&format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6")) == Some(1) {
        out.push(Problem {
            object: format!("service address {addr}"),
            problem: format!(
                "IPv6 is disabled on {name} at the destination, where the address goes"
            ),
            remedy: format!("sysctl -w net.ipv6.conf.{name}.disable_ipv6=0 at the destination"),
        });
    }
}

/// The name of interface `ifindex` of this network namespace.
fn interface_name(ifindex: u32) -> Option<String> {
    std::fs::read_dir("/sys/class/net").ok()?.flatten().find_map(|e| {
        let index = std::fs::read_to_string(e.path().join("ifindex")).ok()?;
        (index.trim().parse::<u32>().ok()? == ifindex)
            .then(|| e.file_name().to_string_lossy().into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sock(role: SocketRole, local: &str) -> RunningSocket {
        RunningSocket {
            pid: 1,
            fd: 3,
            tcp: true,
            ipv6: false,
            role,
            local: local.parse().unwrap(),
            peer: (role == SocketRole::Connection).then(|| "10.9.9.9:80".parse().unwrap()),
            nonlocal: false,
            v6only: false,
        }
    }

    #[test]
    fn a_connection_to_a_listener_is_inbound_else_outbound() {
        let all = vec![
            sock(SocketRole::Listener, "0.0.0.0:80"),
            sock(SocketRole::Connection, "10.0.0.1:80"),
            sock(SocketRole::Connection, "10.0.0.1:54798"),
        ];
        assert_eq!(use_of(&all[0], &all), Use::Bound);
        assert_eq!(use_of(&all[1], &all), Use::Inbound);
        assert_eq!(use_of(&all[2], &all), Use::Outbound);
    }

    #[test]
    fn files_missing_or_mapped_and_resized_here_are_problems_a_new_mtime_a_note() {
        use std::os::unix::fs::MetadataExt;
        let exe = std::fs::read_link("/proc/self/exe").unwrap().to_string_lossy().into_owned();
        let meta = std::fs::metadata(&exe).unwrap();
        let file = |path: &str, size: u64, mtime: (i64, i64), mapped: bool| {
            ferry_engine::running_files::RunningFile {
                path: path.into(),
                size,
                mtime,
                mapped,
                holder: "pid 1 fd 3".into(),
            }
        };
        let same = (meta.mtime(), meta.mtime_nsec());
        let verdict = |list: Vec<_>| {
            let mut v = Verdict::default();
            files(&list, &mut v);
            v
        };
        let v = verdict(vec![file(&exe, meta.size(), same, true)]);
        assert!(v.problems.is_empty() && v.notes.is_empty(), "{v:?}");
        // Open only: its size may change, as logs do.
        assert!(verdict(vec![file(&exe, 1, same, false)]).problems.is_empty());
        let v = verdict(vec![file(&exe, 1, same, true)]);
        assert!(v.problems[0].object.contains("1 bytes there"), "{v:?}");
        let v = verdict(vec![file("/nonexistent/ferry-lib.so", 1, same, true)]);
        assert!(v.problems[0].problem.contains("no such regular file"), "{v:?}");
        let v = verdict(vec![file("/proc", 1, same, false)]);
        assert!(v.problems[0].object.contains("/proc (pid 1 fd 3)"), "a directory: {v:?}");
        let v = verdict(vec![file(&exe, meta.size(), (same.0 - 10, 0), true)]);
        assert!(v.problems.is_empty() && v.notes[0].contains(&exe), "{v:?}");
    }

    #[test]
    fn objects_are_named_then_counted() {
        let names: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
        assert_eq!(some_of(&names[..2]), "s0, s1");
        assert_eq!(some_of(&names), "s0, s1, s2, s3 and 2 more");
    }

    #[test]
    fn the_outbound_remedy_names_the_service_address() {
        let svc: IpAddr = "10.0.0.100".parse().unwrap();
        let (problem, remedy) =
            address_remedy("10.0.0.1".parse().unwrap(), Use::Outbound, Some(svc));
        assert!(problem.contains("10.0.0.1 is not on the destination"), "{problem}");
        assert!(remedy.contains("source outbound connections from the service address 10.0.0.100"));
    }

    #[test]
    fn the_probe_bind_finds_a_listener_on_the_port_and_nothing_else() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let mut s = sock(SocketRole::Listener, &format!("127.0.0.1:{port}"));
        assert!(taken_here(&s), "a listener on the same address and port");
        s.local = format!("0.0.0.0:{port}").parse().unwrap();
        assert!(taken_here(&s), "a wildcard over a listener's port");
        s.tcp = false;
        s.role = SocketRole::Bound;
        assert!(!taken_here(&s), "UDP on a TCP listener's port");
        drop(held);
        s.tcp = true;
        s.role = SocketRole::Listener;
        assert!(!taken_here(&s), "the port once free");
    }

    #[test]
    fn a_socket_is_named_by_its_role() {
        let c = sock(SocketRole::Connection, "10.0.0.1:54798");
        assert_eq!(describe(&c), "TCP 10.0.0.1:54798 -> 10.9.9.9:80 (pid 1 fd 3)");
        assert_eq!(
            describe(&sock(SocketRole::Listener, "0.0.0.0:80")),
            "TCP listener 0.0.0.0:80 (pid 1 fd 3)"
        );
    }
}
