//! References to the tree's sockets that no fd shows, and the send
//! side's urgent pointer, read in the freeze by a BPF task_file iterator
//! ([`ferry_sys::file_iter`]) over each fd table of the tree and ferry's
//! own.
//!
//! An open file description's reference count is exact while the tree
//! is frozen: its threads are stopped outside system calls (no transient
//! fdget reference), so every reference is an fd of some table, a
//! message in flight (SCM_RIGHTS), a mapping of the socket, or something
//! a kernel object keeps (an io_uring's fixed files or requests). The
//! tree's fds (a table several processes share counts once), ferry's
//! own duplicates, the messages in flight in the tree's own unix queues
//! and the tree's mappings of the socket are known; a count above their
//! sum is a reference from outside the tree that no fd table shows (a
//! message in flight to another process's unix socket, not received):
//! a restored copy would not be the socket those references reach, and
//! a listener's address would still be taken (restore's bind failed with
//! EADDRINUSE after the kill). Refused by name. A count that differs is
//! read once more before refusing, so a passing reference from outside
//! (a process reading /proc/PID/fd of the tree) is not taken for one.
//!
//! Sockets ferry is told are the outside world's (`--external-stdio`)
//! are skipped. When the kernel refuses the program (no BTF, no BPF),
//! nothing is refused and the capture says so in its log.

use super::files::socket_preconditions::check_urgent_sent;
use crate::error::{EngineError, Result};
use crate::procfs::MapsEntry;
use ferry_image::{FdSlot, FileKind, OpenFile};
use ferry_sys::file_iter::{FileIterLayout, FileIterProgram, SocketFile};
use std::collections::HashMap;
use std::sync::OnceLock;

static PROGRAM: OnceLock<Option<FileIterProgram>> = OnceLock::new();

/// This iterator as loaded here (loading it first), for the setsockopt
/// watch (`capture/sockopt_watch.rs`): any program of the same tag, which
/// runs the same instructions, only reads and sets no socket option.
pub(crate) fn own_program() -> Option<ferry_sys::bpf::ProgInfo> {
    program()?.info().ok()
}

fn program() -> Option<&'static FileIterProgram> {
    PROGRAM
        .get_or_init(|| match load_program() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::info!(
                    "sockets referenced outside the tree and urgent bytes sent are not checked: {e}"
                );
                None
            }
        })
        .as_ref()
}

/// Loads the iterator (once per process) ahead of the freeze, waiting
/// for a load [`load_in_background`] started.
pub(super) fn load_ahead() {
    let _ = program();
}

/// Starts loading the iterator on a thread of its own
/// ([`crate::parallel::detach`], joined before ferry forks) unless this
/// process has it: its load, most of the presurvey of a small tree when
/// it ran there, then runs beside the presurvey and the checks after it.
pub(super) fn load_in_background() {
    if PROGRAM.get().is_none() {
        crate::parallel::detach("socket refs loaded ahead", || {
            let _ = program();
        });
    }
}

/// Up to this many open fds, a process whose sockets are wanted while
/// the iterator still loads has them listed from /proc: the dentries
/// that listing leaves (the reason for the iterator, [`socket_fds`])
/// cost nothing at the reap for so few.
const PROC_LISTING_MAX_FDS: u64 = 64;

/// [`socket_fds`] without waiting for a load still under way, for a
/// process with at most [`PROC_LISTING_MAX_FDS`] fds: None then, and the
/// caller lists /proc. The count is the size stat gives /proc/PID/fd
/// (the number of open fds since Linux 6.2; 0 before, taken as unknown:
/// the iterator is waited for).
pub(super) fn socket_fds_unless_loading(pid: i32) -> Option<Vec<(i32, u64, u64)>> {
    if PROGRAM.get().is_none() && (1..=PROC_LISTING_MAX_FDS).contains(&open_fds(pid)) {
        return None;
    }
    socket_fds(pid)
}

