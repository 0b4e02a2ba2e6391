//! Socket options: every option number Linux 6.18 defines at the levels
//! a TCP, UDP or unix socket answers (include/uapi/asm-generic/socket.h,
//! linux/in.h, linux/in6.h, linux/tcp.h, linux/udp.h), with what ferry
//! does with it.
//!
//! "restored" options are read in the freeze (capture/files/inet.rs) and
//! set again; "refused" ones are compared, before the freeze, with a fresh
//! socket of the same kind made in the socket's own network namespace
//! (capture/sockopt_check.rs): one that differs stops the checkpoint by
//! name. So is any number the table does not list that answers
//! differently from the fresh socket (an option newer than this table).

use super::{not_applicable as na, refused, restored, Entry, Table};

/// One socket level: its options by number, and which numbers the
/// pre-check reads (0..=`probe_to`, less `skip`).
#[derive(Debug)]
pub struct Level {
    pub level: i32,
    /// As the kernel headers name it (SOL_SOCKET, IPPROTO_TCP...).
    pub name: &'static str,
    pub options: &'static [(i32, Entry)],
    /// Numbers up to this one are read, also those the table lacks, so an
    /// option a newer kernel added is caught.
    pub probe_to: i32,
    /// Numbers that are not options of the socket (netfilter's
    /// getsockopt calls share the IP levels) and are never read.
    pub skip: &'static [(i32, i32)],
    pub table: &'static Table,
}

impl Level {
    pub fn entry(&self, number: i32) -> Option<&'static Entry> {
        self.options.iter().find(|(n, _)| *n == number).map(|(_, e)| e)
    }

    /// The numbers the pre-check reads and compares: every number up to
    /// `probe_to` but the skipped ones and those restored or not
    /// applicable (restored ones are read in the freeze).
    pub fn compared(&self) -> Vec<i32> {
        (0..=self.probe_to)
            .filter(|n| !self.skip.iter().any(|(a, b)| (*a..=*b).contains(n)))
            .filter(|n| self.entry(*n).is_none_or(|e| e.handling == super::Handling::Refused))
            .collect()
    }
}

/// The option's name, or "level L option N (unknown to ferry)".
pub fn describe(level: &Level, number: i32) -> String {
    match level.entry(number) {
        Some(e) => e.name.to_string(),
        None => format!("{} option {number} (unknown to ferry)", level.name),
    }
}

/// The entries of a numbered list, for its `Table`.
const fn entries<const N: usize>(v: &[(i32, Entry)]) -> [Entry; N] {
    let mut out = [na("", ""); N];
    let mut i = 0;
    while i < N {
        out[i] = v[i].1;
        i += 1;
    }
    out
}

const FRESH: &str = "compared with a fresh socket of the same kind before the freeze";
const MORE: &str = "sock_opts_more";

