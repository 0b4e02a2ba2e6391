//! The destination side of a migration (run by ferryd for each
//! connection), as named phases: hello → pages into the store, round
//! after round → image → network lock and address → restore, held →
//! Ready → on Commit: release, announce → Running.
//!
//! Anything short of Commit (an error, the source gone, a timeout) kills
//! what was restored and takes the address and the lock back down: the
//! service stays at the source.

use crate::address;
use crate::error::{MigrateError, Result};
use crate::page_store::PageStore;
use crate::protocol::{self, Msg, Welcome};
use ferry_image::{FileKind, PageRun, TreeImage, Vma};
use ferry_netlock::{Method, NetworkLock, Tuple};
use ferry_transport::Channel;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

pub struct DestinationConfig {
    /// The interface a moved service address goes on.
    pub interface: Option<u32>,
    /// How long to wait for the source between messages.
    pub timeout: Duration,
    pub network_lock: Method,
}

#[derive(Debug, Clone)]
pub struct Served {
    pub pid: i32,
    pub host_pid: i32,
    pub page_bytes: u64,
    pub phases: Vec<(String, f64)>,
}

/// Serves one migration on an accepted, authenticated channel.
pub fn serve(mut ch: Channel, cfg: &DestinationConfig) -> Result<Served> {
    let r = serve_inner(&mut ch, cfg);
    if let Err(e) = &r {
        // Best effort: the source learns why, if it still listens; what it
        // still sends is drained so that the report is not lost to a reset.
        let _ = protocol::send(&mut ch, &Msg::Failed { error: e.to_string() });
        ch.close_after_report(std::time::Duration::from_secs(3));
    }
    r
}

