//! `ferry replace`: swap a running tree for a fresh copy of itself.

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(after_help = "\
What happens: the tree is frozen and captured into memory, the options are applied to that \
image, and the edited image is restored in a trial (scratch PID, network, IPC and mount \
namespaces, with the restore's own check) while the old tree is still frozen. Only when the \
trial passed is the old tree killed (its carried files held open by ferry) and the \
edited image restored in its place with the same PIDs, the carried files placed; the restore checks the new tree \
against the edited image (credentials, limits, seccomp mode and filters, nice values and CPU \
affinity, UTS namespace and names, memory, fds, sockets) before it runs.

On failure: an option that is wrong (a cgroup that does not exist, a seccomp file that is \
not a filter, a limit that is not one, a nice value outside -20..19, a CPU that is not \
online or not ferry's to use) is refused before anything is frozen; a tree that \
cannot be replaced, or whose trial fails, is refused by name and runs on untouched. The kill \
is the one step that cannot be undone: a failure after it (which the trial of the same image \
guards against) is reported as such.

With --exec PATH [ARGS...] (last on the line), the tree is not copied: PATH is started as the \
old root was (working directory, environment, uid/gid/groups, stdout/stderr), its binds of \
the old tree's TCP listening addresses get the old listening sockets themselves (seccomp user \
notification), and once it holds all of them the old tree is frozen for a moment while its \
listener fds are replaced by quiet ones: from then on only the new binary accepts, from the same accept \
queues (no connection attempt is lost). The old tree serves the connections it has until \
their clients close them or --drain-timeout passes, then it gets SIGTERM (SIGKILL 5 s later). \
A new binary that exits or does not bind every address within --bind-timeout is killed and \
the old tree runs on untouched. docs/replacement.md says more.

Files: sockets (TCP connections and listeners included), pipes, FIFOs, eventfd, timerfd, \
signalfd, inotify, unmapped memfds and epolls over them are carried over as the same kernel \
objects (ferry's duplicates, pidfd_getfd): no TCP repair, no network lock, no queue read; a \
listener keeps accepting through the pause. Regular files, directories, devices and ptys are \
made again as a restore makes them; --rebuild-files makes everything again.

Memory: the root's private anonymous memory is pre-copied into memory the new root inherits \
while the old tree runs, in rounds of dirty tracking; the pause copies only what was written \
since the last round and the other processes' memory (--no-precopy copies everything in the \
pause). Trees in a PID namespace of their own are refused.

Namespaces: a tree in a UTS namespace of its own keeps it (a new one with its names); \
--hostname gives it one. No option gives a new user or mount namespace yet \
(docs/replacement.md, \"Not built yet\", says why).")]
pub struct ReplaceArgs {
    /// Root of the tree to replace: this process, its threads and all its
    /// descendants.
    #[arg(long)]
    pub pid: i32,
    /// Put every process of the new tree in this cgroup v2 directory
    /// (e.g. /sys/fs/cgroup/unified/svc, or wherever cgroup2 is mounted).
    /// It must exist and take processes (no controllers enabled for its
    /// children); its limits apply from the new tree's first instruction.
    /// cgroup v1 memberships stay as they were.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Stack this seccomp filter on every thread of the new tree, as its
    /// newest: a file of classic BPF instructions (an array of struct
    /// sock_filter, 8 bytes each, 1 to 4096 of them), checked by loading
    /// it into a throwaway child first. Filters a thread already has stay
    /// (the kernel runs all of them; the most restrictive answer wins). no_new_privs is
    /// left as it was: ferry installs the filter with root's privileges.
    /// A thread in seccomp strict mode is refused.
    #[arg(long, value_name = "FILE")]
    pub seccomp: Option<PathBuf>,
    /// Remove these capabilities (net_raw, sys_admin, cap_chown..., or
    /// `all`) from the permitted, effective, inheritable, ambient and
    /// bounding sets of every process: they cannot be regained.
    #[arg(long, value_name = "CAP[,CAP...]")]
    pub drop_caps: Option<String>,
    /// Set a resource limit in every process: NAME=SOFT:HARD with NAME
    /// one of cpu fsize data stack core rss nproc nofile memlock as locks
    /// sigpending msgqueue nice rtprio rttime, and each limit a number or
    /// `unlimited`; soft must not exceed hard. Repeat for more limits. A
    /// hard limit may be raised above the old one (ferry runs as root);
    /// nofile stays within fs.nr_open.
    #[arg(long, value_name = "NAME=SOFT:HARD")]
    pub rlimit: Vec<String>,
    /// Give every thread of the new tree this nice value (-20 to 19). A
    /// thread under SCHED_FIFO, SCHED_RR, SCHED_DEADLINE or SCHED_IDLE,
    /// which ignore nice, is refused by name (the old tree runs on).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub nice: Option<String>,
    /// Let every thread of the new tree run only on these CPUs: a cpulist
    /// such as 0, 0-1 or 0,2-3. Each CPU must exist, be online and be
    /// one ferry itself may use (its affinity, within its cgroup's cpuset).
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Put the new tree in a new UTS namespace with this hostname (1 to
    /// 64 bytes); its domainname stays the old tree's (ferry's, if the
    /// tree was in ferry's namespace). The tree stays replaceable and
    /// checkpointable: ferry records and restores a UTS namespace of a
    /// tree's own.
    #[arg(long, value_name = "NAME")]
    pub hostname: Option<String>,
    /// Take the tree although its root runs in its parent's process group
    /// (part of the parent's job) and that parent stays outside the tree:
    /// the parent sees the old root exit, and the new root is ferry's
    /// child, then init's (or the nearest subreaper's) once ferry exits.
    /// Without it such a root is refused by name, as by `ferry
    /// checkpoint`. Any replaced root's parent sees it exit.
    #[arg(long)]
    pub parent_sees_exit: bool,
    /// Copy all the memory inside the pause. By default the root's
    /// private anonymous memory is pre-copied into the new tree while the
    /// old one runs, and the pause copies only the pages written since
    /// the last round.
    #[arg(long)]
    pub no_precopy: bool,
    /// Freeze the tree once, the trial restore inside that pause. By
    /// default (with pre-copy) a first short freeze captures the tree for
    /// a trial restore made while the tree runs on, and the pause that
    /// ends in the kill only checks that the tree kept the shape that was
    /// tried (else it tries the final image there too): two pauses, the
    /// longer one without the trial.
    #[arg(long, conflicts_with = "exec")]
    pub single_freeze: bool,
    /// With --exec: seconds the old tree keeps serving its connections
    /// after the takeover before it is stopped.
    #[arg(long, value_name = "SECS", default_value_t = 30.0, requires = "exec")]
    pub drain_timeout: f64,
    /// With --exec: seconds the new binary has to bind every address the
    /// old tree listens on; then it is killed and the old tree runs on.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, requires = "exec")]
    pub bind_timeout: f64,
    /// Start a new binary (PATH and its arguments, the rest of the line)
    /// that takes over the old tree's TCP listeners, instead of a copy of
    /// the tree: for services whose state lives outside their memory.
    #[arg(
        long,
        value_name = "PATH [ARGS...]",
        num_args = 1..,
        allow_hyphen_values = true,
        conflicts_with_all = ["cgroup", "seccomp", "drop_caps", "rlimit", "nice", "cpus", "hostname", "parent_sees_exit", "rebuild_files"]
    )]
    pub exec: Vec<String>,
    /// Make every kernel object of the new tree again, as a restore does
    /// (TCP connections through repair mode behind the network lock),
    /// instead of carrying the old tree's sockets, pipes, eventfds...
    /// over as the same objects.
    #[arg(long)]
    pub rebuild_files: bool,
}

pub fn run(args: ReplaceArgs, verbose: bool) -> Result<i32> {
    if !args.exec.is_empty() {
        return run_exec(args);
    }
    let ReplaceArgs {
        pid,
        cgroup,
        seccomp,
        drop_caps,
        rlimit,
        nice,
        cpus,
        hostname,
        parent_sees_exit,
        rebuild_files,
        no_precopy,
        single_freeze,
        ..
    } = args;
    let opts = ferry_replace::ReplaceOptions {
        cgroup,
        seccomp,
        drop_caps,
        rlimits: rlimit,
        nice,
        cpus,
        hostname,
        parent_sees_exit,
        rebuild_files,
        precopy: !no_precopy,
        single_freeze,
    };
    match ferry_replace::replace(pid, &opts) {
        Ok(r) => {
            if verbose {
                for (name, ms) in &r.phases {
                    eprintln!("  {name:<48} {ms:>9.3} ms");
                }
            }
            println!("{}", r.line());
            Ok(0)
        }
        Err(e) => Err(failure(pid, e)),
    }
}

fn seconds(flag: &str, secs: f64) -> Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(secs)
        .map_err(|_| anyhow::anyhow!("{flag} {secs}: not a number of seconds"))
}

