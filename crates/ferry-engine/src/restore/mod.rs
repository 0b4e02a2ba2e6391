//! Restore: rebuild a process from an image under its old PID.
//!
//! 1. The image is read and every checksum verified before anything else.
//! 2. ferry forks a child with the old PID (clone3 + set_tid). The child
//!    sets up its session, cwd and fd table itself ([`child`]) and stops.
//! 3. ferry drives the stopped child with ptrace and injected syscalls:
//!    it swaps the address space for the image's ([`memory`]), recreates
//!    the threads with their TIDs ([`threads`]), then signals, timers and
//!    limits ([`signals`], [`timers`], [`process`]).
//! 4. Every thread gets its registers, FPU state and signal mask back and
//!    is released. Any failure before that kills the child: a process is
//!    either fully restored or not there at all.

mod child;
mod files;
mod memory;
mod process;
mod signals;
mod threads;
mod timers;

use crate::error::{EngineError, Result};
use crate::inject::{self, Remote, Scratch};
use ferry_image::{ImageDir, ProcessImage, VmaBacking};
use ferry_sys::ptrace::{self, WaitEvent};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Instant;

#[derive(Clone)]
pub struct RestoreOptions {
    /// Where fds that were terminals point after restore.
    pub tty_to: String,
    /// Network namespace to restore into (a file such as /run/netns/NAME
    /// or /proc/PID/ns/net); None: ferry's own.
    pub netns: Option<std::path::PathBuf>,
    /// Called as page data is copied in (bytes done, bytes total).
    pub progress: Option<crate::ProgressFn>,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions { tty_to: "/dev/null".into(), netns: None, progress: None }
    }
}

#[derive(Debug, Clone)]
pub struct Restored {
    pub pid: i32,
    pub threads: usize,
    pub total_ms: f64,
}

/// The restore in progress, driven from ferry.
pub(crate) struct Session<'a> {
    pub pid: i32,
    pub image: &'a ProcessImage,
    pub remote: Remote,
    /// The scratch mapping (batch code and call table) and its part free
    /// for syscall arguments.
    pub scratch: u64,
    pub data: u64,
    /// Descriptors opened by ferry before the fork, present in the child
    /// under the same numbers: files to map and the executable.
    staging: StagingMap,
}

impl Session<'_> {
    /// Runs a syscall in the thread group leader.
    pub fn call(&mut self, name: &str, nr: i64, args: &[u64]) -> Result<u64> {
        self.remote.call(self.pid, name, nr, args)
    }

    /// Runs named calls in thread `tid` as one batch; the first failure
    /// becomes an error naming its call.
    pub fn run(&mut self, tid: i32, calls: &[(String, inject::Call)]) -> Result<Vec<u64>> {
        let only: Vec<inject::Call> = calls.iter().map(|c| c.1).collect();
        let results = self.remote.batch(tid, self.scratch, &only)?;
        calls.iter().zip(results).map(|((name, _), r)| inject::check(self.pid, tid, name, r)).collect()
    }

    pub fn staging_fd(&self, path: &str, rw: bool) -> Result<RawFd> {
        self.staging
            .get(&(path.to_string(), rw))
            .copied()
            .ok_or_else(|| EngineError::restore(self.pid, format!("no staged descriptor for {path}")))
    }
}

fn pid_owner(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string())
}

/// Staged descriptors by (path or memfd key, opened read-write).
type StagingMap = HashMap<(String, bool), RawFd>;