const SOCKET_OPTS: &[(i32, Entry)] = &[
    (1, refused("SO_DEBUG", FRESH, "-")),
    (2, restored("SO_REUSEADDR", "set after the send queue is written", "sock_tcp_listen")),
    (3, na("SO_TYPE", "the socket is made of the same type")),
    (4, na("SO_ERROR", "a pending error: the TCP state checks read it (reading clears it)")),
    (5, restored("SO_DONTROUTE", "setsockopt", "sock_opts_unbound")),
    (6, restored("SO_BROADCAST", "setsockopt", "sock_udp_bound")),
    (7, restored("SO_SNDBUF", "SO_SNDBUFFORCE when SO_BUF_LOCK shows the application fixed it; auto-tuned otherwise", "sock_buf_force")),
    (8, restored("SO_RCVBUF", "SO_RCVBUFFORCE when SO_BUF_LOCK shows the application fixed it; auto-tuned otherwise", "sock_buf_force")),
    (9, restored("SO_KEEPALIVE", "setsockopt", "sock_tcp_established_pair")),
    (10, restored("SO_OOBINLINE", "setsockopt", "sock_opts_unbound")),
    (11, restored("SO_NO_CHECK", "setsockopt", "sock_opts_unbound")),
    (12, restored("SO_PRIORITY", "setsockopt, after IP_TOS (which changes it)", "sock_opts_unbound")),
    (13, restored("SO_LINGER", "setsockopt", "sock_tcp_established_pair")),
    (14, na("SO_BSDCOMPAT", "no effect, reads 0")),
    (15, restored("SO_REUSEPORT", "setsockopt before bind", "sock_tcp_listen")),
    (16, refused("SO_PASSCRED", "no effect on an IP socket; compared with a fresh socket", "-")),
    (17, na("SO_PEERCRED", "a unix peer's credentials (none on an IP socket)")),
    (18, restored("SO_RCVLOWAT", "set after the receive queue is written", "sock_opts_unbound")),
    (19, na("SO_SNDLOWAT", "fixed at 1, cannot be set")),
    (20, restored("SO_RCVTIMEO_OLD", "setsockopt", "sock_udp_bound")),
    (21, restored("SO_SNDTIMEO_OLD", "setsockopt", MORE)),
    (22, na("SO_SECURITY_AUTHENTICATION", "accepted and ignored by Linux")),
    (23, na("SO_SECURITY_ENCRYPTION_TRANSPORT", "accepted and ignored by Linux")),
    (24, na("SO_SECURITY_ENCRYPTION_NETWORK", "accepted and ignored by Linux")),
    (25, restored("SO_BINDTODEVICE", "setsockopt", "sock_opts_unbound")),
    (26, refused("SO_ATTACH_FILTER", "a classic BPF filter (SO_GET_FILTER reads its length): packets it drops would get through", "refuses_a_socket_filter_and_leaves_it_running")),
    (27, na("SO_DETACH_FILTER", "an action (removes the filter)")),
    (28, na("SO_PEERNAME", "the peer's address, restored by connect or repair")),
    (29, restored("SO_TIMESTAMP_OLD", "setsockopt", MORE)),
    (30, na("SO_ACCEPTCONN", "listening, restored by listen()")),
    (31, na("SO_PEERSEC", "the peer's security label")),
    (32, na("SO_SNDBUFFORCE", "sets SO_SNDBUF")),
    (33, na("SO_RCVBUFFORCE", "sets SO_RCVBUF")),
    (34, refused("SO_PASSSEC", FRESH, "-")),
    (35, restored("SO_TIMESTAMPNS_OLD", "setsockopt", MORE)),
    (36, restored("SO_MARK", "setsockopt", "sock_opts_unbound")),
    (37, refused("SO_TIMESTAMPING_OLD", FRESH, "-")),
    (38, na("SO_PROTOCOL", "the socket is made with the same protocol")),
    (39, na("SO_DOMAIN", "the socket is made in the same family")),
    (40, restored("SO_RXQ_OVFL", "setsockopt", MORE)),
    (41, refused("SO_WIFI_STATUS", FRESH, "-")),
    (42, refused("SO_PEEK_OFF", FRESH, "refuses_ip_and_tcp_socket_options_and_leaves_them_running")),
    (43, refused("SO_NOFCS", FRESH, "-")),
    (44, refused("SO_LOCK_FILTER", FRESH, "refuses_a_socket_filter_and_leaves_it_running")),
    (45, restored("SO_SELECT_ERR_QUEUE", "setsockopt", MORE)),
    (46, restored("SO_BUSY_POLL", "setsockopt", MORE)),
    (47, restored("SO_MAX_PACING_RATE", "setsockopt (8 bytes)", MORE)),
    (48, na("SO_BPF_EXTENSIONS", "what the kernel's BPF supports, the same for every socket")),
    (49, na("SO_INCOMING_CPU", "the CPU of the last packet received (a steering hint an application may also set is not told apart)")),
    (50, refused("SO_ATTACH_BPF", "not readable (SO_GET_FILTER refuses an eBPF filter, so SO_ATTACH_FILTER's check refuses it)", "-")),
    (51, refused("SO_ATTACH_REUSEPORT_CBPF", "not readable by getsockopt or sock_diag: not detected", "-")),
    (52, refused("SO_ATTACH_REUSEPORT_EBPF", "not readable by getsockopt or sock_diag: not detected", "-")),
    (53, na("SO_CNX_ADVICE", "an action (route advice)")),
    (54, na("SCM_TIMESTAMPING_OPT_STATS", "a control message type")),
    (55, na("SO_MEMINFO", "memory statistics")),
    (56, na("SO_INCOMING_NAPI_ID", "the NAPI id of the last packet received")),
    (57, na("SO_COOKIE", "the socket's id, new for every socket")),
    (58, na("SCM_TIMESTAMPING_PKTINFO", "a control message type")),
    (59, na("SO_PEERGROUPS", "a unix peer's groups")),
    (60, restored("SO_ZEROCOPY", "setsockopt", MORE)),
    (61, refused("SO_TXTIME", FRESH, "-")),
    (62, na("SO_BINDTOIFINDEX", "the same state as SO_BINDTODEVICE")),
    (63, refused("SO_TIMESTAMP_NEW", FRESH, "-")),
    (64, refused("SO_TIMESTAMPNS_NEW", FRESH, "-")),
    (65, refused("SO_TIMESTAMPING_NEW", FRESH, "-")),
    (66, na("SO_RCVTIMEO_NEW", "the same state as SO_RCVTIMEO_OLD")),
    (67, na("SO_SNDTIMEO_NEW", "the same state as SO_SNDTIMEO_OLD")),
    (68, na("SO_DETACH_REUSEPORT_BPF", "an action")),
    (69, restored("SO_PREFER_BUSY_POLL", "setsockopt", MORE)),
    (70, refused("SO_BUSY_POLL_BUDGET", "set only: not readable, not detected", "-")),
    (71, na("SO_NETNS_COOKIE", "the namespace's id: the restore's namespace")),
    (72, restored("SO_BUF_LOCK", "set by SO_*BUFFORCE with the buffer sizes", "sock_buf_force")),
    (73, refused("SO_RESERVE_MEM", FRESH, "-")),
    (74, refused("SO_TXREHASH", FRESH, "refuses_ip_and_tcp_socket_options_and_leaves_them_running")),
    (75, restored("SO_RCVMARK", "setsockopt", MORE)),
    (76, refused("SO_PASSPIDFD", FRESH, "-")),
    (77, na("SO_PEERPIDFD", "a unix peer's pidfd (reading makes a new file); SO_PEERCRED's")),
    (78, na("SO_DEVMEM_LINEAR", "a control message type")),
    (79, na("SO_DEVMEM_DMABUF", "a control message type")),
    (80, na("SO_DEVMEM_DONTNEED", "an action")),
    (81, na("SCM_TS_OPT_ID", "a control message type")),
    (82, refused("SO_RCVPRIORITY", FRESH, "-")),
    (83, refused("SO_PASSRIGHTS", FRESH, "-")),
    (84, refused("SO_INQ", FRESH, "-")),
];

