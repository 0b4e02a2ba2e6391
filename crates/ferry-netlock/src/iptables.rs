//! iptables method: one chain FERRY_<name> per family holding two DROP rules
//! per tuple (one per direction; one SYN-only rule per wildcard), jumped to
//! first from INPUT and OUTPUT;
//! created with one `iptables-restore --noflush` batch (ip6tables-restore
//! for IPv6 tuples) and removed with one.

use crate::{netns, NetlockError, Tuple};
use std::fmt::Write;
use std::path::Path;

pub(crate) fn chain(lock: &str) -> String {
    format!("FERRY_{lock}")
}

fn tools(v6: bool) -> (&'static str, &'static str) {
    if v6 {
        ("ip6tables-restore", "ip6tables")
    } else {
        ("iptables-restore", "iptables")
    }
}

pub(crate) fn engage_batch(lock: &str, tuples: &[Tuple]) -> String {
    let chain = chain(lock);
    let mut s = format!("*filter\n:{chain} - [0:0]\n");
    s.push_str(&rules(&chain, tuples));
    let _ = write!(s, "-I INPUT 1 -j {chain}\n-I OUTPUT 1 -j {chain}\nCOMMIT\n");
    s
}

/// The rules that drop `tuples`, appended to the lock's chain.
fn rules(chain: &str, tuples: &[Tuple]) -> String {
    let mut s = String::new();
    for t in tuples {
        let (l, lp, r, rp) = (t.local.ip(), t.local.port(), t.remote.ip(), t.remote.port());
        if t.is_wildcard() {
            // New connection attempts to the listener: SYN set, ACK clear.
            // (In OUTPUT this only matches a SYN from the namespace to its
            // own listener, which is dropped there instead of at INPUT.)
            let _ = writeln!(
                s,
                "-A {chain} -p tcp -d {l} --dport {lp} --tcp-flags SYN,ACK SYN -j DROP"
            );
            continue;
        }
        // Incoming: remote -> local. Outgoing: local -> remote.
        let _ = writeln!(s, "-A {chain} -p tcp -s {r} --sport {rp} -d {l} --dport {lp} -j DROP");
        let _ = writeln!(s, "-A {chain} -p tcp -s {l} --sport {lp} -d {r} --dport {rp} -j DROP");
    }
    s
}

/// Appends rules for `tuples` to the existing chains; the IPv6 chain is
/// made (with its jumps) if the lock had no IPv6 tuple so far.
pub(crate) fn extend(
    lock: &str,
    netns_path: Option<&Path>,
    tuples: &[Tuple],
    had_v6: bool,
) -> Result<(), NetlockError> {
    let chain = chain(lock);
    let (v6, v4): (Vec<Tuple>, Vec<Tuple>) =
        tuples.iter().copied().partition(|t| t.local.is_ipv6());
    if !v4.is_empty() {
        let batch = format!("*filter\n{}COMMIT\n", rules(&chain, &v4));
        netns::run_command(lock, netns_path, tools(false).0, &["-w", "5", "--noflush"], &batch)?;
    }
    if !v6.is_empty() {
        let batch = if had_v6 {
            format!("*filter\n{}COMMIT\n", rules(&chain, &v6))
        } else {
            engage_batch(lock, &v6)
        };
        netns::run_command(lock, netns_path, tools(true).0, &["-w", "5", "--noflush"], &batch)?;
    }
    Ok(())
}

/// Creates the IPv4 chain (always) and the IPv6 chain (when there are IPv6
/// tuples). On error the caller removes whatever was made.
pub(crate) fn engage(
    lock: &str,
    netns_path: Option<&Path>,
    tuples: &[Tuple],
) -> Result<(), NetlockError> {
    let (v6, v4): (Vec<Tuple>, Vec<Tuple>) =
        tuples.iter().copied().partition(|t| t.local.is_ipv6());
    netns::run_command(
        lock,
        netns_path,
        tools(false).0,
        &["-w", "5", "--noflush"],
        &engage_batch(lock, &v4),
    )?;
    if !v6.is_empty() {
        netns::run_command(
            lock,
            netns_path,
            tools(true).0,
            &["-w", "5", "--noflush"],
            &engage_batch(lock, &v6),
        )?;
    }
    Ok(())
}

pub(crate) fn release(
    lock: &str,
    netns_path: Option<&Path>,
    has_v6: bool,
) -> Result<(), NetlockError> {
    release_family(lock, netns_path, false)?;
    if has_v6 {
        release_family(lock, netns_path, true)?;
    }
    Ok(())
}

fn release_family(lock: &str, netns_path: Option<&Path>, v6: bool) -> Result<(), NetlockError> {
    let (restore, iptables) = tools(v6);
    let chain = chain(lock);
    let batch = format!(
        "*filter\n-D INPUT -j {chain}\n-D OUTPUT -j {chain}\n-F {chain}\n-X {chain}\nCOMMIT\n"
    );
    let first = netns::run_command(lock, netns_path, restore, &["-w", "5", "--noflush"], &batch);
    if first.is_ok() {
        return Ok(());
    }
    // The batch is all-or-nothing: after a freeze killed half-way one of its
    // steps has nothing to act on. Undo piece by piece, ignoring what is
    // missing, then check that the chain is gone.
    for args in [["-D", "INPUT", "-j"], ["-D", "OUTPUT", "-j"], ["-F", "", ""], ["-X", "", ""]] {
        let mut argv: Vec<&str> = vec!["-w", "5"];
        argv.extend(args.iter().copied().filter(|a| !a.is_empty()));
        argv.push(&chain);
        let _ = netns::run_command(lock, netns_path, iptables, &argv, "");
    }
    match netns::run_command(lock, netns_path, iptables, &["-w", "5", "-S", &chain], "") {
        Ok(()) => first, // the chain is still there: report the batch's error
        Err(_) => Ok(()),
    }
}
