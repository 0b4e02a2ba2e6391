//! The iptables rules that send a service address's output to the queue,
//! and the removal of rules a ferry that died left behind.
//!
//! Each rule carries the comment `ferry-outbox:PID:START:QUEUE` (START is
//! the owner's start time in clock ticks since boot, /proc/PID/stat field
//! 22, so a reused PID does not keep a dead owner's rules alive).

use std::fmt::Write;
use std::net::IpAddr;

pub(crate) const COMMENT_PREFIX: &str = "ferry-outbox:";

/// The owner of a rule, as its comment names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub pid: u32,
    pub start: u64,
    pub queue: u16,
}

impl Owner {
    pub(crate) fn comment(&self) -> String {
        format!("{COMMENT_PREFIX}{}:{}:{}", self.pid, self.start, self.queue)
    }
}

/// The owner named by a comment, None when it is not in the form above.
pub(crate) fn parse_comment(comment: &str) -> Option<Owner> {
    let mut f = comment.strip_prefix(COMMENT_PREFIX)?.split(':');
    let owner = Owner {
        pid: f.next()?.parse().ok()?,
        start: f.next()?.parse().ok()?,
        queue: f.next()?.parse().ok()?,
    };
    f.next().is_none().then_some(owner)
}

/// The start time (field 22) of a /proc/PID/stat line.
pub(crate) fn start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: count
    // from the last ')'. Field 3 is the first after it.
    stat.rsplit_once(')')?.1.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Where the packets are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hook {
    /// `mangle OUTPUT` of the service's own namespace: every packet it
    /// sends from the address, loopback included. A held packet stays
    /// charged to its socket, whose TCP small-queue limit then lets only
    /// about two packets per connection wait below it.
    #[default]
    Output,
    /// `mangle PREROUTING` of the namespace at the other end of the
    /// service's veth (the host's, say): the packets from the address that
    /// arrive there. The kernel has uncharged them from their socket by
    /// then (ip_rcv orphans them), so TCP keeps sending up to its window
    /// during a hold. Traffic that never leaves the service's namespace
    /// is not held.
    Prerouting,
}

impl Hook {
    pub(crate) fn chain(self) -> &'static str {
        match self {
            Hook::Output => "OUTPUT",
            Hook::Prerouting => "PREROUTING",
        }
    }
}

/// The iptables-restore tool for the address's family.
pub(crate) fn restore_tool(v6: bool) -> &'static str {
    if v6 {
        "ip6tables-restore"
    } else {
        "iptables-restore"
    }
}

/// The rule specifications (without -A/-I/-D and chain) for `address`,
/// in the order they must be matched.
fn specs(address: IpAddr, queue: u16, comment: &str) -> Vec<String> {
    let (host, mut out) = match address {
        IpAddr::V4(a) => (format!("{a}/32"), Vec::new()),
        IpAddr::V6(a) => {
            // Neighbour solicitations and advertisements answer for the
            // address itself, not for the service's state: held, they
            // would delay every neighbour's resolution until a sync.
            let nd = [135, 136].map(|t| {
                format!(
                    "-s {a}/128 -p ipv6-icmp -m icmp6 --icmpv6-type {t} \
                     -m comment --comment {comment} -j ACCEPT"
                )
            });
            (format!("{a}/128"), nd.to_vec())
        }
    };
    // No --queue-bypass: with nobody reading the queue, packets are
    // dropped (TCP sends them again later), never let through.
    out.push(format!("-s {host} -m comment --comment {comment} -j NFQUEUE --queue-num {queue}"));
    out
}

/// The iptables-restore batch that puts the rules first in the hook's
/// mangle chain.
pub(crate) fn insert_batch(hook: Hook, address: IpAddr, queue: u16, comment: &str) -> String {
    let chain = hook.chain();
    let mut s = String::from("*mangle\n");
    // Each -I 1 goes before the previous one: insert in reverse order.
    for spec in specs(address, queue, comment).iter().rev() {
        let _ = writeln!(s, "-I {chain} 1 {spec}");
    }
    s.push_str("COMMIT\n");
    s
}

pub(crate) fn delete_batch(hook: Hook, address: IpAddr, queue: u16, comment: &str) -> String {
    let chain = hook.chain();
    let mut s = String::from("*mangle\n");
    for spec in specs(address, queue, comment) {
        let _ = writeln!(s, "-D {chain} {spec}");
    }
    s.push_str("COMMIT\n");
    s
}

