//! File descriptors: every line /proc/PID/fdinfo/N can show, every kind
//! of anonymous inode, every file type and every open flag bit, and the
//! special filesystems a path cannot reach. Capture (capture/files/)
//! refuses by name what these tables refuse and every name or bit they
//! do not list.

use super::{not_applicable as na, refused, restored, Table};

pub static FDINFO_LINES: Table = Table {
    id: "fdinfo",
    column: "fdinfo line",
    intro: "Every line /proc/PID/fdinfo/N shows (named by the text before its first `:`). \
A line a description shows that is not in this table is refused by name (pid, fd, line) \
until ferry learns it. Lines of the kinds the next table refuses are listed for completeness: \
the kind is refused first.",
    entries: &[
        restored("pos", "offset, set again with lseek (or the reopen's own offset)", "fd_dup_shared_offset, fd_regular_append"),
        restored("flags", "every bit by the open flags table; O_CLOEXEC per fd", "fd_flags, fd_open_flags"),
        na("mnt_id", "the mount: a file on a mount the process cannot see is handled by the mounts table"),
        na("ino", "the inode's number: identity, used to find shared descriptions"),
        restored("lock", "flock, POSIX and OFD locks (other types and mandatory locks refused by name)", "fd_locks"),
        restored("eventfd-count", "eventfd: the counter", "fd_eventfd"),
        restored("eventfd-semaphore", "eventfd: EFD_SEMAPHORE", "fd_eventfd"),
        na("eventfd-id", "eventfd: a number the kernel gives each eventfd for fdinfo only; no call reads or sets it"),
        restored("tfd", "epoll: target fd, events, data (a fired EPOLLONESHOT entry refused: re-adding it arms EPOLLERR/EPOLLHUP)", "fd_epoll, fd_epoll_closed, refuses_a_disarmed_epolloneshot_entry"),
        restored("sigmask", "signalfd: the signal set", "fd_signalfd"),
        restored("clockid", "timerfd: the clock", "fd_timerfd"),
        restored("ticks", "timerfd: expirations not read yet", "fd_timerfd_state"),
        restored("settime flags", "timerfd: TFD_TIMER_ABSTIME, TFD_TIMER_CANCEL_ON_SET", "fd_timerfd_state"),
        restored("it_value", "timerfd: time left", "fd_timerfd"),
        restored("it_interval", "timerfd: period", "fd_timerfd"),
        restored("inotify wd", "inotify: watch descriptor, mask and the watched file (from f_handle); queued events refused", "fd_inotify"),
        restored("tty-index", "pty master: the pair's index, made again with the same one", "tty_pty_pair"),
        na("scm_fds", "unix socket: how many descriptors are in flight in its queue; the messages are captured with the queue (unix socket tables)"),
        refused("Pid", "pidfd (kind refused)", "-"),
        refused("NSpid", "pidfd (kind refused)", "-"),
        refused("fanotify flags", "fanotify (kind refused)", "-"),
        refused("fanotify ino", "fanotify inode mark (kind refused)", "-"),
        refused("fanotify mnt_id", "fanotify mount mark (kind refused)", "-"),
        refused("fanotify sdev", "fanotify filesystem mark (kind refused)", "-"),
        refused("pending", "userfaultfd (kind refused)", "-"),
        refused("total", "userfaultfd (kind refused)", "-"),
        refused("API", "userfaultfd (kind refused)", "-"),
        refused("SqMask", "io_uring and its other lines: SqHead, SqTail, CachedSqHead, CqMask, CqHead, CqTail, CachedCqTail, SQEs, CQEs, SqThread, SqThreadCpu, SqTotalTime, SqWorkTime, UserFiles, UserBufs, PollList, CqOverflowList, NAPI (kind refused)", "-"),
        refused("map_type", "bpf-map and its other lines (key_size, value_size, max_entries, map_flags, map_extra, memlock, map_id, frozen) (kind refused)", "-"),
        refused("prog_type", "bpf-prog and its other lines (prog_jited, prog_tag, memlock, prog_id, run_time_ns, run_cnt, recursion_misses, verified_insns) (kind refused)", "-"),
        refused("link_type", "bpf_link and its other lines (kind refused)", "-"),
    ],
};

