//! Per-process queries that take another process's PID directly.

use crate::{check, last_error, Regs, SysResult};

pub fn get_robust_list(tid: i32) -> SysResult<(u64, u64)> {
    let mut head: u64 = 0;
    let mut len: usize = 0;
    // SAFETY: both out pointers are valid for the sizes the kernel writes.
    check("get_robust_list", unsafe {
        libc::syscall(libc::SYS_get_robust_list, tid, &mut head, &mut len)
    })?;
    Ok((head, len as u64))
}

pub fn set_rlimit(pid: i32, resource: u32, soft: u64, hard: u64) -> SysResult<()> {
    let new = libc::rlimit64 { rlim_cur: soft, rlim_max: hard };
    // SAFETY: new points to a valid struct; old is NULL.
    let r = unsafe { libc::prlimit64(pid, resource as _, &new, std::ptr::null_mut()) };
    if r < 0 {
        return Err(last_error("prlimit64(set)"));
    }
    Ok(())
}

/// `struct user_regs_struct` field order, as stored in images.
pub fn regs_to_words(r: &Regs) -> Vec<u64> {
    vec![
        r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx, r.rdx,
        r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss, r.fs_base, r.gs_base, r.ds,
        r.es, r.fs, r.gs,
    ]
}

/// Inverse of [`regs_to_words`]; `w` must hold 27 words.
pub fn words_to_regs(w: &[u64]) -> Option<Regs> {
    if w.len() != 27 {
        return None;
    }
    // SAFETY: plain integers; all-zero is a valid value.
    let mut r: Regs = unsafe { std::mem::zeroed() };
    let fields = [
        &mut r.r15,
        &mut r.r14,
        &mut r.r13,
        &mut r.r12,
        &mut r.rbp,
        &mut r.rbx,
        &mut r.r11,
        &mut r.r10,
        &mut r.r9,
        &mut r.r8,
        &mut r.rax,
        &mut r.rcx,
        &mut r.rdx,
        &mut r.rsi,
        &mut r.rdi,
        &mut r.orig_rax,
        &mut r.rip,
        &mut r.cs,
        &mut r.eflags,
        &mut r.rsp,
        &mut r.ss,
        &mut r.fs_base,
        &mut r.gs_base,
        &mut r.ds,
        &mut r.es,
        &mut r.fs,
        &mut r.gs,
    ];
    for (f, v) in fields.into_iter().zip(w) {
        *f = *v;
    }
    Some(r)
}

/// Maps a file read-only into our address space (used for pages.img).
pub struct MappedFile {
    ptr: *mut libc::c_void,
    len: usize,
}

impl MappedFile {
    pub fn map(fd: &std::fs::File, offset: u64, len: usize) -> SysResult<MappedFile> {
        Self::map_named(fd, offset, len, "mmap(pages.img)")
    }

    /// [`MappedFile::map`], its error naming the call `call`.
    pub fn map_named(
        fd: &std::fs::File,
        offset: u64,
        len: usize,
        call: &'static str,
    ) -> SysResult<MappedFile> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Ok(MappedFile { ptr: std::ptr::null_mut(), len: 0 });
        }
        // No MAP_POPULATE: the verifying threads fault the pages in, in
        // parallel, which measured faster than populating up front.
        // SAFETY: a fresh shared read-only mapping of an open file; the
        // kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as i64,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_error(call));
        }
        Ok(MappedFile { ptr: p, len })
    }

    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr/len describe our live read-only mapping. The file is
        // ferry's own image; a concurrent truncation would SIGBUS, which
        // the image's owner controls.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

// SAFETY: the mapping is read-only and owned by this value alone (unmapped
// only by its Drop); reading it from any thread is as safe as from the one
// that made it, so it may move between threads and be shared by them
// (meta.img's mapping backs the TCP queues a restore's workers send).
unsafe impl Send for MappedFile {}
// SAFETY: see Send: `bytes` only reads the read-only mapping.
unsafe impl Sync for MappedFile {}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmapping exactly the mapping we created.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

