//! Phase "survey": everything that may refuse the tree, read from outside
//! while it is frozen and before anything inside it is changed. Its output
//! is one record per process, in the tree's order, and what the processes
//! share: every later phase walks these records instead of zipping
//! parallel lists by index.

use super::{cgroups, files, memfd, memory, namespaces, prctl, seccomp, sharing, shm, sysv_ipc};
use super::{socket_refs, sockopt_watch, tree::FrozenTree, vma_flags, CaptureOptions};
use crate::error::{EngineError, Result};
use crate::freeze::Frozen;
use crate::inject::{self, Remote};
use crate::procfs;
use ferry_image::{FdSlot, FileKind, OpenFile, UnixDeadPeer, UnixPeerCred, Vma};

/// What the survey of one frozen process found.
pub(super) struct Survey {
    pub pid: i32,
    pub ppid: i32,
    pub smaps: Vec<procfs::MapsEntry>,
    pub vmas: Vec<Vma>,
    pub files: Vec<OpenFile>,
    pub fds: Vec<FdSlot>,
    /// (dev, ino) of each file, by file index.
    inodes: Vec<(u64, u64)>,
    pub memfds: Vec<ferry_image::MemfdObject>,
    pub remote: Remote,
    /// State found from outside (seccomp, fd owners, inode attributes,
    /// stop state); the per-thread prctl part is added by the injected
    /// capture.
    pub fidelity: ferry_image::Fidelity,
    pub seccomp_threads: Vec<seccomp::ThreadSeccomp>,
    /// Files (indices) of unix listeners with one connection waiting.
    pending_listeners: Vec<u32>,
    /// SO_PEERCRED of its connected unix sockets (host pids).
    unix_creds: Vec<UnixPeerCred>,
    /// Its connected unix sockets whose peer was closed.
    unix_dead: Vec<UnixDeadPeer>,
    /// Files in flight in its unix queues that no process of the tree holds.
    unix_orphans: Vec<files::unix::Orphan>,
    /// Options of its unix sockets that restore sets.
    unix_options: Vec<ferry_image::UnixSocketOptions>,
    /// Ferry's duplicates of its TCP connections, by fd, for the repair
    /// capture ([`files::KeptDups`]).
    pub kept: std::collections::HashMap<i32, std::os::fd::OwnedFd>,
    /// The fdinfo of each of its epoll fds, as the fd capture read it.
    epoll_fdinfo: std::collections::HashMap<i32, String>,
    /// Ferry's duplicates of its carried fds, by fd ([`files::carried`]).
    carried: std::collections::HashMap<i32, std::os::fd::OwnedFd>,
}

impl Survey {
    /// (pid, files, fds), the view several file checks take.
    pub fn file_view(&self) -> (i32, &[OpenFile], &[FdSlot]) {
        (self.pid, self.files.as_slice(), self.fds.as_slice())
    }

    /// Each fd with the (dev, ino) of its file.
    pub fn fd_inodes(&self) -> Vec<(i32, (u64, u64))> {
        self.fds.iter().filter_map(|s| Some((s.fd, *self.inodes.get(s.file as usize)?))).collect()
    }
}

/// What the survey of the whole frozen tree found.
pub(super) struct TreeSurvey {
    /// Parents before children, the root first, as the tree was frozen.
    pub procs: Vec<Survey>,
    /// Processes that share their parent's fd table (CLONE_FILES).
    pub share_files: Vec<i32>,
    /// The tree's own PID namespace, when it has one.
    pub pid_view: Option<namespaces::PidView>,
    /// The tree's own UTS namespace, when it has one.
    pub uts: Option<ferry_image::UtsImage>,
    pub cgroups: Vec<ferry_image::ProcessCgroups>,
    /// SO_PEERCRED of the tree's unix sockets, each socket once.
    pub unix_creds: Vec<UnixPeerCred>,
    /// The tree's connected unix sockets whose peer was closed, each once.
    pub unix_dead: Vec<UnixDeadPeer>,
    /// Files in flight in the tree's unix queues that no process holds.
    pub unix_in_flight_files: Vec<ferry_image::InFlightFile>,
    /// Options of the tree's unix sockets that restore sets, each once.
    pub unix_options: Vec<ferry_image::UnixSocketOptions>,
    pub shared_anon: Vec<ferry_image::MemfdObject>,
    pub sysv_shm: Vec<ferry_image::SysvShm>,
    pub sysv_sem: Vec<ferry_image::SysvSem>,
    pub sysv_msg: Vec<ferry_image::SysvMsgQueue>,
    /// Exited children not reaped yet, as the freeze found them.
    pub zombies: Vec<ferry_image::Zombie>,
    /// The tree's pty pairs (host PIDs in their sessions).
    pub ptys: Option<ferry_image::PtysImage>,
    /// Their queues, read out; put back if the tree runs on.
    pub pty_drained: files::pty::Drained,
    /// Ferry's duplicates of the carried files, by description id.
    pub carried: std::collections::HashMap<u64, std::os::fd::OwnedFd>,
}

