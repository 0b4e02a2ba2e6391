//! Phase "pages": each process's pages go to the sink, and what the
//! earlier phases found becomes the image's metadata (process images, the
//! tree, the inventory).

use super::injected::Injected;
use super::survey::{Survey, TreeSurvey};
use super::{memory, namespaces, process, signals, CaptureOptions, CaptureSummary};
use crate::error::Result;
use crate::procfs;
use ferry_image::{Inventory, PageSink, PageSpan, ProcessImage, TreeImage, FORMAT_VERSION};
use std::collections::HashMap;

/// Per process (by PID), the pages the receiver holds already: listed as
/// the parent's instead of copied; `whole`: see [`memory::Held`].
#[derive(Default)]
pub(super) struct HeldPages {
    pub spans: HashMap<i32, Vec<PageSpan>>,
    pub whole: bool,
}

/// The image's metadata; its pages are in the sink.
pub(super) struct Assembled {
    pub inventory: Inventory,
    pub tree: TreeImage,
    /// Per process (image PIDs), the pages left to the parent image.
    pub parent_pages: Vec<(i32, Vec<PageSpan>)>,
    pub summary: CaptureSummary,
}

/// Copies every process's pages into `sink` and builds the metadata.
pub(super) fn pages_and_metadata(
    root: i32,
    survey: TreeSurvey,
    injected: Vec<Injected>,
    held: &HeldPages,
    sink: &mut dyn PageSink,
    opts: &CaptureOptions,
    network_lock: Option<ferry_image::NetworkLockRef>,
) -> Result<Assembled> {
    let TreeSurvey {
        procs,
        share_files,
        pid_view,
        uts,
        cgroups,
        unix_creds,
        unix_dead,
        unix_in_flight_files,
        unix_options,
        ptys,
        ..
    } = survey;
    let mut copy =
        PageCopy { held, several: procs.len() > 1, share_files: &share_files, sink, opts };
    let mut processes: Vec<ProcessImage> = Vec::with_capacity(procs.len());
    let mut parent_pages = Vec::new();
    for (sv, inj) in procs.into_iter().zip(injected) {
        let (image, in_parent) = process_image(sv, inj, &processes, &mut copy)?;
        if !in_parent.is_empty() {
            parent_pages.push((image.pid, in_parent));
        }
        processes.push(image);
    }
    let pages_bytes = copy.sink.data_len();
    let process_attrs = Some(super::process::capture_attrs(&processes)?);
    let mut tree = TreeImage {
        processes,
        zombies: survey.zombies,
        shared_anon: survey.shared_anon,
        sysv_shm: survey.sysv_shm,
        sysv_sem: survey.sysv_sem,
        sysv_msg: survey.sysv_msg,
        network_lock,
        cgroups: Some(ferry_image::CgroupImage { processes: cgroups }),
        unix_peers: Some(ferry_image::UnixPeersImage { sockets: unix_creds }),
        // Written only when there is one: the section is format 4.4's.
        unix_dead_peers: (!unix_dead.is_empty())
            .then_some(ferry_image::UnixDeadPeersImage { sockets: unix_dead }),
        unix_in_flight_files: (!unix_in_flight_files.is_empty())
            .then_some(ferry_image::UnixInFlightFilesImage { files: unix_in_flight_files }),
        ptys,
        process_attrs,
        // Written only when there is one: the section is format 4.8's.
        unix_socket_options: (!unix_options.is_empty())
            .then_some(ferry_image::UnixSocketOptionsImage { sockets: unix_options }),
        // Written only for a tree in a UTS namespace of its own (4.9).
        uts,
        ..Default::default()
    };
    if let Some(view) = &pid_view {
        to_tree_pids(&mut tree, &mut parent_pages, view);
    }
    let inventory = inventory(root, &tree, pages_bytes)?;
    let summary = summary(root, &tree, pages_bytes);
    Ok(Assembled { inventory, tree, parent_pages, summary })
}

/// What every process's page copy shares.
struct PageCopy<'a> {
    held: &'a HeldPages,
    /// Whether the tree has several processes (pages they share matter).
    several: bool,
    share_files: &'a [i32],
    sink: &'a mut dyn PageSink,
    opts: &'a CaptureOptions,
}

