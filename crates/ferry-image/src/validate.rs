//! Checks an image must pass before restore touches anything: every
//! address, size and count in range and consistent with the others. The
//! engine can then trust the image's shape; the kernel still has the last
//! word on the values.

use crate::error::ImageError;
use crate::model::*;

/// Highest user address on x86_64 with 4-level paging.
pub const USER_ADDR_END: u64 = 0x7fff_ffff_f000;
pub const MAX_THREADS: usize = 32768;
pub const MAX_FDS: i32 = 1 << 20;
pub const MAX_XSTATE: usize = 16384;
pub const REGS_WORDS: usize = 27;

fn bad<T>(msg: String) -> Result<T, ImageError> {
    Err(ImageError::Invalid(msg))
}

pub const MAX_PROCESSES: usize = 32768;

fn check_extents(what: &str, size: u64, extents: &[(u64, Vec<u8>)]) -> Result<(), ImageError> {
    if extents.iter().any(|(off, d)| off.checked_add(d.len() as u64).is_none_or(|e| e > size)) {
        return bad(format!("{what} has data beyond its size"));
    }
    Ok(())
}

/// The whole tree: every process, and the relations between them.
pub fn validate(inv: &Inventory, t: &TreeImage) -> Result<(), ImageError> {
    // The inventory holds the major version only (the minor is in the
    // file header).
    if inv.format_version != crate::FORMAT_MAJOR {
        return Err(ImageError::Version {
            found: inv.format_version,
            supported: crate::FORMAT_MAJOR,
        });
    }
    if t.processes.is_empty() || t.processes.len() + t.zombies.len() > MAX_PROCESSES {
        return bad(format!("{} processes", t.processes.len()));
    }
    let seen = validate_processes(inv, t)?;
    validate_ids(t, &seen)?;
    let shm = validate_shared_memory(t)?;
    validate_sysv_ipc(t)?;
    validate_shared_memory_refs(t, &shm)?;
    validate_unix_in_flight(t, &seen)?;
    validate_inotify_deleted(t)?;
    validate_cgroups(t)?;
    validate_unix_dead_peers(t)?;
    validate_unix_peers(t)
}

/// An inotify watch on "PATH (deleted)" (format 4.4) goes on the deleted
/// file of the tree that /proc named so: there must be exactly one such
/// open file description.
fn validate_inotify_deleted(t: &TreeImage) -> Result<(), ImageError> {
    let files = || t.processes.iter().flat_map(|p| &p.files);
    let mut deleted: std::collections::HashMap<String, std::collections::HashSet<u64>> =
        std::collections::HashMap::new();
    for f in files() {
        if let FileKind::Deleted { path, .. } = &f.kind {
            deleted.entry(format!("{path} (deleted)")).or_default().insert(f.id);
        }
    }
    for f in files() {
        let FileKind::Inotify { watches } = &f.kind else { continue };
        for w in watches.iter().filter(|w| w.path.ends_with(" (deleted)")) {
            if deleted.get(&w.path).map_or(0, |ids| ids.len()) != 1 {
                return bad(format!(
                    "inotify watch {} is on {}, which is not exactly one deleted file of the tree",
                    w.wd, w.path
                ));
            }
        }
    }
    Ok(())
}

/// Each process in turn, parents first; returns the pids seen.
fn validate_processes(
    inv: &Inventory,
    t: &TreeImage,
) -> Result<std::collections::HashSet<i32>, ImageError> {
    // Every lookup below goes through a sorted list or a set: a hostile
    // image must not make validation quadratic.
    let mut seen: std::collections::HashSet<i32> =
        std::collections::HashSet::with_capacity(t.processes.len());
    for (i, p) in t.processes.iter().enumerate() {
        // Parents first: restore forks each child from its parent.
        if i > 0 && !seen.contains(&p.ppid) {
            return bad(format!("process {} comes before its parent {}", p.pid, p.ppid));
        }
        if i == 0 && p.fidelity.shares_files_with_parent {
            return bad("the root process cannot share its parent's fd table".into());
        }
        if i == 0 && !p.inherited.is_empty() {
            return bad("the root process cannot inherit mappings".into());
        }
        validate_process(inv, p)?;
        validate_inherited(p)?;
        seen.insert(p.pid);
    }
    Ok(seen)
}

/// Mappings a child inherits from its parent: each is one of its own
/// mappings, and its shared pages lie inside it, in order.
fn validate_inherited(p: &ProcessImage) -> Result<(), ImageError> {
    // vmas are sorted and non-overlapping (checked by validate_process).
    for v in &p.inherited {
        let k = p.vmas.partition_point(|w| w.start < v.start);
        if p.vmas.get(k).is_none_or(|w| w.start != v.start || w.end != v.end) {
            return bad(format!(
                "process {}: an inherited mapping is not one of its mappings",
                p.pid
            ));
        }
        let mut prev = v.start;
        for &crate::model::PageSpan { start: a, pages: n } in &v.shared_pages {
            let end = n.checked_mul(4096).and_then(|l| a.checked_add(l));
            if a % 4096 != 0 || n == 0 || a < prev || end.is_none_or(|e| e > v.end) {
                return bad(format!("process {}: shared pages at {a:#x} lie outside their inherited mapping or out of order", p.pid));
            }
            prev = end.unwrap_or(v.end);
        }
    }
    Ok(())
}

/// Zombies hang off a process of the tree; no pid or tid repeats.
fn validate_ids(t: &TreeImage, seen: &std::collections::HashSet<i32>) -> Result<(), ImageError> {
    let mut ids: Vec<i32> =
        t.processes.iter().flat_map(|p| p.threads.iter().map(|t| t.tid)).collect();
    for z in &t.zombies {
        if !seen.contains(&z.ppid) {
            return bad(format!("zombie {} has no parent in the tree", z.pid));
        }
        ids.push(z.pid);
    }
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) || ids.iter().any(|&t| t <= 0 || t > 4_194_304) {
        return bad("process or thread ids repeat or are out of range".into());
    }
    Ok(())
}