impl TreeSurvey {
    pub fn file_views(&self) -> Vec<(i32, &[OpenFile], &[FdSlot])> {
        self.procs.iter().map(Survey::file_view).collect()
    }
}

/// What was listed of the tree while it ran: each process's sockets.
pub(super) type Presurvey = std::collections::HashMap<i32, files::FdPresurvey>;

/// Phase "presurvey", before the freeze: the sockets of every process
/// of the running tree listed ([`files::presurvey`]), so that the survey
/// in the freeze only checks they are still the same; and the watch of
/// the tree's setsockopt calls started first (a kept one counting from
/// now), before any option is read.
pub(super) fn presurvey(
    root: i32,
    kept: Option<&sockopt_watch::KeptWatch>,
) -> (Presurvey, Option<sockopt_watch::Watch>) {
    let pids = super::tree::running_tree(root);
    let mut pre = Presurvey::new();
    for &pid in &pids {
        let listed = files::presurvey(pid, socket_refs::socket_fds_unless_loading(pid).as_deref());
        tracing::debug!("pid {pid}: {} sockets listed before the freeze", listed.len());
        pre.insert(pid, listed);
    }
    // Before the option check reads anything.
    let sockets: usize = pre.values().map(files::FdPresurvey::len).sum();
    let from = std::env::var("FERRY_SOCKOPT_WATCH_FROM").ok().and_then(|v| v.parse().ok());
    let watch = match kept {
        Some(k) if sockets > 0 => k.take(&pids),
        Some(_) => None,
        None => (sockets >= from.unwrap_or(WATCH_FROM))
            .then(|| sockopt_watch::Watch::start(&pids))
            .flatten(),
    };
    (pre, watch)
}

/// From how many sockets on the options are read before the freeze and
/// watched ([`sockopt_watch`]): the watch costs the checkpoint an RCU
/// grace period when it ends (~10-20 ms on a busy machine), reading 500
/// sockets' options in the freeze costs about as much. Tests set
/// another bound with FERRY_SOCKOPT_WATCH_FROM.
const WATCH_FROM: usize = 500;