/// One process's pages into the sink, and its image.
fn process_image(
    sv: Survey,
    inj: Injected,
    earlier: &[ProcessImage],
    copy: &mut PageCopy,
) -> Result<(ProcessImage, Vec<PageSpan>)> {
    let pid = sv.pid;
    // Pages a child still shares with its parent come with the parent's.
    let inherited = match earlier.iter().find(|p| p.pid == sv.ppid) {
        Some(parent) => memory::inherited_from_parent(pid, &sv.vmas, parent.pid, &parent.vmas)?,
        None => Vec::new(),
    };
    let mut skip: Vec<PageSpan> =
        inherited.iter().flat_map(|v| v.shared_pages.iter().copied()).collect();
    skip.sort_unstable();
    let held_here = memory::Held {
        spans: copy.held.spans.get(&pid).map_or(&[][..], |h| h.as_slice()),
        whole: copy.held.whole,
    };
    let memory::Dumped { runs: page_runs, in_parent } = memory::dump_pages(
        pid,
        &sv.vmas,
        &sv.smaps,
        &skip,
        held_here,
        copy.several,
        &mut *copy.sink,
        copy.opts.progress.as_ref(),
    )?;
    let mut fidelity = sv.fidelity;
    fidelity.securebits = inj.securebits;
    fidelity.exit_signal = procfs::Stat::read(pid)?.field(38) as i32;
    fidelity.shares_files_with_parent = copy.share_files.contains(&pid);
    fidelity.threads = sv
        .seccomp_threads
        .iter()
        .map(|(tid, mode, chain)| ferry_image::ThreadFidelity {
            tid: *tid,
            seccomp_mode: *mode,
            seccomp: chain.clone(),
            pdeathsig: inj.deathsigs.iter().find(|d| d.0 == *tid).map_or(0, |d| d.1),
        })
        .collect();
    let mut image = ProcessImage {
        threads: inj.threads,
        vmas: sv.vmas,
        page_runs,
        files: sv.files,
        fds: sv.fds,
        signals: inj.signals,
        itimers: inj.itimers,
        posix_timers: inj.posix_timers,
        misc: inj.misc,
        memfds: sv.memfds,
        inherited,
        fidelity,
        ..process::capture(pid)?
    };
    image.ppid = sv.ppid;
    image.mm = memory::mm_layout(pid, inj.brk)?;
    image.signals.shared_pending = signals::shared_pending(pid)?;
    Ok((image, in_parent))
}

/// A tree in a PID namespace of its own is recorded with the PIDs it
/// sees itself.
fn to_tree_pids(
    tree: &mut TreeImage,
    parent_pages: &mut [(i32, Vec<PageSpan>)],
    view: &namespaces::PidView,
) {
    for c in tree.unix_peers.iter_mut().flat_map(|u| u.sockets.iter_mut()) {
        c.pid = view.inner(c.pid);
    }
    for c in tree.cgroups.iter_mut().flat_map(|g| g.processes.iter_mut()) {
        c.pid = view.inner(c.pid);
    }
    for p in tree.ptys.iter_mut().flat_map(|p| p.pairs.iter_mut()) {
        if p.session != 0 {
            p.session = view.inner(p.session);
            p.foreground = view.inner(p.foreground);
        }
    }
    namespaces::translate(tree, view);
    for (pid, _) in parent_pages.iter_mut() {
        *pid = view.inner(*pid);
    }
}

fn inventory(root: i32, tree: &TreeImage, pages_bytes: u64) -> Result<Inventory> {
    Ok(Inventory {
        format_version: FORMAT_VERSION,
        ferry_version: env!("CARGO_PKG_VERSION").to_string(),
        kernel_release: procfs::read_string("/proc/sys/kernel/osrelease")?.trim().to_string(),
        arch: std::env::consts::ARCH.to_string(),
        xsave_size: tree.processes[0].threads[0].xstate.len() as u32,
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        source_pid: root,
        pages_bytes,
    })
}

fn summary(root: i32, tree: &TreeImage, pages_bytes: u64) -> CaptureSummary {
    CaptureSummary {
        pid: root,
        processes: tree.processes.len(),
        threads: tree.processes.iter().map(|p| p.threads.len()).sum(),
        mappings: tree.processes.iter().map(|p| p.vmas.len()).sum(),
        fds: tree.processes.iter().map(|p| p.fds.len()).sum(),
        pages: pages_bytes / 4096,
        image_bytes: pages_bytes,
        frozen_ms: 0.0,
        total_ms: 0.0,
    }
}