/// `ferry replace --exec`: a new binary takes over the listeners.
fn run_exec(args: ReplaceArgs) -> Result<i32> {
    let pid = args.pid;
    let mut exec = args.exec.into_iter();
    let path = exec.next().unwrap_or_default();
    let opts = ferry_replace::ExecOptions {
        path,
        args: exec.collect(),
        bind_timeout: seconds("--bind-timeout", args.bind_timeout)?,
        drain_timeout: seconds("--drain-timeout", args.drain_timeout)?,
    };
    let mut progress = |line: String| eprintln!("{line}");
    match ferry_replace::replace_exec(pid, &opts, &mut progress) {
        Ok(r) => {
            println!("{}", r.line());
            Ok(0)
        }
        Err(e) => Err(failure(pid, e)),
    }
}

/// The one line a refusal or failure is reported as: whether the old tree
/// runs on is the first thing a user needs to know.
fn failure(pid: i32, e: ferry_replace::ReplaceError) -> anyhow::Error {
    match e {
        ferry_replace::ReplaceError::NoSuchProcess(_) | ferry_replace::ReplaceError::Exited(_) => {
            anyhow::anyhow!("replace: {e}")
        }
        e if e.old_tree_runs() => {
            anyhow::anyhow!("replace of pid {pid} refused: {e}; the old tree runs on untouched")
        }
        e => anyhow::anyhow!("replace of pid {pid} failed: {e}"),
    }
}
