//! What a checkpoint image holds. Plain data, serialised with postcard;
//! everything the engine needs to rebuild the process and nothing that
//! only makes sense inside the capturing ferry process.

use serde::{Deserialize, Serialize};

/// Facts about the image and the machine it was taken on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Inventory {
    pub format_version: u32,
    pub ferry_version: String,
    pub kernel_release: String,
    pub arch: String,
    /// Size of the XSAVE area on the capturing CPU; restore needs the same.
    pub xsave_size: u32,
    pub created_unix_ms: u64,
    pub source_pid: i32,
    /// Total bytes of page data in pages.img (after its header).
    pub pages_bytes: u64,
}

/// A whole process tree: every process of it, and the kernel objects its
/// processes share (shared memory segments live here, not in a process).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct TreeImage {
    /// Parents come before their children; the first is the tree's root.
    pub processes: Vec<ProcessImage>,
    /// Children that had exited but were not yet reaped by their parent.
    pub zombies: Vec<Zombie>,
    /// Anonymous shared memory (MAP_SHARED | MAP_ANONYMOUS), by shmem
    /// inode, with its content; `VmaBacking::SharedAnon` refers to it.
    pub shared_anon: Vec<MemfdObject>,
    /// SysV shared memory segments some process of the tree has attached.
    pub sysv_shm: Vec<SysvShm>,
    /// SysV semaphore sets the tree used.
    pub sysv_sem: Vec<SysvSem>,
    /// SysV message queues the tree used, with their messages.
    pub sysv_msg: Vec<SysvMsgQueue>,
    /// The tree ran in a PID namespace of its own (not the capturing
    /// ferry's): every PID here is as that namespace saw it, and restore
    /// makes a new PID namespace for it.
    pub own_pid_namespace: bool,
    /// The network lock holding the tree's TCP connections frozen, if it
    /// had any.
    pub network_lock: Option<NetworkLockRef>,
    /// Format 4.2: the cgroups each process was in. Not part of the
    /// process tree section (postcard is positional, and an older minor
    /// must still decode): the container writes and reads it as the
    /// optional `Cgroups` section. `None` for images older than 4.2,
    /// whose processes were in the cgroups of the ferry that took them.
    #[serde(skip)]
    pub cgroups: Option<CgroupImage>,
    /// Format 4.3: what SO_PEERCRED said on each connected unix socket of
    /// the tree, in the optional `UnixPeers` section (outside the tree
    /// section for the reason `cgroups` is). `None` for older images,
    /// whose connections restore makes in ferry (SO_PEERCRED then names
    /// the restoring ferry and root).
    #[serde(skip)]
    pub unix_peers: Option<UnixPeersImage>,
    /// Format 4.4: the connected unix sockets of the tree whose peer was
    /// closed, in the optional `UnixDeadPeers` section (outside the tree
    /// section for the reason `cgroups` is). `None` for older images,
    /// which never hold such a socket (checkpoint refused them).
    #[serde(skip)]
    pub unix_dead_peers: Option<UnixDeadPeersImage>,
    /// Format 4.4: files passed with SCM_RIGHTS, still in flight, that no
    /// process of the tree holds (the sender closed its copy), in the
    /// optional `UnixInFlightFiles` section. Their `PassedFd` in
    /// `UnixInFlight::fds` is [`PassedFd::HELD_BY_NONE`].
    #[serde(skip)]
    pub unix_in_flight_files: Option<UnixInFlightFilesImage>,
    /// Format 4.5: the pseudo-terminal pairs of the tree (both ends held
    /// by its processes), in the optional `Ptys` section. Their ends are
    /// `FileKind::Terminal` files this section lists by id; a terminal
    /// it does not list is replaced by `--tty-to` at restore. `None` for
    /// older images, whose terminals were all replaced.
    #[serde(skip)]
    pub ptys: Option<PtysImage>,
    /// Format 4.7: per-process attributes added after the process
    /// section's layout was fixed, in the optional `ProcessAttrs` section
    /// (outside the tree section for the reason `cgroups` is), one entry
    /// per process in `processes` order. `None` for older images.
    #[serde(skip)]
    pub process_attrs: Option<ProcessAttrsImage>,
    /// Format 4.8: the SOL_SOCKET options of the tree's unix sockets
    /// (buffer sizes, timeouts, flags...), in the optional
    /// `UnixSocketOptions` section (outside the tree section for the
    /// reason `cgroups` is). `None` for older images, whose unix sockets
    /// had every option but SO_PASSCRED as a fresh socket has it
    /// (checkpoint refused any other).
    #[serde(skip)]
    pub unix_socket_options: Option<UnixSocketOptionsImage>,
    /// Format 4.9: the UTS namespace of the tree's own (every process in
    /// one that is not ferry's and that no process outside the tree is
    /// in), in the optional `Uts` section: restore makes a new one with
    /// these names for the root, which its descendants inherit. `None`:
    /// the tree was in the UTS namespace of the ferry that took it (older
    /// images always), and is restored into the restoring ferry's.
    #[serde(skip)]
    pub uts: Option<UtsImage>,
}