fn serve_inner(ch: &mut Channel, cfg: &DestinationConfig) -> Result<Served> {
    ch.set_timeout(Some(cfg.timeout))?;
    let mut ph = ferry_engine::phases::Phases::start("destination");
    let hello = protocol::expect(ch, &["Hello"])?;
    let Msg::Hello(hello) = hello.msg else { unreachable!("expect checked the kind") };
    if let Err(reason) = check_hello(&hello, cfg) {
        protocol::send(ch, &Msg::Refused { reason: reason.clone() })?;
        return Err(MigrateError::Refused(reason));
    }
    // Loading and attaching the lock's program takes tens of ms: done
    // before the source is welcomed, so it never falls in the freeze (a
    // stop-and-copy or post-copy source freezes right after Welcome);
    // engaged with the image's connections later.
    let mut lock =
        Some(NetworkLock::prepare(cfg.network_lock, &ferry_netlock::Netns::Current, "migrate")?);
    ph.mark("network lock prepared");
    let interface = cfg.interface.map(|i| format!("ifindex {i}"));
    protocol::send(
        ch,
        &Msg::Welcome(Welcome {
            ferry_version: env!("CARGO_PKG_VERSION").to_string(),
            kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            interface,
        }),
    )?;
    ph.mark("hello");

    let mut store = PageStore::new()?;
    if !hello.lazy {
        store.place_pages_of(hello.root_pid);
    }
    let (meta, host_pids) = loop {
        let r = protocol::recv(ch)?;
        match r.msg {
            Msg::Pages { pid, ref ranges } => store.insert(pid, ranges, r.data())?,
            Msg::RoundDone { round, .. } => {
                protocol::send(ch, &Msg::RoundStored { round })?;
                ph.mark(&format!("round {round} received"));
            }
            Msg::Layout { pid, ref mappings } => store.reserve(pid, mappings),
            Msg::Image { meta, host_pids } => break (meta, host_pids),
            Msg::Abort { reason } => return Err(MigrateError::Aborted(reason)),
            m => {
                return Err(MigrateError::Protocol(format!(
                    "unexpected {} while receiving pages",
                    m.name()
                )))
            }
        }
    };
    ph.mark("final pages + image received");
    // Decoded, checked and validated like any image, the parent's page
    // ranges included.
    let (_inv, mut tree, incremental) = ferry_image::decode_meta_full(&meta)?;
    drop(meta);
    if host_pids.len() != tree.processes.len() {
        return Err(MigrateError::Protocol(format!(
            "{} source PIDs for {} processes",
            host_pids.len(),
            tree.processes.len()
        )));
    }
    let parent_pages = incremental.map(|i| i.parent_pages).unwrap_or_default();
    let mut placed_bytes = 0;
    // Post-copy: (image PID, source PID, pages still at the source).
    let mut lazy: Vec<(i32, i32, Vec<(u64, u64)>)> = Vec::new();
    for (p, &host) in tree.processes.iter_mut().zip(&host_pids) {
        let mut runs: Vec<(u64, u64)> = p.page_runs.iter().map(|r| (r.start, r.pages)).collect();
        // The parent is this migration's earlier rounds, kept in the store
        // under the PIDs the source sees (or, post-copy, still at the source).
        if let Some(parent) = parent_pages.iter().find(|pp| pp.pid == p.pid) {
            if hello.lazy {
                lazy.push((p.pid, host, parent.ranges.clone()));
            } else {
                runs.extend_from_slice(&parent.ranges);
            }
        }
        runs.sort_unstable();
        if host == hello.root_pid && !hello.lazy {
            // The root inherits its placed pages; the rest comes from the file.
            let root = store.settle_root(host, &p.vmas, &runs, (p.mm.start_brk, p.mm.brk))?;
            placed_bytes = root.placed_bytes;
            p.inherited = root.inherited;
            p.page_runs = split_at_mappings(root.runs, &p.vmas);
        } else {
            p.page_runs = split_at_mappings(store.runs_for(host, &runs)?, &p.vmas);
        }
    }
    tracing::debug!("{placed_bytes} bytes of the root's pages are inherited, not copied");
    // This host's lock and address, not the source's.
    tree.network_lock = None;
    ph.mark("page runs resolved");

    let tuples = held_tuples(&tree);
    let mut unneeded_lock = None;
    let lock_name = match lock.take() {
        Some(mut l) if !tuples.is_empty() => {
            l.engage(&tuples)?;
            Some(l.hand_over())
        }
        // No connection to hold: taken down after the release, where its
        // tens of ms do not count in the pause.
        Some(l) => {
            unneeded_lock = Some(l);
            None
        }
        None => None,
    };
    let lock_guard = LockByName(lock_name.clone());
    ph.mark("network lock");
    let placed = match hello.address {
        Some((addr, prefix)) => {
            let ifindex = cfg.interface.ok_or_else(|| {
                MigrateError::Invalid("this ferryd has no interface for service addresses".into())
            })?;
            Some(address::place(ifindex, addr, prefix)?)
        }
        None => None,
    };
    ph.mark("address on");

    let pages = store.map()?;
    ph.mark("page store mapped");
    let here = restore_here(&tree, hello.lazy);
    let opts = ferry_engine::restore::RestoreOptions {
        adopt_lock: lock_name,
        lazy: lazy.iter().map(|(p, _, r)| (*p, r.clone())).collect(),
        // Only a helper forked from us has copies of its own to drop.
        placed_for_root: if here { Default::default() } else { store.placed_regions() },
        ..Default::default()
    };
    let t_restore = Instant::now();
    let held = if here {
        tracing::info!(
            "restoring in this agent's PID namespace: every PID of the tree is free here"
        );
        ferry_engine::restore::restore_held(tree, pages.bytes(), &opts, t_restore)
            .map(HeldTree::Here)
    } else {
        ferry_engine::restore::restore_held_in_new_pid_ns(tree, pages.bytes(), &opts, t_restore)
            .map(HeldTree::InNamespace)
    };
    let restore_ms = t_restore.elapsed().as_secs_f64() * 1e3;
    // The root has its own copies of the placed pages now (or failed).
    // Unmapping them walks every page table entry (~15 ms per GiB): done
    // beside the rest of the migration, not in its pause.
    // Joined before anything could fork again (a thread holding the
    // allocator's lock across a fork would deadlock the child); when no
    // thread can be started, the closure and the regions are dropped here.
    let placed_pages = store.take_placed();
    let unmapper = JoinOnDrop(
        std::thread::Builder::new()
            .name("unmap-placed".into())
            .spawn(move || drop(placed_pages))
            .ok(),
    );
    let mut held = held?;
    let uffds = held.take_uffds();
    if lazy.iter().any(|(_, _, r)| !r.is_empty())
        && uffds.len() != lazy.iter().filter(|(_, _, r)| !r.is_empty()).count()
    {
        return Err(MigrateError::Invalid(format!("post-copy: the restore registered {} userfaultfd(s) for {} process(es) with lazy pages", uffds.len(), lazy.len())));
    }
    let mut phases: Vec<(String, f64)> = ph.done().to_vec();
    let restore_phases = held.phases();
    // What the restore's own phases leave out (a helper's report reaching us).
    let in_phases: f64 = restore_phases.iter().map(|(_, ms)| ms).sum();
    phases.extend(restore_phases);
    phases.push(("restore, outside its phases".to_string(), (restore_ms - in_phases).max(0.0)));
    phases.push(("ready".to_string(), t_restore.elapsed().as_secs_f64() * 1e3 - restore_ms));
    ph.mark("restored (held)");
    protocol::send(ch, &Msg::Ready { phases: phases.clone() })?;

    let go = protocol::recv(ch);
    match go.map(|r| r.msg) {
        Ok(Msg::Commit) => {}
        Ok(m) => {
            return Err(MigrateError::Aborted(format!(
                "the source sent {} instead of Commit",
                m.name()
            )))
        }
        Err(e) => return Err(MigrateError::Aborted(format!("no commit from the source: {e}"))),
    }
    let t_release = Instant::now();
    // Announced and reported as soon as the tree runs: taking this host's
    // lock down after that takes tens of ms, outside the pause.
    let mut release_phases = Vec::new();
    let mut announce_socket = None;
    let mut reported = Ok(());
    let restored = held.release_then(|restored| {
        release_phases.push(("release".to_string(), t_release.elapsed().as_secs_f64() * 1e3));
        if let Some(p) = placed {
            let t = Instant::now();
            match p.announce_and_keep() {
                Ok(sock) => announce_socket = sock,
                Err(e) => tracing::warn!("{e}"),
            }
            release_phases.push(("announce".to_string(), t.elapsed().as_secs_f64() * 1e3));
        }
        reported = protocol::send(
            ch,
            &Msg::Running {
                pid: restored.pid,
                host_pid: restored.host_pid,
                phases: release_phases.clone(),
            },
        );
    })?;
    // The lock went with the released tree; the address stays.
    lock_guard.forget();
    ph.mark("released");
    reported?;
    phases.extend(release_phases);
    drop(announce_socket);
    drop(unmapper);
    if let Some(l) = unneeded_lock {
        l.thaw()?;
    }
    if hello.lazy {
        let r = crate::pager::run(ch, uffds, &lazy, restored.init_pid, restored.pid)?;
        eprintln!(
            "ferryd: post-copy of pid {}: {:.1} MiB in {:.0} ms, {} faults, {} page requests, {} zero pages",
            restored.pid,
            r.bytes as f64 / 1048576.0,
            r.ms,
            r.faults,
            r.requests,
            r.zero_pages
        );
        phases.push(("post-copy".to_string(), r.ms));
    }
    Ok(Served { pid: restored.pid, host_pid: restored.host_pid, page_bytes: store.bytes(), phases })
}