/// The ids of the tree's shared memory objects, sorted, for lookups.
struct SharedMemoryIds {
    anon: Vec<u64>,
    sysv: Vec<i32>,
}

fn validate_shared_memory(t: &TreeImage) -> Result<SharedMemoryIds, ImageError> {
    for m in &t.shared_anon {
        check_extents("shared memory", m.size, &m.extents)?;
    }
    for s in &t.sysv_shm {
        check_extents(&format!("SysV segment {}", s.id), s.size, &s.extents)?;
    }
    let mut anon: Vec<u64> = t.shared_anon.iter().map(|m| m.id).collect();
    anon.sort_unstable();
    let mut sysv: Vec<i32> = t.sysv_shm.iter().map(|s| s.id).collect();
    sysv.sort_unstable();
    if anon.windows(2).any(|w| w[0] == w[1]) || sysv.windows(2).any(|w| w[0] == w[1]) {
        return bad("a shared memory object appears twice".into());
    }
    Ok(SharedMemoryIds { anon, sysv })
}

fn validate_sysv_ipc(t: &TreeImage) -> Result<(), ImageError> {
    let mut sem_ids: Vec<i32> = t.sysv_sem.iter().map(|s| s.id).collect();
    sem_ids.sort_unstable();
    let mut msg_ids: Vec<i32> = t.sysv_msg.iter().map(|q| q.id).collect();
    msg_ids.sort_unstable();
    if sem_ids.windows(2).any(|w| w[0] == w[1]) || msg_ids.windows(2).any(|w| w[0] == w[1]) {
        return bad("a SysV semaphore set or message queue appears twice".into());
    }
    for s in &t.sysv_sem {
        // SEMMSL's ceiling and SEMVMX, as the kernel enforces them.
        if s.id < 0
            || s.values.is_empty()
            || s.values.len() > 32_000
            || s.values.iter().any(|&v| v > 32_767)
        {
            return bad(format!("SysV semaphore set {}: bad id, size or value", s.id));
        }
    }
    for q in &t.sysv_msg {
        let bytes: u64 = q.messages.iter().map(|(_, m)| m.len() as u64).sum();
        if q.id < 0 || q.messages.iter().any(|(ty, _)| *ty <= 0) || bytes > q.max_bytes {
            return bad(format!("SysV message queue {}: bad id, message type or size", q.id));
        }
    }
    Ok(())
}

/// Every shared mapping refers to an object the image holds.
fn validate_shared_memory_refs(t: &TreeImage, shm: &SharedMemoryIds) -> Result<(), ImageError> {
    for p in &t.processes {
        for v in &p.vmas {
            let missing = match &v.backing {
                VmaBacking::SharedAnon { id } => shm.anon.binary_search(id).is_err(),
                VmaBacking::SysvShm { id } => shm.sysv.binary_search(id).is_err(),
                _ => false,
            };
            if missing {
                return bad(format!(
                    "process {}: mapping {:#x} refers to shared memory the image does not hold",
                    p.pid, v.start
                ));
            }
        }
    }
    Ok(())
}

/// The `UnixPeers` section: restore makes each listed connection (or
/// listen() call) in the process named, with the uid and gid given, so every entry must name a
/// connected or listening unix socket of the tree (once) and a process of the tree,
/// and ids must be real ones: -1 would mean "unchanged" to setresuid.
/// Supplementary groups restore can give a process for one call (they
/// travel through its scratch area); NGROUPS_MAX is 65536.
pub const MAX_PEER_GROUPS: usize = 4096;

pub fn validate_unix_peers(t: &TreeImage) -> Result<(), ImageError> {
    let Some(up) = &t.unix_peers else {
        return Ok(());
    };
    let pids: std::collections::HashSet<i32> = t.processes.iter().map(|p| p.pid).collect();
    let connected: std::collections::HashSet<u64> = t
        .processes
        .iter()
        .flat_map(|p| &p.files)
        .filter_map(|f| match &f.kind {
            FileKind::UnixSocket(u) if u.peer.is_some() || u.listen_backlog.is_some() => {
                Some(u.ino)
            }
            _ => None,
        })
        .chain(t.unix_dead_peers.iter().flat_map(|d| d.sockets.iter().map(|s| s.ino)))
        .collect();
    let mut seen = std::collections::HashSet::with_capacity(up.sockets.len().min(connected.len()));
    for c in &up.sockets {
        if !connected.contains(&c.ino) {
            return bad(format!("unix peers section: socket {} is not a connected or listening unix socket of the tree", c.ino));
        }
        if !seen.insert(c.ino) {
            return bad(format!("unix peers section: socket {} listed twice", c.ino));
        }
        if !pids.contains(&c.pid) {
            return bad(format!(
                "unix peers section: socket {}: peer pid {} is not a process of the tree",
                c.ino, c.pid
            ));
        }
        if c.uid == u32::MAX
            || c.gid == u32::MAX
            || c.groups.len() > MAX_PEER_GROUPS
            || c.groups.contains(&u32::MAX)
        {
            return bad(format!(
                "unix peers section: socket {}: bad uid {}, gid {} or groups ({} of them)",
                c.ino,
                c.uid,
                c.gid,
                c.groups.len()
            ));
        }
    }
    Ok(())
}

