//! `ferry replace`: swap a running tree for a fresh copy of itself.

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(after_help = "\
What happens: the tree is frozen and captured into memory, the options are applied to that \
image, and the edited image is restored in a trial (scratch PID, network, IPC and mount \
namespaces, with the restore's own check) while the old tree is still frozen. Only when the \
trial passed is the old tree killed (its TCP connections held by the network lock) and the \
edited image restored in its place with the same PIDs; the restore checks the new tree \
against the edited image (credentials, limits, seccomp mode and filters, memory, fds, \
sockets) before it runs.

On failure: an option that is wrong (a cgroup that does not exist, a seccomp file that is \
not a filter, a limit that is not one) is refused before anything is frozen; a tree that \
cannot be replaced, or whose trial fails, is refused by name and runs on untouched. The kill \
is the one step that cannot be undone: a failure after it (which the trial of the same image \
guards against) is reported as such.

Not built yet: descriptors carried over with pidfd_getfd (they are made again, as a restore \
does), pre-copy of memory while the tree runs (the whole copy is in the pause), --exec of a \
new binary. Trees in a PID namespace of their own are refused.")]
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
}

pub fn run(args: ReplaceArgs, verbose: bool) -> Result<i32> {
    let ReplaceArgs { pid, cgroup, seccomp, drop_caps, rlimit, parent_sees_exit, no_precopy } =
        args;
    let opts = ferry_replace::ReplaceOptions {
        cgroup,
        seccomp,
        drop_caps,
        rlimits: rlimit,
        parent_sees_exit,
        precopy: !no_precopy,
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
        Err(
            e @ (ferry_replace::ReplaceError::NoSuchProcess(_)
            | ferry_replace::ReplaceError::Exited(_)),
        ) => {
            anyhow::bail!("replace: {e}")
        }
        Err(e) if e.old_tree_runs() => {
            anyhow::bail!("replace of pid {pid} refused: {e}; the old tree runs on untouched")
        }
        Err(e) => anyhow::bail!("replace of pid {pid} failed: {e}"),
    }
}
