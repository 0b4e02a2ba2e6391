//! `ferry inspect`: a readable (or JSON) view of an image: the process
//! tree, one block per process (parents before children), then the
//! zombies and the shared memory the processes share.

use anyhow::{Context, Result};
use ferry_image::{
    FileKind, ImageDir, Inventory, ProcessImage, TreeImage, UnixDeadPeer, VmaBacking, Zombie,
};
use std::collections::HashMap;
use std::path::Path;

pub fn show(dir: &Path, json: bool) -> Result<()> {
    let d = ImageDir::new(dir);
    let (inv, tree) = d.read_meta().with_context(|| format!("reading image {}", dir.display()))?;
    let f = d.check_pages_file(&inv)?;
    let map = ferry_sys_map(&f, inv.pages_bytes)?;
    for p in &tree.processes {
        ImageDir::verify_runs(&p.page_runs, &map)
            .with_context(|| format!("checking the pages of process {}", p.pid))?;
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "inventory": inv, "tree": tree }))?
        );
        return Ok(());
    }
    show_text(dir, &inv, &tree);
    Ok(())
}

fn show_text(dir: &Path, inv: &Inventory, tree: &TreeImage) {
    show_summary(dir, inv, tree);
    let holders = file_holders(tree);
    for p in &tree.processes {
        println!();
        show_process(tree, p, &holders);
    }
    show_zombies(tree);
    show_shared_anon(tree);
    show_sysv_shm(tree);
}

/// The image and the tree as a whole, and its SysV semaphores and message queues.
fn show_summary(dir: &Path, inv: &Inventory, tree: &TreeImage) {
    println!(
        "image {} (format v{}, ferry {}, kernel {}, {})",
        dir.display(),
        inv.format_version,
        inv.ferry_version,
        inv.kernel_release,
        inv.arch
    );
    println!(
        "process tree: {} processes, {} zombies, {} shared memory objects, {} SysV segments, {} semaphore sets, {} message queues; {} pages stored ({:.1} MiB)",
        tree.processes.len(),
        tree.zombies.len(),
        tree.shared_anon.len(),
        tree.sysv_shm.len(),
        tree.sysv_sem.len(),
        tree.sysv_msg.len(),
        inv.pages_bytes / 4096,
        inv.pages_bytes as f64 / 1048576.0
    );
    if tree.own_pid_namespace {
        println!("PIDs are those of the tree's own PID namespace; restore makes a new PID namespace for it");
    }
    if let Some(l) = &tree.network_lock {
        println!(
            "TCP connections held by network lock {} ({}); restore releases it",
            l.name, l.method
        );
    }
    for s in &tree.sysv_sem {
        println!("semaphore set {} key {:#x} mode {:o} values {:?}", s.id, s.key, s.mode, s.values);
    }
    for q in &tree.sysv_msg {
        let bytes: usize = q.messages.iter().map(|(_, m)| m.len()).sum();
        println!(
            "message queue {} key {:#x} mode {:o}: {} messages, {bytes} bytes",
            q.id,
            q.key,
            q.mode,
            q.messages.len()
        );
    }
}

/// Which processes hold each open file description (by its id).
fn file_holders(tree: &TreeImage) -> HashMap<u64, Vec<i32>> {
    let mut holders: HashMap<u64, Vec<i32>> = HashMap::new();
    for p in &tree.processes {
        for f in &p.files {
            let pids = holders.entry(f.id).or_default();
            if !pids.contains(&p.pid) {
                pids.push(p.pid);
            }
        }
    }
    holders
}

fn show_zombies(tree: &TreeImage) {
    if !tree.zombies.is_empty() {
        println!();
        println!("zombies ({}):", tree.zombies.len());
        for z in &tree.zombies {
            println!(
                "  pid {:>7} ppid {} pgid {} sid {}  {}",
                z.pid,
                z.ppid,
                z.pgid,
                z.sid,
                exit_status(z)
            );
        }
    }
}

fn show_shared_anon(tree: &TreeImage) {
    if !tree.shared_anon.is_empty() {
        println!();
        println!("shared anonymous memory ({}):", tree.shared_anon.len());
        for m in &tree.shared_anon {
            let users =
                mapped_by(tree, |b| matches!(b, VmaBacking::SharedAnon { id } if *id == m.id));
            println!(
                "  {} {:?}: {} bytes, {} stored, mapped by {}",
                m.id,
                m.name,
                m.size,
                stored(&m.extents),
                users
            );
        }
    }
}