/// The `UnixDeadPeers` section: each entry names an unconnected, not
/// listening unix socket of the tree (once) with nothing in flight in its
/// queue (restore sends it from a stand-in it closes before any process
/// exists), a peer name that fits a sockaddr_un, and says "client" only
/// for a stream or seqpacket socket whose peer had a name to connect to.
pub fn validate_unix_dead_peers(t: &TreeImage) -> Result<(), ImageError> {
    let Some(dp) = &t.unix_dead_peers else {
        return Ok(());
    };
    let sockets: std::collections::HashMap<u64, &crate::model::UnixSocket> = t
        .processes
        .iter()
        .flat_map(|p| &p.files)
        .filter_map(|f| match &f.kind {
            FileKind::UnixSocket(u) => Some((u.ino, u)),
            _ => None,
        })
        .collect();
    let mut seen = std::collections::HashSet::with_capacity(dp.sockets.len().min(sockets.len()));
    for d in &dp.sockets {
        let what = format!("unix dead peers section: socket {}", d.ino);
        let Some(u) = sockets.get(&d.ino) else {
            return bad(format!("{what} is not a unix socket of the tree"));
        };
        if !seen.insert(d.ino) {
            return bad(format!("{what} listed twice"));
        }
        if u.peer.is_some() || u.listen_backlog.is_some() || !u.in_flight.is_empty() {
            return bad(format!("{what} is connected, listening or has messages in flight"));
        }
        if d.peer_name.len() >= MAX_UNIX_NAME {
            return bad(format!("{what}: peer name of {} bytes", d.peer_name.len()));
        }
        let stream = matches!(u.sock_type, libc_consts::SOCK_STREAM | libc_consts::SOCK_SEQPACKET);
        if d.client && (!stream || d.peer_name.is_empty()) {
            return bad(format!("{what}: a client without a peer name to connect to"));
        }
    }
    Ok(())
}

/// The `UnixInFlightFiles` section against the tree: every descriptor in
/// flight held by no process has exactly one entry and every entry one
/// such descriptor; an entry's file is of a kind restore makes on its
/// own (a regular file, a directory, a device, an eventfd), and one id is
/// one description (the same file in every entry that has it, and no
/// file of a process).
pub fn validate_unix_in_flight_files(t: &TreeImage) -> Result<(), ImageError> {
    let mut slots = std::collections::HashSet::new();
    for f in t.processes.iter().flat_map(|p| &p.files) {
        let FileKind::UnixSocket(u) = &f.kind else { continue };
        for m in &u.in_flight {
            for (i, d) in m.fds.iter().enumerate() {
                if *d == PassedFd::HELD_BY_NONE {
                    slots.insert((u.ino, m.message, i as u32));
                }
            }
        }
    }
    let entries = t.unix_in_flight_files.as_ref().map_or(&[][..], |f| f.files.as_slice());
    let ids: std::collections::HashSet<u64> =
        t.processes.iter().flat_map(|p| p.files.iter().map(|f| f.id)).collect();
    let mut seen = std::collections::HashMap::new();
    for e in entries {
        let what = format!(
            "unix in-flight files section: socket {} message {} descriptor {}",
            e.socket, e.message, e.index
        );
        if !slots.remove(&(e.socket, e.message, e.index)) {
            return bad(format!(
                "{what} is not a descriptor in flight held by no process, or is listed twice"
            ));
        }
        let plain = matches!(
            e.file.kind,
            FileKind::Regular { .. }
                | FileKind::Directory { .. }
                | FileKind::CharDevice { .. }
                | FileKind::EventFd { .. }
        );
        if !plain || !e.file.locks.is_empty() || ids.contains(&e.file.id) {
            return bad(format!("{what}: a file of a kind not made on its own, with locks, or with the id of a process's file"));
        }
        if seen.insert(e.file.id, &e.file).is_some_and(|f| *f != e.file) {
            return bad(format!("{what}: id {} names two different files", e.file.id));
        }
    }
    if let Some((ino, m, i)) = slots.into_iter().next() {
        return bad(format!("unix socket {ino}: descriptor {i} in flight in message {m} is held by no process and the image does not hold its file"));
    }
    Ok(())
}

/// sun_path's size: a name (with an abstract name's leading NUL) is shorter.
const MAX_UNIX_NAME: usize = 108;

/// The socket types of Linux (this crate does not link libc).
mod libc_consts {
    pub const SOCK_STREAM: i32 = 1;
    pub const SOCK_SEQPACKET: i32 = 5;
}

/// The `Cgroups` section: restore writes PIDs into files under each
/// recorded path, so a path must stay inside its hierarchy (absolute, no
/// `.` or `..` component, no NUL or newline), and every entry must name
/// a process of the tree, once.
pub fn validate_cgroups(t: &TreeImage) -> Result<(), ImageError> {
    let Some(cg) = &t.cgroups else { return Ok(()) };
    let pids: std::collections::HashSet<i32> = t.processes.iter().map(|p| p.pid).collect();
    let mut seen = std::collections::HashSet::with_capacity(cg.processes.len().min(pids.len()));
    for p in &cg.processes {
        if !pids.contains(&p.pid) {
            return bad(format!("cgroups section: pid {} is not a process of the tree", p.pid));
        }
        if !seen.insert(p.pid) {
            return bad(format!("cgroups section: pid {} listed twice", p.pid));
        }
        if p.memberships.len() > 64 {
            return bad(format!(
                "cgroups section: pid {} is in {} hierarchies",
                p.pid,
                p.memberships.len()
            ));
        }
        for m in &p.memberships {
            let path_ok = m.path.starts_with('/')
                && m.path.len() <= 4096
                && !m.path.contains(['\0', '\n'])
                && m.path.split('/').all(|c| c != "." && c != "..");
            let controllers_ok = m.controllers.len() <= 256
                && m.controllers
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | '=' | '-' | '.'));
            if !path_ok || !controllers_ok {
                return bad(format!(
                    "cgroups section: pid {}: bad cgroup {:?}:{:?}",
                    p.pid, m.controllers, m.path
                ));
            }
        }
    }
    Ok(())
}

