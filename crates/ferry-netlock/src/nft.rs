//! nftables method: one table `inet ferry_<name>` with a set of concatenated
//! 4-tuples per family (and one of local address . port per family for
//! wildcards) and input/output chains that drop matches, created in one
//! `nft -f -` transaction (engage) and deleted in one (disengage).

use crate::{netns, NetlockError, Tuple};
use std::fmt::Write;
use std::path::Path;

pub(crate) fn table(lock: &str) -> String {
    format!("ferry_{lock}")
}

/// The transaction that creates the table, its sets (with every element)
/// and chains. Connection sets are keyed local address . local port . remote
/// address . remote port; the input chain builds that key from (daddr,
/// dport, saddr, sport), the output chain from (saddr, sport, daddr, dport).
/// Wildcards (remote unspecified, port 0) go to the `listen_*` sets, keyed
/// local address . local port, matched only by incoming SYN-without-ACK.
pub(crate) fn engage_script(lock: &str, tuples: &[Tuple]) -> String {
    let (mut v4, mut v6, mut l4, mut l6) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in tuples {
        let wildcard = t.is_wildcard();
        let element = if wildcard {
            format!("{} . {}", t.local.ip(), t.local.port())
        } else {
            format!(
                "{} . {} . {} . {}",
                t.local.ip(),
                t.local.port(),
                t.remote.ip(),
                t.remote.port()
            )
        };
        match (t.local.is_ipv4(), wildcard) {
            (true, false) => v4.push(element),
            (false, false) => v6.push(element),
            (true, true) => l4.push(element),
            (false, true) => l6.push(element),
        }
    }
    let elements = |list: &[String]| {
        if list.is_empty() {
            String::new()
        } else {
            format!("\t\telements = {{ {} }}\n", list.join(", "))
        }
    };
    let mut s = String::new();
    let _ = write!(
        s,
        "table inet {table} {{\n\
         \tset frozen_v4 {{\n\t\ttype ipv4_addr . inet_service . ipv4_addr . inet_service\n{e4}\t}}\n\
         \tset frozen_v6 {{\n\t\ttype ipv6_addr . inet_service . ipv6_addr . inet_service\n{e6}\t}}\n\
         \tset listen_v4 {{\n\t\ttype ipv4_addr . inet_service\n{l4}\t}}\n\
         \tset listen_v6 {{\n\t\ttype ipv6_addr . inet_service\n{l6}\t}}\n\
         \tchain input {{\n\t\ttype filter hook input priority -300; policy accept;\n\
         \t\tip daddr . tcp dport . ip saddr . tcp sport @frozen_v4 drop\n\
         \t\tip6 daddr . tcp dport . ip6 saddr . tcp sport @frozen_v6 drop\n\
         \t\ttcp flags & (syn | ack) == syn ip daddr . tcp dport @listen_v4 drop\n\
         \t\ttcp flags & (syn | ack) == syn ip6 daddr . tcp dport @listen_v6 drop\n\t}}\n\
         \tchain output {{\n\t\ttype filter hook output priority -300; policy accept;\n\
         \t\tip saddr . tcp sport . ip daddr . tcp dport @frozen_v4 drop\n\
         \t\tip6 saddr . tcp sport . ip6 daddr . tcp dport @frozen_v6 drop\n\t}}\n}}\n",
        table = table(lock),
        e4 = elements(&v4),
        e6 = elements(&v6),
        l4 = elements(&l4),
        l6 = elements(&l6),
    );
    s
}

pub(crate) fn engage(
    lock: &str,
    netns_path: Option<&Path>,
    tuples: &[Tuple],
) -> Result<(), NetlockError> {
    // `add table` first: the transaction fails instead of merging into a
    // table of the same name that somehow exists already.
    let script = format!("add table inet {}\n{}", table(lock), engage_script(lock, tuples));
    netns::run_command(lock, netns_path, "nft", &["-f", "-"], &script)
}

pub(crate) fn release(lock: &str, netns_path: Option<&Path>) -> Result<(), NetlockError> {
    // `destroy` (nft 1.0.7+) would ignore a missing table; bookworm has 1.0.6,
    // so a missing table is recognised from the error instead.
    match netns::run_command(
        lock,
        netns_path,
        "nft",
        &["-f", "-"],
        &format!("delete table inet {}\n", table(lock)),
    ) {
        Err(NetlockError::Command { stderr, .. })
            if stderr.contains("No such file or directory") =>
        {
            Ok(())
        }
        other => other,
    }
}

/// `add element` statements that put `tuples` into the sets of an existing
/// table, in one transaction.
pub(crate) fn extend_script(lock: &str, tuples: &[Tuple]) -> String {
    let mut sets: [(&str, Vec<String>); 4] = [
        ("frozen_v4", vec![]),
        ("frozen_v6", vec![]),
        ("listen_v4", vec![]),
        ("listen_v6", vec![]),
    ];
    for t in tuples {
        let wildcard = t.is_wildcard();
        let element = if wildcard {
            format!("{} . {}", t.local.ip(), t.local.port())
        } else {
            format!(
                "{} . {} . {} . {}",
                t.local.ip(),
                t.local.port(),
                t.remote.ip(),
                t.remote.port()
            )
        };
        let i = usize::from(!t.local.is_ipv4()) + 2 * usize::from(wildcard);
        sets[i].1.push(element);
    }
    let mut s = String::new();
    for (set, elements) in &sets {
        if !elements.is_empty() {
            let _ =
                writeln!(s, "add element inet {} {set} {{ {} }}", table(lock), elements.join(", "));
        }
    }
    s
}

pub(crate) fn extend(
    lock: &str,
    netns_path: Option<&Path>,
    tuples: &[Tuple],
) -> Result<(), NetlockError> {
    netns::run_command(lock, netns_path, "nft", &["-f", "-"], &extend_script(lock, tuples))
}