/// A thread's scheduling: policy, real-time priority, nice value, CPU mask.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sched {
    pub policy: i32,
    pub rt_priority: i32,
    pub nice: i32,
    pub cpus: Vec<u64>,
}

pub fn get_sched(tid: i32) -> SysResult<Sched> {
    // SAFETY: integer argument.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy < 0 {
        return Err(last_error("sched_getscheduler"));
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: param is a valid out pointer.
    if unsafe { libc::sched_getparam(tid, &mut param) } < 0 {
        return Err(last_error("sched_getparam"));
    }
    // getpriority can legitimately return -1: clear errno first.
    // SAFETY: errno location is thread-local and always valid.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: integer arguments.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    // SAFETY: as above.
    if nice == -1 && unsafe { *libc::__errno_location() } != 0 {
        return Err(last_error("getpriority"));
    }
    let mut cpus = vec![0u64; 16];
    // SAFETY: cpus is a writable buffer of the given byte length.
    let r = unsafe {
        libc::syscall(libc::SYS_sched_getaffinity, tid, cpus.len() * 8, cpus.as_mut_ptr())
    };
    let n = check("sched_getaffinity", r)? as usize;
    cpus.truncate(n / 8);
    Ok(Sched { policy, rt_priority: param.sched_priority, nice, cpus })
}

/// What sched_getattr(2) adds to [`Sched`]: the deadline parameters and
/// the utilization clamps a thread asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SchedExtra {
    pub policy: u32,
    pub flags: u64,
    pub runtime: u64,
    pub deadline: u64,
    pub period: u64,
    /// 0 and 1024 unless the thread set clamps (both 0 on a kernel
    /// without utilization clamping, which reports the shorter struct).
    pub util_min: u32,
    pub util_max: u32,
}

pub const SCHED_DEADLINE: u32 = 6;

pub fn get_sched_extra(tid: i32) -> SysResult<SchedExtra> {
    // struct sched_attr as of SCHED_ATTR_SIZE_VER1 (56 bytes).
    let mut attr = [0u8; 56];
    // SAFETY: attr is a writable buffer of the size passed.
    let r = unsafe {
        libc::syscall(libc::SYS_sched_getattr, tid, attr.as_mut_ptr(), attr.len() as u32, 0u32)
    };
    check("sched_getattr", r)?;
    let u32_at = |o: usize| u32::from_ne_bytes([attr[o], attr[o + 1], attr[o + 2], attr[o + 3]]);
    let u64_at = |o: usize| u64::from(u32_at(o)) | u64::from(u32_at(o + 4)) << 32;
    Ok(SchedExtra {
        policy: u32_at(4),
        flags: u64_at(8),
        runtime: u64_at(24),
        deadline: u64_at(32),
        period: u64_at(40),
        util_min: u32_at(48),
        util_max: u32_at(52),
    })
}

pub fn set_sched(tid: i32, s: &Sched) -> SysResult<()> {
    // SAFETY: the mask buffer is live for the given byte length.
    check("sched_setaffinity", unsafe {
        libc::syscall(libc::SYS_sched_setaffinity, tid, s.cpus.len() * 8, s.cpus.as_ptr())
    })?;
    // SAFETY: integer arguments.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, s.nice) } < 0 {
        return Err(last_error("setpriority"));
    }
    let param = libc::sched_param { sched_priority: s.rt_priority };
    // SAFETY: param is a valid sched_param.
    if unsafe { libc::sched_setscheduler(tid, s.policy, &param) } < 0 {
        return Err(last_error("sched_setscheduler"));
    }
    Ok(())
}

/// The CPU the calling thread runs on at this moment (sched_getcpu),
/// None if the kernel cannot tell.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments; returns a CPU number or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Lets thread `tid` run on CPU `cpu` only (sched_setaffinity).
pub fn pin_to_cpu(tid: i32, cpu: usize) -> SysResult<()> {
    let mut mask = vec![0u64; cpu / 64 + 1];
    mask[cpu / 64] |= 1 << (cpu % 64);
    // SAFETY: the mask buffer is live for the given byte length.
    check("sched_setaffinity", unsafe {
        libc::syscall(libc::SYS_sched_setaffinity, tid, mask.len() * 8, mask.as_ptr())
    })?;
    Ok(())
}