fn show_sysv_shm(tree: &TreeImage) {
    if !tree.sysv_shm.is_empty() {
        println!();
        println!("SysV shared memory segments ({}):", tree.sysv_shm.len());
        for s in &tree.sysv_shm {
            let users = mapped_by(tree, |b| matches!(b, VmaBacking::SysvShm { id } if *id == s.id));
            println!(
                "  id {} key {:#x}: {} bytes, mode {:03o} uid {} gid {}, {} stored, attached by {}",
                s.id,
                s.key,
                s.size,
                s.mode,
                s.uid,
                s.gid,
                stored(&s.extents),
                users
            );
        }
    }
}

fn show_process(tree: &TreeImage, p: &ProcessImage, holders: &HashMap<u64, Vec<i32>>) {
    show_identity(tree, p);
    show_threads(p);
    show_mappings(tree, p);
    show_fds(tree, p, holders);
    show_signals_and_memfds(p);
    show_fidelity(p);
}

fn show_identity(tree: &TreeImage, p: &ProcessImage) {
    let is_root = tree.root().is_some_and(|r| r.pid == p.pid);
    println!(
        "process {} \"{}\" exe {} cwd {}{}",
        p.pid,
        p.comm,
        p.exe,
        p.cwd,
        if is_root { " (root of the tree)" } else { "" }
    );
    println!(
        "  ppid {} pgid {} sid {} umask {:03o} uid {} gid {}",
        p.ppid, p.pgid, p.sid, p.umask, p.creds.uids[0], p.creds.gids[0]
    );
    if let Some(root) = &p.root {
        println!("  root directory {root}");
    }
}

fn show_threads(p: &ProcessImage) {
    println!("threads ({}):", p.threads.len());
    for t in &p.threads {
        let in_call = t.regs.get(15).copied().unwrap_or(u64::MAX) as i64;
        let call = if in_call >= 0 { format!(" in syscall {in_call}") } else { String::new() };
        println!(
            "  tid {:>7} {:<16} rip {:#x} sigmask {:#x}{}",
            t.tid,
            t.comm,
            t.regs.get(16).copied().unwrap_or(0),
            t.sigmask,
            call
        );
    }
}

fn show_mappings(tree: &TreeImage, p: &ProcessImage) {
    let pages: u64 = p.page_runs.iter().map(|r| r.pages).sum();
    let inherited = if p.inherited.is_empty() {
        String::new()
    } else {
        format!(", {} inherited from the parent", p.inherited.len())
    };
    println!(
        "mappings ({}{inherited}), {} pages stored ({:.1} MiB):",
        p.vmas.len(),
        pages,
        pages as f64 * 4096.0 / 1048576.0
    );
    for v in &p.vmas {
        let prot = format!(
            "{}{}{}{}",
            if v.prot & 1 != 0 { 'r' } else { '-' },
            if v.prot & 2 != 0 { 'w' } else { '-' },
            if v.prot & 4 != 0 { 'x' } else { '-' },
            if v.shared { 's' } else { 'p' }
        );
        let what = vma_description(tree, p, &v.backing);
        let stored: u64 = p
            .page_runs
            .iter()
            .filter(|r| r.start >= v.start && r.start < v.end)
            .map(|r| r.pages)
            .sum();
        let inherited = match p.inherited.iter().find(|i| i.start == v.start && i.end == v.end) {
            Some(i) => {
                let shared: u64 = i.shared_pages.iter().map(|r| r.pages).sum();
                format!("  (inherited, {shared} pages shared with the parent)")
            }
            None => String::new(),
        };
        println!(
            "  {:#014x}-{:#014x} {} {:>8} pages stored  {}{}",
            v.start, v.end, prot, stored, what, inherited
        );
    }
}

fn vma_description(tree: &TreeImage, p: &ProcessImage, backing: &VmaBacking) -> String {
    match backing {
        VmaBacking::Anonymous => "[anonymous]".to_string(),
        VmaBacking::SharedAnon { id } => format!("[shared anonymous {id}]"),
        VmaBacking::Memfd { id } => format!("memfd {}", memfd_name(p, *id)),
        VmaBacking::SysvShm { id } => match tree.sysv_shm.iter().find(|s| s.id == *id) {
            Some(s) => format!("[SysV segment {id} key {:#x}]", s.key),
            None => format!("[SysV segment {id}]"),
        },
        VmaBacking::File { path, .. } => path.clone(),
        VmaBacking::Vdso => "[vdso]".into(),
        VmaBacking::Vvar { name } => name.clone(),
        VmaBacking::Vsyscall => "[vsyscall]".into(),
        VmaBacking::DeletedFile { id } => {
            match p.fidelity.deleted_files.iter().find(|d| d.id == *id) {
                Some(d) => format!("{} (deleted; {} bytes kept)", d.name, d.size),
                None => format!("[deleted file {id}]"),
            }
        }
    }
}

