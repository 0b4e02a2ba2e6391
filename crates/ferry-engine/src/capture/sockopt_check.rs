//! Phase "socket options checked", before the freeze: every socket of the
//! running tree (taken with pidfd_getfd) is read at every option number
//! of its levels (`catalog::socket_options`) and compared with a fresh
//! socket of the same family, type and protocol (listening when it
//! listens) made in the socket's own network namespace. An option that
//! differs and that ferry does not restore refuses the checkpoint by
//! name, and so does an option number ferry does not know. What only
//! sock_diag and /proc show is checked here too: TCP MD5 keys and
//! multicast memberships.
//!
//! The options ferry restores are read here too, through the
//! presurvey's duplicate of each socket (files::PreRead): the survey in
//! the freeze takes them when no setsockopt can have happened since
//! (`sockopt_watch.rs`), else reads them again, so a change between this
//! check and the freeze is captured for them; an option set to a refused
//! value in that window (milliseconds) is not seen.

use super::survey::Presurvey;
use super::tcp_tables::{TcpTables, TreeSocket, ASKED_ALONE_UP_TO};
use crate::catalog::socket_options::{self as cat, Level};
use crate::error::{EngineError, Result};
use ferry_sys::socket;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

/// What one read gave: the bytes, or the errno.
type Read = std::result::Result<Vec<u8>, i32>;

const SO_ATTACH_FILTER: i32 = 26;

/// Reads option `number` of `level` without changing the socket.
fn read(fd: RawFd, level: i32, number: i32) -> Read {
    if level == libc::SOL_SOCKET && number == SO_ATTACH_FILTER {
        return socket::getsockopt_len(fd, level, number)
            .map(|n| n.to_ne_bytes().to_vec())
            .map_err(|e| e.errno);
    }
    socket::getsockopt_bytes(fd, level, number, 256).map_err(|e| e.errno)
}

/// The kind of socket a fresh one is made as.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Kind {
    netns: u64,
    family: i32,
    ty: i32,
    protocol: i32,
    listening: bool,
}

impl Kind {
    fn is_tcp(&self) -> bool {
        self.protocol == libc::IPPROTO_TCP && self.family != libc::AF_UNIX
    }

    fn levels(&self) -> Vec<&'static Level> {
        match (self.family, self.protocol) {
            (libc::AF_UNIX, _) => vec![&cat::UNIX],
            (libc::AF_INET, libc::IPPROTO_TCP) => vec![&cat::SOCKET, &cat::IP, &cat::TCP],
            (libc::AF_INET6, libc::IPPROTO_TCP) => {
                vec![&cat::SOCKET, &cat::IP, &cat::IPV6, &cat::TCP]
            }
            (libc::AF_INET, libc::IPPROTO_UDP) => vec![&cat::SOCKET, &cat::IP, &cat::UDP],
            (libc::AF_INET6, libc::IPPROTO_UDP) => {
                vec![&cat::SOCKET, &cat::IP, &cat::IPV6, &cat::UDP]
            }
            _ => vec![],
        }
    }
}

/// A fresh socket's values, read once per kind, in the order they are
/// compared: (level, number, value). A list, not a map, and made once:
/// 10,000 sockets each compare every entry.
type Fresh = Vec<(&'static Level, i32, Read)>;

fn fresh_values(kind: &Kind, ns: &OwnedFd) -> std::result::Result<Fresh, ferry_sys::SysError> {
    let s = ferry_sys::sockdiag::socket_in(ns.as_fd(), kind.family, kind.ty, kind.protocol)?;
    if kind.listening {
        socket::listen(s.as_raw_fd(), 1)?;
    }
    let mut out = Fresh::new();
    for l in kind.levels() {
        for n in l.compared() {
            // A number the kernel has no getsockopt for, for this kind of
            // socket, answers so for every socket of the kind: not read.
            match read(s.as_raw_fd(), l.level, n) {
                Err(libc::ENOPROTOOPT) | Err(libc::EOPNOTSUPP) => {}
                r => out.push((l, n, r)),
            }
        }
    }
    Ok(out)
}

/// One socket of the tree as the check found it.
struct Found<'a> {
    pid: i32,
    fd: i32,
    link: &'a str,
}

impl Found<'_> {
    fn refuse(&self, sock: RawFd, what: String) -> EngineError {
        let name = |peer| socket::address(sock, peer).ok().flatten();
        let at = match (name(false), name(true)) {
            (Some(l), Some(p)) => format!(" {l} -> {p}"),
            (Some(l), None) => format!(" {l}"),
            _ => String::new(),
        };
        EngineError::unsupported(
            self.pid,
            format!("fd {} ({}{at})", self.fd, self.link),
            format!("{what}: ferry does not restore it (checked before the freeze)"),
        )
    }
}

