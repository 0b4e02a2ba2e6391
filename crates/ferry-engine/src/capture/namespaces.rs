//! Which PID, mount and IPC namespaces the tree lives in.
//!
//! A tree in ferry's own PID namespace is recorded with the PIDs ferry
//! sees. A tree in a PID namespace of its own (one that `restore
//! --new-pid-ns` made, or a container's) is recorded with the PIDs its
//! processes see, so that it comes back with those; the namespace's init
//! itself stays behind (restore provides a new one).
//!
//! ferry resolves every path of the tree (files, cwd, executables) in its
//! own mount namespace, so a tree in another mount namespace is accepted
//! only if that namespace has the same mounts as ferry's, /proc aside
//! (a PID namespace comes with its own /proc).

use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::TreeImage;
use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;

fn ns_inode(pid: i32, kind: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/ns/{kind}");
    std::fs::metadata(&path).map(|m| m.ino()).map_err(|e| EngineError::io(path, e))
}

/// The PIDs of a task in every PID namespace it belongs to, outermost
/// first (the NSpid line of /proc/PID/status).
fn ns_pids(pid: i32, tid: i32) -> Result<Vec<i32>> {
    let path = format!("/proc/{pid}/task/{tid}/status");
    let text = procfs::read_string(&path)?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .ok_or_else(|| EngineError::Parse { path: path.clone(), what: "no NSpid line".into() })?;
    let ids: Vec<i32> = line.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    if ids.is_empty() {
        return Err(EngineError::Parse { path, what: "empty NSpid line".into() });
    }
    Ok(ids)
}

/// PIDs as ferry sees them mapped to PIDs as the tree sees them.
pub struct PidView {
    inner: HashMap<i32, i32>,
}

impl PidView {
    /// Ids of processes outside the tree that the tree cannot see (its
    /// namespace's parent side) read as 0, as getppid()/getsid() give them.
    pub fn inner(&self, host: i32) -> i32 {
        if let Some(&v) = self.inner.get(&host) {
            return v;
        }
        match ns_pids(host, host) {
            Ok(ids) if ids.len() >= 2 => ids[ids.len() - 1],
            _ => 0,
        }
    }
}

/// Returns None for a tree in ferry's PID namespace, else the view of
/// the tree's own namespace. `tasks` lists (pid, tids) of every process,
/// the root first; `zombies` their unreaped children.
pub fn pid_view(tasks: &[(i32, Vec<i32>)], zombies: &[i32]) -> Result<Option<PidView>> {
    let root = tasks[0].0;
    let ours = ns_inode(std::process::id() as i32, "pid")?;
    let theirs = ns_inode(root, "pid")?;
    if ours == theirs {
        for (pid, _) in &tasks[1..] {
            if ns_inode(*pid, "pid")? != ours {
                return Err(EngineError::unsupported(
                    *pid,
                    "the PID namespace",
                    "a child is in a PID namespace of its own, its parent is not",
                ));
            }
        }
        return Ok(None);
    }
    let mut inner = HashMap::new();
    let depth = ns_pids(root, root)?.len();
    for (pid, tids) in tasks {
        if ns_inode(*pid, "pid")? != theirs {
            return Err(EngineError::unsupported(
                *pid,
                "the PID namespace",
                "processes of the tree are in different PID namespaces",
            ));
        }
        for &tid in tids {
            let ids = ns_pids(*pid, tid)?;
            if ids.len() != depth {
                return Err(EngineError::unsupported(
                    *pid,
                    "the PID namespace",
                    "processes of the tree are in different PID namespaces",
                ));
            }
            inner.insert(tid, ids[ids.len() - 1]);
        }
    }
    for &z in zombies {
        let ids = ns_pids(z, z)?;
        inner.insert(z, ids[ids.len() - 1]);
    }
    if inner.get(&root) == Some(&1) {
        return Err(EngineError::unsupported(
            root,
            "the PID namespace",
            "the root is PID 1 (init) of its namespace; checkpoint the process below it instead, restore gives it a new init",
        ));
    }
    Ok(Some(PidView { inner }))
}