/// The survey phase over the frozen tree.
pub(super) fn survey_tree(
    tree: &FrozenTree,
    opts: &CaptureOptions,
    pre: &Presurvey,
    watch: Option<sockopt_watch::Watch>,
) -> Result<TreeSurvey> {
    let pids = tree.pids();
    let mut splits = crate::phases::Splits::start("survey");
    tree.check_groups()?;
    tree.check_zombies()?;
    namespaces::check_mounts(&pids)?;
    namespaces::check_ipc(&pids)?;
    namespaces::check_others(&pids)?;
    let ppids: Vec<i32> = tree.procs.iter().map(|p| p.ppid).collect();
    splits.mark("namespaces");
    let share_files = sharing::check(&pids, &ppids)?;
    if let Some(root) = tree.procs.first() {
        sharing::check_outside(root.frozen.pid, root.ppid)?;
    }
    splits.mark("sharing");
    let tasks: Vec<(i32, Vec<i32>)> = tree
        .procs
        .iter()
        .map(|p| (p.frozen.pid, p.frozen.threads.iter().map(|t| t.tid).collect()))
        .collect();
    let zombie_pids: Vec<i32> = tree.zombies.iter().map(|z| z.pid).collect();
    let pid_view = namespaces::pid_view(&tasks, &zombie_pids)?;
    let uts = namespaces::capture_uts(&tasks)?;
    let cgroups = cgroups::capture(&tasks)?;
    let tids: Vec<i32> = tasks.iter().flat_map(|t| t.1.iter().copied()).collect();
    let quiet = watch.map(|w| w.quiet(&tids)).unwrap_or_default();
    splits.mark("pids, uts, cgroups, watch");
    let mut procs = Vec::with_capacity(tree.procs.len());
    for p in &tree.procs {
        let listed = pre.get(&p.frozen.pid);
        procs.push(survey_process(&p.frozen, p.ppid, &pids, opts, (listed, quiet), &mut splits)?);
    }
    let (unix_creds, unix_dead) = link_files(&mut procs, &pids)?;
    splits.mark("files linked");
    let carried = carried_by_id(&mut procs);
    let orphans = procs.iter_mut().flat_map(|s| std::mem::take(&mut s.unix_orphans)).collect();
    let next_id = procs.iter().flat_map(|s| s.files.iter().map(|f| f.id + 1)).max().unwrap_or(0);
    let unix_in_flight_files = files::unix::link_orphans(orphans, next_id)?;
    // A socket shared by several processes was read once by each.
    let mut unix_options: Vec<ferry_image::UnixSocketOptions> =
        procs.iter_mut().flat_map(|s| std::mem::take(&mut s.unix_options)).collect();
    unix_options.sort_by_key(|o| o.ino);
    unix_options.dedup_by_key(|o| o.ino);
    let views: Vec<socket_refs::Survey> = procs
        .iter()
        .map(|s| socket_refs::Survey {
            pid: s.pid,
            ppid: s.ppid,
            files: &s.files,
            fds: &s.fds,
            smaps: &s.smaps,
        })
        .collect();
    socket_refs::check(&views, &share_files)?;
    splits.mark("socket references");
    let mem_views: Vec<(i32, &[Vma], &[procfs::MapsEntry])> =
        procs.iter().map(|s| (s.pid, s.vmas.as_slice(), s.smaps.as_slice())).collect();
    let shared_anon = shm::capture_shared_anon(&mem_views)?;
    let sysv_shm = shm::capture_sysv(&mem_views)?;
    splits.mark("shared memory");
    // Last: it reads the ptys' queues out, which every refusal above left.
    let ptys = capture_ptys(tree, &procs, opts)?;
    splits.mark("ptys");
    Ok(TreeSurvey {
        share_files,
        pid_view,
        uts,
        cgroups,
        unix_creds,
        unix_dead,
        unix_in_flight_files,
        unix_options,
        shared_anon,
        sysv_shm,
        sysv_sem: sysv_ipc::capture_sem(&pids)?,
        sysv_msg: sysv_ipc::capture_msg(&pids)?,
        zombies: tree.zombies.clone(),
        ptys: ptys.image,
        pty_drained: ptys.drained,
        carried,
        procs,
    })
}

/// The pty pass ([`files::pty::capture_tree`]) over the surveyed tree.
fn capture_ptys(
    tree: &FrozenTree,
    procs: &[Survey],
    opts: &CaptureOptions,
) -> Result<files::pty::TreePtys> {
    let views: Vec<files::pty::PtyView> = tree
        .procs
        .iter()
        .zip(procs)
        .map(|(p, s)| files::pty::PtyView {
            pid: s.pid,
            pidfd: &p.frozen.pidfd,
            files: &s.files,
            fds: &s.fds,
        })
        .collect();
    let leaders = session_ids(procs)?;
    files::pty::capture_tree(&views, &leaders, opts.external_stdio)
}

/// (pid, session, process group) of every process, from /proc.
fn session_ids(procs: &[Survey]) -> Result<Vec<(i32, i32, i32)>> {
    procs
        .iter()
        .map(|s| {
            let st = procfs::Stat::read(s.pid)?;
            Ok((s.pid, st.field(6) as i32, st.field(5) as i32))
        })
        .collect()
}