/// Format 4.9, in the optional `Uts` section: the names of the tree's UTS
/// namespace, each at most 64 bytes (__NEW_UTS_LEN) with no NUL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UtsImage {
    pub hostname: String,
    pub domainname: String,
}

/// Format 4.8, in the optional `UnixSocketOptions` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnixSocketOptionsImage {
    pub sockets: Vec<UnixSocketOptions>,
}

/// The options one unix socket of the tree has, each at most once, in
/// the order restore sets them. SO_PASSCRED is `UnixSocket::passcred`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnixSocketOptions {
    /// `UnixSocket::ino` of a socket of the tree.
    pub ino: u64,
    /// Each a SOL_SOCKET option of [`UNIX_SOCKET_OPTIONS`].
    pub options: Vec<SockOpt>,
}

/// The SOL_SOCKET options a `UnixSocketOptions` entry may hold, with the
/// length of the value getsockopt gives: an int, `struct linger` (8
/// bytes) or a `struct timeval` (16 bytes, SO_RCVTIMEO_OLD and
/// SO_SNDTIMEO_OLD).
pub const UNIX_SOCKET_OPTIONS: &[(i32, usize)] = &[
    (1, 4),   // SO_DEBUG
    (2, 4),   // SO_REUSEADDR
    (5, 4),   // SO_DONTROUTE
    (6, 4),   // SO_BROADCAST
    (7, 4),   // SO_SNDBUF
    (8, 4),   // SO_RCVBUF
    (9, 4),   // SO_KEEPALIVE
    (10, 4),  // SO_OOBINLINE
    (11, 4),  // SO_NO_CHECK
    (12, 4),  // SO_PRIORITY
    (13, 8),  // SO_LINGER
    (18, 4),  // SO_RCVLOWAT
    (20, 16), // SO_RCVTIMEO_OLD
    (21, 16), // SO_SNDTIMEO_OLD
    (29, 4),  // SO_TIMESTAMP_OLD
    (34, 4),  // SO_PASSSEC
    (35, 4),  // SO_TIMESTAMPNS_OLD
    (36, 4),  // SO_MARK
    (40, 4),  // SO_RXQ_OVFL
    (42, 4),  // SO_PEEK_OFF
    (45, 4),  // SO_SELECT_ERR_QUEUE
    (46, 4),  // SO_BUSY_POLL
    (69, 4),  // SO_PREFER_BUSY_POLL
    (72, 4),  // SO_BUF_LOCK
    (75, 4),  // SO_RCVMARK
    (76, 4),  // SO_PASSPIDFD
    (82, 4),  // SO_RCVPRIORITY
    (83, 4),  // SO_PASSRIGHTS
];

/// Format 4.7, in the optional `ProcessAttrs` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ProcessAttrsImage {
    /// Entry i belongs to `TreeImage::processes[i]`.
    pub processes: Vec<ProcessAttrs>,
}

/// Attributes of one process that the process section does not hold.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ProcessAttrs {
    /// /proc/PID/coredump_filter: which mappings a core dump includes.
    pub coredump_filter: u32,
    /// The inode of the process's network namespace when it was not the
    /// checkpointing ferry's; None when it was. A restore without
    /// `--netns` that would put such a process into another namespace
    /// refuses the image instead.
    pub netns: Option<u64>,
    /// Format 4.8: each thread's I/O priority as ioprio_get(2) reads it
    /// (class << 13 | level), one per thread in `ProcessImage::threads`
    /// order.
    pub ioprio: Vec<u16>,
    /// Format 4.8: the nice value of the process's scheduling autogroup
    /// (/proc/PID/autogroup) when the process is in the autogroup of its
    /// session, whose leader is in the tree; None otherwise.
    pub autogroup_nice: Option<i32>,
    /// Format 4.8: (/proc/PID/loginuid, /proc/PID/sessionid), u32::MAX
    /// when unset. The restored root writes the loginuid itself when it
    /// differs from the restoring ferry's (the kernel then gives it a new
    /// audit session, unset for an unset loginuid); the other processes
    /// inherit their parent's. None for an older image.
    pub audit: Option<(u32, u32)>,
}

/// What a 4.7 image's `ProcessAttrs` section holds for one process.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct ProcessAttrs47 {
    pub coredump_filter: u32,
    pub netns: Option<u64>,
}

/// A 4.7 image's `ProcessAttrs` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ProcessAttrsImage47 {
    pub processes: Vec<ProcessAttrs47>,
}

impl From<ProcessAttrsImage47> for ProcessAttrsImage {
    /// A 4.7 image was checkpointed only when the loginuid, I/O priority
    /// and autogroup nice were what any restored process gets: nothing
    /// to set.
    fn from(old: ProcessAttrsImage47) -> Self {
        let processes = old
            .processes
            .into_iter()
            .map(|a| ProcessAttrs {
                coredump_filter: a.coredump_filter,
                netns: a.netns,
                ioprio: Vec::new(),
                autogroup_nice: None,
                audit: None,
            })
            .collect();
        ProcessAttrsImage { processes }
    }
}