/// An `Incremental` section against the tree it belongs to (which
/// [`validate`] has accepted): every entry names a process of the tree,
/// once; its ranges are page-aligned, non-empty, sorted and
/// non-overlapping, with no overflow; each lies inside one mapping of that
/// process and overlaps none of its page runs (a page is either in this
/// image or in the parent, never both). Linear in the number of ranges,
/// mappings and runs.
pub fn validate_incremental(t: &TreeImage, inc: &Incremental) -> Result<(), ImageError> {
    let by_pid: std::collections::HashMap<i32, &ProcessImage> =
        t.processes.iter().map(|p| (p.pid, p)).collect();
    let mut seen: std::collections::HashSet<i32> =
        std::collections::HashSet::with_capacity(inc.parent_pages.len().min(by_pid.len()));
    for pp in &inc.parent_pages {
        let Some(p) = by_pid.get(&pp.pid) else {
            return bad(format!(
                "incremental section: parent pages for pid {}, which is not a process of the tree",
                pp.pid
            ));
        };
        if !seen.insert(pp.pid) {
            return bad(format!(
                "incremental section: parent pages for pid {} listed twice",
                pp.pid
            ));
        }
        let (mut vi, mut ri, mut prev_end) = (0usize, 0usize, 0u64);
        for &crate::model::PageSpan { start, pages } in &pp.ranges {
            let at = || {
                format!(
                    "incremental section: pid {}: parent pages at {start:#x} ({pages} pages)",
                    pp.pid
                )
            };
            if pages == 0 || start % 4096 != 0 {
                return bad(format!("{} are empty or misaligned", at()));
            }
            let Some(end) = pages.checked_mul(4096).and_then(|l| start.checked_add(l)) else {
                return bad(format!("{}: the range overflows", at()));
            };
            if start < prev_end {
                return bad(format!("{} are out of order or overlap the range before", at()));
            }
            prev_end = end;
            while p.vmas.get(vi).is_some_and(|v| v.end <= start) {
                vi += 1;
            }
            if !p.vmas.get(vi).is_some_and(|v| v.start <= start && end <= v.end) {
                return bad(format!("{} lie outside every mapping of the process", at()));
            }
            let run_end = |r: &PageRun| r.start.saturating_add(r.pages.saturating_mul(4096));
            while p.page_runs.get(ri).is_some_and(|r| run_end(r) <= start) {
                ri += 1;
            }
            if let Some(r) = p.page_runs.get(ri).filter(|r| r.start < end) {
                return bad(format!(
                    "{} overlap the page run at {:#x} this image holds",
                    at(),
                    r.start
                ));
            }
        }
    }
    Ok(())
}

/// SCM_RIGHTS and SCM_CREDENTIALS of queued unix messages: each names a
/// queued message, in order; passed descriptors are fds of processes of
/// the tree, credentials name one of its processes.
fn validate_unix_in_flight(
    t: &TreeImage,
    pids: &std::collections::HashSet<i32>,
) -> Result<(), ImageError> {
    let mut fds: Option<std::collections::HashSet<(i32, i32)>> = None;
    for p in &t.processes {
        for f in &p.files {
            let FileKind::UnixSocket(u) = &f.kind else {
                continue;
            };
            let mut prev: Option<u32> = None;
            for m in &u.in_flight {
                if m.message as usize >= u.queued.len() || prev.is_some_and(|q| q >= m.message) {
                    return bad(format!("process {}: unix socket {}: ancillary data for a message it does not queue, or out of order", p.pid, u.ino));
                }
                prev = Some(m.message);
                if u.peer.is_none() || m.fds.len() > 253 || (m.fds.is_empty() && m.creds.is_none())
                {
                    return bad(format!(
                        "process {}: unix socket {}: malformed ancillary data",
                        p.pid, u.ino
                    ));
                }
                if m.creds.is_some_and(|c| !pids.contains(&c.pid)) {
                    return bad(format!(
                        "process {}: unix socket {}: credentials of a process not in the tree",
                        p.pid, u.ino
                    ));
                }
                let all = fds.get_or_insert_with(|| {
                    t.processes
                        .iter()
                        .flat_map(|q| q.fds.iter().map(move |s| (q.pid, s.fd)))
                        .collect()
                });
                // Descriptors held by no process: `validate_unix_in_flight_files`.
                if m.fds
                    .iter()
                    .any(|d| *d != PassedFd::HELD_BY_NONE && !all.contains(&(d.pid, d.fd)))
                {
                    return bad(format!("process {}: unix socket {}: a descriptor in flight is not an fd of the tree", p.pid, u.ino));
                }
            }
        }
    }
    Ok(())
}

fn validate_process(inv: &Inventory, p: &ProcessImage) -> Result<(), ImageError> {
    if p.pid <= 0 || p.pid > 4_194_304 {
        return bad(format!("pid {} out of range", p.pid));
    }
    let tids = validate_threads(p)?;
    validate_vmas(p)?;
    validate_page_runs(inv, p)?;
    let fds = validate_fds(p)?;
    validate_files(p, &fds)?;
    let memfd_ids = validate_memfds(p)?;
    let has_memfd = |id: &u64| memfd_ids.binary_search(id).is_ok();
    validate_signals(p)?;
    validate_fidelity(p, &tids, &has_memfd)
}