/// The comment of a rule line of `iptables -S`, unquoted.
fn comment_of(line: &str) -> Option<&str> {
    let rest = line.split_once("--comment ")?.1;
    match rest.strip_prefix('"') {
        Some(quoted) => quoted.split_once('"').map(|(c, _)| c),
        None => rest.split_whitespace().next(),
    }
}

/// From `iptables -t mangle -S` output: the delete lines (for an
/// iptables-restore batch) of every outbox rule whose owner `alive` says
/// is gone. A comment with the prefix that does not parse counts as gone.
pub(crate) fn stale_deletes(listing: &str, alive: impl Fn(&Owner) -> bool) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| {
            let (chain, rule) = line.strip_prefix("-A ")?.split_once(' ')?;
            let comment = comment_of(line)?;
            if !comment.starts_with(COMMENT_PREFIX) {
                return None;
            }
            match parse_comment(comment) {
                Some(owner) if alive(&owner) => None,
                _ => Some(format!("-D {chain} {rule}")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_round_trip_and_reject_other_forms() {
        let o = Owner { pid: 42, start: 123456, queue: 9 };
        assert_eq!(parse_comment(&o.comment()), Some(o));
        assert_eq!(parse_comment("ferry-outbox:1:2"), None);
        assert_eq!(parse_comment("ferry-outbox:1:2:3:4"), None);
        assert_eq!(parse_comment("ferry-outbox:x:2:3"), None);
        assert_eq!(parse_comment("other:1:2:3"), None);
    }

    #[test]
    fn start_time_is_counted_from_the_last_parenthesis() {
        let stat = "77 (a) b) (c) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1 2";
        assert_eq!(start_time(stat), Some(987654));
        assert_eq!(start_time("77 (x) S 1"), None);
    }

    #[test]
    fn the_tools_follow_the_family() {
        assert_eq!(restore_tool(false), "iptables-restore");
        assert_eq!(restore_tool(true), "ip6tables-restore");
    }

    #[test]
    fn v4_gets_one_rule_v6_lets_neighbour_discovery_pass_first() {
        let b = insert_batch(Hook::Output, "10.1.2.3".parse().unwrap(), 5, "ferry-outbox:1:2:5");
        assert_eq!(
            b,
            "*mangle\n-I OUTPUT 1 -s 10.1.2.3/32 -m comment --comment ferry-outbox:1:2:5 \
             -j NFQUEUE --queue-num 5\nCOMMIT\n"
        );
        let b = insert_batch(Hook::Output, "fd00::1".parse().unwrap(), 5, "c");
        let lines: Vec<&str> = b.lines().collect();
        // Inserted in reverse: the NFQUEUE rule first, so it ends up last.
        assert!(lines[1].ends_with("-j NFQUEUE --queue-num 5"), "{b}");
        assert!(lines[3].contains("--icmpv6-type 135"), "{b}");
        let d = delete_batch(Hook::Output, "fd00::1".parse().unwrap(), 5, "c");
        assert_eq!(d.lines().filter(|l| l.starts_with("-D OUTPUT -s fd00::1/128")).count(), 3);
    }

    #[test]
    fn only_rules_of_dead_owners_are_stale() {
        let listing = "-P OUTPUT ACCEPT\n\
            -A OUTPUT -s 10.0.0.1/32 -m comment --comment \"ferry-outbox:10:20:1\" -j NFQUEUE --queue-num 1\n\
            -A PREROUTING -s 10.0.0.2/32 -m comment --comment ferry-outbox:11:21:2 -j NFQUEUE --queue-num 2\n\
            -A OUTPUT -s 10.0.0.3/32 -m comment --comment \"ferry-outbox:junk\" -j NFQUEUE --queue-num 3\n\
            -A OUTPUT -s 10.0.0.4/32 -m comment --comment \"someone else\" -j ACCEPT\n";
        let d = stale_deletes(listing, |o| o.pid == 10);
        assert_eq!(
            d,
            [
                "-D PREROUTING -s 10.0.0.2/32 -m comment --comment ferry-outbox:11:21:2 -j NFQUEUE --queue-num 2",
                "-D OUTPUT -s 10.0.0.3/32 -m comment --comment \"ferry-outbox:junk\" -j NFQUEUE --queue-num 3",
            ]
        );
    }
}