const UNIX_SET: &str = "setsockopt, after the queue is written (image section UnixSocketOptions)";
const UNIX_TEST: &str = "sock_unix_opts";

/// Unix sockets answer at SOL_SOCKET only. The image keeps SO_PASSCRED
/// of a unix socket (and its peer's credentials), and the options of
/// `ferry_image::UNIX_SOCKET_OPTIONS` (format 4.8, read in the freeze by
/// capture/files/unix_options.rs); every other option that differs from
/// a fresh unix socket of the same type is refused.
const UNIX_OPTS: &[(i32, Entry)] = &[
    (1, restored("SO_DEBUG", UNIX_SET, UNIX_TEST)),
    (2, restored("SO_REUSEADDR", UNIX_SET, UNIX_TEST)),
    (3, na("SO_TYPE", "the socket is made of the same type")),
    (
        4,
        na("SO_ERROR", "a pending error: the unix capture checks it with poll (reading clears it)"),
    ),
    (5, restored("SO_DONTROUTE", UNIX_SET, UNIX_TEST)),
    (6, restored("SO_BROADCAST", UNIX_SET, UNIX_TEST)),
    (7, restored("SO_SNDBUF", "SO_SNDBUFFORCE with half the size (the kernel doubles it), so a size above net.core.wmem_max comes back", UNIX_TEST)),
    (8, restored("SO_RCVBUF", "SO_RCVBUFFORCE with half the size, so a size above net.core.rmem_max comes back", UNIX_TEST)),
    (9, restored("SO_KEEPALIVE", UNIX_SET, UNIX_TEST)),
    (10, restored("SO_OOBINLINE", UNIX_SET, UNIX_TEST)),
    (11, restored("SO_NO_CHECK", UNIX_SET, UNIX_TEST)),
    (12, restored("SO_PRIORITY", UNIX_SET, UNIX_TEST)),
    (13, restored("SO_LINGER", "setsockopt (a time kept with lingering off too)", UNIX_TEST)),
    (14, na("SO_BSDCOMPAT", "no effect, reads 0")),
    (15, refused("SO_REUSEPORT", FRESH, "-")),
    (16, restored("SO_PASSCRED", "setsockopt", "sock_opts_unbound")),
    (
        17,
        restored(
            "SO_PEERCRED",
            "made by the process it names (image section UnixPeers)",
            "tree_unix_peercred",
        ),
    ),
    (18, restored("SO_RCVLOWAT", UNIX_SET, UNIX_TEST)),
    (19, na("SO_SNDLOWAT", "fixed at 1, cannot be set")),
    (20, restored("SO_RCVTIMEO_OLD", UNIX_SET, UNIX_TEST)),
    (21, restored("SO_SNDTIMEO_OLD", UNIX_SET, UNIX_TEST)),
    (22, na("SO_SECURITY_AUTHENTICATION", "accepted and ignored by Linux")),
    (23, na("SO_SECURITY_ENCRYPTION_TRANSPORT", "accepted and ignored by Linux")),
    (24, na("SO_SECURITY_ENCRYPTION_NETWORK", "accepted and ignored by Linux")),
    (25, refused("SO_BINDTODEVICE", FRESH, "-")),
    (26, refused("SO_ATTACH_FILTER", "SO_GET_FILTER reads its length", "-")),
    (27, na("SO_DETACH_FILTER", "an action (removes the filter)")),
    (28, na("SO_PEERNAME", "the peer's name, restored with the connection")),
    (29, restored("SO_TIMESTAMP_OLD", UNIX_SET, UNIX_TEST)),
    (30, na("SO_ACCEPTCONN", "listening, restored by listen()")),
    (31, na("SO_PEERSEC", "the peer's security label")),
    (32, na("SO_SNDBUFFORCE", "sets SO_SNDBUF")),
    (33, na("SO_RCVBUFFORCE", "sets SO_RCVBUF")),
    (34, restored("SO_PASSSEC", "setsockopt; refused while messages are queued (restore sends them from ferry: they would carry its label)", UNIX_TEST)),
    (35, restored("SO_TIMESTAMPNS_OLD", UNIX_SET, UNIX_TEST)),
    (36, restored("SO_MARK", UNIX_SET, UNIX_TEST)),
    (37, refused("SO_TIMESTAMPING_OLD", FRESH, "-")),
    (38, na("SO_PROTOCOL", "the socket is made with the same protocol")),
    (39, na("SO_DOMAIN", "the socket is made in the same family")),
    (40, restored("SO_RXQ_OVFL", UNIX_SET, UNIX_TEST)),
    (41, refused("SO_WIFI_STATUS", FRESH, "-")),
    (42, restored("SO_PEEK_OFF", "setsockopt, after the queue is written", UNIX_TEST)),
    (43, refused("SO_NOFCS", FRESH, "-")),
    (44, refused("SO_LOCK_FILTER", FRESH, "-")),
    (45, restored("SO_SELECT_ERR_QUEUE", UNIX_SET, UNIX_TEST)),
    (46, restored("SO_BUSY_POLL", UNIX_SET, UNIX_TEST)),
    (47, refused("SO_MAX_PACING_RATE", FRESH, "-")),
    (48, na("SO_BPF_EXTENSIONS", "what the kernel's BPF supports, the same for every socket")),
    (49, na("SO_INCOMING_CPU", "the CPU of the last packet received")),
    (50, refused("SO_ATTACH_BPF", "not readable (SO_GET_FILTER refuses an eBPF filter)", "-")),
    (51, na("SO_ATTACH_REUSEPORT_CBPF", "no reuseport groups for unix sockets")),
    (52, na("SO_ATTACH_REUSEPORT_EBPF", "no reuseport groups for unix sockets")),
    (53, na("SO_CNX_ADVICE", "an action")),
    (54, na("SCM_TIMESTAMPING_OPT_STATS", "a control message type")),
    (55, na("SO_MEMINFO", "memory statistics")),
    (56, na("SO_INCOMING_NAPI_ID", "no NAPI for unix sockets")),
    (57, na("SO_COOKIE", "the socket's id, new for every socket")),
    (58, na("SCM_TIMESTAMPING_PKTINFO", "a control message type")),
    (
        59,
        restored(
            "SO_PEERGROUPS",
            "made by the process SO_PEERCRED names, with its groups",
            "tree_unix_peercred",
        ),
    ),
    (60, refused("SO_ZEROCOPY", FRESH, "-")),
    (61, refused("SO_TXTIME", FRESH, "-")),
    (62, na("SO_BINDTOIFINDEX", "the same state as SO_BINDTODEVICE")),
    (63, refused("SO_TIMESTAMP_NEW", FRESH, "refuses_unix_socket_options_and_leaves_them_running")),
    (64, refused("SO_TIMESTAMPNS_NEW", FRESH, "-")),
    (65, refused("SO_TIMESTAMPING_NEW", FRESH, "-")),
    (66, na("SO_RCVTIMEO_NEW", "the same state as SO_RCVTIMEO_OLD")),
    (67, na("SO_SNDTIMEO_NEW", "the same state as SO_SNDTIMEO_OLD")),
    (68, na("SO_DETACH_REUSEPORT_BPF", "an action")),
    (69, restored("SO_PREFER_BUSY_POLL", UNIX_SET, UNIX_TEST)),
    (70, refused("SO_BUSY_POLL_BUDGET", FRESH, "-")),
    (71, na("SO_NETNS_COOKIE", "the namespace's id")),
    (72, restored("SO_BUF_LOCK", "setsockopt, after the buffer sizes (whose FORCE calls set it)", UNIX_TEST)),
    (73, refused("SO_RESERVE_MEM", FRESH, "-")),
    (74, refused("SO_TXREHASH", FRESH, "-")),
    (75, restored("SO_RCVMARK", UNIX_SET, UNIX_TEST)),
    (76, restored("SO_PASSPIDFD", "setsockopt; refused while messages are queued (restore sends them from ferry: they would carry its pid)", UNIX_TEST)),
    (77, na("SO_PEERPIDFD", "reading makes a new file; SO_PEERCRED's process")),
    (78, na("SO_DEVMEM_LINEAR", "a control message type")),
    (79, na("SO_DEVMEM_DMABUF", "a control message type")),
    (80, na("SO_DEVMEM_DONTNEED", "an action")),
    (81, na("SCM_TS_OPT_ID", "a control message type")),
    (82, restored("SO_RCVPRIORITY", UNIX_SET, UNIX_TEST)),
    (83, restored("SO_PASSRIGHTS", UNIX_SET, UNIX_TEST)),
    (84, refused("SO_INQ", "set only on a unix stream socket (getsockopt answers ENOPROTOOPT): not detected", "-")),
];