/// Whether the tree is restored in this agent's own PID namespace rather
/// than in a new one under a helper: one fork fewer, and with it one copy
/// of the page tables of every placed page (~20 ms per GiB in the pause).
/// Only when every PID of the tree is free here, the tree did not have a
/// PID namespace of its own, the root's threads have no parent-death
/// signal and the root exits with SIGCHLD (their parent, this worker,
/// exits after the migration, and the root then belongs to ferryd, the
/// child subreaper), and not post-copy
/// (whose pager needs the tree in a namespace it can wait on).
fn restore_here(tree: &TreeImage, lazy: bool) -> bool {
    let Some(root) = tree.root() else {
        return false;
    };
    !lazy
        && !tree.own_pid_namespace
        && root.fidelity.threads.iter().all(|t| t.pdeathsig == 0)
        // Adoption resets the exit signal to SIGCHLD.
        && root.fidelity.exit_signal == libc::SIGCHLD
        && ferry_engine::restore::pids_free_here(tree)
}

/// A restored tree held stopped, in this agent's PID namespace or in a
/// new one under a helper.
enum HeldTree {
    Here(ferry_engine::restore::Held),
    InNamespace(ferry_engine::restore::HeldInNamespace),
}

impl HeldTree {
    fn phases(&self) -> Vec<(String, f64)> {
        match self {
            HeldTree::Here(h) => h.phases().done().to_vec(),
            HeldTree::InNamespace(h) => h.phases.clone(),
        }
    }

    fn take_uffds(&mut self) -> Vec<(i32, std::os::fd::OwnedFd)> {
        match self {
            // Never post-copy (see restore_here).
            HeldTree::Here(_) => Vec::new(),
            HeldTree::InNamespace(h) => std::mem::take(&mut h.uffds),
        }
    }

    /// Lets the tree run and calls `running` as soon as it does (before
    /// the network lock is taken down, which the helper of a new
    /// namespace does on its own after reporting).
    fn release_then(
        self,
        running: impl FnOnce(&ferry_engine::restore::Restored),
    ) -> Result<ferry_engine::restore::Restored> {
        Ok(match self {
            HeldTree::Here(h) => h.release_then(running)?,
            HeldTree::InNamespace(h) => {
                let r = h.release()?;
                running(&r);
                r
            }
        })
    }
}

/// A thread joined when this is dropped, on every path out.
struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