/// Thread `tid`'s CPU mask (sched_getaffinity), as 64-bit words.
pub fn get_affinity(tid: i32) -> SysResult<Vec<u64>> {
    let mut cpus = vec![0u64; 16];
    // SAFETY: cpus is a writable buffer of the given byte length.
    let r = unsafe {
        libc::syscall(libc::SYS_sched_getaffinity, tid, cpus.len() * 8, cpus.as_mut_ptr())
    };
    let n = check("sched_getaffinity", r)? as usize;
    cpus.truncate(n / 8);
    Ok(cpus)
}

/// Sets thread `tid`'s CPU mask (sched_setaffinity) to `cpus` words.
pub fn set_affinity(tid: i32, cpus: &[u64]) -> SysResult<()> {
    // SAFETY: the mask buffer is live for the given byte length.
    check("sched_setaffinity", unsafe {
        libc::syscall(libc::SYS_sched_setaffinity, tid, std::mem::size_of_val(cpus), cpus.as_ptr())
    })?;
    Ok(())
}

/// The calling thread's id.
pub fn gettid() -> i32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::gettid() }
}

/// Thread `tid`'s nice value (Linux keeps one per thread; 0: the
/// calling thread).
pub fn thread_nice(tid: i32) -> SysResult<i32> {
    // getpriority can legitimately return -1: clear errno first.
    // SAFETY: errno location is thread-local and always valid.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: integer arguments.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    // SAFETY: as above.
    if nice == -1 && unsafe { *libc::__errno_location() } != 0 {
        return Err(last_error("getpriority"));
    }
    Ok(nice)
}

/// Sets thread `tid`'s nice value (0: the calling thread); threads it
/// starts afterwards (and processes it forks) inherit it.
pub fn set_thread_nice(tid: i32, nice: i32) -> SysResult<()> {
    // SAFETY: integer arguments.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } < 0 {
        return Err(last_error("setpriority"));
    }
    Ok(())
}

/// Puts thread `tid` (0: the calling thread) under real-time round-robin
/// scheduling at `priority` (1-99); threads it starts afterwards (and
/// processes it forks) inherit it.
pub fn set_round_robin(tid: i32, priority: i32) -> SysResult<()> {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: param is a valid sched_param.
    if unsafe { libc::sched_setscheduler(tid, libc::SCHED_RR, &param) } < 0 {
        return Err(last_error("sched_setscheduler(SCHED_RR)"));
    }
    Ok(())
}

/// Waits for child `pid` to exit (retrying on EINTR); errors are ignored.
pub fn wait_child(pid: i32) {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Makes a freshly forked helper independent of the command that forked
/// it: a session of its own, stdio on /dev/null (so it does not hold the
/// caller's pipes open), every other descriptor but `keep` closed.
pub fn detach_from_caller(keep: i32) {
    // SAFETY: setsid, open, dup2 and close_range take plain arguments.
    unsafe {
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                if fd != keep {
                    libc::dup2(null, fd);
                }
            }
            if null > 2 && null != keep {
                libc::close(null);
            }
        }
        if keep > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (keep - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (keep.max(2) + 1) as u32, u32::MAX, 0u32);
    }
}

/// kill(2).
pub fn kill(pid: i32, sig: i32) -> SysResult<()> {
    // SAFETY: integer arguments.
    if unsafe { libc::kill(pid, sig) } < 0 {
        Err(crate::last_error("kill"))
    } else {
        Ok(())
    }
}

/// kcmp(2) kinds that compare a whole resource of two processes.
pub const KCMP_VM: i32 = 1;
pub const KCMP_FILES: i32 = 2;
pub const KCMP_FS: i32 = 3;
pub const KCMP_SIGHAND: i32 = 4;

/// Whether two processes share the resource `kind` (KCMP_VM, KCMP_FILES...).
pub fn kcmp_shared(pid1: i32, pid2: i32, kind: i32) -> SysResult<bool> {
    // SAFETY: kcmp with these kinds takes only integers.
    let r = unsafe {
        libc::syscall(libc::SYS_kcmp, pid1, pid2, kind, 0 as libc::c_ulong, 0 as libc::c_ulong)
    };
    Ok(crate::check("kcmp", r)? == 0)
}