/// Format 4.6, in the optional `Ptys` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtysImage {
    pub pairs: Vec<PtyPair>,
    /// Which open file descriptions are ends of which pair.
    pub ends: Vec<PtyEnd>,
}

/// One pseudo-terminal pair, /dev/pts/`index` and its master.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyPair {
    /// The slave's number in the tree's devpts (TIOCGPTN).
    pub index: u32,
    /// The pair's termios (TCGETS2; a master reads the slave's).
    pub termios: PtyTermios,
    /// TIOCGWINSZ: rows, columns, x and y pixels.
    pub winsize: [u16; 4],
    /// TIOCGPKT: packet mode on the master.
    pub packet: bool,
    /// TIOCGPTLCK: the slave is locked (unlockpt not called).
    pub locked: bool,
    /// TIOCGEXCL: exclusive mode.
    pub exclusive: bool,
    /// The slave node's mode (permission bits), owner and group, as
    /// grantpt or the program set them.
    pub slave_mode: u32,
    pub slave_uid: u32,
    pub slave_gid: u32,
    /// Input the slave has not read: complete lines first (in canonical
    /// mode, each as one read returned it, its terminator included; an
    /// empty one is an end of file typed on an empty line), then what
    /// follows the last line end (a line being typed, or, in
    /// non-canonical mode, everything).
    pub input_lines: Vec<Vec<u8>>,
    pub input_rest: Vec<u8>,
    /// Output of the slave the master has not read.
    pub output: Vec<u8>,
    /// The session whose controlling terminal this is (0: none), and its
    /// foreground process group, as the tree sees them.
    pub session: i32,
    pub foreground: i32,
}

/// `struct termios2`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyTermios {
    pub iflag: u32,
    pub oflag: u32,
    pub cflag: u32,
    pub lflag: u32,
    pub line: u8,
    pub cc: Vec<u8>,
    pub ispeed: u32,
    pub ospeed: u32,
}

/// An open file description (`FileKind::Terminal`) that is one end of
/// a pair of the section.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyEnd {
    /// `OpenFile::id`.
    pub file: u64,
    pub index: u32,
    /// The master (/dev/ptmx); otherwise the slave (/dev/pts/N).
    pub master: bool,
}

/// Format 4.4, in the optional `UnixInFlightFiles` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnixInFlightFilesImage {
    pub files: Vec<InFlightFile>,
}

/// One descriptor in flight that only the message holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InFlightFile {
    /// `UnixSocket::ino` of the socket whose queue holds the message.
    pub socket: u64,
    /// Index of the message in that socket's `queued`.
    pub message: u32,
    /// Place of the descriptor among the message's `UnixInFlight::fds`.
    pub index: u32,
    /// The open file description; its id is unique in the tree (the
    /// same id where one description is in flight several times).
    pub file: OpenFile,
}

/// Format 4.4, in the optional `UnixDeadPeers` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixDeadPeersImage {
    pub sockets: Vec<UnixDeadPeer>,
}

/// A connected unix socket of the tree whose peer was closed. The kernel
/// keeps the closed peer as its peer (getpeername names it, sock_diag
/// gives it no inode), shuts a stream or seqpacket survivor down both
/// ways (reads give what is queued then EOF, writes EPIPE) and, when the
/// peer had unread data, leaves ECONNRESET pending in SO_ERROR; a
/// datagram survivor's next send fails with ECONNREFUSED and disconnects
/// it. Restore connects the socket again to a stand-in for the peer,
/// sends its queue from the stand-in and closes the stand-in. The
/// survivor's `UnixSocket` has no `peer` and its shutdown as the kernel
/// set it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixDeadPeer {
    /// `UnixSocket::ino` of the surviving socket.
    pub ino: u64,
    /// The closed peer's name (getpeername of the survivor), as
    /// `UnixSocket::name`: empty when it had none.
    pub peer_name: Vec<u8>,
    /// A stream or seqpacket survivor called connect() (its peer was the
    /// accepted end, named like the listener); otherwise it is an
    /// accepted end or one end of a socketpair.
    pub client: bool,
    /// ECONNRESET is pending in SO_ERROR (the peer was closed with data
    /// the survivor had sent still unread).
    pub reset: bool,
}

/// Format 4.3, in the optional `UnixPeers` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixPeersImage {
    pub sockets: Vec<UnixPeerCred>,
}

/// SO_PEERCRED of one connected (or listening) unix socket of the tree:
/// the process that made the connection (for an accepted end, the one
/// that called connect; for a client, the one that called listen on its
/// listener; for both ends of a socketpair, its caller; for a listener,
/// the one that called listen) with its effective uid and gid then.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixPeerCred {
    /// `UnixSocket::ino` of a socket of the tree.
    pub ino: u64,
    /// A process of the tree, as the tree sees its PID.
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// SO_PEERGROUPS: that process's supplementary groups then.
    pub groups: Vec<u32>,
}

