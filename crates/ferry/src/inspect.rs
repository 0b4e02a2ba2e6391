//! `ferry inspect`: a readable (or JSON) view of an image.

use anyhow::{Context, Result};
use ferry_image::{FileKind, ImageDir, VmaBacking};
use std::path::Path;

pub fn show(dir: &Path, json: bool) -> Result<()> {
    let d = ImageDir::new(dir);
    let (inv, p) = d.read_meta().with_context(|| format!("reading image {}", dir.display()))?;
    let f = d.check_pages_file(&inv)?;
    let map = ferry_sys_map(&f, inv.pages_bytes)?;
    ImageDir::verify_runs(&p.page_runs, &map)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "inventory": inv, "process": p }))?);
        return Ok(());
    }
    println!("image {} (format v{}, ferry {}, kernel {}, {})", dir.display(), inv.format_version, inv.ferry_version, inv.kernel_release, inv.arch);
    println!("process {} \"{}\" exe {} cwd {}", p.pid, p.comm, p.exe, p.cwd);
    println!("  ppid {} pgid {} sid {} umask {:03o} uid {} gid {}", p.ppid, p.pgid, p.sid, p.umask, p.creds.uids[0], p.creds.gids[0]);
    println!("threads ({}):", p.threads.len());
    for t in &p.threads {
        let in_call = t.regs.get(15).copied().unwrap_or(u64::MAX) as i64;
        let call = if in_call >= 0 { format!(" in syscall {in_call}") } else { String::new() };
        println!("  tid {:>7} {:<16} rip {:#x} sigmask {:#x}{}", t.tid, t.comm, t.regs.get(16).copied().unwrap_or(0), t.sigmask, call);
    }
    println!("mappings ({}), {} pages stored ({:.1} MiB):", p.vmas.len(), inv.pages_bytes / 4096, inv.pages_bytes as f64 / 1048576.0);
    for v in &p.vmas {
        let prot = format!(
            "{}{}{}{}",
            if v.prot & 1 != 0 { 'r' } else { '-' },
            if v.prot & 2 != 0 { 'w' } else { '-' },
            if v.prot & 4 != 0 { 'x' } else { '-' },
            if v.shared { 's' } else { 'p' }
        );
        let what = match &v.backing {
            VmaBacking::Anonymous => "[anonymous]".to_string(),
            VmaBacking::SharedAnon { id } => format!("[shared anonymous {id}]"),
            VmaBacking::Memfd { id } => format!("memfd {}", memfd_name(&p, *id)),
            VmaBacking::File { path, .. } => path.clone(),
            VmaBacking::Vdso => "[vdso]".into(),
            VmaBacking::Vvar { name } => name.clone(),
            VmaBacking::Vsyscall => "[vsyscall]".into(),
        };
        let stored: u64 = p.page_runs.iter().filter(|r| r.start >= v.start && r.start < v.end).map(|r| r.pages).sum();
        println!("  {:#014x}-{:#014x} {} {:>8} pages stored  {}", v.start, v.end, prot, stored, what);
    }
    println!("fds ({}):", p.fds.len());
    for s in &p.fds {
        let f = &p.files[s.file as usize];
        let what = match &f.kind {
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
            FileKind::Memfd { id } => format!("memfd {}", memfd_name(&p, *id)),
            FileKind::Pipe(e) => format!("pipe {} {} end, {} bytes queued", e.id, if e.write_end { "write" } else { "read" }, e.data.len()),
            FileKind::Fifo { path, pipe } => format!("fifo {path}, {} bytes queued", pipe.data.len()),
            FileKind::EventFd { count, semaphore } => format!("eventfd count {count}{}", if *semaphore { " (semaphore)" } else { "" }),
            FileKind::TimerFd(t) => format!("timerfd clock {} value {} ns interval {} ns", t.clockid, t.value_ns, t.interval_ns),
            FileKind::SignalFd { mask } => format!("signalfd mask {mask:#x}"),
            FileKind::Epoll { entries } => format!("epoll with {} entries", entries.len()),
            FileKind::InetSocket(s) => format!(
                "{} socket port {}{}",
                if s.sock_type == 1 { "tcp" } else { "udp" },
                s.port,
                s.listen_backlog.map(|b| format!(" listening (backlog {b})")).unwrap_or_default()
            ),
        };
        println!("  {:>4} flags {:#o} pos {}{}  {}", s.fd, f.flags, f.pos, if s.cloexec { " cloexec" } else { "" }, what);
    }
    let handled = p.signals.actions.iter().filter(|a| a.handler > 1).count();
    println!("signals: {handled} handlers, {} pending for the process", p.signals.shared_pending.len());
    println!("timers: {} interval timers, {} POSIX timers", p.itimers.len(), p.posix_timers.len());
    for m in &p.memfds {
        let stored: usize = m.extents.iter().map(|(_, d)| d.len()).sum();
        println!("memfd {:?}: {} bytes, {} stored, seals {:#x}", m.name, m.size, stored, m.seals);
    }
    Ok(())
}

fn ferry_sys_map(f: &std::fs::File, len: u64) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, ferry_image::dir::PAGES_DATA_OFFSET).context("reading pages.img")?;
    Ok(buf)
}

fn memfd_name(p: &ferry_image::ProcessImage, id: u64) -> String {
    p.memfds.iter().find(|m| m.id == id).map_or_else(|| format!("#{id}"), |m| format!("{:?}", m.name))
}