/// Returns the thread ids, sorted.
fn validate_threads(p: &ProcessImage) -> Result<Vec<i32>, ImageError> {
    if p.threads.is_empty() || p.threads.len() > MAX_THREADS {
        return bad(format!("{} threads", p.threads.len()));
    }
    if p.threads[0].tid != p.pid {
        return bad(format!("first thread {} is not the leader {}", p.threads[0].tid, p.pid));
    }
    let mut tids: Vec<i32> = p.threads.iter().map(|t| t.tid).collect();
    tids.sort_unstable();
    if tids.windows(2).any(|w| w[0] == w[1]) || tids.iter().any(|&t| t <= 0 || t > 4_194_304) {
        return bad("thread ids repeat or are out of range".into());
    }
    for t in &p.threads {
        if t.regs.len() != REGS_WORDS {
            return bad(format!(
                "thread {}: {} register words, expected {REGS_WORDS}",
                t.tid,
                t.regs.len()
            ));
        }
        if t.xstate.len() < 576 || t.xstate.len() > MAX_XSTATE {
            return bad(format!("thread {}: xstate of {} bytes", t.tid, t.xstate.len()));
        }
        if t.sched.cpus.len() > 128 {
            return bad(format!("thread {}: CPU mask of {} words", t.tid, t.sched.cpus.len()));
        }
        if t.pending.iter().any(|s| s.len() != 128) {
            return bad(format!("thread {}: malformed pending siginfo", t.tid));
        }
    }
    Ok(tids)
}

fn validate_vmas(p: &ProcessImage) -> Result<(), ImageError> {
    let mut prev_end = 0u64;
    for v in &p.vmas {
        let aligned = v.start % 4096 == 0 && v.end % 4096 == 0;
        let special = matches!(v.backing, VmaBacking::Vsyscall);
        if !aligned || v.start >= v.end || v.start < prev_end || (!special && v.end > USER_ADDR_END)
        {
            return bad(format!(
                "mapping {:#x}-{:#x} is misaligned, empty, overlapping or out of range",
                v.start, v.end
            ));
        }
        prev_end = v.end;
    }
    Ok(())
}

/// Page runs are sorted, each inside one mapping (the mappings are
/// sorted: one pass over both) and inside the page data.
fn validate_page_runs(inv: &Inventory, p: &ProcessImage) -> Result<(), ImageError> {
    let mut vi = 0usize;
    let mut prev_run_end = 0u64;
    for r in &p.page_runs {
        let len = r
            .pages
            .checked_mul(4096)
            .ok_or_else(|| ImageError::Invalid("page run length overflows".into()))?;
        let end = r
            .start
            .checked_add(len)
            .ok_or_else(|| ImageError::Invalid("page run end overflows".into()))?;
        if r.pages == 0 || r.start % 4096 != 0 || r.offset % 4096 != 0 || r.start < prev_run_end {
            return bad(format!("page run at {:#x} is empty, misaligned or out of order", r.start));
        }
        prev_run_end = end;
        while vi < p.vmas.len() && p.vmas[vi].end <= r.start {
            vi += 1;
        }
        match p.vmas.get(vi) {
            Some(v) if v.start <= r.start && end <= v.end => {}
            _ => {
                return bad(format!(
                    "page run {:#x}-{:#x} lies outside every mapping",
                    r.start, end
                ))
            }
        }
        let run_data_end = r
            .offset
            .checked_add(len)
            .ok_or_else(|| ImageError::Invalid("page offset overflows".into()))?;
        if run_data_end > inv.pages_bytes {
            return bad(format!("page run at {:#x} points past the end of page data", r.start));
        }
    }
    Ok(())
}

/// Returns the fd numbers, sorted.
fn validate_fds(p: &ProcessImage) -> Result<Vec<i32>, ImageError> {
    let mut fds: Vec<i32> = Vec::with_capacity(p.fds.len());
    for s in &p.fds {
        if s.fd < 0 || s.fd >= MAX_FDS {
            return bad(format!("fd {} out of range", s.fd));
        }
        if s.file as usize >= p.files.len() {
            return bad(format!("fd {} refers to missing file {}", s.fd, s.file));
        }
        fds.push(s.fd);
    }
    fds.sort_unstable();
    if fds.windows(2).any(|w| w[0] == w[1]) {
        return bad("an fd number appears twice".into());
    }
    Ok(fds)
}

/// The open files, against the process's sorted fd numbers.
fn validate_files(p: &ProcessImage, sorted_fds: &[i32]) -> Result<(), ImageError> {
    let retargets: std::collections::HashSet<(u32, i32)> =
        p.fidelity.epoll_targets.iter().map(|t| (t.epoll_file, t.fd)).collect();
    for (fi, f) in p.files.iter().enumerate() {
        if let FileKind::Epoll { entries } = &f.kind {
            let retargeted = |fd: i32| retargets.contains(&(fi as u32, fd));
            if entries.iter().any(|e| sorted_fds.binary_search(&e.fd).is_err() && !retargeted(e.fd))
            {
                return bad("epoll entry refers to an fd the process does not have".into());
            }
        }
        if let FileKind::ProcFile { path } = &f.kind {
            if !path.starts_with("/proc/") || path.contains("/../") {
                return bad(format!("/proc file {path:?} is not under /proc"));
            }
        }
        if let FileKind::Inotify { watches } = &f.kind {
            if watches.len() > 1 << 20
                || watches.windows(2).any(|w| w[0].wd >= w[1].wd)
                || watches.first().is_some_and(|w| w.wd <= 0)
            {
                return bad(
                    "inotify watches out of order, repeated or with a descriptor below 1".into()
                );
            }
        }
        if let FileKind::InetSocket(s) = &f.kind {
            validate_inet_socket(p, s)?;
        }
    }
    Ok(())
}