/// Rewrites every PID of the image as the tree's namespace sees it.
pub fn translate(image: &mut TreeImage, view: &PidView) {
    for p in &mut image.processes {
        for id in [&mut p.pid, &mut p.ppid, &mut p.pgid, &mut p.sid] {
            *id = view.inner(*id);
        }
        for t in &mut p.threads {
            t.tid = view.inner(t.tid);
        }
        for timer in &mut p.posix_timers {
            if timer.notify_tid > 0 {
                timer.notify_tid = view.inner(timer.notify_tid);
            }
        }
        for t in &mut p.fidelity.threads {
            t.tid = view.inner(t.tid);
        }
        for f in &mut p.files {
            if let ferry_image::FileKind::ProcFile { path } = &mut f.kind {
                let rest = path.trim_start_matches("/proc/");
                let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
                if let Ok(id) = id.parse::<i32>() {
                    *path = format!("/proc/{}/{tail}", view.inner(id));
                }
            }
            if let ferry_image::FileKind::UnixSocket(u) = &mut f.kind {
                for m in &mut u.in_flight {
                    for d in m.fds.iter_mut().filter(|d| **d != ferry_image::PassedFd::HELD_BY_NONE)
                    {
                        d.pid = view.inner(d.pid);
                    }
                    if let Some(c) = &mut m.creds {
                        c.pid = view.inner(c.pid);
                    }
                }
            }
        }
        for o in &mut p.fidelity.file_owners {
            if o.owner > 0 {
                o.owner = view.inner(o.owner);
            }
        }
    }
    for z in &mut image.zombies {
        for id in [&mut z.pid, &mut z.ppid, &mut z.pgid, &mut z.sid] {
            *id = view.inner(*id);
        }
    }
    image.own_pid_namespace = true;
}

/// (mount point, root within the filesystem, device, type) of every
/// mount that names files.
fn mounts(pid: i32) -> Result<BTreeSet<(String, String, String, String)>> {
    let path = format!("/proc/{pid}/mountinfo");
    let text = procfs::read_string(&path)?;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|&x| x == "-") else {
            return Err(EngineError::Parse {
                path,
                what: format!("mountinfo line without separator: {line}"),
            });
        };
        if f.len() < 5 || f.len() < sep + 2 {
            return Err(EngineError::Parse { path, what: format!("short mountinfo line: {line}") });
        }
        let point = f[4];
        // /proc comes with the PID namespace and /sys with the network
        // namespace (`ip netns exec` mounts a sysfs of its own); namespace
        // handles (nsfs, `ip netns` names) come and go on the host. None of
        // them moves a file the tree uses elsewhere.
        let under =
            |dir: &str| point == dir || point.strip_prefix(dir).is_some_and(|r| r.starts_with('/'));
        if under("/proc") || under("/sys") || under("/run/netns") || f[sep + 1] == "nsfs" {
            continue;
        }
        out.insert((point.to_string(), f[3].to_string(), f[2].to_string(), f[sep + 1].to_string()));
    }
    Ok(out)
}

/// Refuses a tree whose mount namespace would make its paths mean
/// something else in ferry's.
pub fn check_mounts(pids: &[i32]) -> Result<()> {
    let me = std::process::id() as i32;
    let ours = ns_inode(me, "mnt")?;
    let mut checked = None;
    for &pid in pids {
        let theirs = ns_inode(pid, "mnt")?;
        if theirs == ours || checked == Some(theirs) {
            continue;
        }
        let (a, b) = (mounts(me)?, mounts(pid)?);
        if let Some(m) = b.symmetric_difference(&a).next() {
            let side = if b.contains(m) { "only in the tree's" } else { "only in ferry's" };
            return Err(EngineError::unsupported(
                pid,
                "the mount namespace",
                format!("its mounts differ from ferry's ({} is {side}); ferry restores paths in its own mount namespace", m.0),
            ));
        }
        checked = Some(theirs);
    }
    Ok(())
}