/// The number of `pid`'s open fds as stat reports /proc/PID/fd's size
/// (Linux 6.2 and later; 0 before, or when it cannot be read).
fn open_fds(pid: i32) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/fd")).map_or(0, |m| m.len())
}

/// The sockets of `pid`'s fd table as (fd, inode number, the open file
/// description's address), read by the
/// iterator while the process runs: a listing that leaves no dentry
/// under /proc/PID/fd (each one /proc makes stays until the process is
/// reaped, and the reap of a killed server with 10,000 of them ran
/// beside the checkpoint's last steps). None when the iterator does not
/// load or the read fails: the caller lists /proc.
pub(super) fn socket_fds(pid: i32) -> Option<Vec<(i32, u64, u64)>> {
    let socks = program()?
        .sockets(pid)
        .map_err(|e| tracing::debug!("pid {pid}: sockets listed from /proc: {e}"))
        .ok()?;
    Some(socks.iter().map(|s| (s.fd, s.ino, s.file)).collect())
}

fn load_program() -> std::result::Result<FileIterProgram, String> {
    let mut btf = crate::kernel_btf::KernelBtf::open();
    let ctx = "bpf_iter__task_file";
    let layout = FileIterLayout {
        attach_btf_id: btf.func("bpf_iter_task_file")?,
        ctx_meta: btf.byte(ctx, "meta")?,
        ctx_fd: btf.byte(ctx, "fd")?,
        ctx_file: btf.byte(ctx, "file")?,
        meta_seq: btf.byte("bpf_iter_meta", "seq")?,
        f_ref: btf.byte("file", "f_ref")?,
        f_inode: btf.byte("file", "f_inode")?,
        private_data: btf.byte("file", "private_data")?,
        i_mode: btf.byte("inode", "i_mode")?,
        i_ino: btf.byte("inode", "i_ino")?,
        socket_sk: btf.byte("socket", "sk")?,
        snd_una: btf.byte("tcp_sock", "snd_una")?,
        snd_up: btf.byte("tcp_sock", "snd_up")?,
    };
    let program = FileIterProgram::load(&layout).map_err(|e| e.to_string())?;
    btf.save();
    Ok(program)
}

/// Where the references to one description come from.
#[derive(Default, Debug, PartialEq)]
struct Count {
    /// fds of the tree's tables and of ferry's.
    fds: u64,
    in_flight: u64,
    mapped: u64,
    /// As the kernel counted them.
    counted: u64,
    /// The first fd of the tree that holds it.
    holder: Option<(i32, i32, u64)>,
}

impl Count {
    fn outside(&self) -> u64 {
        self.counted.saturating_sub(self.fds + self.in_flight + self.mapped)
    }
}

/// What the check reads of one surveyed process.
pub(super) struct Survey<'a> {
    pub pid: i32,
    pub ppid: i32,
    pub files: &'a [OpenFile],
    pub fds: &'a [FdSlot],
    pub smaps: &'a [MapsEntry],
}

/// The process whose fd table `pid` uses: itself, or the nearest parent
/// it shares its table with (CLONE_FILES).
fn table_owner(pid: i32, procs: &[Survey], share_files: &[i32]) -> i32 {
    let mut p = pid;
    for _ in 0..procs.len() {
        if !share_files.contains(&p) {
            return p;
        }
        match procs.iter().find(|s| s.pid == p) {
            Some(s) => p = s.ppid,
            None => return p,
        }
    }
    p
}

/// The tree's sockets that may be counted: not declared the outside
/// world's (`--external-stdio`).
fn checked_fds<'a>(s: &Survey<'a>) -> HashMap<i32, &'a FileKind> {
    s.fds
        .iter()
        .filter_map(|slot| Some((slot.fd, &s.files.get(slot.file as usize)?.kind)))
        .filter(|(_, k)| !matches!(k, FileKind::ExternalStdio { .. }))
        .collect()
}

fn is_tcp(kind: &FileKind) -> bool {
    matches!(kind, FileKind::InetSocket(s)
        if s.sock_type == libc::SOCK_STREAM && matches!(s.protocol, 0 | libc::IPPROTO_TCP))
}