fn validate_inet_socket(p: &ProcessImage, s: &crate::InetSocket) -> Result<(), ImageError> {
    let want = if s.family == 2 { 4 } else { 16 };
    if s.addr.len() != want || s.peer.as_ref().is_some_and(|(a, _)| a.len() != want) {
        return bad("socket address of wrong length".into());
    }
    if let Some(c) = &s.connection {
        check_tcp_connection(s, c).map_err(|why| {
            ImageError::Invalid(format!("pid {}: TCP connection on port {}: {why}", p.pid, s.port))
        })?;
    }
    Ok(())
}

/// Returns the memfd ids, sorted, once every reference to one is known
/// to resolve.
fn validate_memfds(p: &ProcessImage) -> Result<Vec<u64>, ImageError> {
    for m in &p.memfds {
        check_extents(&format!("memfd {}", m.name), m.size, &m.extents)?;
    }
    let mut memfd_ids: Vec<u64> = p.memfds.iter().map(|m| m.id).collect();
    memfd_ids.sort_unstable();
    let has_memfd = |id: &u64| memfd_ids.binary_search(id).is_ok();
    if p.vmas.iter().any(|v| matches!(&v.backing, VmaBacking::Memfd { id } if !has_memfd(id)))
        || p.files.iter().any(|f| matches!(&f.kind, FileKind::Memfd { id } if !has_memfd(id)))
    {
        return bad("a mapping or fd refers to a memfd the image does not hold".into());
    }
    Ok(memfd_ids)
}

/// Signal state and the auxiliary vector.
fn validate_signals(p: &ProcessImage) -> Result<(), ImageError> {
    if p.signals.actions.len() != 64 {
        return bad(format!("{} signal actions, expected 64", p.signals.actions.len()));
    }
    if p.signals.shared_pending.iter().any(|s| s.len() != 128) {
        return bad("malformed pending siginfo".into());
    }
    if !p.mm.auxv.len().is_multiple_of(2) || p.mm.auxv.len() > 512 {
        return bad("malformed auxiliary vector".into());
    }
    Ok(())
}

/// The kernel's limit on one classic BPF program (BPF_MAXINSNS).
pub const MAX_SECCOMP_INSNS: usize = 4096;
/// Filters per thread: the kernel caps the chain at MAX_INSNS_PER_PATH
/// (32768) instructions, at least 1 each.
pub const MAX_SECCOMP_CHAIN: usize = 32768;

/// Format-4 state: every reference points at something the image holds.
fn validate_fidelity(
    p: &ProcessImage,
    sorted_tids: &[i32],
    has_memfd: &dyn Fn(&u64) -> bool,
) -> Result<(), ImageError> {
    let f = &p.fidelity;
    if f.seccomp_filters.iter().any(|s| s.insns.is_empty() || s.insns.len() > MAX_SECCOMP_INSNS) {
        return bad("seccomp filter with no or too many instructions".into());
    }
    for d in &f.deleted_files {
        check_extents(&format!("deleted file {}", d.name), d.size, &d.extents)?;
    }
    if p.vmas.iter().any(|v| matches!(v.backing, VmaBacking::DeletedFile { id } if !f.deleted_files.iter().any(|d| d.id == id))) {
        return bad("a mapping refers to a deleted file the image does not hold".into());
    }
    if !(0..=64).contains(&f.exit_signal) {
        return bad(format!("exit signal {}", f.exit_signal));
    }
    validate_thread_fidelity(p, sorted_tids)?;
    validate_epoll_targets(p)?;
    validate_file_fidelity(p)?;
    validate_inode_attrs(p, has_memfd)
}

/// Per-thread seccomp state and parent-death signals.
fn validate_thread_fidelity(p: &ProcessImage, sorted_tids: &[i32]) -> Result<(), ImageError> {
    let f = &p.fidelity;
    if f.threads.len() > p.threads.len() {
        return bad("more seccomp/thread entries than threads".into());
    }
    for t in &f.threads {
        if sorted_tids.binary_search(&t.tid).is_err() {
            return bad(format!("per-thread state for thread {} the process does not have", t.tid));
        }
        if t.seccomp_mode > 2
            || (t.seccomp_mode != 2 && !t.seccomp.is_empty())
            || (t.seccomp_mode == 2 && t.seccomp.is_empty())
        {
            return bad(format!(
                "thread {}: seccomp mode {} with {} filters",
                t.tid,
                t.seccomp_mode,
                t.seccomp.len()
            ));
        }
        if t.seccomp.len() > MAX_SECCOMP_CHAIN
            || t.seccomp.iter().any(|&i| i as usize >= f.seccomp_filters.len())
        {
            return bad(format!("thread {}: seccomp filter index out of range", t.tid));
        }
        if !(0..=64).contains(&t.pdeathsig) {
            return bad(format!("thread {}: parent-death signal {}", t.tid, t.pdeathsig));
        }
    }
    Ok(())
}

fn validate_epoll_targets(p: &ProcessImage) -> Result<(), ImageError> {
    let f = &p.fidelity;
    if f.epoll_targets.len()
        > p.files
            .iter()
            .map(|g| if let FileKind::Epoll { entries } = &g.kind { entries.len() } else { 0 })
            .sum::<usize>()
    {
        return bad("more epoll targets than epoll entries".into());
    }
    let entry_keys: std::collections::HashSet<(u32, i32)> = p
        .files
        .iter()
        .enumerate()
        .flat_map(|(i, g)| match &g.kind {
            FileKind::Epoll { entries } => {
                entries.iter().map(|e| (i as u32, e.fd)).collect::<Vec<_>>()
            }
            _ => Vec::new(),
        })
        .collect();
    for t in &f.epoll_targets {
        let ok = entry_keys.contains(&(t.epoll_file, t.fd));
        if !ok || t.fd < 0 || t.fd >= MAX_FDS {
            return bad(format!(
                "epoll target for fd {} is not an entry of an epoll instance",
                t.fd
            ));
        }
    }
    Ok(())
}