pub static ANON_INODES: Table = Table {
    id: "anon_inodes",
    column: "anon_inode kind",
    intro: "What /proc/PID/fd/N links to for an anonymous inode (`anon_inode:KIND`), from the \
callers of anon_inode_getfile/anon_inode_getfd in the kernel's core (drivers add their own). \
An unknown kind is refused by name.",
    entries: &[
        restored("[eventfd]", "eventfd2 with the count and flags", "fd_eventfd"),
        restored("[eventpoll]", "epoll_create1, then every entry", "fd_epoll"),
        restored("[signalfd]", "signalfd4 with the mask", "fd_signalfd"),
        restored("[timerfd]", "timerfd_create and settime", "fd_timerfd"),
        restored("inotify", "inotify_init1 and every watch", "fd_inotify"),
        refused("[fanotify]", "marks and queued events are not restored", "-"),
        refused("[pidfd]", "a pidfd is not made again", "refuses_a_pidfd"),
        refused(
            "[io_uring]",
            "rings, registered files and buffers, requests in flight are not restored",
            "refuses_an_io_uring_with_an_fd",
        ),
        refused("[userfaultfd]", "registrations and pending faults are not restored", "-"),
        refused("[perf_event]", "counters are not restored", "-"),
        refused("bpf-map", "BPF objects are not restored", "-"),
        refused("bpf-prog", "BPF objects are not restored", "-"),
        refused("bpf_link", "BPF objects are not restored", "-"),
        refused("bpf_iter", "BPF objects are not restored", "-"),
        refused("btf", "BPF objects are not restored", "-"),
        refused("bpf-token", "BPF objects are not restored", "-"),
        refused(
            "seccomp notify",
            "a seccomp listener is not made again",
            "refuses_a_seccomp_user_notification_filter_and_leaves_it_confined",
        ),
        refused("[fscontext]", "a filesystem context (fsopen, fspick) is not restored", "-"),
        refused("landlock-ruleset", "a Landlock ruleset is not restored", "-"),
        refused("[landlock-ruleset]", "a Landlock ruleset is not restored", "-"),
        refused("kvm-vm", "virtual machines are not restored", "-"),
        refused("kvm-vcpu:N", "virtual machines are not restored", "-"),
        refused("[kvm-gmem]", "virtual machines are not restored", "-"),
        refused("[vfio-device]", "devices are not restored", "-"),
        refused("[iommufd]", "devices are not restored", "-"),
        refused("sync_file", "GPU fences are not restored", "-"),
    ],
};

pub static FILE_TYPES: Table = Table {
    id: "file_types",
    column: "file type",
    intro: "The type (S_IFMT) of what an fd refers to. An unknown type is refused by name.",
    entries: &[
        restored("S_IFREG", "reopened by path; deleted ones made again with their content; memfds staged", "fd_regular_append, fd_deleted_file, mem_memfd"),
        restored("S_IFDIR", "reopened by path (O_PATH ones too)", "fd_dir"),
        restored("S_IFCHR", "/dev/null, zero, full, random, urandom and pty pairs of the tree; other devices refused by name", "fd_dev_nodes, tty_pty_pair"),
        restored("S_IFIFO", "pipes and FIFOs with their data", "fd_pipe_unread, fd_fifo_unread"),
        restored("S_IFSOCK", "by the socket tables", "sock_tcp_listen, sock_unix_pair"),
        refused("S_IFBLK", "block devices are not restored", "-"),
        refused("S_IFLNK", "an O_PATH|O_NOFOLLOW fd on a symbolic link is not reopened", "refuses_an_fd_on_a_symlink"),
        restored("none (anonymous inode)", "by the anon_inode table", "fd_eventfd"),
    ],
};