/// One read of every table: each description's count, and the tree's
/// TCP sockets with their (snd_una, snd_up).
type Read = (HashMap<u64, Count>, Vec<(i32, SocketFile)>);

/// The tables are read one after the other, never side by side: the
/// iterator holds a reference to each file while its program runs, and
/// ferry's duplicates are the tree's descriptions, so a read of ferry's
/// table beside the tree's shows descriptions one reference more (tried:
/// connections were refused as referenced outside the tree).
fn read_tables(prog: &FileIterProgram, procs: &[Survey], share_files: &[i32]) -> Result<Read> {
    let mut counts: HashMap<u64, Count> = HashMap::new();
    let mut tcp = Vec::new();
    let mut by_fd: HashMap<(i32, i32), u64> = HashMap::new();
    for s in procs.iter().filter(|s| !share_files.contains(&s.pid)) {
        let socks = prog
            .sockets(s.pid)
            .map_err(|e| EngineError::kernel(s.pid, "reading its sockets", e))?;
        let kinds = checked_fds(s);
        for f in socks {
            let Some(kind) = kinds.get(&f.fd) else { continue };
            by_fd.insert((s.pid, f.fd), f.file);
            let c = counts.entry(f.file).or_default();
            c.fds += 1;
            c.counted = f.references;
            c.holder.get_or_insert((s.pid, f.fd, f.ino));
            if is_tcp(kind) {
                tcp.push((s.pid, f));
            }
        }
    }
    let me = std::process::id() as i32;
    let own =
        prog.sockets(me).map_err(|e| EngineError::kernel(me, "reading ferry's sockets", e))?;
    for f in own {
        if let Some(c) = counts.get_mut(&f.file) {
            c.fds += 1;
        }
    }
    count_in_flight(procs, share_files, &by_fd, &mut counts);
    count_mapped(procs, &mut counts);
    Ok((counts, tcp))
}

/// Each description in flight in the tree's own unix queues (each queue
/// once: a socket several processes hold is in each one's files).
fn count_in_flight(
    procs: &[Survey],
    share_files: &[i32],
    by_fd: &HashMap<(i32, i32), u64>,
    counts: &mut HashMap<u64, Count>,
) {
    let mut queues = std::collections::HashSet::new();
    for s in procs {
        for f in s.files {
            let FileKind::UnixSocket(u) = &f.kind else { continue };
            if !queues.insert(u.ino) {
                continue;
            }
            for passed in u.in_flight.iter().flat_map(|m| &m.fds) {
                let owner = table_owner(passed.pid, procs, share_files);
                if let Some(c) = by_fd.get(&(owner, passed.fd)).and_then(|f| counts.get_mut(f)) {
                    c.in_flight += 1;
                }
            }
        }
    }
}

/// The tree's mappings of its sockets (a packet ring, a TCP zerocopy
/// receive area): each holds a reference.
fn count_mapped(procs: &[Survey], counts: &mut HashMap<u64, Count>) {
    let mapped: Vec<u64> = procs
        .iter()
        .flat_map(|s| s.smaps)
        .filter(|m| m.path.starts_with("socket:["))
        .map(|m| m.inode)
        .collect();
    if mapped.is_empty() {
        return;
    }
    for c in counts.values_mut() {
        let ino = c.holder.map(|h| h.2).unwrap_or(0);
        c.mapped += mapped.iter().filter(|&&i| i == ino).count() as u64;
    }
}

/// The first description referenced from outside the tree, if any.
fn first_outside(counts: &HashMap<u64, Count>) -> Option<&Count> {
    counts.values().filter(|c| c.outside() > 0).min_by_key(|c| c.holder)
}