/// Pending unix connections and fd owners name files of the process.
fn validate_file_fidelity(p: &ProcessImage) -> Result<(), ImageError> {
    let f = &p.fidelity;
    for u in &f.unix_connects {
        if !p.files.get(u.file as usize).is_some_and(|g| matches!(&g.kind, FileKind::UnixSocket(s) if s.peer.is_none() && s.listen_backlog.is_none())) {
            return bad(format!("pending unix connection for file {} that is not an unconnected unix socket", u.file));
        }
    }
    for o in &f.file_owners {
        if o.file as usize >= p.files.len()
            || !(0..=2).contains(&o.owner_type)
            || !(0..=64).contains(&o.signal)
        {
            return bad(format!("fd owner entry for file {} is malformed", o.file));
        }
    }
    Ok(())
}

fn validate_inode_attrs(
    p: &ProcessImage,
    has_memfd: &dyn Fn(&u64) -> bool,
) -> Result<(), ImageError> {
    for a in &p.fidelity.inode_attrs {
        let ok = match a.of {
            InodeOf::File(i) => p.files.get(i as usize).is_some_and(|f| match &f.kind {
                FileKind::Deleted { .. } => true,
                // A FIFO, device node or directory removed while open is made again too.
                FileKind::Fifo { path, .. }
                | FileKind::CharDevice { path, .. }
                | FileKind::Directory { path } => path.ends_with(" (deleted)"),
                _ => false,
            }),
            InodeOf::Memfd(id) => has_memfd(&id),
        };
        if !ok || a.mode > 0o7777 {
            return bad("inode attributes for an object the image does not recreate".into());
        }
    }
    Ok(())
}

/// An established connection's state must describe a connection the
/// kernel can be given: a stream socket with a peer, window scales and
/// MSS in the ranges TCP allows, buffer sizes that hold the queues.
fn check_tcp_connection(
    s: &crate::InetSocket,
    c: &crate::TcpConnection,
) -> std::result::Result<(), String> {
    if s.sock_type != 1 || !(s.family == 2 || s.family == 10) {
        return Err("only IPv4/IPv6 stream sockets carry a connection".into());
    }
    if s.peer.is_none() {
        return Err("no peer address".into());
    }
    const ESTABLISHED: u8 = 1;
    const CLOSE_WAIT: u8 = 8;
    if c.state != ESTABLISHED && c.state != CLOSE_WAIT {
        return Err(format!("TCP state {} (only ESTABLISHED and CLOSE_WAIT are rebuilt)", c.state));
    }
    if c.unsent as usize > c.send_queue.len() {
        return Err(format!("{} unsent bytes in a send queue of {}", c.unsent, c.send_queue.len()));
    }
    if c.snd_wscale.is_some_and(|w| w > 14) || c.rcv_wscale > 14 {
        return Err("window scale above 14".into());
    }
    if c.mss_clamp == 0 || c.mss_clamp > 65535 {
        return Err(format!("MSS {}", c.mss_clamp));
    }
    const MAX_BUF: i32 = 1 << 30;
    if !(0..=MAX_BUF).contains(&c.sndbuf) || !(0..=MAX_BUF).contains(&c.rcvbuf) {
        return Err(format!("buffer sizes {} / {}", c.sndbuf, c.rcvbuf));
    }
    if c.send_queue.len() > MAX_BUF as usize || c.recv_queue.len() > MAX_BUF as usize {
        return Err("queue larger than any socket buffer".into());
    }
    if c.buf_lock & !3 != 0 {
        return Err(format!("SO_BUF_LOCK bits {:#x}", c.buf_lock));
    }
    Ok(())
}

/// Queued pty bytes above this, in one direction, are refused: a pty's
/// buffers hold at most a few pages.
pub const MAX_PTY_QUEUE: usize = 1 << 20;

/// The `Ptys` section: each pair once by index, with 19 control
/// characters and bounded queues; each end names a `Terminal` file of
/// the tree (each file once) and a pair of the section, its master at
/// most one description and every pair with a master and a slave end.
pub fn validate_ptys(t: &TreeImage) -> Result<(), ImageError> {
    let Some(p) = &t.ptys else {
        return Ok(());
    };
    let mut indexes = std::collections::HashSet::new();
    for pair in &p.pairs {
        let what = format!("ptys section: pair {}", pair.index);
        if !indexes.insert(pair.index) {
            return bad(format!("{what} listed twice"));
        }
        if pair.termios.cc.len() != 19 {
            return bad(format!("{what}: {} control characters", pair.termios.cc.len()));
        }
        let input: usize =
            pair.input_lines.iter().map(Vec::len).sum::<usize>() + pair.input_rest.len();
        if input > MAX_PTY_QUEUE || pair.output.len() > MAX_PTY_QUEUE {
            return bad(format!("{what}: queues of {input} and {} bytes", pair.output.len()));
        }
        if (pair.session == 0) != (pair.foreground == 0) || pair.session < 0 || pair.foreground < 0
        {
            return bad(format!("{what}: session {} foreground {}", pair.session, pair.foreground));
        }
    }
    let terminals: std::collections::HashSet<u64> = t
        .processes
        .iter()
        .flat_map(|p| &p.files)
        .filter(|f| matches!(f.kind, FileKind::Terminal { .. }))
        .map(|f| f.id)
        .collect();
    let mut files = std::collections::HashSet::new();
    let mut masters = std::collections::HashSet::new();
    let mut slaves = std::collections::HashSet::new();
    for e in &p.ends {
        let what = format!("ptys section: file {}", e.file);
        if !terminals.contains(&e.file) {
            return bad(format!("{what} is not a terminal of the tree"));
        }
        if !files.insert(e.file) {
            return bad(format!("{what} listed twice"));
        }
        if !indexes.contains(&e.index) {
            return bad(format!("{what}: no pair {}", e.index));
        }
        let new = if e.master { masters.insert(e.index) } else { slaves.insert(e.index) };
        if e.master && !new {
            return bad(format!("{what}: a second master of pair {}", e.index));
        }
    }
    if let Some(i) = indexes.iter().find(|i| !masters.contains(i) || !slaves.contains(i)) {
        return bad(format!("ptys section: pair {i} lacks its master or a slave end"));
    }
    Ok(())
}