/// prctl(2) for a getter whose answer is the return value (e.g.
/// PR_GET_SPECULATION_CTRL); a negative value means -1 and errno.
pub fn prctl_get(option: i32, arg: u64) -> i64 {
    // SAFETY: integer arguments; getters only read the caller's setting.
    unsafe { libc::prctl(option, arg, 0, 0, 0) as i64 }
}

/// ioprio_get(IOPRIO_WHO_PROCESS, tid): the I/O priority of one thread
/// (0 for the calling one).
pub fn ioprio_get(tid: i32) -> SysResult<i32> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    // SAFETY: integer arguments; the call only reads a thread's setting.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid as libc::c_long) };
    if r < 0 {
        return Err(last_error("ioprio_get"));
    }
    Ok(r as i32)
}

/// Sets thread `tid`'s I/O priority (IOPRIO_WHO_PROCESS: one thread).
pub fn ioprio_set(tid: i32, prio: i32) -> SysResult<()> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    // SAFETY: integer arguments; the call only changes a thread's setting.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_long,
            prio as libc::c_long,
        )
    };
    if r < 0 {
        return Err(last_error("ioprio_set"));
    }
    Ok(())
}

/// Makes the caller the child subreaper of its descendants: orphans below
/// it are re-parented to it rather than to PID 1.
pub fn set_child_subreaper() -> SysResult<()> {
    // SAFETY: prctl with integer arguments on the calling process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } < 0 {
        return Err(last_error("prctl(PR_SET_CHILD_SUBREAPER)"));
    }
    Ok(())
}

/// Waits for any child to end and reaps it: Some((pid, exit code or
/// 128+signal)), or None when there is no child at all.
pub fn wait_any() -> SysResult<Option<(i32, i32)>> {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r >= 0 {
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
            return Ok(Some((r, code)));
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return Ok(None),
            _ => return Err(last_error("waitpid(-1)")),
        }
    }
}

/// setsid(2): the caller leads a new session (and process group).
pub fn setsid() -> SysResult<i32> {
    // SAFETY: no arguments.
    let r = unsafe { libc::setsid() };
    if r < 0 {
        Err(last_error("setsid"))
    } else {
        Ok(r)
    }
}

/// setpgid(2); 0 for either argument means the caller.
pub fn setpgid(pid: i32, pgid: i32) -> SysResult<()> {
    // SAFETY: integer arguments.
    if unsafe { libc::setpgid(pid, pgid) } < 0 {
        Err(last_error("setpgid"))
    } else {
        Ok(())
    }
}

/// umask(2): sets the caller's file creation mask, returns the old one.
pub fn umask(mask: u32) -> u32 {
    // SAFETY: integer argument; umask cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// personality(2): sets the caller's execution domain, returns the old one.
pub fn set_personality(persona: u64) -> SysResult<i32> {
    // SAFETY: integer argument.
    let r = unsafe { libc::personality(persona as libc::c_ulong) };
    if r < 0 {
        Err(last_error("personality"))
    } else {
        Ok(r)
    }
}

/// prctl(PR_SET_NO_NEW_PRIVS, 1): execve can no longer grant privileges
/// to the caller (irreversible).
pub fn set_no_new_privs() -> SysResult<()> {
    // SAFETY: integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        Err(last_error("prctl(PR_SET_NO_NEW_PRIVS)"))
    } else {
        Ok(())
    }
}

/// _exit(2): ends the process at once, without atexit handlers or
/// flushing stdio (which belong to the parent in a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions and does not return.
    unsafe { libc::_exit(code) }
}

/// A shared anonymous mapping (MAP_SHARED | MAP_ANONYMOUS) of our own,
/// unmapped on drop. The shmem object behind it can be opened through
/// /proc/self/map_files/START-END and outlives the mapping in that fd.
pub struct SharedAnon {
    ptr: *mut libc::c_void,
    len: usize,
}