const IP_OPTS: &[(i32, Entry)] = &[
    (1, restored("IP_TOS", "setsockopt, also on an AF_INET6 socket (v4-mapped traffic)", "sock_tcp_established_pair")),
    (2, restored("IP_TTL", "setsockopt, also on an AF_INET6 socket", "sock_udp_bound")),
    (3, na("IP_HDRINCL", "raw sockets only")),
    (4, refused("IP_OPTIONS", FRESH, "refuses_ip_and_tcp_socket_options_and_leaves_them_running")),
    (5, na("IP_ROUTER_ALERT", "raw sockets only")),
    (6, restored("IP_RECVOPTS", "setsockopt", MORE)),
    (7, restored("IP_RETOPTS", "setsockopt", MORE)),
    (8, restored("IP_PKTINFO", "setsockopt", "sock_opts_more")),
    (9, na("IP_PKTOPTIONS", "options of the last packet received")),
    (10, restored("IP_MTU_DISCOVER", "setsockopt", MORE)),
    (11, restored("IP_RECVERR", "setsockopt", MORE)),
    (12, restored("IP_RECVTTL", "setsockopt", MORE)),
    (13, restored("IP_RECVTOS", "setsockopt", MORE)),
    (14, na("IP_MTU", "the path MTU of a connected socket")),
    (15, restored("IP_FREEBIND", "setsockopt", MORE)),
    (16, na("IP_IPSEC_POLICY", "set only (xfrm policy): not readable, not detected")),
    (17, na("IP_XFRM_POLICY", "set only (xfrm policy): not readable, not detected")),
    (18, restored("IP_PASSSEC", "setsockopt", MORE)),
    (19, restored("IP_TRANSPARENT", "setsockopt", MORE)),
    (20, restored("IP_RECVORIGDSTADDR", "setsockopt", MORE)),
    (21, restored("IP_MINTTL", "setsockopt, also on listeners", MORE)),
    (22, na("IP_NODEFRAG", "raw sockets only")),
    (23, restored("IP_CHECKSUM", "setsockopt", MORE)),
    (24, restored("IP_BIND_ADDRESS_NO_PORT", "setsockopt", MORE)),
    (25, restored("IP_RECVFRAGSIZE", "setsockopt", MORE)),
    (26, restored("IP_RECVERR_RFC4884", "setsockopt", MORE)),
    (32, refused("IP_MULTICAST_IF", "compared with a fresh socket (the address; an interface set by index alone reads 0 and is not detected)", "-")),
    (33, restored("IP_MULTICAST_TTL", "setsockopt", MORE)),
    (34, restored("IP_MULTICAST_LOOP", "setsockopt", MORE)),
    (35, refused("IP_ADD_MEMBERSHIP", "memberships: every group of the namespace's /proc/net/igmp is asked of each UDP socket (MCAST_MSFILTER)", "refuses_a_multicast_membership_and_leaves_it_running")),
    (36, na("IP_DROP_MEMBERSHIP", "an action")),
    (37, na("IP_UNBLOCK_SOURCE", "an action")),
    (38, refused("IP_BLOCK_SOURCE", "part of a membership (refused with it)", "-")),
    (39, refused("IP_ADD_SOURCE_MEMBERSHIP", "a membership (refused as IP_ADD_MEMBERSHIP)", "-")),
    (40, na("IP_DROP_SOURCE_MEMBERSHIP", "an action")),
    (41, na("IP_MSFILTER", "a membership's filter, read by group (refused with it)")),
    (42, na("MCAST_JOIN_GROUP", "a membership (refused as IP_ADD_MEMBERSHIP)")),
    (43, na("MCAST_BLOCK_SOURCE", "part of a membership")),
    (44, na("MCAST_UNBLOCK_SOURCE", "an action")),
    (45, na("MCAST_LEAVE_GROUP", "an action")),
    (46, na("MCAST_JOIN_SOURCE_GROUP", "a membership")),
    (47, na("MCAST_LEAVE_SOURCE_GROUP", "an action")),
    (48, na("MCAST_MSFILTER", "a membership's filter, read by group (how memberships are found)")),
    (49, restored("IP_MULTICAST_ALL", "setsockopt", MORE)),
    (50, restored("IP_UNICAST_IF", "setsockopt", MORE)),
    (51, restored("IP_LOCAL_PORT_RANGE", "setsockopt", MORE)),
    (52, na("IP_PROTOCOL", "the socket's protocol")),
];

