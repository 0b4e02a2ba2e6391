//! `ferry checkpoint`: capture a tree into an image directory.

use anyhow::{Context, Result};
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
    /// refusing the checkpoint.
    #[arg(long)]
    pub external_stdio: bool,
    /// How established TCP connections are held still while they are
    /// captured and until `ferry restore` re-creates them: one eBPF
    /// program with a map of the connections (ebpf), one nftables set
    /// (nftables), or an iptables chain (iptables). The lock stays in
    /// place after the checkpoint; restore releases it.
    #[arg(long, default_value = "ebpf", value_parser = ["ebpf", "nftables", "iptables"])]
    pub network_lock: String,
}

pub fn run(args: CheckpointArgs) -> Result<i32> {
    let CheckpointArgs { pid, images, leave_running, parent, external_stdio, network_lock } = args;
    let network_lock = network_lock.parse().map_err(|e| anyhow::anyhow!("--network-lock: {e}"))?;
    let opts = ferry_engine::capture::CaptureOptions {
        leave_running,
        external_stdio,
        progress: crate::progress::bar("copying memory"),
        network_lock,
        parent,
        ..Default::default()
    };
    let s = ferry_engine::capture::checkpoint(pid, &images, &opts)
        .with_context(|| format!("checkpoint of pid {pid} failed"))?;
    println!(
        "checkpointed pid {} ({} processes, {} threads, {} mappings, {} fds, {} pages, {:.1} MiB image) in {:.1} ms; {}",
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