fn shown(r: &Read) -> String {
    match r {
        Ok(v) if v.len() == 4 => i32::from_ne_bytes([v[0], v[1], v[2], v[3]]).to_string(),
        Ok(v) => format!("{v:02x?}"),
        Err(e) => format!("error {e}"),
    }
}

/// The first option of `sock` that differs from the fresh socket's.
fn first_difference(sock: RawFd, fresh: &Fresh) -> Option<String> {
    for &(l, n, ref want) in fresh {
        let got = read(sock, l.level, n);
        if &got != want {
            return Some(format!(
                "socket option {} is {} (a fresh socket's is {})",
                cat::describe(l, n),
                shown(&got),
                shown(want)
            ));
        }
    }
    None
}

/// One socket of the tree: ferry's duplicate, taken by the presurvey.
struct Taken<'a> {
    pid: i32,
    fd: i32,
    link: String,
    sock: &'a super::files::PreSocket,
    kind: Kind,
    cookie: Option<u64>,
    inode: u32,
}

/// A socket this check passed, by its cookie (SO_COOKIE: never given to
/// another socket): what was read of it for the survey.
#[derive(Clone)]
struct CheckedSocket {
    read: Option<super::files::PreRead>,
}

/// The sockets one capture checked, kept for the next
/// ([`super::CaptureOptions::kept_checks`]): they stand there when the
/// kept setsockopt watch says nothing can have changed them since. And
/// the connections it described before its freeze
/// ([`super::files::KeptDescriptions`]).
#[derive(Clone, Default)]
pub struct KeptChecks(
    std::sync::Arc<std::sync::Mutex<HashMap<u64, CheckedSocket>>>,
    super::files::KeptDescriptions,
);

impl std::fmt::Debug for KeptChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptChecks")
    }
}

impl KeptChecks {
    /// What this capture starts from: the sockets the capture before
    /// checked when they `stand`, nothing otherwise (and nothing kept
    /// until [`KeptChecks::keep`]: a check that fails keeps none).
    fn begin(&self, stand: bool) -> Checked {
        let before = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        Checked { before: if stand { before } else { HashMap::new() }, now: Default::default() }
    }

    /// This capture's sockets, for the next.
    fn keep(&self, checked: Checked) {
        let now = checked.now.into_inner().unwrap_or_else(|e| e.into_inner());
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// The connections the capture before described, kept.
    pub(super) fn descriptions(&self) -> &super::files::KeptDescriptions {
        &self.1
    }
}

/// The sockets checked by the capture before and by this one.
struct Checked {
    /// Those of the capture before, when no thread of the tree can have
    /// set an option since they were read (else empty): each stands as
    /// it was checked then and is not read again.
    before: HashMap<u64, CheckedSocket>,
    /// This capture's, for the next.
    now: std::sync::Mutex<HashMap<u64, CheckedSocket>>,
}

impl Checked {
    /// Passed by the capture before and standing: recorded for the
    /// next, and its early read handed to the survey.
    fn take_standing(&self, cookie: u64, sock: &super::files::PreSocket) -> bool {
        let Some(c) = self.before.get(&cookie) else { return false };
        if let Some(read) = &c.read {
            sock.set_read(read.clone());
        }
        self.record(cookie, c.clone());
        true
    }