const IPV6_OPTS: &[(i32, Entry)] = &[
    (1, na("IPV6_ADDRFORM", "turns the socket into AF_INET: its family is read")),
    (2, restored("IPV6_2292PKTINFO", "setsockopt", MORE)),
    (3, restored("IPV6_2292HOPOPTS", "setsockopt", MORE)),
    (4, restored("IPV6_2292DSTOPTS", "setsockopt", MORE)),
    (5, restored("IPV6_2292RTHDR", "setsockopt", MORE)),
    (6, na("IPV6_2292PKTOPTIONS", "options of the last packet received; sticky options set with it are IPV6_HOPOPTS...")),
    (7, na("IPV6_CHECKSUM", "raw sockets only")),
    (8, restored("IPV6_2292HOPLIMIT", "setsockopt", MORE)),
    (9, na("IPV6_NEXTHOP", "set only")),
    (10, na("IPV6_AUTHHDR", "obsolete")),
    (11, restored("IPV6_FLOWINFO", "setsockopt", MORE)),
    (16, restored("IPV6_UNICAST_HOPS", "setsockopt", MORE)),
    (17, restored("IPV6_MULTICAST_IF", "setsockopt", MORE)),
    (18, restored("IPV6_MULTICAST_HOPS", "setsockopt", MORE)),
    (19, restored("IPV6_MULTICAST_LOOP", "setsockopt", MORE)),
    (20, refused("IPV6_ADD_MEMBERSHIP", "memberships: every group of /proc/net/igmp6 is asked of each UDP socket (MCAST_MSFILTER)", "refuses_a_multicast_membership_and_leaves_it_running")),
    (21, na("IPV6_DROP_MEMBERSHIP", "an action")),
    (22, na("IPV6_ROUTER_ALERT", "raw sockets only")),
    (23, restored("IPV6_MTU_DISCOVER", "setsockopt", MORE)),
    (24, na("IPV6_MTU", "reads the path MTU; a value set (np->frag_size) is not readable: not detected")),
    (25, restored("IPV6_RECVERR", "setsockopt", MORE)),
    (26, restored("IPV6_V6ONLY", "setsockopt before bind", "sock_tcp_v6only")),
    (27, refused("IPV6_JOIN_ANYCAST", "not readable: not detected", "-")),
    (28, na("IPV6_LEAVE_ANYCAST", "an action")),
    (29, restored("IPV6_MULTICAST_ALL", "setsockopt", MORE)),
    (30, na("IPV6_ROUTER_ALERT_ISOLATE", "raw sockets only")),
    (31, restored("IPV6_RECVERR_RFC4884", "setsockopt", MORE)),
    (32, refused("IPV6_FLOWLABEL_MGR", "flow label leases: not readable without the label, not detected", "-")),
    (33, restored("IPV6_FLOWINFO_SEND", "setsockopt", MORE)),
    (34, na("IPV6_IPSEC_POLICY", "set only (xfrm policy): not detected")),
    (35, na("IPV6_XFRM_POLICY", "set only (xfrm policy): not detected")),
    (36, na("IPV6_HDRINCL", "raw sockets only")),
    (42, na("MCAST_JOIN_GROUP", "a membership (refused as IPV6_ADD_MEMBERSHIP)")),
    (43, na("MCAST_BLOCK_SOURCE", "part of a membership")),
    (44, na("MCAST_UNBLOCK_SOURCE", "an action")),
    (45, na("MCAST_LEAVE_GROUP", "an action")),
    (46, na("MCAST_JOIN_SOURCE_GROUP", "a membership")),
    (47, na("MCAST_LEAVE_SOURCE_GROUP", "an action")),
    (48, na("MCAST_MSFILTER", "a membership's filter, read by group (how memberships are found)")),
    (49, restored("IPV6_RECVPKTINFO", "setsockopt", MORE)),
    (50, refused("IPV6_PKTINFO", "sticky source address and interface: not readable, not detected", "-")),
    (51, restored("IPV6_RECVHOPLIMIT", "setsockopt", MORE)),
    (52, na("IPV6_HOPLIMIT", "a control message type")),
    (53, restored("IPV6_RECVHOPOPTS", "setsockopt", MORE)),
    (54, refused("IPV6_HOPOPTS", FRESH, "-")),
    (55, refused("IPV6_RTHDRDSTOPTS", FRESH, "-")),
    (56, restored("IPV6_RECVRTHDR", "setsockopt", MORE)),
    (57, refused("IPV6_RTHDR", FRESH, "-")),
    (58, restored("IPV6_RECVDSTOPTS", "setsockopt", MORE)),
    (59, refused("IPV6_DSTOPTS", FRESH, "-")),
    (60, restored("IPV6_RECVPATHMTU", "setsockopt", MORE)),
    (61, na("IPV6_PATHMTU", "the path MTU of a connected socket")),
    (62, restored("IPV6_DONTFRAG", "setsockopt", MORE)),
    (66, restored("IPV6_RECVTCLASS", "setsockopt", MORE)),
    (67, restored("IPV6_TCLASS", "setsockopt", "sock_tcp_established_pair")),
    (70, refused("IPV6_AUTOFLOWLABEL", FRESH, "-")),
    (72, refused("IPV6_ADDR_PREFERENCES", FRESH, "-")),
    (73, restored("IPV6_MINHOPCOUNT", "setsockopt", MORE)),
    (74, restored("IPV6_RECVORIGDSTADDR", "setsockopt", MORE)),
    (75, na("IPV6_TRANSPARENT", "the same state as IP_TRANSPARENT")),
    (76, restored("IPV6_UNICAST_IF", "setsockopt", MORE)),
    (77, restored("IPV6_RECVFRAGSIZE", "setsockopt", MORE)),
    (78, na("IPV6_FREEBIND", "the same state as IP_FREEBIND")),
];