impl SharedAnon {
    pub fn map(len: usize) -> SysResult<SharedAnon> {
        // SAFETY: a fresh shared anonymous mapping at an address the
        // kernel picks; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_error("mmap(MAP_SHARED | MAP_ANONYMOUS)"));
        }
        Ok(SharedAnon { ptr: p, len })
    }

    /// First address of the mapping.
    pub fn start(&self) -> u64 {
        self.ptr as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SharedAnon {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`; nothing
        // borrows its memory (the type hands out no references to it).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Waits for child `pid` (any state change that ends it), retrying on
/// EINTR: Some(exit code or 128+signal), None when it is not our child.
pub fn wait_pid(pid: i32) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// Reaps any child or traced thread that has ended (waitpid(-1, __WALL)),
/// blocking; false once there is none left to wait for.
pub fn reap_any_thread() -> bool {
    // SAFETY: no status wanted; reaping is all this does.
    unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::__WALL) >= 0 }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit.
pub fn raise_nofile_limit() {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: r is a valid rlimit to fill and then pass back.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Sets the calling thread's name (PR_SET_NAME, at most 15 bytes used).
pub fn set_name(name: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: name is a NUL-terminated string the kernel only reads.
    if unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) } < 0 {
        return Err(last_error("prctl(PR_SET_NAME)"));
    }
    Ok(())
}

/// Whether the caller runs as root (effective UID 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// What a child started with [`std::process::Command`] does between
/// fork and exec, in this order.
#[derive(Debug, Default)]
pub struct ExecSetup {
    /// setns(2) into this network namespace (an open nsfs file).
    pub net_namespace: Option<std::os::fd::OwnedFd>,
    /// setsid(2): a session and process group of its own, so that the
    /// program refers to none of its parent's.
    pub new_session: bool,
    /// close_range(3, ~0): only stdin, stdout and stderr cross exec. A
    /// descriptor inherited without O_CLOEXEC (cargo's jobserver pipe, for
    /// one) would otherwise end up in the program.
    pub only_stdio: bool,
}

/// Makes `cmd`'s child run `setup` between fork and exec. A failed setns
/// or setsid fails the spawn.
pub fn set_exec_setup(
    cmd: &mut std::process::Command,
    setup: ExecSetup,
) -> &mut std::process::Command {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let ExecSetup { net_namespace, new_session, only_stdio } = setup;
    let hook = move || -> std::io::Result<()> {
        if let Some(ns) = &net_namespace {
            // SAFETY: setns with an fd the closure owns (open until the
            // Command is dropped) and a constant flag.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: no arguments.
        if new_session && unsafe { libc::setsid() } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if only_stdio {
            // SAFETY: integer arguments; this process owns no Rust value
            // holding those fds that runs again before exec.
            unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and calls only
    // setns, setsid and close_range, which are async-signal-safe; it does
    // not allocate (the Option is matched by reference).
    unsafe { cmd.pre_exec(hook) }
}

/// waitpid(pid, WNOHANG): reaps child `pid` if it has ended and returns
/// its raw wait status, None while it runs.
pub fn try_wait_pid(pid: i32) -> SysResult<Option<i32>> {
    let mut status = 0;
    // SAFETY: status is a valid out pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    if r < 0 {
        return Err(last_error("waitpid(WNOHANG)"));
    }
    Ok((r == pid).then_some(status))
}

#[cfg(test)]
mod pin_tests {
    use super::*;

    #[test]
    fn a_thread_pinned_to_its_cpu_may_run_there_only() {
        // A thread of its own: the test harness's threads keep their masks.
        std::thread::spawn(|| {
            let cpu = current_cpu().expect("sched_getcpu");
            pin_to_cpu(gettid(), cpu).expect("sched_setaffinity");
            let cpus = get_sched(gettid()).expect("sched_getaffinity").cpus;
            let allowed: Vec<usize> =
                (0..cpus.len() * 64).filter(|&c| cpus[c / 64] & (1 << (c % 64)) != 0).collect();
            assert_eq!(allowed, vec![cpu]);
            assert_eq!(current_cpu(), Some(cpu));
        })
        .join()
        .expect("the pinned thread");
    }
}