/// Format 4.2, in the optional `Cgroups` section: cgroup membership,
/// one entry per process of the tree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupImage {
    pub processes: Vec<ProcessCgroups>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessCgroups {
    /// A process of the tree (every thread is in the same cgroups).
    pub pid: i32,
    /// One entry per hierarchy, as /proc/PID/cgroup lists them.
    pub memberships: Vec<CgroupMembership>,
}

/// One line of /proc/PID/cgroup. Hierarchy ids are local to a host, so
/// restore finds the hierarchy by its controllers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupMembership {
    /// The hierarchy id (0 for the cgroup v2 hierarchy).
    pub hierarchy: u32,
    /// Comma-separated controllers of a v1 hierarchy ("memory",
    /// "cpu,cpuacct", "name=systemd"); empty for v2.
    pub controllers: String,
    /// The cgroup, from the hierarchy's root ("/" or "/a/b").
    pub path: String,
}

impl TreeImage {
    /// A tree of one process.
    pub fn single(p: ProcessImage) -> TreeImage {
        TreeImage { processes: vec![p], ..Default::default() }
    }
    pub fn root(&self) -> Option<&ProcessImage> {
        self.processes.first()
    }
}

/// A run of whole 4 KiB pages: its first address and how many pages. Not
/// an address range (see [`AddrRange`]): the second number counts pages.
/// Encoded as the (address, pages) pair it replaces.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct PageSpan {
    pub start: u64,
    pub pages: u64,
}

impl PageSpan {
    pub const fn new(start: u64, pages: u64) -> PageSpan {
        PageSpan { start, pages }
    }

    /// The address after the last page (saturating).
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.pages.saturating_mul(4096))
    }

    pub fn range(&self) -> AddrRange {
        AddrRange { start: self.start, end: self.end() }
    }
}

/// Addresses `start..end`, end excluded.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct AddrRange {
    pub start: u64,
    pub end: u64,
}

impl AddrRange {
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// Format 4.1, in the optional `Incremental` section: the image is one
/// round of a pre-copy migration and holds only the pages written since
/// the previous round; the other pages the processes had are in its
/// parent (the earlier rounds). An image without this section holds all
/// its pages. Restoring an incremental image needs its parent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incremental {
    /// Identifies the parent (e.g. the migration id or the parent image's id).
    pub parent_id: u64,
    /// At most one entry per process.
    pub parent_pages: Vec<ParentPages>,
}

/// Pages present when the image was taken whose bytes are not in this
/// image but in its parent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentPages {
    /// A process of the tree.
    pub pid: i32,
    /// Sorted, non-overlapping (start address, number of 4 KiB pages);
    /// each inside one of the process's mappings and outside its own
    /// page runs.
    pub ranges: Vec<PageSpan>,
}

impl Incremental {
    /// Number of pages that are in the parent (saturating).
    pub fn parent_page_count(&self) -> u64 {
        self.parent_pages
            .iter()
            .flat_map(|p| p.ranges.iter())
            .fold(0u64, |a, r| a.saturating_add(r.pages))
    }
}

/// An exited child its parent had not reaped yet.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Zombie {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    /// The exit status as wait(2) reports it (exit code << 8, or signal).
    pub wait_status: i32,
}

/// A SysV shared memory segment (shmget), recreated under the same id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SysvShm {
    pub id: i32,
    pub key: i32,
    pub size: u64,
    /// Permission bits (the low 9 bits of shm_perm.mode).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// (offset, bytes) of every data extent; holes are not stored.
    pub extents: Vec<(u64, Vec<u8>)>,
}

/// A SysV semaphore set (semget), recreated under the same id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SysvSem {
    pub id: i32,
    pub key: i32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The value of every semaphore of the set, in order.
    pub values: Vec<u16>,
}

/// A SysV message queue (msgget), recreated under the same id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SysvMsgQueue {
    pub id: i32,
    pub key: i32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The queue's byte limit (msg_qbytes).
    pub max_bytes: u64,
    /// Queued messages, oldest first: (type, text).
    pub messages: Vec<(i64, Vec<u8>)>,
}