/// The bit of each open flag the table below names (x86-64 values, as
/// fdinfo's octal `flags:` shows them).
pub const OPEN_FLAG_BITS: &[(&str, i32)] = &[
    ("O_ACCMODE", 0o3),
    ("O_CREAT", 0o100),
    ("O_EXCL", 0o200),
    ("O_NOCTTY", 0o400),
    ("O_TRUNC", 0o1000),
    ("O_APPEND", 0o2000),
    ("O_NONBLOCK", 0o4000),
    ("O_DSYNC", 0o10000),
    ("FASYNC", 0o20000),
    ("O_DIRECT", 0o40000),
    ("O_LARGEFILE", 0o100000),
    ("O_DIRECTORY", 0o200000),
    ("O_NOFOLLOW", 0o400000),
    ("O_NOATIME", 0o1000000),
    ("O_CLOEXEC", 0o2000000),
    ("__O_SYNC", 0o4000000),
    ("O_PATH", 0o10000000),
    ("__O_TMPFILE", 0o20000000),
];

pub static OPEN_FLAGS: Table = Table {
    id: "open_flags",
    column: "open flag",
    intro: "Each bit of fdinfo's `flags:`. Files ferry opens again by path get every bit from \
open(); pipes, sockets and anonymous inodes get O_APPEND, O_NONBLOCK, FASYNC, O_DIRECT and \
O_NOATIME from F_SETFL, and a bit F_SETFL cannot set on them (O_DSYNC, __O_SYNC) is refused. \
A bit not in this table is refused by its octal value.",
    entries: &[
        restored("O_ACCMODE", "O_RDONLY, O_WRONLY, O_RDWR: the reopen's or the new object's", "fd_flags"),
        na("O_CREAT", "cleared by open(), never kept in a description"),
        na("O_EXCL", "cleared by open(), never kept in a description"),
        na("O_NOCTTY", "cleared by open(), never kept in a description"),
        na("O_TRUNC", "cleared by open(), never kept in a description"),
        restored("O_APPEND", "open() or F_SETFL", "fd_regular_append, fd_flags"),
        restored("O_NONBLOCK", "open() or F_SETFL", "fd_flags"),
        restored("O_DSYNC", "open() for files opened by path; refused on other kinds", "fd_open_flags"),
        restored("FASYNC", "F_SETFL, with the owner and signal", "fd_async_owner"),
        restored("O_DIRECT", "open() or F_SETFL; on a pipe's write end it is packet mode: restored when the pipe is empty, refused with bytes queued (their boundaries are not kept)", "fd_open_flags, refuses_a_packet_mode_pipe_with_data"),
        na("O_LARGEFILE", "set by every open on 64-bit"),
        restored("O_DIRECTORY", "directories are reopened with it", "fd_dir"),
        restored("O_NOFOLLOW", "open() (the path is the resolved one)", "fd_open_flags"),
        restored("O_NOATIME", "open() or F_SETFL", "fd_open_flags"),
        restored("O_CLOEXEC", "per fd, not per description", "fd_flags"),
        restored("__O_SYNC", "open() for files opened by path; refused on other kinds", "fd_open_flags"),
        restored("O_PATH", "open()", "fd_dir"),
        refused("__O_TMPFILE", "an O_TMPFILE file: restore cannot make a file linkat() can link again (reopening it failed after the checkpoint: ENOTDIR)", "refuses_an_o_tmpfile_fd"),
    ],
};

pub static FD_MOUNTS: Table = Table {
    id: "fd_mounts",
    column: "file on",
    intro: "Files that look like paths but that no path reaches: the fd's mount (`mnt_id`) is not \
in the process's /proc/PID/mountinfo. Checked once per process, from the mountinfo read when \
the first such file is met; the filesystem is named by statfs only for those files.",
    entries: &[
        refused("mqueue", "a POSIX message queue (mq_open): its messages and attributes are not restored (reopening the name failed after the checkpoint: ENOENT)", "refuses_a_posix_message_queue"),
        refused("secretmem", "memfd_secret: its pages cannot be read, so they are not restored", "refuses_a_memfd_secret_fd"),
        refused("nsfs", "a namespace fd (/proc/PID/ns/*): namespaces are not restored as fds (reopening `net:[...]` failed after the checkpoint: ENOENT)", "refuses_a_namespace_fd"),
        refused("proc outside the root", "a /proc file opened before chroot: the process opens it again itself, and its root has no such path (openat failed after the checkpoint: ENOENT)", "refuses_a_proc_fd_opened_before_chroot"),
        restored("another mount of the same file", "reopened by path when that path reaches the same device and inode (a mount namespace entered or copied since)", "fd_other_mount"),
        refused("a detached or unreachable mount", "a file whose path reaches another file or none (open_tree, fsmount, a mount since unmounted)", "-"),
    ],
};

