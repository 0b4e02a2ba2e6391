//! Capture: freeze a process, read every piece of its state, write the
//! image, and only then (optionally) kill it.
//!
//! Each kind of kernel object has its own module; this file only orders
//! them. Everything that may refuse a process (an unsupported fd or
//! mapping) runs before anything is changed inside it.

mod files;
mod memfd;
mod memory;
mod process;
mod signals;
mod threads;
mod timers;

use crate::error::{EngineError, Result};
use crate::freeze::Frozen;
use crate::inject::{self, Remote, Scratch};
use crate::procfs;
use ferry_image::{ImageDir, Inventory, ProcessImage, FORMAT_VERSION};
use std::path::Path;
use std::time::Instant;

#[derive(Clone, Default)]
pub struct CaptureOptions {
    /// Let the process run on after the capture instead of killing it.
    pub leave_running: bool,
    /// Record pipes and sockets on fds 0-2 that lead to another process as
    /// external (replaced at restore) instead of refusing them.
    pub external_stdio: bool,
    /// Called as page data is copied (bytes done, bytes total).
    pub progress: Option<crate::ProgressFn>,
}

#[derive(Debug, Clone)]
pub struct CaptureSummary {
    pub pid: i32,
    pub threads: usize,
    pub mappings: usize,
    pub fds: usize,
    pub pages: u64,
    pub image_bytes: u64,
    pub frozen_ms: f64,
    pub total_ms: f64,
}

/// What capture needs while the process is frozen.
pub(crate) struct Ctx<'a> {
    pub pid: i32,
    pub frozen: &'a Frozen,
    pub remote: Remote,
    /// The scratch mapping (batch code and call table)...
    pub scratch: u64,
    /// ...and its part free for syscall arguments and results.
    pub data: u64,
}

pub fn checkpoint(pid: i32, dir: &Path, opts: &CaptureOptions) -> Result<CaptureSummary> {
    let t0 = Instant::now();
    if pid <= 0 {
        return Err(EngineError::Gone { pid, what: "not a valid PID".into() });
    }
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(EngineError::Gone { pid, what: "no such process".into() });
    }
    if pid == std::process::id() as i32 {
        return Err(EngineError::unsupported(pid, "the process", "ferry cannot checkpoint itself"));
    }
    process::refuse_children(pid)?;
    let mut ph = crate::phases::Phases::start("checkpoint");
    let frozen = Frozen::freeze(pid)?;
    let t_frozen = Instant::now();
    ph.mark("freeze");

    // Survey first: refuse what we cannot capture before touching anything.
    let smaps = procfs::smaps(pid)?;
    let vmas = memory::classify(pid, &smaps)?;
    let (files, fds) = files::capture(pid, &frozen.pidfd, opts.external_stdio)?;
    let memfds = memfd::capture(pid, &files, &fds, &vmas, &smaps)?;
    let vdso = smaps
        .iter()
        .find(|m| m.path == "[vdso]")
        .ok_or_else(|| EngineError::unsupported(pid, "the vDSO", "process has no [vdso] mapping"))?;
    let remote = Remote { pid, syscall_ip: inject::find_syscall_insn(pid, vdso.start, vdso.end)? };
    let leader = pid;
    ph.mark("survey");

    let scratch = Scratch::map(&remote, leader)?;
    let ctx = Ctx { pid, frozen: &frozen, remote, scratch: scratch.addr, data: scratch.addr + inject::SCRATCH_DATA };
    let injected = capture_injected(&ctx);
    let unmapped = scratch.unmap(&ctx.remote, leader);
    let (thread_images, signal_state, itimers, posix_timers, (brk, misc)) = injected?;
    unmapped?;
    ph.mark("injected syscalls");

    let dirh = ImageDir::new(dir);
    let mut pages = dirh.create_pages()?;
    let page_runs = memory::dump_pages(pid, &vmas, &smaps, &mut pages, opts.progress.as_ref())?;
    let pages_bytes = pages.finish()?;
    ph.mark("pages");
    let mut image = ProcessImage {
        threads: thread_images,
        vmas,
        page_runs,
        files,
        fds,
        signals: signal_state,
        itimers,
        posix_timers,
        misc,
        memfds,
        ..process::capture(pid)?
    };
    image.mm = memory::mm_layout(pid, brk)?;
    image.signals.shared_pending = signals::shared_pending(pid)?;

    let inventory = Inventory {
        format_version: FORMAT_VERSION,
        ferry_version: env!("CARGO_PKG_VERSION").to_string(),
        kernel_release: procfs::read_string("/proc/sys/kernel/osrelease")?.trim().to_string(),
        arch: std::env::consts::ARCH.to_string(),
        xsave_size: image.threads[0].xstate.len() as u32,
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        source_pid: pid,
        pages_bytes,
    };
    dirh.write_meta(&inventory, &image)?;
    ph.mark("metadata");
    verify_written(&dirh)?;
    ph.mark("verify");

    let summary = CaptureSummary {
        pid,
        threads: image.threads.len(),
        mappings: image.vmas.len(),
        fds: image.fds.len(),
        pages: pages_bytes / 4096,
        image_bytes: pages_bytes + std::fs::metadata(dir.join("meta.img")).map(|m| m.len()).unwrap_or(0),
        frozen_ms: 0.0,
        total_ms: 0.0,
    };
    if opts.leave_running {
        frozen.release()?;
    } else {
        frozen.kill()?;
    }
    ph.mark(if opts.leave_running { "release" } else { "kill" });
    Ok(CaptureSummary {
        frozen_ms: t_frozen.elapsed().as_secs_f64() * 1e3,
        total_ms: t0.elapsed().as_secs_f64() * 1e3,
        ..summary
    })
}

type Injected = (
    Vec<ferry_image::ThreadImage>,
    ferry_image::SignalState,
    Vec<ferry_image::ITimer>,
    Vec<ferry_image::PosixTimer>,
    (u64, ferry_image::ProcessMisc),
);

/// Everything that needs syscalls run inside the process.
fn capture_injected(ctx: &Ctx) -> Result<Injected> {
    let threads = ctx.frozen.threads.iter().map(|t| threads::capture(ctx, t)).collect::<Result<Vec<_>>>()?;
    let signal_state = signals::capture_actions(ctx)?;
    let itimers = timers::capture_itimers(ctx)?;
    let posix = timers::capture_posix(ctx)?;
    let brk_misc = process::capture_injected(ctx)?;
    Ok((threads, signal_state, itimers, posix, brk_misc))
}

/// Reads the metadata back and checks the page file against it. Page data
/// was already read back and checked batch by batch as it was written.
fn verify_written(dir: &ImageDir) -> Result<()> {
    let (inv, _process) = dir.read_meta()?;
    dir.check_pages_file(&inv)?;
    Ok(())
}