const TCP_OPTS: &[(i32, Entry)] = &[
    (1, restored("TCP_NODELAY", "setsockopt", "sock_tcp_established_pair")),
    (2, restored("TCP_MAXSEG", "unconnected and listening: setsockopt; a connection: repair option", "sock_tcp_established_pair")),
    (3, restored("TCP_CORK", "set after the send queue is written", MORE)),
    (4, restored("TCP_KEEPIDLE", "setsockopt", "sock_tcp_established_pair")),
    (5, restored("TCP_KEEPINTVL", "setsockopt", "sock_tcp_established_pair")),
    (6, restored("TCP_KEEPCNT", "setsockopt", "sock_tcp_established_pair")),
    (7, restored("TCP_SYNCNT", "setsockopt", MORE)),
    (8, restored("TCP_LINGER2", "setsockopt", MORE)),
    (9, restored("TCP_DEFER_ACCEPT", "setsockopt", MORE)),
    (10, restored("TCP_WINDOW_CLAMP", "unconnected and listening: setsockopt; on a connection the stack's own value is read (a clamp the application set there is not told apart)", MORE)),
    (11, na("TCP_INFO", "statistics and state")),
    (12, na("TCP_QUICKACK", "a passing mode the stack leaves by itself")),
    (13, restored("TCP_CONGESTION", "setsockopt", "sock_tcp_established_pair")),
    (14, refused("TCP_MD5SIG", "keys seen by sock_diag (INET_DIAG_MD5SIG)", "refuses_tcp_md5_keys_and_save_syn_and_leaves_them_running")),
    (15, na("TCP_COOKIE_TRANSACTIONS", "removed from Linux")),
    (16, restored("TCP_THIN_LINEAR_TIMEOUTS", "setsockopt", MORE)),
    (17, na("TCP_THIN_DUPACK", "no effect since Linux 4.15")),
    (18, restored("TCP_USER_TIMEOUT", "setsockopt", "sock_tcp_established_pair")),
    (19, na("TCP_REPAIR", "ferry's own mode while it reads a connection")),
    (20, na("TCP_REPAIR_QUEUE", "repair state (queues restored)")),
    (21, na("TCP_QUEUE_SEQ", "repair state (sequence numbers restored)")),
    (22, na("TCP_REPAIR_OPTIONS", "repair state (negotiated options restored)")),
    (23, restored("TCP_FASTOPEN", "setsockopt", MORE)),
    (24, na("TCP_TIMESTAMP", "the timestamp clock, restored by repair")),
    (25, restored("TCP_NOTSENT_LOWAT", "set after the send queue is written", "sock_tcp_established_pair")),
    (26, na("TCP_CC_INFO", "congestion control statistics")),
    (27, refused("TCP_SAVE_SYN", FRESH, "refuses_tcp_md5_keys_and_save_syn_and_leaves_them_running")),
    (28, na("TCP_SAVED_SYN", "what TCP_SAVE_SYN kept (reading frees it; refused with TCP_SAVE_SYN)")),
    (29, na("TCP_REPAIR_WINDOW", "repair state (window restored)")),
    (30, refused("TCP_FASTOPEN_CONNECT", FRESH, "refuses_ip_and_tcp_socket_options_and_leaves_them_running")),
    (31, refused("TCP_ULP", "the upper layer's name (kTLS, ...) compared with a fresh socket's (none); untested: the test kernel has no kTLS", "-")),
    (32, na("TCP_MD5SIG_EXT", "set only: keys seen as TCP_MD5SIG's")),
    (33, refused("TCP_FASTOPEN_KEY", FRESH, "refuses_ip_and_tcp_socket_options_and_leaves_them_running")),
    (34, refused("TCP_FASTOPEN_NO_COOKIE", FRESH, "refuses_ip_and_tcp_socket_options_and_leaves_them_running")),
    (35, na("TCP_ZEROCOPY_RECEIVE", "an action (reading receives data)")),
    (36, restored("TCP_INQ", "setsockopt", MORE)),
    (37, restored("TCP_TX_DELAY", "setsockopt", MORE)),
    (38, na("TCP_AO_ADD_KEY", "set only: keys seen by TCP_AO_INFO")),
    (39, na("TCP_AO_DEL_KEY", "an action")),
    (40, refused("TCP_AO_INFO", FRESH, "-")),
    (41, na("TCP_AO_GET_KEYS", "keys by request; TCP_AO_INFO tells whether there are any")),
    (42, na("TCP_AO_REPAIR", "repair state of TCP-AO (refused with TCP_AO_INFO)")),
    (43, na("TCP_IS_MPTCP", "0 for a TCP socket")),
    (44, restored("TCP_RTO_MAX_MS", "setsockopt", MORE)),
    (45, restored("TCP_RTO_MIN_US", "setsockopt", MORE)),
    (46, restored("TCP_DELACK_MAX_US", "setsockopt", MORE)),
];