/// The fd tables, in the order docs/coverage.md shows them.
pub fn tables() -> [&'static Table; 5] {
    [&FILE_TYPES, &ANON_INODES, &FDINFO_LINES, &OPEN_FLAGS, &FD_MOUNTS]
}

/// The name an fdinfo line is known by: the text before its first `:`;
/// None for continuation lines (indented) and blank ones.
pub fn fdinfo_key(line: &str) -> Option<&str> {
    if line.is_empty() || line.starts_with(char::is_whitespace) {
        return None;
    }
    Some(line.split_once(':').map_or(line, |(k, _)| k).trim_end())
}

/// The table's name for an anon_inode kind: per-instance numbers folded.
pub fn anon_kind_name(kind: &str) -> &str {
    if kind.starts_with("kvm-vcpu:") {
        return "kvm-vcpu:N";
    }
    kind
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_bit_has_a_row_and_every_row_a_bit() {
        for (name, _) in OPEN_FLAG_BITS {
            assert!(OPEN_FLAGS.get(name).is_some(), "{name} has no row");
        }
        for e in OPEN_FLAGS.entries {
            assert!(OPEN_FLAG_BITS.iter().any(|(n, _)| *n == e.name), "{} has no bit", e.name);
        }
        let mut all = 0;
        for (name, bit) in OPEN_FLAG_BITS {
            assert_eq!(all & bit, 0, "{name} overlaps another flag");
            all |= bit;
        }
        for (name, bit) in [
            ("O_APPEND", libc::O_APPEND),
            ("O_NONBLOCK", libc::O_NONBLOCK),
            ("O_DSYNC", libc::O_DSYNC),
            ("FASYNC", libc::O_ASYNC),
            ("O_DIRECT", libc::O_DIRECT),
            ("O_NOATIME", libc::O_NOATIME),
            ("O_CLOEXEC", libc::O_CLOEXEC),
            ("O_PATH", libc::O_PATH),
            ("O_DIRECTORY", libc::O_DIRECTORY),
        ] {
            assert!(OPEN_FLAG_BITS.contains(&(name, bit)), "{name} is not {bit:#o}");
        }
        assert_eq!(libc::O_SYNC, 0o4000000 | libc::O_DSYNC);
        assert_eq!(libc::O_TMPFILE, 0o20000000 | libc::O_DIRECTORY);
    }

    #[test]
    fn fdinfo_keys_are_the_text_before_the_colon() {
        assert_eq!(fdinfo_key("pos:\t0"), Some("pos"));
        assert_eq!(fdinfo_key("settime flags:\t01"), Some("settime flags"));
        assert_eq!(fdinfo_key("inotify wd:1 ino:2 sdev:3"), Some("inotify wd"));
        assert_eq!(fdinfo_key("tfd:       13 events: 19 data: 0"), Some("tfd"));
        assert_eq!(fdinfo_key("lock:\t1: FLOCK  ADVISORY  WRITE 1 00:1:2 0 EOF"), Some("lock"));
        assert_eq!(fdinfo_key("  user_data=1"), None);
        assert_eq!(fdinfo_key(""), None);
        assert_eq!(anon_kind_name("kvm-vcpu:3"), "kvm-vcpu:N");
    }

    #[test]
    fn names_are_unique_in_each_table() {
        for t in tables() {
            for (i, e) in t.entries.iter().enumerate() {
                assert!(
                    t.entries[i + 1..].iter().all(|o| o.name != e.name),
                    "{} twice in {}",
                    e.name,
                    t.id
                );
            }
        }
    }
}