/// Opens the files that mappings need (and the executable) above
/// `temp_base`, so the child inherits them under known numbers.
fn stage_files(image: &ProcessImage, temp_base: RawFd) -> Result<(StagingMap, Vec<OwnedFd>, Option<RawFd>)> {
    let mut map = HashMap::new();
    let mut owned = Vec::new();
    for m in &image.memfds {
        let name = std::ffi::CString::new(m.name.replace('\0', "")).unwrap_or_default();
        // SAFETY: name is NUL-terminated; flags are plain integers.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(files::errno_err(image.pid, format!("recreating memfd {}", m.name)));
        }
        // SAFETY: raw is a new descriptor we own.
        let f = std::fs::File::from(unsafe { ferry_sys::fd::own(raw) });
        f.set_len(m.size).map_err(|e| EngineError::io(format!("memfd {}", m.name), e))?;
        for (off, data) in &m.extents {
            use std::os::unix::fs::FileExt;
            f.write_all_at(data, *off).map_err(|e| EngineError::io(format!("memfd {}", m.name), e))?;
        }
        let fd = ferry_sys::fd::fcntl_int(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, temp_base as libc::c_long, "fcntl(F_DUPFD)")
            .map_err(|e| EngineError::kernel(image.pid, "staging a memfd", e))?;
        // SAFETY: fd is a new descriptor we own.
        owned.push(unsafe { ferry_sys::fd::own(fd) });
        map.insert((memory::memfd_key(m.id), true), fd);
    }
    let mut open = |path: &str, rw: bool, what: String| -> Result<RawFd> {
        if let Some(fd) = map.get(&(path.to_string(), rw)) {
            return Ok(*fd);
        }
        let f = std::fs::OpenOptions::new().read(true).write(rw).open(path).map_err(|e| EngineError::io(format!("{what} {path}"), e))?;
        let fd = ferry_sys::fd::fcntl_int(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, temp_base as libc::c_long, "fcntl(F_DUPFD)")
            .map_err(|e| EngineError::kernel(image.pid, "staging a file", e))?;
        // SAFETY: fd is a new descriptor we own.
        owned.push(unsafe { ferry_sys::fd::own(fd) });
        map.insert((path.to_string(), rw), fd);
        Ok(fd)
    };
    for v in &image.vmas {
        if let VmaBacking::File { path, .. } = &v.backing {
            open(path, memory::needs_rw(v), format!("file mapped at {:#x}:", v.start))?;
        }
    }
    let exe = open(&image.exe, false, "executable".into()).ok();
    Ok((map, owned, exe))
}

/// Kills the half-built child unless disarmed.
struct ChildGuard(i32, bool);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.1 {
            // SAFETY: killing our own child by PID, then reaping it and
            // its traced threads (they must go before the leader).
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                loop {
                    let r = libc::waitpid(-1, std::ptr::null_mut(), libc::__WALL);
                    if r == self.0 || r < 0 {
                        break;
                    }
                }
            }
        }
    }
}