const UDP_OPTS: &[(i32, Entry)] = &[
    (1, restored("UDP_CORK", "setsockopt", MORE)),
    (10, na("UDPLITE_SEND_CSCOV", "UDP-Lite only")),
    (11, na("UDPLITE_RECV_CSCOV", "UDP-Lite only")),
    (100, refused("UDP_ENCAP", FRESH, "-")),
    (101, restored("UDP_NO_CHECK6_TX", "setsockopt", MORE)),
    (102, restored("UDP_NO_CHECK6_RX", "setsockopt", MORE)),
    (103, restored("UDP_SEGMENT", "setsockopt", MORE)),
    (104, restored("UDP_GRO", "setsockopt", MORE)),
];

macro_rules! table {
    ($entries:ident, $table:ident, $list:ident, $id:literal, $intro:literal) => {
        static $entries: [Entry; $list.len()] = entries($list);
        pub static $table: Table =
            Table { id: $id, column: "option", intro: $intro, entries: &$entries };
    };
}

table!(
    SOCKET_E,
    SOCKET_TABLE,
    SOCKET_OPTS,
    "sockopt-socket",
    "SOL_SOCKET options of TCP and UDP sockets (numbers 0-127 are read)."
);
table!(
    UNIX_E,
    UNIX_TABLE,
    UNIX_OPTS,
    "sockopt-unix",
    "SOL_SOCKET options of unix sockets (numbers 0-127 are read)."
);
table!(IP_E, IP_TABLE, IP_OPTS, "sockopt-ip",
    "IPPROTO_IP options of TCP and UDP sockets, AF_INET6 ones included (numbers 0-63 are read; 64-99 are netfilter's).");