/// In the freeze, after the survey: refuses a socket of the tree that
/// something outside the tree references without an fd, and a TCP
/// connection with an urgent byte in its send queue.
pub(super) fn check(procs: &[Survey], share_files: &[i32]) -> Result<()> {
    let has_sockets = procs
        .iter()
        .flat_map(|s| s.files)
        .any(|f| matches!(f.kind, FileKind::InetSocket(_) | FileKind::UnixSocket(_)));
    if !has_sockets {
        return Ok(());
    }
    let Some(prog) = program() else { return Ok(()) };
    let started = std::time::Instant::now();
    let (mut counts, tcp) = read_tables(prog, procs, share_files)?;
    let again = first_outside(&counts).is_some();
    if again {
        counts = read_tables(prog, procs, share_files)?.0;
    }
    tracing::debug!(
        "socket references and urgent pointers of {} sockets read in {:.2} ms{}",
        counts.len(),
        started.elapsed().as_secs_f64() * 1e3,
        if again { " (read twice: a count was above what the tree and ferry hold)" } else { "" }
    );
    for (pid, f) in &tcp {
        check_urgent_sent(*pid, f.fd, f.ino, f.snd_una, f.snd_up)?;
    }
    if let Some(c) = first_outside(&counts) {
        let (pid, fd, ino) = c.holder.unwrap_or_default();
        return Err(EngineError::unsupported(
            pid,
            format!("fd {fd} (socket:[{ino}])"),
            format!(
                "its open file description is also referenced outside the tree (in flight in another process's unix socket, or held by an io_uring): {} reference(s) beyond the tree's fds, its queued messages and mappings; a restored copy would not be the socket they reach, and its address would still be taken",
                c.outside()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn what_is_not_accounted_for_is_outside() {
        let c = Count { fds: 2, in_flight: 1, mapped: 0, counted: 3, holder: None };
        assert_eq!(c.outside(), 0);
        let c = Count { counted: 5, ..c };
        assert_eq!(c.outside(), 2);
        let c = Count { counted: 1, ..c };
        assert_eq!(c.outside(), 0, "fewer than known is not outside");
    }

    /// The iterator on ferry's own table: a listener's description counts
    /// one reference per fd, and one more while in flight in a unix queue.
    #[test]
    fn the_iterator_counts_fds_and_descriptors_in_flight() {
        if !ferry_testkit::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let Some(prog) = program() else {
            eprintln!("skipped: the task_file iterator does not load here");
            return;
        };
        let me = std::process::id() as i32;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let fd = listener.as_raw_fd();
        let count = |fd: i32| {
            let socks = prog.sockets(me).expect("read");
            socks.iter().find(|s| s.fd == fd).map(|s| s.references)
        };
        assert_eq!(count(fd), Some(1));
        let dup = listener.try_clone().expect("dup");
        assert_eq!(count(fd), Some(2));
        assert_eq!(count(dup.as_raw_fd()), Some(2));
        drop(dup);
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        ferry_sys::unix::send(a.as_raw_fd(), b"x", &[fd], None, 0).expect("send");
        assert_eq!(count(fd), Some(2), "in flight in b's queue");
        drop(b);
        drop(a);
    }

    /// The kernel fact the presurvey's choice rests on: /proc/PID/fd's
    /// size is the number of open fds: what a listing shows of a process
    /// that opens no more (0, 1, 2, 5, 6 and what it inherited).
    #[test]
    fn proc_fd_size_counts_the_open_fds() {
        use std::process::{Command, Stdio};
        let mut child = Command::new("sh")
            .args(["-c", "exec 5</dev/null 6</dev/null; exec sleep 30"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh");
        let pid = child.id() as i32;
        // The exec sets the new name before it closes the close-on-exec
        // fds: wait until sleep sleeps (state S, its name set), when the
        // table no longer changes.
        let asleep = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
            stat.contains("(sleep)") && after.starts_with('S')
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !asleep() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let counted = super::open_fds(pid);
        let listed = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
        let _ = child.kill();
        let _ = child.wait();
        assert!(listed >= 5, "{listed} fds listed");
        assert_eq!(counted, listed as u64);
    }
}