pub fn restore(dir: &Path, opts: &RestoreOptions) -> Result<Restored> {
    let t0 = Instant::now();
    let mut ph = crate::phases::Phases::start("restore");
    let dirh = ImageDir::new(dir);
    let (inv, image) = dirh.read_meta()?;
    let pages_file = dirh.check_pages_file(&inv)?;
    let pages = ferry_sys::process::MappedFile::map(&pages_file, ferry_image::dir::PAGES_DATA_OFFSET, inv.pages_bytes as usize)
        .map_err(|e| EngineError::kernel(image.pid, "mapping pages.img", e))?;
    ImageDir::verify_runs_parallel(&image.page_runs, pages.bytes(), crate::worker_threads())?;
    let pid = image.pid;
    ph.mark("read+verify image");
    for t in &image.threads {
        if let Some(comm) = pid_owner(t.tid) {
            return Err(EngineError::PidTaken { pid: t.tid, comm });
        }
    }

    let max_fd = image.fds.iter().map(|s| s.fd).max().unwrap_or(2).max(2);
    let temp_base = max_fd + 1;
    let (staging, staged_owned, exe_fd) = stage_files(&image, temp_base)?;
    let (go_r, go_w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC).map_err(|e| EngineError::kernel(pid, "creating a pipe", e))?;
    let (st_r, st_w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC).map_err(|e| EngineError::kernel(pid, "creating a pipe", e))?;
    let st_w_high = ferry_sys::fd::fcntl_int(st_w.as_raw_fd(), libc::F_DUPFD_CLOEXEC, temp_base as libc::c_long, "fcntl(F_DUPFD)")
        .map_err(|e| EngineError::kernel(pid, "staging the status pipe", e))?;
    drop(st_w);
    // SAFETY: new descriptor owned by us.
    let st_w = unsafe { ferry_sys::fd::own(st_w_high) };
    let mut keep: Vec<RawFd> = staging.values().copied().collect();
    keep.push(st_w.as_raw_fd());
    let netns = match &opts.netns {
        Some(path) => {
            let f = std::fs::File::open(path).map_err(|e| EngineError::io(format!("network namespace {}", path.display()), e))?;
            let fd = ferry_sys::fd::fcntl_int(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, temp_base as libc::c_long, "fcntl(F_DUPFD)")
                .map_err(|e| EngineError::kernel(pid, "staging the network namespace", e))?;
            keep.push(fd);
            // SAFETY: fd is a new descriptor we own.
            Some(unsafe { ferry_sys::fd::own(fd) })
        }
        None => None,
    };
    let netns_fd = netns.as_ref().map(|f| f.as_raw_fd());

    // SAFETY: ferry is single-threaded here (no thread pools, no
    // background logging), so the child may run ordinary Rust code.
    let forked = unsafe { ferry_sys::clone::fork_with_pid(pid) };
    let child_pid = match forked {
        Ok(0) => {
            let memfds = image.memfds.iter().filter_map(|m| staging.get(&(memory::memfd_key(m.id), true)).map(|fd| (m.id, *fd))).collect();
            child::run(child::ChildPlan { image: &image, tty_to: &opts.tty_to, keep, temp_base, memfds, netns: netns_fd, go: go_r, status: st_w })
        }
        Ok(p) => p,
        Err(e) if e.errno == libc::EEXIST => {
            return Err(EngineError::PidTaken { pid, comm: pid_owner(pid).unwrap_or_else(|| "unknown".into()) })
        }
        Err(e) => return Err(EngineError::kernel(pid, "creating the process with its PID", e)),
    };
    let mut guard = ChildGuard(child_pid, false);
    drop(st_w);
    drop(go_r);
    ptrace::seize(child_pid, ptrace::PTRACE_O_TRACECLONE | ptrace::PTRACE_O_EXITKILL)
        .map_err(|e| EngineError::kernel(pid, "seizing the new process", e))?;
    std::fs::File::from(go_w).write_all(b"g").map_err(|e| EngineError::io("restore go pipe", e))?;
    let mut msg = String::new();
    std::fs::File::from(st_r).read_to_string(&mut msg).map_err(|e| EngineError::io("restore status pipe", e))?;
    if !msg.is_empty() {
        return Err(EngineError::restore(pid, msg));
    }
    match ptrace::wait_tid(child_pid, 0).map_err(|e| EngineError::kernel(pid, "waiting for the new process", e))? {
        Some((_, WaitEvent::Stopped { sig: libc::SIGSTOP, .. })) => {}
        other => return Err(EngineError::restore(pid, format!("new process did not stop as expected: {other:?}"))),
    }
    // The child has its own copies now; memfds stay open here until their
    // seals can be applied, after every mapping exists.
    let memfd_fds: Vec<(i32, RawFd)> =
        image.memfds.iter().filter_map(|m| staging.get(&(memory::memfd_key(m.id), true)).map(|fd| (m.seals, *fd))).collect();
    ph.mark("fork+fd table");

    let vdso = ferry_sys_self_vdso()?;
    let remote = Remote { pid, syscall_ip: inject::find_syscall_insn(pid, vdso.0, vdso.1)? };
    let mut s = Session { pid, image: &image, remote, scratch: 0, data: 0, staging };
    run_injected(&mut s, &pages, exe_fd, opts.progress.as_ref(), &mut ph)?;
    for (seals, fd) in memfd_fds {
        // SAFETY: F_ADD_SEALS with an integer on our own descriptor.
        if seals != 0 && unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } < 0 {
            return Err(files::errno_err(pid, format!("sealing a memfd with {seals:#x}")));
        }
    }
    drop(staged_owned);
    guard.1 = true;
    Ok(Restored { pid, threads: image.threads.len(), total_ms: t0.elapsed().as_secs_f64() * 1e3 })
}