    fn record(&self, cookie: u64, c: CheckedSocket) {
        self.now.lock().unwrap_or_else(|e| e.into_inner()).insert(cookie, c);
    }
}

/// The socket's cookie (SO_COOKIE).
fn cookie_of(sock: &OwnedFd) -> Option<u64> {
    let bytes = socket::getsockopt_bytes(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_COOKIE, 8);
    bytes.ok().and_then(|b| Some(u64::from_ne_bytes(b.as_slice().try_into().ok()?)))
}

/// The phase: every socket of every process `pre` listed, each once.
/// Sockets are taken and their kinds' fresh sockets made in order; the
/// comparisons run on the worker threads.
/// With `read_early`, the options ferry restores are read too, for the
/// survey in the freeze ([`super::sockopt_watch`]; without a watch it
/// reads them itself). With `kept` (the checks kept, and whether what
/// they hold stands), a socket the capture before checked and nothing
/// can have changed since is not read again.
pub(super) fn check(
    pre: &Presurvey,
    read_early: bool,
    tcp: &TcpTables,
    kept: Option<(&KeptChecks, bool)>,
) -> Result<()> {
    let checked = kept.map(|(k, stand)| k.begin(stand));
    let kept_now = checked.as_ref();
    let mut fresh: HashMap<Kind, Fresh> = HashMap::new();
    let mut groups: HashMap<i32, Vec<(u32, std::net::IpAddr)>> = HashMap::new();
    // The sockets in order, each description once: no syscall yet.
    let mut listed_socks = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut pids: Vec<&i32> = pre.keys().collect();
    pids.sort();
    for &pid in pids {
        groups.insert(pid, multicast_groups(pid));
        let listed = &pre[&pid];
        let mut fds: Vec<i32> = listed.fds().collect();
        fds.sort_unstable();
        for fd in fds {
            let Some((link, meta)) = listed.listed(fd) else { continue };
            if !seen.insert(link.clone()) {
                continue;
            }
            // Not duplicated (gone since it was listed): the freeze sees
            // the fd as it is.
            let Some(sock) = listed.socket(fd) else { continue };
            let inode = std::os::unix::fs::MetadataExt::ino(meta) as u32;
            listed_socks.push((pid, fd, link, sock, inode));
        }
    }
    // Each socket's cookie and kind (six calls, one of them making a
    // namespace fd) on the worker threads; the namespace is kept only
    // for the first socket of its kind, which makes the fresh socket.
    let first_of_kind = std::sync::Mutex::new(std::collections::HashSet::new());
    // Whether every socket listed is taken here, its kind known: then the
    // TCP sockets taken in a namespace are all the tree's there.
    let whole = std::sync::atomic::AtomicBool::new(true);
    let partial = || whole.store(false, std::sync::atomic::Ordering::Relaxed);
    let kinds = crate::parallel::map(&listed_socks, |&(pid, fd, link, sock, inode)| {
        let cookie = kept_now.and_then(|_| sock.with_dup(cookie_of).flatten());
        if let Some(c) = cookie {
            sock.set_cookie(c);
        }
        if let (Some(k), Some(c)) = (kept_now, cookie) {
            if k.take_standing(c, sock) {
                partial();
                return Ok(None);
            }
        }
        let (kind, ns) = match sock.with_dup(kind_of) {
            Some(Ok(Some(k))) => k,
            Some(Ok(None)) => return Ok(None),
            _ => {
                partial();
                return Ok(None);
            }
        };
        let first = first_of_kind.lock().unwrap_or_else(|e| e.into_inner()).insert(kind);
        let t = Taken { pid, fd, link: link.clone(), sock, kind, cookie, inode };
        Ok(Some((t, first.then_some(ns))))
    })?;
    let mut taken = Vec::with_capacity(kinds.len());
    let mut tcp_ns = HashMap::new();
    for (t, ns) in kinds.into_iter().flatten() {
        if let Some(ns) = ns {
            prepare(&t, &ns, &mut fresh)?;
            if t.kind.is_tcp() {
                tcp_ns.entry(t.kind.netns).or_insert(ns);
            }
        }
        taken.push(t);
    }
    for k in fresh.keys() {
        super::files::inet::load_option_defaults(k.family, k.ty, k.protocol, k.listening);
    }
    let md5 = md5_by_namespace(tcp, &taken, &tcp_ns, whole.into_inner());
    crate::parallel::map(&taken, |t| {
        compare(t, &fresh, &md5, &groups[&t.pid], read_early)?;
        if let (Some(k), Some(c)) = (kept_now, t.cookie) {
            k.record(c, CheckedSocket { read: t.sock.read().cloned() });
        }
        Ok(())
    })?;
    if let (Some((k, _)), Some(c)) = (kept, checked) {
        k.keep(c);
    }
    Ok(())
}

/// The socket's kind and network namespace; None for one that is not a
/// TCP, UDP or unix socket (the capture refuses those itself); Err when
/// its namespace cannot be read.
fn kind_of(sock: &OwnedFd) -> std::result::Result<Option<(Kind, OwnedFd)>, ()> {
    let fd = sock.as_raw_fd();
    let int = |n| socket::getsockopt_int(fd, libc::SOL_SOCKET, n).unwrap_or(-1);
    let ns = ferry_sys::sockdiag::socket_netns(sock.as_fd()).map_err(drop)?;
    let netns = ferry_sys::sockdiag::inode_of(ns.as_fd()).map_err(drop)?;
    let family = int(libc::SO_DOMAIN);
    let kind = Kind {
        netns,
        family,
        ty: int(libc::SO_TYPE),
        protocol: int(libc::SO_PROTOCOL),
        // A unix listener answers like any unix socket of its type.
        listening: family != libc::AF_UNIX && int(libc::SO_ACCEPTCONN) == 1,
    };
    Ok((!kind.levels().is_empty()).then_some((kind, ns)))
}

/// What the comparison of `t` needs: its kind's fresh values.
fn prepare(t: &Taken, ns: &OwnedFd, fresh: &mut HashMap<Kind, Fresh>) -> Result<()> {
    if let std::collections::hash_map::Entry::Vacant(e) = fresh.entry(t.kind) {
        let values = fresh_values(&t.kind, ns).map_err(|err| {
            let what = format!("fd {}: making a fresh socket to compare its options with", t.fd);
            EngineError::kernel(t.pid, what, err)
        })?;
        e.insert(values);
    }
    Ok(())
}

/// The MD5-keyed sockets among `taken`, by network namespace (`tcp_ns`:
/// those of the TCP sockets taken, each open); Err (sock_diag's error)
/// for a namespace whose sockets sock_diag could not show: each TCP
/// socket there is refused then, never taken for one without a key.
fn md5_by_namespace(
    tcp: &TcpTables,
    taken: &[Taken],
    tcp_ns: &HashMap<u64, OwnedFd>,
    whole: bool,
) -> HashMap<u64, Md5Keyed> {
    let mut md5 = HashMap::new();
    for (netns, ns) in tcp_ns {
        let here: Vec<&Taken> =
            taken.iter().filter(|t| t.kind.is_tcp() && t.kind.netns == *netns).collect();
        md5.insert(*netns, md5_keyed(tcp, *netns, ns, &here, whole));
    }
    md5
}

/// The inodes of the MD5-keyed sockets of namespace `netns` (`ns`)
/// among the tree's TCP sockets `here` there (`whole`: every one of
/// them), as sock_diag reports them with INET_DIAG_INFO: each asked
/// alone when they are few, else the namespace's dump
/// ([`TcpTables::of_tree`]). A socket whose addresses cannot be read
/// sends the namespace to the dump, never to "no key".
fn md5_keyed(tcp: &TcpTables, netns: u64, ns: &OwnedFd, here: &[&Taken], whole: bool) -> Md5Keyed {
    let read = |t: &&Taken| t.sock.with_dup(|d| TreeSocket::read(d.as_fd(), t.inode, t.cookie));
    let tree: Option<Vec<TreeSocket>> = (here.len() <= ASKED_ALONE_UP_TO)
        .then(|| here.iter().map(|t| read(t).flatten()).collect())
        .flatten();
    let table = match tree {
        Some(tree) => tcp.of_tree(netns, ns.as_fd(), &tree, whole),
        None => tcp.of(netns, ns.as_fd()),
    };
    table
        .map(|t| t.sockets.iter().filter(|s| s.md5).map(|s| s.inode).collect())
        .map_err(|e| e.to_string())
}

/// A namespace's MD5-keyed sockets by inode, or why sock_diag could not
/// show them.
type Md5Keyed = std::result::Result<Vec<u32>, String>;

/// Why a TCP socket of inode `ino` (None: its inode unreadable) is
/// refused for its MD5 keys, as `keyed` (its namespace's) tells: it has
/// one, or whether it has one is not known.
fn md5_refusal(keyed: &Md5Keyed, ino: Option<u64>) -> Option<String> {
    match (keyed, ino) {
        (Ok(keyed), Some(ino)) => keyed
            .iter()
            .any(|&i| u64::from(i) == ino)
            .then(|| "TCP MD5 signature keys (TCP_MD5SIG, shown by sock_diag)".to_string()),
        (Err(e), _) => {
            Some(format!("TCP MD5 signature keys (TCP_MD5SIG) that sock_diag could not show ({e})"))
        }
        (Ok(_), None) => {
            Some("TCP MD5 signature keys (TCP_MD5SIG) of a socket whose inode is unreadable".into())
        }
    }
}

/// Compares `t` with a fresh socket of its kind, then keeps what the
/// survey in the freeze may take from this read ([`files::inet::pre_read`]).
fn compare(
    t: &Taken,
    fresh: &HashMap<Kind, Fresh>,
    md5: &HashMap<u64, Md5Keyed>,
    groups: &[(u32, std::net::IpAddr)],
    read_early: bool,
) -> Result<()> {
    let compared = t.sock.with_dup(|sock| {
        compare_sock(t, sock, fresh, md5, groups)?;
        let kind = (t.kind.family, t.kind.ty, t.kind.protocol);
        if let Some(read) =
            read_early.then(|| super::files::inet::pre_read(sock.as_raw_fd(), kind)).flatten()
        {
            t.sock.set_read(read);
        }
        Ok(())
    });
    compared.unwrap_or(Ok(()))
}

fn compare_sock(
    t: &Taken,
    sock: &OwnedFd,
    fresh: &HashMap<Kind, Fresh>,
    md5: &HashMap<u64, Md5Keyed>,
    groups: &[(u32, std::net::IpAddr)],
) -> Result<()> {
    let fd = sock.as_raw_fd();
    let found = Found { pid: t.pid, fd: t.fd, link: &t.link };
    if let Some(what) = fresh.get(&t.kind).and_then(|f| first_difference(fd, f)) {
        return Err(found.refuse(fd, what));
    }
    if let Some(keyed) = md5.get(&t.kind.netns).filter(|_| t.kind.protocol == libc::IPPROTO_TCP) {
        if let Some(what) = md5_refusal(keyed, ferry_sys::sockdiag::inode_of(sock.as_fd()).ok()) {
            return Err(found.refuse(fd, what));
        }
    }
    if t.kind.protocol == libc::IPPROTO_UDP {
        for (ifindex, group) in groups {
            if socket::is_multicast_member(fd, *ifindex, group) {
                let what =
                    format!("multicast group {group} on interface {ifindex} (IP_ADD_MEMBERSHIP)");
                return Err(found.refuse(fd, what));
            }
        }
    }
    Ok(())
}

/// The multicast groups joined in `pid`'s network namespace, each with
/// its interface index (/proc/PID/net/igmp and igmp6).
fn multicast_groups(pid: i32) -> Vec<(u32, std::net::IpAddr)> {
    let v4 = std::fs::read_to_string(format!("/proc/{pid}/net/igmp")).unwrap_or_default();
    let v6 = std::fs::read_to_string(format!("/proc/{pid}/net/igmp6")).unwrap_or_default();
    let mut out = parse_igmp(&v4);
    out.extend(parse_igmp6(&v6));
    out
}

/// /proc/net/igmp: an interface line ("1\tlo : ..."), then its groups
/// indented, each a hex word in memory order.
fn parse_igmp(text: &str) -> Vec<(u32, std::net::IpAddr)> {
    let mut out = Vec::new();
    let mut ifindex = None;
    for line in text.lines().skip(1) {
        let first = line.split_whitespace().next().unwrap_or("");
        if !line.starts_with(char::is_whitespace) {
            ifindex = first.parse::<u32>().ok();
        } else if let (Some(i), Ok(w)) = (ifindex, u32::from_str_radix(first, 16)) {
            let b = w.to_ne_bytes();
            out.push((i, std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).into()));
        }
    }
    out
}