fn survey_process(
    frozen: &Frozen,
    ppid: i32,
    tree: &[i32],
    opts: &CaptureOptions,
    (pre, quiet): (Option<&files::FdPresurvey>, sockopt_watch::Quiet),
    splits: &mut crate::phases::Splits,
) -> Result<Survey> {
    let pid = frozen.pid;
    let (smaps, without_page_walk) = vma_flags::frozen_smaps(pid, opts.presurveyed.get(&pid))?;
    tracing::debug!(
        "pid {pid}: mappings read {}",
        if without_page_walk { "by BPF and maps (presurvey proven)" } else { "from smaps" }
    );
    let vmas = memory::classify(pid, &smaps)?;
    memory::check_guard_regions(pid, &smaps)?;
    splits.mark("mappings");
    let files::CapturedFds {
        files,
        fds,
        inodes,
        unix_connects,
        pending_listeners,
        unix_creds,
        unix_dead,
        unix_orphans,
        unix_options,
        mut kept,
        early_owners,
        epoll_fdinfo,
        carried,
    } = files::capture(pid, &frozen.pidfd, tree, opts, pre, quiet)?;
    splits.mark("fds");
    files::check_deleted_mapped(pid, &files, &fds, &vmas)?;
    let (memfds, mut inode_attrs) = memfd::capture(pid, &files, &fds, &vmas, &smaps)?;
    inode_attrs.extend(files::owner::deleted_attrs(pid, &files, &fds)?);
    // The carried files' duplicates serve the owner read too (no second
    // pidfd_getfd per fd in the freeze), then go their own way.
    kept.extend(carried);
    let file_owners =
        files::owner::capture(pid, &frozen.pidfd, &files, &fds, tree, &kept, &early_owners)?;
    let carried = files::carried::take_from(&mut kept, &files, &fds);
    keep_connections(&mut kept, &files, &fds);
    splits.mark("memfds, owners");
    let tids: Vec<i32> = frozen.threads.iter().map(|t| t.tid).collect();
    prctl::check_thread_creds(pid, &tids)?;
    super::process::check_unrestored(pid)?;
    let (seccomp_filters, seccomp_threads) = seccomp::capture(pid, &tids)?;
    let deleted_files = memfd::capture_deleted_files(pid, &vmas, &smaps)?;
    check_deleted_exe(pid, &deleted_files)?;
    let fidelity = ferry_image::Fidelity {
        seccomp_filters,
        file_owners,
        inode_attrs,
        stopped: frozen.stopped,
        deleted_files,
        unix_connects,
        ..Default::default()
    };
    let vdso = smaps.iter().find(|m| m.path == "[vdso]").ok_or_else(|| {
        EngineError::unsupported(pid, "the vDSO", "process has no [vdso] mapping")
    })?;
    let syscall_ip = inject::find_syscall_insn(pid, vdso.start, vdso.end)?;
    let remote = Remote { pid, syscall_ip, settle: true };
    splits.mark("creds, seccomp, vdso");
    Ok(Survey {
        pid,
        ppid,
        smaps,
        vmas,
        files,
        fds,
        inodes,
        memfds,
        remote,
        fidelity,
        seccomp_threads,
        pending_listeners,
        unix_creds,
        unix_dead,
        unix_orphans,
        unix_options,
        kept,
        epoll_fdinfo,
        carried,
    })
}

/// The carried duplicates of every process by description id (ids are
/// the tree's once [`link_files`] ran), each description once.
fn carried_by_id(procs: &mut [Survey]) -> std::collections::HashMap<u64, std::os::fd::OwnedFd> {
    let mut out = std::collections::HashMap::new();
    for s in procs {
        for (fd, dup) in std::mem::take(&mut s.carried) {
            let id = s.fds.iter().find(|x| x.fd == fd).and_then(|x| s.files.get(x.file as usize));
            if let Some(f) = id {
                out.entry(f.id).or_insert(dup);
            }
        }
    }
    out
}

/// Keeps only the duplicates the repair capture takes: TCP sockets with
/// a peer (the rest are closed now rather than held through the freeze).
fn keep_connections(
    kept: &mut std::collections::HashMap<i32, std::os::fd::OwnedFd>,
    files: &[OpenFile],
    fds: &[FdSlot],
) {
    let connections: std::collections::HashSet<i32> = fds
        .iter()
        .filter(|slot| {
            matches!(files.get(slot.file as usize).map(|f| &f.kind),
                Some(FileKind::InetSocket(s)) if s.sock_type == libc::SOCK_STREAM && s.peer.is_some())
        })
        .map(|slot| slot.fd)
        .collect();
    kept.retain(|fd, _| connections.contains(fd));
}