fn ferry_sys_self_vdso() -> Result<(u64, u64)> {
    let me = std::process::id() as i32;
    crate::procfs::maps(me)?
        .into_iter()
        .find(|m| m.path == "[vdso]")
        .map(|m| (m.start, m.end))
        .ok_or_else(|| EngineError::restore(me, "ferry has no [vdso] mapping"))
}

fn run_injected(
    s: &mut Session,
    pages: &ferry_sys::process::MappedFile,
    exe_fd: Option<RawFd>,
    progress: Option<&crate::ProgressFn>,
    ph: &mut crate::phases::Phases,
) -> Result<()> {
    let pid = s.pid;
    let image = s.image;
    threads::block_signals(pid, pid)?;
    let xs = ptrace::get_xstate(pid).map_err(|e| EngineError::kernel(pid, "reading XSAVE layout", e))?;
    if xs.len() != image.threads[0].xstate.len() {
        return Err(EngineError::restore(
            pid,
            format!("image has a {}-byte XSAVE area, this CPU {} bytes: restore on the same kind of CPU", image.threads[0].xstate.len(), xs.len()),
        ));
    }
    threads::drop_inherited_rseq(s)?;
    // The scratch area goes where neither the image nor the forked copy
    // of ferry has anything, so it survives the whole memory swap and all
    // later work runs as batches from it.
    let at = memory::free_gap(s.pid, &image.vmas, inject::SCRATCH_LEN)?;
    let scratch = Scratch::map_at(&s.remote, pid, at)?;
    s.scratch = scratch.addr;
    s.data = scratch.addr + inject::SCRATCH_DATA;
    memory::clear_address_space(s)?;
    memory::place_vdso(s, &image.vmas)?;
    ph.mark("clear address space");
    let reprotect = memory::map_all(s, &image.vmas, &image.page_runs)?;
    ph.mark("map");
    memory::write_pages(pid, &image.page_runs, pages.bytes(), progress)?;
    ph.mark("write pages");
    memory::reprotect(s, &reprotect)?;
    memory::set_mm(s, exe_fd)?;
    ph.mark("memory::set_mm");
    signals::restore_actions(s)?;
    ph.mark("signals::restore_actions");
    // The leader first, so new threads inherit its name.
    threads::restore_thread_state(s, &image.threads[0])?;
    let tids = threads::create_threads(s)?;
    ph.mark("threads::create_threads");
    for t in &image.threads[1..] {
        threads::restore_thread_state(s, t)?;
    }
    timers::restore_itimers(s)?;
    ph.mark("timers::restore_itimers");
    timers::restore_posix(s)?;
    ph.mark("timers::restore_posix");
    process::restore_misc(s)?;
    ph.mark("process::restore_misc");
    signals::queue_pending(s)?;
    ph.mark("signals::queue_pending");
    let first_staged = (image.fds.iter().map(|f| f.fd).max().unwrap_or(2).max(2) + 1) as u64;
    s.run(pid, &[("close_range(staging)".into(), inject::Call::new(libc::SYS_close_range, &[first_staged, u32::MAX as u64, 0]))])?;
    let (lock_calls, lock_args) = files::locks::posix_lock_calls(image, s.data);
    if !lock_calls.is_empty() {
        s.remote.write(s.data, &lock_args)?;
        s.run(pid, &lock_calls)?;
    }
    // Limits while the process still has ferry's user (a process of
    // another user would need CAP_SYS_RESOURCE), credentials last.
    process::restore_limits(pid, image)?;
    let all_tids: Vec<i32> = std::iter::once(pid).chain(tids.iter().copied()).collect();
    process::restore_creds(s, &all_tids)?;
    scratch.unmap(&s.remote, pid)?;
    for t in &image.threads {
        threads::set_final_registers(pid, t)?;
    }
    ph.mark("threads, signals, timers");
    for tid in std::iter::once(pid).chain(tids) {
        ptrace::detach(tid, 0).map_err(|e| EngineError::kernel(pid, format!("releasing thread {tid}"), e))?;
    }
    Ok(())
}
