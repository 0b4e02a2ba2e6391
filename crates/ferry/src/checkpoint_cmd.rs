//! `ferry checkpoint`: capture a tree into an image directory.

use anyhow::{Context, Result};
use ferry_engine::restore::trial::{self, TrialOutcome};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CheckpointArgs {
    /// Root of the tree to capture: this process, its threads and all
    /// its descendants.
    #[arg(long)]
    pub pid: i32,
    /// Directory to write the image to (created if missing).
    #[arg(long)]
    pub images: PathBuf,
    /// Keep the process running after the image is written.
    #[arg(long)]
    pub leave_running: bool,
    /// Write an incremental image over the image in this directory
    /// (taken earlier of the same tree with --leave-running): pages
    /// whose content the parent holds at the same address are left to
    /// it. `ferry restore` of the new image reads the whole chain and
    /// refuses it if a parent changed since.
    #[arg(long, value_name = "DIR")]
    pub parent: Option<PathBuf>,
    /// A pipe or socket on stdin/stdout/stderr that leads to another
    /// process (a supervisor, a log collector) is recorded as external
    /// and replaced at restore by the --tty-to file, instead of
    /// refusing the checkpoint. A file on fds 0-2 that another process
    /// holds in the same open file description (a log the launcher kept
    /// open) is then taken too: it is opened again at its offset, which
    /// is no longer shared with that process.
    #[arg(long)]
    pub external_stdio: bool,
    /// How established TCP connections are held still while they are
    /// captured and until `ferry restore` re-creates them: one eBPF
    /// program with a map of the connections (ebpf), one nftables set
    /// (nftables), or an iptables chain (iptables). The lock stays in
    /// place after the checkpoint; restore releases it.
    #[arg(long, default_value = "ebpf", value_parser = ["ebpf", "nftables", "iptables"])]
    pub network_lock: String,
    /// Take the tree although its root runs in its parent's process
    /// group (part of the parent's job: a worker of a master process, a
    /// child its parent waits for) and that parent stays outside the
    /// tree. The parent sees the process exit when the checkpoint ends
    /// the tree (SIGCHLD, waitpid); the restored copy becomes a child of
    /// `ferry restore`. Without it such a root is refused by name. A root
    /// that leads its own process group or session, or whose parent is
    /// init or ferry, needs no option. Sharing with the parent (memory,
    /// files, fd table) is refused either way.
    #[arg(long)]
    pub parent_sees_exit: bool,
    /// Before the tree is killed, restore the image in a trial: in new
    /// PID, network, IPC and mount namespaces (the tree's addresses added
    /// there), with the restore's own check, then end the copy before it
    /// runs. If it fails, the checkpoint fails with the trial's error, the
    /// tree runs on and the image stays. On by default; the tree's pause
    /// grows by the trial (with --leave-running the trial runs after the
    /// tree runs on). Trees whose restore would re-create an object the
    /// original still holds in the filesystem (a unix socket bound to a
    /// file, a FIFO, a file lock) are not tried: the output says so.
    #[arg(long, overrides_with = "no_verify")]
    pub verify: bool,
    /// Skip the trial restore of --verify.
    #[arg(long, overrides_with = "verify")]
    pub no_verify: bool,
}

pub fn run(args: CheckpointArgs) -> Result<i32> {
    let CheckpointArgs {
        pid,
        images,
        leave_running,
        parent,
        external_stdio,
        network_lock,
        parent_sees_exit,
        verify: _,
        no_verify,
    } = args;
    let network_lock = network_lock.parse().map_err(|e| anyhow::anyhow!("--network-lock: {e}"))?;
    // The trial's helper forked now, while ferry is small and one thread:
    // its namespaces are made while the capture runs, not in the pause.
    let mut ahead = (!no_verify)
        .then(|| {
            trial::TrialAhead::fork()
                .map_err(|e| tracing::debug!("the trial forks its helper when it starts: {e}"))
                .ok()
        })
        .flatten();
    let opts = ferry_engine::capture::CaptureOptions {
        leave_running,
        external_stdio,
        progress: crate::progress::bar("copying memory"),
        network_lock,
        parent,
        parent_sees_exit,
        ..Default::default()
    };
    let mut outcome = None;
    let mut ending = None;
    let s = ferry_engine::capture::checkpoint_then(pid, &images, &opts, |dir, inherited| {
        if !no_verify {
            outcome = Some(match ahead.take() {
                Some(helper) => {
                    let (outcome, copy) = helper.trial(dir)?;
                    ending = copy;
                    outcome
                }
                None => trial::trial(dir, inherited)?,
            });
        }
        Ok(())
    })
    .with_context(|| format!("checkpoint of pid {pid} failed"))?;
    // The trial's copy ends beside the original's kill, not in the pause;
    // the command exits once it is gone.
    if let Some(copy) = ending {
        copy.wait(trial::END_PATIENCE);
    }
    let verified = match outcome {
        None => "not verified (--no-verify)".to_string(),
        Some(TrialOutcome::Passed { ms }) => format!("verified by a trial restore ({ms:.1} ms)"),
        Some(TrialOutcome::Skipped(why)) => format!("not verified: no trial restore for {why}"),
    };
    println!(
        "checkpointed pid {} ({} processes, {} threads, {} mappings, {} fds, {} pages, {:.1} MiB image) in {:.1} ms; {}; {verified}",
        s.pid,
        s.processes,
        s.threads,
        s.mappings,
        s.fds,
        s.pages,
        s.image_bytes as f64 / (1 << 20) as f64,
        s.total_ms,
        if leave_running { "left running" } else { "tree killed" }
    );
    Ok(0)
}