/// /proc/net/igmp6: "ifindex name group-hex users flags timer".
fn parse_igmp6(text: &str) -> Vec<(u32, std::net::IpAddr)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let i = f.next()?.parse().ok()?;
            let hex = f.nth(1)?;
            let v = u128::from_str_radix(hex, 16).ok()?;
            Some((i, std::net::Ipv6Addr::from(v).into()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn igmp_groups_are_read_with_their_interface() {
        let text = "Idx\tDevice    : Count Querier\tGroup    Users Timer\tReporter\n\
                    1\tlo        :     2      V3\n\
                    \t\t\t\tFB0000E0     1 0:00000000\t\t0\n\
                    \t\t\t\t010000E0     1 0:00000000\t\t0\n";
        let g = parse_igmp(text);
        assert_eq!(g.len(), 2);
        if cfg!(target_endian = "little") {
            assert_eq!(g[0], (1, "224.0.0.251".parse().unwrap()));
        }
        let g6 =
            parse_igmp6("1    lo              ff020000000000000000000000000001     1 0000000C 0\n");
        assert_eq!(g6, vec![(1, "ff02::1".parse().unwrap())]);
    }

    /// A namespace whose keys sock_diag could not show refuses every TCP
    /// socket there: never "no key".
    #[test]
    fn md5_keys_unknown_are_refused_not_taken_for_none() {
        use super::md5_refusal;
        assert_eq!(md5_refusal(&Ok(vec![7, 9]), Some(8)), None);
        assert!(md5_refusal(&Ok(vec![7, 9]), Some(9)).is_some_and(|w| w.contains("TCP_MD5SIG")));
        let failed: super::Md5Keyed = Err("recv(sock_diag) failed: ENOBUFS".into());
        assert!(md5_refusal(&failed, Some(8)).is_some_and(|w| w.contains("ENOBUFS")));
        assert!(md5_refusal(&Ok(vec![]), None).is_some());
    }
}