/// `runs` cut where a mapping ends. The store joins pages adjacent in
/// memory and in the store into one run, also across two mappings (a
/// read-write page next to a read-only one, both sent in the same round);
/// the restore makes a mapping writable for its pages only when a run
/// starts in it, and an image's runs must each lie in one mapping.
fn split_at_mappings(runs: Vec<PageRun>, vmas: &[Vma]) -> Vec<PageRun> {
    const PAGE: u64 = 4096;
    let mut out = Vec::with_capacity(runs.len());
    let mut vi = 0;
    for mut r in runs {
        loop {
            while vi < vmas.len() && vmas[vi].end <= r.start {
                vi += 1;
            }
            match vmas.get(vi) {
                Some(v) if v.start <= r.start && v.end < r.start + r.pages * PAGE => {
                    let n = (v.end - r.start) / PAGE;
                    out.push(PageRun { start: r.start, pages: n, offset: r.offset, checksum: 0 });
                    r = PageRun {
                        start: v.end,
                        pages: r.pages - n,
                        offset: r.offset + n * PAGE,
                        checksum: 0,
                    };
                }
                _ => {
                    out.push(r);
                    break;
                }
            }
        }
    }
    out
}

/// Releases a handed-over lock by name unless the restored tree took it.
struct LockByName(Option<String>);

impl LockByName {
    fn forget(mut self) {
        self.0 = None;
    }
}

impl Drop for LockByName {
    fn drop(&mut self) {
        if let Some(name) = self.0.take() {
            if let Err(e) = ferry_netlock::release(&name) {
                tracing::warn!("releasing network lock {name}: {e}");
            }
        }
    }
}

fn check_hello(h: &protocol::Hello, cfg: &DestinationConfig) -> std::result::Result<(), String> {
    if h.protocol != protocol::PROTOCOL_VERSION {
        return Err(format!(
            "migration protocol {} (this ferryd speaks {})",
            h.protocol,
            protocol::PROTOCOL_VERSION
        ));
    }
    let (major, minor) = crate::FORMAT;
    if h.format.0 != major || h.format.1 > minor {
        return Err(format!(
            "the source writes image format {}.{}, this ferryd reads {major}.0 to {major}.{minor}: upgrade ferry here",
            h.format.0, h.format.1
        ));
    }
    if h.arch != std::env::consts::ARCH {
        return Err(format!("the source is {}, this host {}", h.arch, std::env::consts::ARCH));
    }
    if h.address.is_some() && cfg.interface.is_none() {
        return Err("this ferryd has no interface for a service address (start it with --interface, or listen on an interface's address)".into());
    }
    Ok(())
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        16 => {
            let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

/// What the lock holds here until the tree is released: the tree's
/// established connections, and new connection attempts to its listeners
/// (a SYN answered by no listener would be refused).
fn held_tuples(tree: &TreeImage) -> Vec<Tuple> {
    let mut out = Vec::new();
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::InetSocket(s) = &f.kind else {
                continue;
            };
            if s.sock_type != libc::SOCK_STREAM {
                continue;
            }
            let Some(local_ip) = ip_of(&s.addr) else {
                continue;
            };
            let local = SocketAddr::new(local_ip, s.port);
            if s.listen_backlog.is_some() {
                if !local_ip.is_unspecified() && !local_ip.is_loopback() {
                    out.push(Tuple::new_connections_to(local));
                }
                continue;
            }
            if let (Some(_), Some((peer, port))) = (&s.connection, &s.peer) {
                if let Some(remote) = ip_of(peer) {
                    out.push(Tuple { local, remote: SocketAddr::new(remote, *port) });
                }
            }
        }
    }
    out.sort_by_key(|t| (t.local, t.remote));
    out.dedup_by_key(|t| (t.local, t.remote));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_cut_at_mapping_ends() {
        let vma = |start: u64, end: u64| Vma {
            start,
            end,
            prot: 3,
            shared: false,
            flags: 0,
            pgoff: 0,
            backing: ferry_image::VmaBacking::Anonymous,
        };
        let vmas = [vma(0x1000, 0x3000), vma(0x3000, 0x4000), vma(0x4000, 0x8000)];
        let run =
            |start: u64, pages: u64, offset: u64| PageRun { start, pages, offset, checksum: 0 };
        let out = split_at_mappings(vec![run(0x2000, 4, 0), run(0x7000, 1, 0x8000)], &vmas);
        assert_eq!(
            out,
            vec![
                run(0x2000, 1, 0),
                run(0x3000, 1, 0x1000),
                run(0x4000, 2, 0x2000),
                run(0x7000, 1, 0x8000)
            ]
        );
    }
}