/// Refuses a tree in another IPC namespace: its SysV objects are read
/// (and recreated) in ferry's.
pub fn check_ipc(pids: &[i32]) -> Result<()> {
    let ours = ns_inode(std::process::id() as i32, "ipc")?;
    for &pid in pids {
        if ns_inode(pid, "ipc")? != ours {
            return Err(EngineError::unsupported(
                pid,
                "the IPC namespace",
                "it is not ferry's; SysV IPC objects are captured in ferry's namespace",
            ));
        }
    }
    Ok(())
}

/// Namespaces ferry cannot make again: a tree in a user, time or cgroup
/// namespace other than ferry's is refused (restore would put it in
/// ferry's, with other clock offsets, id mapping or cgroup root). The
/// UTS namespace is [`capture_uts`]'s.
pub fn check_others(pids: &[i32]) -> Result<()> {
    let me = std::process::id() as i32;
    for (kind, name) in [
        ("user", "user"),
        ("time", "time"),
        ("time_for_children", "time (for children)"),
        ("cgroup", "cgroup"),
    ] {
        let Ok(ours) = ns_inode(me, kind) else {
            continue;
        };
        for &pid in pids {
            if ns_inode(pid, kind)? != ours {
                return Err(EngineError::unsupported(
                    pid,
                    format!("the {name} namespace"),
                    "it is not ferry's; ferry restores into its own and cannot make this one again",
                ));
            }
        }
    }
    Ok(())
}

/// The tree's UTS namespace: `None` when every thread is in ferry's; its
/// names when every thread is in one UTS namespace of its own that no
/// process outside the tree is in (restore makes a new one with those
/// names, which would split a namespace shared with outside processes).
/// Any other layout is refused by name. `tasks` lists (pid, tids).
pub fn capture_uts(tasks: &[(i32, Vec<i32>)]) -> Result<Option<ferry_image::UtsImage>> {
    let Some(&(root, _)) = tasks.first() else {
        return Ok(None);
    };
    let ours = ns_inode(std::process::id() as i32, "uts")?;
    let theirs = ns_inode(root, "uts")?;
    for (pid, tids) in tasks {
        for &tid in tids {
            let path = format!("/proc/{pid}/task/{tid}/ns/uts");
            let ino =
                std::fs::metadata(&path).map(|m| m.ino()).map_err(|e| EngineError::io(path, e))?;
            if ino != theirs {
                return Err(EngineError::unsupported(
                    *pid,
                    "the UTS namespace",
                    format!("thread {tid} is in another UTS namespace than the root {root}; ferry restores a tree into one"),
                ));
            }
        }
    }
    if theirs == ours {
        return Ok(None);
    }
    let inside: BTreeSet<i32> = tasks.iter().map(|t| t.0).collect();
    if let Some(other) = outside_process_in(theirs, &inside) {
        return Err(EngineError::unsupported(
            root,
            "the UTS namespace",
            format!("process {other}, outside the tree, is in it too; a restore would give the tree a namespace of its own"),
        ));
    }
    let (hostname, domainname) = ferry_sys::uts::names_of(root)
        .map_err(|e| EngineError::kernel(root, "reading the names of its UTS namespace", e))?;
    Ok(Some(ferry_image::UtsImage { hostname, domainname }))
}

/// A process (not of `inside`) whose UTS namespace has inode `ino`.
/// Processes that end while /proc is read are skipped.
fn outside_process_in(ino: u64, inside: &BTreeSet<i32>) -> Option<i32> {
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| !inside.contains(pid))
        .find(|&pid| ns_inode(pid, "uts").is_ok_and(|i| i == ino))
}