table!(IPV6_E, IPV6_TABLE, IPV6_OPTS, "sockopt-ipv6",
    "IPPROTO_IPV6 options of AF_INET6 sockets (numbers 0-95 are read but 64, 65, 68, 69 and 80, which are netfilter's).");
table!(TCP_E, TCP_TABLE, TCP_OPTS, "sockopt-tcp", "IPPROTO_TCP options (numbers 0-79 are read).");
table!(UDP_E, UDP_TABLE, UDP_OPTS, "sockopt-udp", "IPPROTO_UDP options (numbers 0-127 are read).");

pub static SOCKET: Level = Level {
    level: 1,
    name: "SOL_SOCKET",
    options: SOCKET_OPTS,
    probe_to: 127,
    skip: &[],
    table: &SOCKET_TABLE,
};
pub static UNIX: Level = Level {
    level: 1,
    name: "SOL_SOCKET",
    options: UNIX_OPTS,
    probe_to: 127,
    skip: &[],
    table: &UNIX_TABLE,
};
pub static IP: Level = Level {
    level: 0,
    name: "IPPROTO_IP",
    options: IP_OPTS,
    probe_to: 63,
    skip: &[],
    table: &IP_TABLE,
};
pub static IPV6: Level = Level {
    level: 41,
    name: "IPPROTO_IPV6",
    options: IPV6_OPTS,
    probe_to: 95,
    skip: &[(64, 65), (68, 69), (80, 80)],
    table: &IPV6_TABLE,
};
pub static TCP: Level = Level {
    level: 6,
    name: "IPPROTO_TCP",
    options: TCP_OPTS,
    probe_to: 79,
    skip: &[],
    table: &TCP_TABLE,
};
pub static UDP: Level = Level {
    level: 17,
    name: "IPPROTO_UDP",
    options: UDP_OPTS,
    probe_to: 127,
    skip: &[],
    table: &UDP_TABLE,
};

/// Every level, in the order docs/coverage.md shows them.
pub fn levels() -> [&'static Level; 6] {
    [&SOCKET, &IP, &IPV6, &TCP, &UDP, &UNIX]
}

/// The name of an option of an IP socket, for messages.
pub fn inet_option_name(level: i32, number: i32) -> Option<&'static str> {
    [&SOCKET, &IP, &IPV6, &TCP, &UDP]
        .into_iter()
        .find(|l| l.level == level)
        .and_then(|l| l.entry(number))
        .map(|e| e.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_ascending_and_within_the_probe() {
        for l in levels() {
            let mut last = -1;
            for (n, e) in l.options {
                assert!(*n > last, "{} {}: numbers out of order", l.name, e.name);
                assert!(*n <= l.probe_to, "{} {} is beyond the probe", l.name, e.name);
                last = *n;
            }
            assert_eq!(l.table.entries.len(), l.options.len());
        }
    }

    #[test]
    fn reads_that_would_change_the_socket_are_never_compared() {
        // SO_ERROR clears the error, SO_PEERPIDFD makes a file,
        // TCP_SAVED_SYN frees the SYN, TCP_ZEROCOPY_RECEIVE receives.
        assert!(!SOCKET.compared().contains(&4));
        assert!(!SOCKET.compared().contains(&77));
        assert!(!UNIX.compared().contains(&77));
        assert!(!TCP.compared().contains(&28));
        assert!(!TCP.compared().contains(&35));
        // Netfilter's getsockopt calls are not socket options.
        assert!(!IPV6.compared().contains(&64));
        assert!(!IP.compared().contains(&64));
    }

    #[test]
    fn unknown_numbers_are_named_as_unknown() {
        assert_eq!(describe(&TCP, 14), "TCP_MD5SIG");
        assert_eq!(describe(&TCP, 77), "IPPROTO_TCP option 77 (unknown to ferry)");
        assert!(TCP.compared().contains(&77), "numbers the table lacks are compared");
        assert_eq!(inet_option_name(41, 62), Some("IPV6_DONTFRAG"));
    }
}