/// The `ProcessAttrs` section: one entry per process, each value one the
/// kernel takes.
pub fn validate_process_attrs(t: &TreeImage) -> Result<(), ImageError> {
    let Some(a) = &t.process_attrs else {
        return Ok(());
    };
    if a.processes.len() != t.processes.len() {
        return bad(format!(
            "process attributes section: {} entries for {} processes",
            a.processes.len(),
            t.processes.len()
        ));
    }
    for (p, attrs) in t.processes.iter().zip(&a.processes) {
        // Nine filter bits (fs/proc/base.c, MMF_DUMP_FILTER_BITS).
        if attrs.coredump_filter >> 9 != 0 {
            return bad(format!(
                "process attributes section: pid {}: coredump_filter {:#x} has bits the kernel does not know",
                p.pid, attrs.coredump_filter
            ));
        }
        validate_attrs_48(p, attrs)?;
    }
    Ok(())
}

/// The 4.8 values: an I/O priority per thread of the process, of a
/// class ioprio_set knows; an autogroup nice in -20..=19.
fn validate_attrs_48(p: &crate::model::ProcessImage, a: &ProcessAttrs) -> Result<(), ImageError> {
    if !a.ioprio.is_empty() && a.ioprio.len() != p.threads.len() {
        return bad(format!(
            "process attributes section: pid {}: {} I/O priorities for {} threads",
            p.pid,
            a.ioprio.len(),
            p.threads.len()
        ));
    }
    for (t, &prio) in p.threads.iter().zip(&a.ioprio) {
        let tid = t.tid;
        // Classes NONE, RT, BE, IDLE (the kernel checks level and hints).
        if prio >> 13 > 3 {
            return bad(format!(
                "process attributes section: pid {}: thread {tid}: I/O priority {prio:#x} has no class ioprio_set knows",
                p.pid
            ));
        }
    }
    if let Some(n) = a.autogroup_nice {
        if !(-20..=19).contains(&n) {
            return bad(format!(
                "process attributes section: pid {}: autogroup nice {n} outside -20..19",
                p.pid
            ));
        }
    }
    Ok(())
}

/// The longest host or domain name a UTS namespace holds (__NEW_UTS_LEN).
pub const MAX_UTS_NAME: usize = 64;

/// The `Uts` section: a host and a domain name the kernel can take (at
/// most 64 bytes, no NUL).
pub fn validate_uts(t: &TreeImage) -> Result<(), ImageError> {
    let Some(u) = &t.uts else {
        return Ok(());
    };
    for (what, name) in [("hostname", &u.hostname), ("domainname", &u.domainname)] {
        if name.len() > MAX_UTS_NAME {
            return bad(format!(
                "uts section: the {what} has {} bytes, a UTS namespace holds at most {MAX_UTS_NAME}",
                name.len()
            ));
        }
        if name.contains('\0') {
            return bad(format!("uts section: the {what} holds a NUL byte"));
        }
    }
    Ok(())
}

/// The `UnixSocketOptions` section: each entry a unix socket of the tree,
/// listed once, with options of [`crate::UNIX_SOCKET_OPTIONS`], each once
/// and of its length, buffer sizes the kernel can give (positive).
pub fn validate_unix_socket_options(t: &TreeImage) -> Result<(), ImageError> {
    let Some(o) = &t.unix_socket_options else {
        return Ok(());
    };
    let inos: std::collections::HashSet<u64> = t
        .processes
        .iter()
        .flat_map(|p| &p.files)
        .filter_map(|f| match &f.kind {
            FileKind::UnixSocket(u) => Some(u.ino),
            _ => None,
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    for s in &o.sockets {
        let what = format!("unix socket options section: socket {}", s.ino);
        if !inos.contains(&s.ino) {
            return bad(format!("{what} is not a unix socket of the tree"));
        }
        if !seen.insert(s.ino) {
            return bad(format!("{what} listed twice"));
        }
        let mut names = std::collections::HashSet::new();
        for opt in &s.options {
            let known = crate::UNIX_SOCKET_OPTIONS.iter().find(|(n, _)| *n == opt.name);
            let Some(&(_, len)) = known.filter(|_| opt.level == SOL_SOCKET) else {
                return bad(format!(
                    "{what}: option {}/{} is not one restore sets",
                    opt.level, opt.name
                ));
            };
            if opt.value.len() != len || !names.insert(opt.name) {
                return bad(format!(
                    "{what}: option {} has {} bytes (it takes {len}) or is listed twice",
                    opt.name,
                    opt.value.len()
                ));
            }
            let int = <[u8; 4]>::try_from(&opt.value[..len.min(4)]).map(i32::from_ne_bytes);
            if matches!(opt.name, 7 | 8) && !int.is_ok_and(|v| v > 0) {
                return bad(format!("{what}: buffer size option {} is not positive", opt.name));
            }
        }
    }
    Ok(())
}

/// SOL_SOCKET on Linux (this crate does not depend on libc).
const SOL_SOCKET: i32 = 1;