/// An executable deleted while it runs is made again from the deleted
/// file its text is mapped from: it must be the one mapped file of that
/// name, and the same inode.
fn check_deleted_exe(pid: i32, deleted: &[ferry_image::MemfdObject]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let exe = crate::procfs::read_link(&format!("/proc/{pid}/exe"))?;
    let Some(old) = exe.strip_suffix(" (deleted)") else {
        return Ok(());
    };
    let path = format!("/proc/{pid}/exe");
    let ino = std::fs::metadata(&path).map_err(|e| EngineError::io(&path, e))?.ino();
    let named: Vec<_> = deleted.iter().filter(|d| d.name == old).collect();
    if named.len() != 1 || named[0].id != ino {
        return Err(EngineError::unsupported(
            pid,
            format!("its executable {exe}"),
            "deleted, and not the one deleted file of that name it has mapped, so restore could not make it again",
        ));
    }
    Ok(())
}

/// Links the files the processes share (unix peers, epoll targets) and
/// checks what only the whole tree can tell; returns the tree's unix
/// peer credentials and its unix sockets whose peer was closed, each
/// socket once.
fn link_files(
    procs: &mut [Survey],
    pids: &[i32],
) -> Result<(Vec<UnixPeerCred>, Vec<UnixDeadPeer>)> {
    // A socket shared by several processes was read once by each.
    let mut unix_creds: Vec<UnixPeerCred> =
        procs.iter_mut().flat_map(|s| std::mem::take(&mut s.unix_creds)).collect();
    unix_creds.sort_unstable_by_key(|c| c.ino);
    unix_creds.dedup_by_key(|c| c.ino);
    let mut unix_dead: Vec<UnixDeadPeer> =
        procs.iter_mut().flat_map(|s| std::mem::take(&mut s.unix_dead)).collect();
    unix_dead.sort_unstable_by_key(|d| d.ino);
    unix_dead.dedup_by_key(|d| d.ino);
    {
        let mut pf: Vec<files::ProcessFiles> = procs
            .iter_mut()
            .map(|s| files::ProcessFiles {
                pid: s.pid,
                files: &mut s.files,
                fds: &s.fds,
                inodes: &s.inodes,
            })
            .collect();
        files::link_tree(&mut pf, pids, &unix_creds)?;
    }
    check_pending_listeners(procs)?;
    let targets = {
        let views: Vec<(i32, &[OpenFile], &[FdSlot])> =
            procs.iter().map(Survey::file_view).collect();
        let inodes: Vec<&[(u64, u64)]> = procs.iter().map(|s| s.inodes.as_slice()).collect();
        let fdinfos: Vec<_> = procs.iter().map(|s| &s.epoll_fdinfo).collect();
        files::epoll::resolve_targets(&views, &inodes, &fdinfos)?
    };
    for (s, t) in procs.iter_mut().zip(targets) {
        s.fidelity.epoll_targets = t;
    }
    Ok((unix_creds, unix_dead))
}

/// A listener's waiting connection must be one of the tree's sockets.
fn check_pending_listeners(procs: &[Survey]) -> Result<()> {
    for s in procs {
        for &l in &s.pending_listeners {
            let FileKind::UnixSocket(u) = &s.files[l as usize].kind else { continue };
            let mut positions: Vec<u32> = procs
                .iter()
                .flat_map(|t| t.fidelity.unix_connects.iter())
                .filter(|c| c.listener == u.ino)
                .map(|c| c.position)
                .collect();
            positions.sort_unstable();
            // Every waiting client, each at its own place (0, 1, 2...).
            if positions.is_empty() || positions.iter().enumerate().any(|(i, &p)| p != i as u32) {
                let fd = s.fds.iter().find(|x| x.file == l).map_or(-1, |x| x.fd);
                return Err(EngineError::unsupported(
                    s.pid,
                    format!("fd {fd} (socket:[{}])", u.ino),
                    "the connection waiting in its accept queue comes from outside the process tree",
                ));
            }
        }
    }
    Ok(())
}