fn show_fds(tree: &TreeImage, p: &ProcessImage, holders: &HashMap<u64, Vec<i32>>) {
    println!("fds ({}):", p.fds.len());
    for s in &p.fds {
        let Some(f) = p.files.get(s.file as usize) else {
            println!("  {:>4} (missing open file {})", s.fd, s.file);
            continue;
        };
        let mut what = file_description(p, &f.kind);
        if let Some(d) = dead_peer_of(tree, &f.kind) {
            let name = String::from_utf8_lossy(&d.peer_name).replace('\0', "@");
            let name = if name.is_empty() { "unnamed".to_string() } else { name };
            let reset = if d.reset { ", ECONNRESET pending" } else { "" };
            what.push_str(&format!(", its peer ({name}) closed{reset}"));
        }
        let others: Vec<String> = holders
            .get(&f.id)
            .into_iter()
            .flatten()
            .filter(|&&pid| pid != p.pid)
            .map(|pid| pid.to_string())
            .collect();
        let shared = if others.is_empty() {
            String::new()
        } else {
            format!(" (shared with {})", others.join(", "))
        };
        println!(
            "  {:>4} flags {:#o} pos {}{}  {}{}",
            s.fd,
            f.flags,
            f.pos,
            if s.cloexec { " cloexec" } else { "" },
            what,
            shared
        );
    }
}

/// The closed peer of a unix socket whose peer was closed (format 4.4).
fn dead_peer_of<'t>(tree: &'t TreeImage, kind: &FileKind) -> Option<&'t UnixDeadPeer> {
    let FileKind::UnixSocket(u) = kind else { return None };
    tree.unix_dead_peers.as_ref()?.sockets.iter().find(|d| d.ino == u.ino)
}

fn file_description(p: &ProcessImage, kind: &FileKind) -> String {
    match kind {
        FileKind::Regular { path, .. } => format!("file {path}"),
        FileKind::Deleted { path, content, .. } => format!("deleted file {path} ({} bytes kept)", content.len()),
        FileKind::Directory { path } => format!("directory {path}"),
        FileKind::CharDevice { path, .. } => format!("device {path}"),
        FileKind::Terminal { path } => format!("terminal {path} (replaced at restore)"),
        FileKind::ExternalStdio { what } => format!("{what} leading out of the process (replaced at restore)"),
        FileKind::UnixSocket(u) => format!(
            "unix socket {}{}{}{}",
            if u.name.is_empty() { "(unnamed)".to_string() } else { String::from_utf8_lossy(&u.name).replace('\0', "@") },
            u.peer.map(|p| format!(" connected to socket {p}")).unwrap_or_default(),
            u.listen_backlog.map(|b| format!(" listening (backlog {b})")).unwrap_or_default(),
            if u.queued.is_empty() { String::new() } else { format!(", {} queued messages", u.queued.len()) }
        ),
        FileKind::Memfd { id } => format!("memfd {}", memfd_name(p, *id)),
        FileKind::Pipe(e) => format!("pipe {} {} end, {} bytes queued", e.id, if e.write_end { "write" } else { "read" }, e.data.len()),
        FileKind::Fifo { path, pipe } => format!("fifo {path}, {} bytes queued", pipe.data.len()),
        FileKind::EventFd { count, semaphore } => format!("eventfd count {count}{}", if *semaphore { " (semaphore)" } else { "" }),
        FileKind::TimerFd(t) => format!("timerfd clock {} value {} ns interval {} ns", t.clockid, t.value_ns, t.interval_ns),
        FileKind::SignalFd { mask } => format!("signalfd mask {mask:#x}"),
        FileKind::Epoll { entries } => format!("epoll with {} entries", entries.len()),
        FileKind::ProcFile { path } => format!("{path} (a /proc file of the tree, opened again by the process)"),
        FileKind::Carried(c) => format!("{} (carried over as the same file, not in the image)", c.link),
        FileKind::Inotify { watches } => format!(
            "inotify with {} watches: {}",
            watches.len(),
            watches.iter().map(|w| format!("{} {} mask {:#x}", w.wd, w.path, w.mask)).collect::<Vec<_>>().join(", ")
        ),
        FileKind::InetSocket(s) => format!(
            "{} socket port {}{}{}",
            if s.sock_type == 1 { "tcp" } else { "udp" },
            s.port,
            s.listen_backlog.map(|b| format!(" listening (backlog {b})")).unwrap_or_default(),
            s.connection
                .as_ref()
                .map(|c| format!(
                    " established to port {}, {} bytes to read, {} bytes to send ({} never sent), mss {}",
                    s.peer.as_ref().map_or(0, |p| p.1),
                    c.recv_queue.len(),
                    c.send_queue.len(),
                    c.unsent,
                    c.mss_clamp
                ))
                .unwrap_or_default()
        ),
    }
}