/// A private mapping a child inherited from its parent over fork, with
/// the pages it still shares with the parent (copy-on-write, not yet
/// written by either). Restore forks the child from its restored parent
/// and keeps these pages shared instead of copying them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InheritedVma {
    pub start: u64,
    pub end: u64,
    /// Runs of pages shared with the parent.
    pub shared_pages: Vec<PageSpan>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessImage {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    pub comm: String,
    pub exe: String,
    pub cwd: String,
    pub umask: u32,
    pub personality: u32,
    pub no_new_privs: bool,
    pub creds: Creds,
    pub rlimits: Vec<Rlimit>,
    /// The thread group leader comes first.
    pub threads: Vec<ThreadImage>,
    pub mm: MmLayout,
    pub vmas: Vec<Vma>,
    pub page_runs: Vec<PageRun>,
    pub files: Vec<OpenFile>,
    pub fds: Vec<FdSlot>,
    pub signals: SignalState,
    pub itimers: Vec<ITimer>,
    pub posix_timers: Vec<PosixTimer>,
    pub misc: ProcessMisc,
    /// memfd files the process maps or has open, with their content.
    pub memfds: Vec<MemfdObject>,
    /// Mappings inherited from the parent (empty for the root); each is
    /// also in `vmas`.
    pub inherited: Vec<InheritedVma>,
    /// The root directory if it is not "/" (chroot).
    pub root: Option<String>,
    /// State added in format 4 (seccomp, parent-death signal, fd owners,
    /// inode owners, job-control stop...), kept apart from the older
    /// fields.
    pub fidelity: Fidelity,
}