fn show_signals_and_memfds(p: &ProcessImage) {
    let handled = p.signals.actions.iter().filter(|a| a.handler > 1).count();
    println!(
        "signals: {handled} handlers, {} pending for the process",
        p.signals.shared_pending.len()
    );
    println!("timers: {} interval timers, {} POSIX timers", p.itimers.len(), p.posix_timers.len());
    for m in &p.memfds {
        println!(
            "memfd {:?}: {} bytes, {} stored, seals {:#x}",
            m.name,
            m.size,
            stored(&m.extents),
            m.seals
        );
    }
}

/// The format-4 part: seccomp, credentials details, parent-death
/// signals, fd owners, inode attributes, job-control stop.
fn show_fidelity(p: &ProcessImage) {
    let f = &p.fidelity;
    let c = &p.creds;
    println!(
        "credentials: uid {:?} gid {:?} (real, effective, saved, filesystem), groups {:?}, securebits {:#x}",
        c.uids, c.gids, c.groups, f.securebits
    );
    if f.exit_signal != libc::SIGCHLD {
        println!("exit signal to its parent: {}", f.exit_signal);
    }
    if f.shares_files_with_parent {
        println!("shares its parent's fd table (CLONE_FILES)");
    }
    if f.stopped {
        println!("stopped by a job-control signal: restored stopped");
    }
    for t in &f.threads {
        let mode = match t.seccomp_mode {
            0 => "none".to_string(),
            1 => "strict".to_string(),
            _ => format!(
                "filter ({} filters: {})",
                t.seccomp.len(),
                t.seccomp.iter().map(|i| format!("#{i}")).collect::<Vec<_>>().join(" ")
            ),
        };
        if t.seccomp_mode != 0 || t.pdeathsig != 0 {
            println!("thread {}: seccomp {mode}, parent-death signal {}", t.tid, t.pdeathsig);
        }
    }
    for (i, sf) in f.seccomp_filters.iter().enumerate() {
        println!(
            "seccomp filter #{i}: {} instructions{}",
            sf.insns.len(),
            if sf.log { ", SECCOMP_FILTER_FLAG_LOG" } else { "" }
        );
    }
    for o in &f.file_owners {
        let fds: Vec<String> =
            p.fds.iter().filter(|s| s.file == o.file).map(|s| s.fd.to_string()).collect();
        let kind = ["thread", "process", "process group"]
            .get(o.owner_type as usize)
            .copied()
            .unwrap_or("?");
        println!(
            "fd {}: owner {kind} {}, signal {}",
            fds.join(","),
            o.owner,
            if o.signal == 0 { "SIGIO".to_string() } else { o.signal.to_string() }
        );
    }
    for a in &f.inode_attrs {
        let what = match a.of {
            ferry_image::InodeOf::File(i) => format!("recreated file (open file {i})"),
            ferry_image::InodeOf::Memfd(id) => format!("memfd {id}"),
        };
        println!("{what}: mode {:04o} owner {}:{}", a.mode, a.uid, a.gid);
    }
}

/// A zombie's wait(2) status in words.
fn exit_status(z: &Zombie) -> String {
    let st = z.wait_status;
    if libc::WIFEXITED(st) {
        format!("exited with status {}", libc::WEXITSTATUS(st))
    } else if libc::WIFSIGNALED(st) {
        format!(
            "killed by signal {}{}",
            libc::WTERMSIG(st),
            if libc::WCOREDUMP(st) { " (core dumped)" } else { "" }
        )
    } else {
        format!("wait status {st:#x}")
    }
}

/// The pids of the processes with a mapping `is` matches, for display.
fn mapped_by(tree: &TreeImage, is: impl Fn(&VmaBacking) -> bool) -> String {
    let pids: Vec<String> = tree
        .processes
        .iter()
        .filter(|p| p.vmas.iter().any(|v| is(&v.backing)))
        .map(|p| p.pid.to_string())
        .collect();
    if pids.is_empty() {
        "no process".into()
    } else {
        format!("{} {}", if pids.len() == 1 { "process" } else { "processes" }, pids.join(", "))
    }
}

fn stored(extents: &[(u64, Vec<u8>)]) -> usize {
    extents.iter().map(|(_, d)| d.len()).sum()
}

fn ferry_sys_map(f: &std::fs::File, len: u64) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, ferry_image::dir::PAGES_DATA_OFFSET).context("reading pages.img")?;
    Ok(buf)
}

fn memfd_name(p: &ProcessImage, id: u64) -> String {
    p.memfds
        .iter()
        .find(|m| m.id == id)
        .map_or_else(|| format!("#{id}"), |m| format!("{:?}", m.name))
}