/// Process state recorded since format 4. Per-thread and per-file parts
/// refer to threads by TID and to files by their index in
/// `ProcessImage::files`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Fidelity {
    /// Every distinct seccomp filter of the process's threads.
    pub seccomp_filters: Vec<SeccompFilter>,
    /// Per-thread state, one entry per thread of `threads`, same order.
    pub threads: Vec<ThreadFidelity>,
    /// Owners and signals of fds set with F_SETOWN / F_SETOWN_EX / F_SETSIG.
    pub file_owners: Vec<FileOwner>,
    /// Mode and owner of inodes restore creates (deleted files, memfds).
    pub inode_attrs: Vec<InodeAttrs>,
    /// The process was stopped by a job-control signal (SIGSTOP and
    /// friends) and comes back stopped.
    pub stopped: bool,
    /// prctl(PR_GET_SECUREBITS), including SECBIT_KEEP_CAPS.
    pub securebits: u32,
    /// The signal the parent gets when this process ends (clone's
    /// exit_signal, field 38 of stat; SIGCHLD for fork).
    pub exit_signal: i32,
    /// Mapped files deleted since they were mapped, with their content:
    /// `name` is the path they had, `seals` holds their mode bits.
    pub deleted_files: Vec<MemfdObject>,
    /// The process shares its parent's fd table (clone with CLONE_FILES,
    /// without CLONE_THREAD): restore forks it with CLONE_FILES.
    pub shares_files_with_parent: bool,
    /// epoll entries whose fd number no longer (or no longer only) names
    /// the watched file: the file is the open file description `target`
    /// (an `OpenFile::id` of the tree), kept alive by another fd.
    pub epoll_targets: Vec<EpollTarget>,
    /// Unix sockets that had connected to a listener of the tree and
    /// waited in its accept queue (no data sent yet): restore connects
    /// them again, in queue order.
    pub unix_connects: Vec<UnixConnect>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct UnixConnect {
    /// Index of the connecting socket in `ProcessImage::files` (a
    /// `UnixSocket` without a peer).
    pub file: u32,
    /// Inode of the listening socket (`UnixSocket::ino` in the tree).
    pub listener: u64,
    /// Place in the listener's accept queue, 0 = accepted first.
    pub position: u32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct EpollTarget {
    /// Index of the epoll instance in `ProcessImage::files`.
    pub epoll_file: u32,
    /// The fd number the entry is keyed by (`EpollEntry::fd`).
    pub fd: i32,
    /// The watched open file description.
    pub target: u64,
}

/// One seccomp filter: classic BPF, each `struct sock_filter` packed in a
/// u64 as in memory (code u16, jt u8, jf u8, k u32 little-endian).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SeccompFilter {
    pub insns: Vec<u64>,
    /// Installed with SECCOMP_FILTER_FLAG_LOG.
    pub log: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ThreadFidelity {
    pub tid: i32,
    /// 0 none, 1 strict, 2 filter (the Seccomp: field of status).
    pub seccomp_mode: u8,
    /// The thread's filters as indices into `Fidelity::seccomp_filters`,
    /// oldest first (the order they are installed in again).
    pub seccomp: Vec<u32>,
    /// prctl(PR_GET_PDEATHSIG).
    pub pdeathsig: i32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct FileOwner {
    /// Index into `ProcessImage::files`.
    pub file: u32,
    /// F_OWNER_TID (0), F_OWNER_PID (1) or F_OWNER_PGRP (2); 0 with
    /// `owner` 0 means no owner.
    pub owner_type: i32,
    pub owner: i32,
    /// F_GETSIG (0: SIGIO).
    pub signal: i32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub enum InodeOf {
    /// A file of `ProcessImage::files` (by index) that restore recreates.
    File(u32),
    /// A memfd of `ProcessImage::memfds` (by id).
    Memfd(u64),
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct InodeAttrs {
    pub of: InodeOf,
    /// Permission bits (07777).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A memfd (anonymous file): name, size, seals and the parts that hold data.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemfdObject {
    /// The memfd's inode: fds and mappings of one memfd share it.
    pub id: u64,
    pub name: String,
    pub size: u64,
    pub seals: i32,
    /// (offset, bytes) of every data extent; holes are not stored.
    pub extents: Vec<(u64, Vec<u8>)>,
}

/// prctl-level process attributes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct ProcessMisc {
    pub dumpable: u32,
    pub thp_disable: bool,
    pub child_subreaper: bool,
    pub oom_score_adj: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Creds {
    pub uids: [u32; 4],
    pub gids: [u32; 4],
    pub groups: Vec<u32>,
    pub caps: Caps,
}

/// Capability sets as bit masks (bit n: capability n).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct Caps {
    pub inheritable: u64,
    pub permitted: u64,
    pub effective: u64,
    pub bounding: u64,
    pub ambient: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Rlimit {
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThreadImage {
    pub tid: i32,
    pub comm: String,
    /// `struct user_regs_struct` as 27 u64 words, in kernel order.
    pub regs: Vec<u64>,
    /// The XSAVE area as PTRACE_GETREGSET(NT_X86_XSTATE) returned it.
    pub xstate: Vec<u8>,
    pub sigmask: u64,
    /// Signals pending for this thread only (raw 128-byte siginfo each).
    pub pending: Vec<Vec<u8>>,
    pub altstack: AltStack,
    pub rseq: Option<Rseq>,
    pub robust_list: RobustList,
    pub clear_child_tid: u64,
    pub timer_slack_ns: u64,
    pub sched: Sched,
    /// If the thread was inside a sleep when captured: what is left of it.
    pub sleep_remaining_ns: Option<u64>,
}

/// Scheduling policy, real-time priority, nice value and CPU affinity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Sched {
    pub policy: i32,
    pub rt_priority: i32,
    pub nice: i32,
    /// CPU mask words (bit n of word w: CPU 64 * w + n).
    pub cpus: Vec<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct AltStack {
    pub sp: u64,
    pub flags: i32,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Rseq {
    pub addr: u64,
    pub len: u32,
    pub signature: u32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct RobustList {
    pub head: u64,
    pub len: u64,
}

/// The mm_struct fields that PR_SET_MM_MAP restores.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct MmLayout {
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub brk: u64,
    pub start_stack: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
    /// The auxiliary vector as (type, value) words, AT_NULL included.
    pub auxv: Vec<u64>,
}

pub const PROT_READ: u8 = 1;
pub const PROT_WRITE: u8 = 2;
pub const PROT_EXEC: u8 = 4;

/// Per-mapping kernel flags (from smaps VmFlags) that restore re-applies.
pub mod vmflag {
    pub const GROWSDOWN: u32 = 1 << 0;
    pub const DONTFORK: u32 = 1 << 1;
    pub const DONTDUMP: u32 = 1 << 2;
    pub const WIPEONFORK: u32 = 1 << 3;
    pub const HUGEPAGE: u32 = 1 << 4;
    pub const NOHUGEPAGE: u32 = 1 << 5;
    pub const MERGEABLE: u32 = 1 << 6;
    pub const MAYWRITE: u32 = 1 << 7;
    pub const LOCKED: u32 = 1 << 8;
    pub const NORESERVE: u32 = 1 << 9;
    /// mlock2(MLOCK_ONFAULT): with LOCKED, only resident pages are locked.
    pub const LOCKONFAULT: u32 = 1 << 10;
    pub const SEQ_READ: u32 = 1 << 11;
    pub const RAND_READ: u32 = 1 << 12;
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub prot: u8,
    pub shared: bool,
    pub flags: u32,
    pub pgoff: u64,
    pub backing: VmaBacking,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum VmaBacking {
    /// Anonymous memory (private, or shared between no one else but us).
    Anonymous,
    /// Anonymous shared memory in `TreeImage::shared_anon`; mappings with
    /// the same `id` (the kernel's shmem inode) show the same pages, in
    /// one process or several.
    SharedAnon {
        id: u64,
    },
    /// A mapping of a memfd in `ProcessImage::memfds`.
    Memfd {
        id: u64,
    },
    /// An attached SysV shared memory segment in `TreeImage::sysv_shm`.
    SysvShm {
        id: i32,
    },
    /// A mapping of a file that still exists at `path`.
    File {
        path: String,
        dev: u64,
        ino: u64,
    },
    /// Kernel-provided mappings; restore moves the running kernel's own.
    Vdso,
    Vvar {
        name: String,
    },
    Vsyscall,
    /// A mapping of a file deleted since it was mapped (format 4): its
    /// content is in `Fidelity::deleted_files` under the same id (the
    /// file's inode); restore recreates the file, maps it and deletes it.
    DeletedFile {
        id: u64,
    },
}

/// A run of consecutive pages stored in pages.img.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct PageRun {
    pub start: u64,
    pub pages: u64,
    /// Byte offset of the run's data in pages.img's data area.
    pub offset: u64,
    pub checksum: u64,
}

/// One fd number of the process, pointing at an open file description.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct FdSlot {
    pub fd: i32,
    /// Index into `ProcessImage::files`. Several fds may share one.
    pub file: u32,
    pub cloexec: bool,
}

/// The lowest fd number that points at each file of a table, by file
/// index (a linear pass: a server may hold 10,000 descriptors).
pub fn first_fd_of_each_file(fds: &[FdSlot]) -> std::collections::HashMap<u32, i32> {
    let mut m = std::collections::HashMap::with_capacity(fds.len());
    for s in fds {
        m.entry(s.file).and_modify(|fd: &mut i32| *fd = (*fd).min(s.fd)).or_insert(s.fd);
    }
    m
}

/// An open file description: what it is, its status flags and offset.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OpenFile {
    /// Unique in the tree: fds of several processes that share one open
    /// file description (inherited over fork, or passed with SCM_RIGHTS)
    /// carry the same id, and restore creates it once.
    pub id: u64,
    /// O_* status flags (access mode, O_APPEND, O_NONBLOCK, ...).
    pub flags: i32,
    pub pos: i64,
    pub kind: FileKind,
    /// Locks the process holds through this file.
    pub locks: Vec<FileLock>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub enum LockKind {
    /// flock(2): belongs to the open file description.
    Flock,
    /// fcntl(F_SETLK): belongs to the process.
    Posix,
    /// fcntl(F_OFD_SETLK): belongs to the open file description.
    Ofd,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct FileLock {
    pub kind: LockKind,
    pub write: bool,
    pub start: u64,
    /// Last byte locked; None: to the end of the file.
    pub end: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum FileKind {
    Regular {
        path: String,
        size: u64,
    },
    /// A regular file unlinked while open; its content travels in the image.
    Deleted {
        path: String,
        mode: u32,
        content: Vec<u8>,
    },
    Directory {
        path: String,
    },
    CharDevice {
        path: String,
        rdev: u64,
    },
    /// A terminal: replaced at restore by a file the user chooses.
    Terminal {
        path: String,
    },
    /// A pipe or socket on fd 0-2 leading out of the process (to a
    /// supervisor or log collector), recorded with --external-stdio: like
    /// a terminal, replaced at restore by the file the user chooses.
    ExternalStdio {
        what: String,
    },
    /// A memfd in `ProcessImage::memfds`.
    Memfd {
        id: u64,
    },
    Pipe(PipeEnd),
    Fifo {
        path: String,
        pipe: PipeEnd,
    },
    EventFd {
        count: u64,
        semaphore: bool,
    },
    TimerFd(TimerFd),
    SignalFd {
        mask: u64,
    },
    Epoll {
        entries: Vec<EpollEntry>,
    },
    InetSocket(InetSocket),
    UnixSocket(UnixSocket),
    /// An inotify instance with its watches (format 4). Queued events are
    /// refused at checkpoint, so there are none.
    Inotify {
        watches: Vec<InotifyWatch>,
    },
    /// A file under /proc/PID/ of a process of the tree (format 4): it
    /// only exists once that process does, so restore opens it from
    /// inside the holder after every process of the tree was made.
    ProcFile {
        path: String,
    },
    /// A description ferry carries over to the restore as the same kernel
    /// object (`ferry replace`: both trees on one host): the restore is
    /// handed ferry's duplicate of it and places that, instead of making
    /// the file again. Meaningless in an image on disk: a restore that is
    /// not handed the file refuses it.
    Carried(CarriedFile),
}

/// What identifies a carried description, for the restore's check that
/// the fd it placed is that very file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CarriedFile {
    /// The fd's link in /proc as the capture read it ("socket:[123]",
    /// "pipe:[456]", "anon_inode:[eventfd]", "/memfd:name (deleted)").
    pub link: String,
    pub dev: u64,
    pub ino: u64,
}

/// One inotify watch: its descriptor, the watched path, its event mask.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InotifyWatch {
    pub wd: i32,
    pub path: String,
    pub mask: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UnixSocket {
    /// The socket's inode; a connected peer refers to it.
    pub ino: u64,
    pub sock_type: i32,
    /// sun_path bytes as bound (empty: unnamed; leading NUL: abstract).
    pub name: Vec<u8>,
    pub listen_backlog: Option<i32>,
    /// Inode of the connected peer, held by a process of the tree.
    pub peer: Option<u64>,
    /// Messages waiting in its receive queue (one entry per datagram; a
    /// stream socket's bytes in one entry).
    pub queued: Vec<Vec<u8>>,
    pub passcred: bool,
    /// shutdown(2) state: 1 = reading shut down, 2 = writing shut down.
    pub shutdown: u8,
    /// Ancillary data of queued messages (SCM_RIGHTS, SCM_CREDENTIALS),
    /// in queue order. A stream socket's queue is then split in `queued`
    /// where the kernel keeps messages apart (each message with
    /// descriptors ends a read; credentials that differ too). Restore
    /// sends the whole queue again once every process exists.
    pub in_flight: Vec<UnixInFlight>,
}

/// The ancillary data one queued unix message carries.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UnixInFlight {
    /// Index of the message in `UnixSocket::queued`.
    pub message: u32,
    /// Descriptors passed with SCM_RIGHTS, in order: each is the open
    /// file description an fd of a process of the tree holds.
    pub fds: Vec<PassedFd>,
    /// SCM_CREDENTIALS as the receiver reads them (its SO_PASSCRED is on).
    pub creds: Option<UnixCreds>,
}

/// An fd of a process of the tree: `pid` (a process of the image), `fd`
/// (one of its fd numbers).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct PassedFd {
    pub pid: i32,
    pub fd: i32,
}

impl PassedFd {
    /// A descriptor in flight that no process of the tree holds: its
    /// file is in `TreeImage::unix_in_flight_files` (format 4.4).
    pub const HELD_BY_NONE: PassedFd = PassedFd { pid: 0, fd: -1 };
}

/// Sender credentials of a unix message; `pid` is a process of the image.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct UnixCreds {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PipeEnd {
    /// The pipe's inode: both ends of one pipe carry the same id.
    pub id: u64,
    pub write_end: bool,
    pub capacity: u32,
    /// Unread bytes; stored once, on the read end.
    pub data: Vec<u8>,
    /// The other end was closed (by everyone): restore leaves it closed.
    pub peer_closed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimerFd {
    pub clockid: i32,
    pub value_ns: u64,
    pub interval_ns: u64,
    pub ticks: u64,
    pub settime_flags: i32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct EpollEntry {
    pub fd: i32,
    pub events: u32,
    pub data: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InetSocket {
    pub family: i32,
    pub sock_type: i32,
    pub protocol: i32,
    pub addr: Vec<u8>,
    pub port: u16,
    /// Some(backlog) for a listening TCP socket.
    pub listen_backlog: Option<i32>,
    /// The peer of a connected UDP socket or an established TCP
    /// connection (address bytes, port).
    pub peer: Option<(Vec<u8>, u16)>,
    pub options: Vec<SockOpt>,
    /// An established TCP connection's state, read in TCP repair mode.
    pub connection: Option<TcpConnection>,
}

/// What TCP repair mode reads from an established connection and needs to
/// rebuild it without the peer noticing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct TcpConnection {
    /// TCP state as TCP_INFO reports it: 1 = ESTABLISHED, or (format 4.5)
    /// 8 = CLOSE_WAIT, the peer's FIN received after `recv_queue`.
    pub state: u8,
    /// Sequence number of the first byte of `send_queue` (snd_una).
    pub send_seq: u32,
    /// Data sent but not acknowledged, then data not sent yet. (Stored as
    /// one byte string: a busy server's queues run to many megabytes.)
    pub send_queue: crate::queue::QueueBytes,
    /// How many bytes at the end of `send_queue` were never sent.
    pub unsent: u32,
    /// Sequence number of the first byte of `recv_queue`.
    pub recv_seq: u32,
    /// Data received and acknowledged but not read by the application.
    pub recv_queue: crate::queue::QueueBytes,
    /// The MSS clamp (TCP_MAXSEG in repair mode).
    pub mss_clamp: u32,
    /// Window scale shifts, or None when window scaling is off.
    pub snd_wscale: Option<u8>,
    pub rcv_wscale: u8,
    pub sack: bool,
    pub timestamps: bool,
    /// The connection's TCP timestamp clock (TCP_TIMESTAMP), restored so
    /// the peer sees it run on monotonically.
    pub timestamp: u32,
    pub window: TcpWindow,
    /// Buffer sizes at capture (SO_SNDBUF/SO_RCVBUF as getsockopt reports
    /// them) and which of them the application fixed (SO_BUF_LOCK bits);
    /// unfixed sizes stay auto-tuned after restore.
    pub sndbuf: i32,
    pub rcvbuf: i32,
    pub buf_lock: i32,
}

/// `struct tcp_repair_window`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct TcpWindow {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

/// The network lock that froze the tree's TCP connections at checkpoint;
/// restore thaws it once the connections exist again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NetworkLockRef {
    /// "ebpf", "nftables" or "iptables".
    pub method: String,
    /// The lock's name (`ferry network-lock --status` lists it).
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SockOpt {
    pub level: i32,
    pub name: i32,
    /// The option's value exactly as getsockopt returned it.
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct SignalState {
    /// Index i holds signal i + 1.
    pub actions: Vec<SigAction>,
    /// Signals pending for the whole process (raw siginfo each).
    pub shared_pending: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct SigAction {
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct ITimer {
    pub which: i32,
    pub interval_us: u64,
    pub value_us: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PosixTimer {
    pub id: i32,
    pub clockid: i32,
    pub notify: i32,
    pub signo: i32,
    pub notify_tid: i32,
    pub sigev_value: u64,
    pub value_ns: u64,
    pub interval_ns: u64,
    pub overrun: i32,
}
