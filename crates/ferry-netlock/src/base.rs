//! A namespace's base: the one copy of the lock's BPF program and maps that
//! serves every eBPF lock of a network namespace. It is loaded, attached to
//! ingress and egress of every interface and pinned by the first lock of the
//! namespace, and kept: later locks only claim an owner slot, write their
//! tuples and flip their bit of `active`. So a checkpoint pays neither the
//! program load and attach (78-97 ms here) nor the detach's RCU grace
//! periods that a lock per capture cost.
//!
//! Kernel objects: /sys/fs/bpf/ferry/<base>/ holds the programs, the maps
//! and one link per interface and direction. Bookkeeping:
//! /run/ferry/bases/<base>/ holds `lock` (flock: one writer of the maps at
//! a time), `info.json` (namespace, for `status`) and `slot-<n>` files, each
//! naming the lock that owns slot n. Entries of owner n exist in the maps
//! only while `slot-n` exists.
//!
//! `<base>` is `ns<cookie>-<object hash>`: the namespace's cookie is never
//! reused while the machine runs (an inode number is, once a namespace is
//! gone), and a ferry whose BPF object differs installs a base of its own.

use crate::{netns, NetlockError};
use aya::programs::links::{FdLink, LinkOrder};
use aya::programs::tc::TcAttachOptions;
use aya::programs::{SchedClassifier, TcAttachType};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The BPF object compiled by build.rs from bpf/netlock.bpf.c.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/netlock.bpf.o"));

const BPFFS: &str = "/sys/fs/bpf";
pub(crate) const STATE_ROOT: &str = "/run/ferry/bases";

/// Owner slots per base: bits of the 64-bit `active` word.
pub(crate) const SLOTS: u8 = 64;

const PROGRAMS: [(&str, TcAttachType, &str); 2] = [
    ("ferry_ingress", TcAttachType::Ingress, "ingress"),
    ("ferry_egress", TcAttachType::Egress, "egress"),
];
const MAPS: [&str; 5] = ["frozen", "active", "table", "held", "lost"];

/// Tuples written to `frozen` (the overflow of `table`) at most. Elements
/// are allocated on insert (`BPF_F_NO_PREALLOC`), but a lock's release
/// walks every bucket to find its keys (~1 ns each): 2^16 keeps that walk
/// near 60 us, and the table's 2^16 slots take nearly every tuple anyway.
pub const MAX_TUPLES: u32 = 1 << 16;

/// Slots of the open-addressing table (`table` in netlock.bpf.c: 40 bytes
/// each, 2.5 MiB), and bytes of its values, all mapped.
pub(crate) const TABLE_SLOTS: u32 = 1 << 16;
pub(crate) const KEY_LEN: usize = 40;
pub(crate) const TABLE_BYTES: usize = TABLE_SLOTS as usize * KEY_LEN;

/// What `info.json` says of a base.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BaseInfo {
    pub netns: String,
    pub netns_inode: u64,
    pub created_unix_ms: u64,
}

/// An open base: its maps, and the file whose flock serialises writers.
#[derive(Debug)]
pub(crate) struct Base {
    pub name: String,
    pub frozen: OwnedFd,
    pub active: OwnedFd,
    /// Per owner slot, the packets its lock dropped without keeping them
    /// (None in a base an earlier ferry installed, whose program counts
    /// nothing: its locks' losses are unknown).
    pub lost: Option<OwnedFd>,
    /// The map `table`, mapped only once a lock needs it as memory (see
    /// [`Base::table`]): the kernel maps every page of it at mmap (2.5
    /// MiB, ~0.7 ms here with the unmap), more than a few entries cost
    /// through the bpf syscall.
    table_fd: OwnedFd,
    table: Option<ferry_sys::bpf::MappedArray>,
    /// The id of the map `table` maps (see `reuse.rs`).
    table_id: u32,
    flock_file: std::fs::File,
}

impl Drop for Base {
    fn drop(&mut self) {
        if let Some(table) = self.table.take() {
            crate::reuse::put_table(&self.name, self.table_id, table);
        }
    }
}

/// Holds a base's flock until dropped (through a duplicate of the file's
/// descriptor: a flock belongs to the open file, not the descriptor).
pub(crate) struct Exclusive(std::fs::File);

impl Drop for Exclusive {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

impl Base {
    /// Takes the base's flock: the caller is the only writer of its maps
    /// and slot files until the guard drops.
    pub fn exclusive(&self, lock: &str) -> Result<Exclusive, NetlockError> {
        exclusive(lock, &self.flock_file, &self.name)
    }

    /// The table as memory, mapped now if it was not yet.
    pub fn table(&mut self, lock: &str) -> Result<&mut [u8], NetlockError> {
        let table = match self.table.take() {
            Some(table) => table,
            None => ferry_sys::bpf::MappedArray::map(self.table_fd.as_fd(), TABLE_BYTES).map_err(
                sys_error(lock, format!("mapping BPF map {}/table", pin_dir(&self.name).display())),
            )?,
        };
        Ok(self.table.insert(table).as_mut_slice())
    }

    /// True when the table is mapped already (then writing it as memory
    /// costs nothing more).
    pub fn table_is_mapped(&self) -> bool {
        self.table.is_some()
    }

    /// The table map's descriptor, for single-entry bpf calls.
    pub fn table_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.table_fd.as_fd()
    }
}

fn exclusive(lock: &str, file: &std::fs::File, base: &str) -> Result<Exclusive, NetlockError> {
    let dup =
        file.try_clone().map_err(io_error(lock, "duplicating", &state_dir(base).join("lock")))?;
    take_flock(lock, &dup, base)?;
    Ok(Exclusive(dup))
}

fn take_flock(lock: &str, file: &std::fs::File, base: &str) -> Result<(), NetlockError> {
    file.lock().map_err(|source| NetlockError::Io {
        lock: lock.to_string(),
        what: "locking",
        path: state_dir(base).join("lock"),
        source,
    })
}

/// Where the bases and the locks pin their programs, maps and links:
/// `/sys/fs/bpf/ferry` when /sys/fs/bpf is a bpffs here (or none is
/// found: [`ensure_bpffs`] mounts one there).
///
/// `ip netns exec` runs its command in a mount namespace of its own
/// with a fresh /sys, where /sys/fs/bpf is no bpffs. One mounted there
/// would end with the command, and with it every pin: a handed-over
/// lock's links would detach before its restore (the peers' packets
/// would meet a stack without their connections: resets), and the
/// bases of other namespaces, their pins unseen, would look dead to the
/// start-of-run sweep. So when the mount namespace ferry was started
/// from has a bpffs there, ferry pins in that one, through a directory
/// descriptor of it kept open for the whole run.
pub(crate) fn pin_root() -> &'static Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let is = |p: &Path| ferry_sys::netns::is_bpffs(p).unwrap_or(false);
        if is(Path::new(BPFFS)) {
            return Path::new(BPFFS).join("ferry");
        }
        let starter =
            PathBuf::from(format!("/proc/{}/root{BPFFS}", std::os::unix::process::parent_id()));
        let kept = is(&starter)
            .then(|| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                    .open(&starter)
                    .ok()
            })
            .flatten();
        match kept {
            // Never closed: the paths below go through it until ferry exits.
            Some(dir) => PathBuf::from(format!(
                "/proc/self/fd/{}/ferry",
                std::os::fd::IntoRawFd::into_raw_fd(dir)
            )),
            None => Path::new(BPFFS).join("ferry"),
        }
    })
}

pub(crate) fn pin_dir(base: &str) -> PathBuf {
    pin_root().join(base)
}

pub(crate) fn state_dir(base: &str) -> PathBuf {
    Path::new(STATE_ROOT).join(base)
}

/// FNV-1a of the BPF object: bases of another ferry build are not reused.
/// Computed once per process (a byte at a time over the whole object:
/// ~0.1 ms, asked by every start and every prepare).
fn object_hash() -> u32 {
    static HASH: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *HASH.get_or_init(|| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in OBJECT {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h ^ (h >> 32)) as u32
    })
}

fn base_name(cookie: u64) -> String {
    format!("ns{cookie}-{:08x}", object_hash())
}

/// True when `name` has the form of a base name (lock names have no '-').
pub(crate) fn is_base_name(name: &str) -> bool {
    name.starts_with("ns")
        && name.contains('-')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn io_error(
    lock: &str,
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> NetlockError {
    let (lock, path) = (lock.to_string(), path.to_path_buf());
    move |source| NetlockError::Io { lock, what, path, source }
}

fn sys_error(lock: &str, what: String) -> impl FnOnce(ferry_sys::SysError) -> NetlockError {
    let lock = lock.to_string();
    move |source| NetlockError::Sys { lock, what, source }
}

fn ensure_bpffs(lock: &str) -> Result<(), NetlockError> {
    let bpffs = pin_root().parent().unwrap_or(Path::new(BPFFS));
    let shown = bpffs.display();
    if !ferry_sys::netns::is_bpffs(bpffs).map_err(sys_error(lock, format!("checking {shown}")))? {
        ferry_sys::netns::mount_bpffs(bpffs)
            .map_err(sys_error(lock, format!("mounting bpffs on {shown}")))?;
    }
    Ok(())
}

/// Opens the base of the namespace at `netns_path` (None: the caller's),
/// installing it first when the namespace has none, and attaching it to
/// any interface that appeared since; claims an owner slot for `lock`. With a base in place this is a few
/// syscalls per interface: no program load, no attach.
pub(crate) fn ensure(
    lock: &str,
    netns_path: Option<&Path>,
    netns_desc: &str,
    netns_inode: u64,
) -> Result<(Base, u8), NetlockError> {
    ensure_bpffs(lock)?;
    // Inside the namespace: its cookie, its interfaces, and tcx attach
    // resolve interface indexes in the caller's namespace.
    netns::run_in(lock, netns_path, || {
        let cookie = ferry_sys::netns::netns_cookie()
            .map_err(sys_error(lock, format!("identifying {netns_desc}")))?;
        let name = base_name(cookie);
        let (flock_file, held) = open_locked(lock, &name)?;
        let pins = pin_dir(&name);
        if !PROGRAMS.iter().all(|(program, ..)| pins.join(program).exists()) {
            install(lock, &pins)?;
        }
        attach_missing(lock, &pins, netns_desc)?;
        write_info(lock, &name, netns_desc, netns_inode)?;
        let base = open_maps(lock, name, flock_file)?;
        // Claimed before the flock is let go: from here the base has a
        // user, and no release takes it away.
        let slot = claim_slot(&base, lock)?;
        drop(held);
        Ok((base, slot))
    })
}

/// Opens the base's flock file and takes the flock, on the file that is
/// the base's lock when the flock is granted: a release removes the
/// whole state directory under the flock, and a process that waited on
/// the removed file would otherwise go on under a lock nobody else
/// takes (installing pins another release is removing). Such a waiter
/// finds its file gone and starts again on a fresh one.
fn open_locked(lock: &str, base: &str) -> Result<(std::fs::File, Exclusive), NetlockError> {
    use std::os::unix::fs::MetadataExt;
    let path = state_dir(base).join("lock");
    for _ in 0..100 {
        let file = open_state(lock, base)?;
        let held = exclusive(lock, &file, base)?;
        let locked = file.metadata().map_err(io_error(lock, "reading", &path))?;
        match std::fs::metadata(&path) {
            Ok(now) if now.ino() == locked.ino() && now.dev() == locked.dev() => {
                return Ok((file, held))
            }
            _ => continue,
        }
    }
    Err(NetlockError::Io {
        lock: lock.to_string(),
        what: "locking (removed and made again 100 times meanwhile)",
        path,
        source: std::io::Error::from(std::io::ErrorKind::WouldBlock),
    })
}

/// Creates the base's state directory and opens its flock file.
fn open_state(lock: &str, base: &str) -> Result<std::fs::File, NetlockError> {
    let dir = state_dir(base);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io_error(lock, "creating", &dir))?;
    let path = dir.join("lock");
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io_error(lock, "opening", &path))
}

fn write_info(lock: &str, base: &str, netns: &str, inode: u64) -> Result<(), NetlockError> {
    let path = state_dir(base).join("info.json");
    if path.exists() {
        return Ok(());
    }
    let info = BaseInfo {
        netns: netns.to_string(),
        netns_inode: inode,
        created_unix_ms: crate::record::now_unix_ms(),
    };
    let json = serde_json::to_vec(&info).map_err(|source| NetlockError::Record {
        lock: lock.to_string(),
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, json).map_err(io_error(lock, "writing", &path))
}

pub(crate) fn read_info(base: &str) -> Option<BaseInfo> {
    let bytes = std::fs::read(state_dir(base).join("info.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Loads the object and pins its maps and programs (no links yet). Pins
/// left by an install that died half-way are removed first.
fn install(lock: &str, pins: &Path) -> Result<(), NetlockError> {
    remove_pins(lock, pins)?;
    std::fs::create_dir_all(pins).map_err(io_error(lock, "creating pin directory", pins))?;
    // The program needs no CO-RE relocation: btf(None) skips reading and
    // parsing the kernel's BTF (about 19 ms).
    let mut bpf = aya::EbpfLoader::new()
        .btf(None)
        .set_max_entries("frozen", MAX_TUPLES)
        .load(OBJECT)
        .map_err(|source| NetlockError::BpfLoad {
            lock: lock.to_string(),
            source: Box::new(source),
        })?;
    for map in MAPS {
        let path = pins.join(map);
        let wrong = |what| NetlockError::BpfMap {
            lock: lock.to_string(),
            what,
            source: Box::new(aya::maps::MapError::InvalidName { name: map.into() }),
        };
        let map = bpf.map(map).ok_or_else(|| wrong("missing from the BPF object"))?;
        map.pin(&path).map_err(|source| NetlockError::BpfPin {
            lock: lock.to_string(),
            path: path.clone(),
            source: Box::new(source),
        })?;
    }
    // An array map starts zeroed: `active` is 0, nothing is dropped.
    for (program, ..) in PROGRAMS {
        let prog_error = |what: &str, source| NetlockError::BpfProgram {
            lock: lock.to_string(),
            what: format!("{what} {program}"),
            source: Box::new(source),
        };
        let classifier: &mut SchedClassifier = bpf
            .program_mut(program)
            .ok_or_else(|| {
                prog_error("finding", aya::programs::ProgramError::UnexpectedProgramType)
            })?
            .try_into()
            .map_err(|e| prog_error("finding", e))?;
        classifier.load().map_err(|e| prog_error("loading", e))?;
        let path = pins.join(program);
        classifier.pin(&path).map_err(|source| NetlockError::BpfPin {
            lock: lock.to_string(),
            path,
            source: Box::new(source),
        })?;
    }
    tracing::info!(lock, pins = %pins.display(), "network lock base installed");
    Ok(())
}

fn link_pin(pins: &Path, index: u32, direction: &str) -> PathBuf {
    pins.join(format!("link-{index}-{direction}"))
}

/// True when the pinned link at `path` is attached to interface `index`
/// with program `prog_id`.
fn link_is_live(path: &Path, index: u32, prog_id: u32) -> bool {
    let Ok(fd) = ferry_sys::bpf::obj_get(path) else {
        return false;
    };
    matches!(
        ferry_sys::bpf::tcx_link_info(fd.as_fd()),
        Ok(Some(info)) if info.ifindex == index && info.prog_id == prog_id
    )
}

/// Attaches each program to every interface of the caller's namespace that
/// has no live link of it (first in the tcx chain: no other program sees a
/// frozen packet); links of interfaces that are gone are unpinned.
fn attach_missing(lock: &str, pins: &Path, netns_desc: &str) -> Result<(), NetlockError> {
    let interfaces = ferry_sys::netns::interfaces()
        .map_err(sys_error(lock, format!("listing interfaces of {netns_desc}")))?;
    // The links found live or attached here: only the others can be dead.
    let mut current = std::collections::HashSet::new();
    for (program, direction, direction_name) in PROGRAMS {
        let prog_path = pins.join(program);
        let prog_fd = ferry_sys::bpf::obj_get(&prog_path)
            .map_err(sys_error(lock, format!("opening {}", prog_path.display())))?;
        let prog_id = ferry_sys::bpf::prog_id(prog_fd.as_fd())
            .map_err(sys_error(lock, format!("reading the id of {}", prog_path.display())))?;
        let mut classifier: Option<SchedClassifier> = None;
        for (index, interface) in &interfaces {
            let path = link_pin(pins, *index, direction_name);
            if link_is_live(&path, *index, prog_id) {
                current.insert(path);
                continue;
            }
            // A link of an interface that is gone (or of another program).
            let _ = std::fs::remove_file(&path);
            if classifier.is_none() {
                classifier = Some(SchedClassifier::from_pin(&prog_path).map_err(|source| {
                    NetlockError::BpfProgram {
                        lock: lock.to_string(),
                        what: format!("opening {}", prog_path.display()),
                        source: Box::new(source),
                    }
                })?);
            }
            if let Some(classifier) = classifier.as_mut() {
                let at = LinkTarget { lock, netns_desc, interface, direction, direction_name };
                attach_interface(classifier, &at, &path)?;
            }
            current.insert(path);
        }
        drop(classifier);
    }
    remove_dead_links(pins, &current);
    Ok(())
}

struct LinkTarget<'a> {
    lock: &'a str,
    netns_desc: &'a str,
    interface: &'a str,
    direction: TcAttachType,
    direction_name: &'static str,
}

fn attach_interface(
    classifier: &mut SchedClassifier,
    at: &LinkTarget,
    path: &Path,
) -> Result<(), NetlockError> {
    let attach_error = |source| NetlockError::BpfAttach {
        lock: at.lock.to_string(),
        interface: at.interface.to_string(),
        direction: at.direction_name,
        netns: at.netns_desc.to_string(),
        source: Box::new(source),
    };
    let link_id = classifier
        .attach_with_options(
            at.interface,
            at.direction,
            TcAttachOptions::TcxOrder(LinkOrder::first()),
        )
        .map_err(attach_error)?;
    let link = classifier.take_link(link_id).map_err(attach_error)?;
    let link = FdLink::try_from(link).map_err(|source| NetlockError::BpfLink {
        lock: at.lock.to_string(),
        path: path.to_path_buf(),
        source: Box::new(source),
    })?;
    link.pin(path).map_err(|source| NetlockError::BpfPin {
        lock: at.lock.to_string(),
        path: path.to_path_buf(),
        source: Box::new(source),
    })?;
    Ok(())
}

/// Link pins whose interface is gone (the kernel reports ifindex 0),
/// looking only at those not in `known_live`.
fn dead_links(
    pins: &Path,
    known_live: &std::collections::HashSet<PathBuf>,
) -> (usize, Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(pins) else {
        return (0, Vec::new());
    };
    let mut live = 0;
    let mut dead = Vec::new();
    for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        if !path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("link-")) {
            continue;
        }
        if known_live.contains(&path) {
            live += 1;
            continue;
        }
        let attached = ferry_sys::bpf::obj_get(&path)
            .ok()
            .and_then(|fd| ferry_sys::bpf::tcx_link_info(fd.as_fd()).ok().flatten())
            .is_some_and(|info| info.ifindex != 0);
        if attached {
            live += 1;
        } else {
            dead.push(path);
        }
    }
    (live, dead)
}

/// True when a link pin under `pins` is attached to a live interface
/// (looks no further than the first: every ferry run asks, for every base).
fn has_live_link(pins: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(pins) else {
        return false;
    };
    entries.filter_map(|e| e.ok()).map(|e| e.path()).any(|path| {
        path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("link-"))
            && ferry_sys::bpf::obj_get(&path)
                .ok()
                .and_then(|fd| ferry_sys::bpf::tcx_link_info(fd.as_fd()).ok().flatten())
                .is_some_and(|info| info.ifindex != 0)
    })
}

fn remove_dead_links(pins: &Path, known_live: &std::collections::HashSet<PathBuf>) {
    for path in dead_links(pins, known_live).1 {
        let _ = std::fs::remove_file(path);
    }
}

/// Opens the maps of base `name` from their pins.
fn open_maps(lock: &str, name: String, flock_file: std::fs::File) -> Result<Base, NetlockError> {
    let pins = pin_dir(&name);
    let get = |map: &str| {
        let path = pins.join(map);
        ferry_sys::bpf::obj_get(&path)
            .map_err(sys_error(lock, format!("opening pinned map {}", path.display())))
    };
    let table_fd = get("table")?;
    let what = || format!("identifying BPF map {}/table", pins.display());
    let table_id = ferry_sys::bpf::map_id(table_fd.as_fd()).map_err(sys_error(lock, what()))?;
    // A mapping kept by this process (reuse.rs); else mapped when needed.
    let table = crate::reuse::take_table(&name, table_id);
    let (frozen, active) = (get("frozen")?, get("active")?);
    let lost = ferry_sys::bpf::obj_get(&pins.join("lost")).ok();
    Ok(Base { frozen, active, lost, table_fd, table, table_id, name, flock_file })
}

/// Opens an installed base (a process that adopts a lock it did not make).
pub(crate) fn open(lock: &str, name: &str) -> Result<Base, NetlockError> {
    if !pin_dir(name).join(PROGRAMS[0].0).exists() {
        return Err(NetlockError::BaseGone { lock: lock.to_string(), base: name.to_string() });
    }
    let flock_file = open_state(lock, name)?;
    open_maps(lock, name.to_string(), flock_file)
}

pub(crate) fn slot_path(base: &str, slot: u8) -> PathBuf {
    state_dir(base).join(format!("slot-{slot}"))
}

/// Claims a free owner slot for `lock` (its entries in the maps are gone:
/// see the module's invariant).
pub(crate) fn claim_slot(base: &Base, lock: &str) -> Result<u8, NetlockError> {
    for slot in 0..SLOTS {
        let path = slot_path(&base.name, slot);
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
            Ok(mut file) => {
                file.write_all(lock.as_bytes()).map_err(io_error(lock, "writing", &path))?;
                return Ok(slot);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(io_error(lock, "creating", &path)(source)),
        }
    }
    Err(NetlockError::NoFreeSlot { lock: lock.to_string(), base: base.name.clone(), slots: SLOTS })
}

/// Every base on this machine (names), sorted.
pub(crate) fn list() -> Vec<String> {
    let mut names: Vec<String> = [Path::new(STATE_ROOT), pin_root()]
        .iter()
        .filter_map(|root| std::fs::read_dir(root).ok())
        .flat_map(|entries| entries.filter_map(|e| e.ok()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| is_base_name(n))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The slots of a base in use, with the lock named in each.
pub(crate) fn slots(base: &str) -> Vec<(u8, String)> {
    let Ok(entries) = std::fs::read_dir(state_dir(base)) else {
        return Vec::new();
    };
    let mut slots: Vec<(u8, String)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let slot: u8 = e.file_name().to_str()?.strip_prefix("slot-")?.parse().ok()?;
            Some((slot, std::fs::read_to_string(e.path()).ok()?))
        })
        .collect();
    slots.sort();
    slots
}

/// What `status` shows of a base.
#[derive(Debug, Clone)]
pub struct BaseStatus {
    pub name: String,
    pub netns: String,
    /// Its network namespace's inode (None: its info is unreadable).
    pub netns_inode: Option<u64>,
    /// Links attached to a live interface.
    pub links: usize,
    /// Locks using it (name per slot).
    pub locks: Vec<String>,
    pub age: std::time::Duration,
    /// Its namespace is gone (no live link): `release_stale` removes it.
    pub dead: bool,
}

pub(crate) fn status(name: &str) -> BaseStatus {
    let info = read_info(name);
    let (links, _) = dead_links(&pin_dir(name), &std::collections::HashSet::new());
    let now = crate::record::now_unix_ms();
    BaseStatus {
        name: name.to_string(),
        netns: info
            .as_ref()
            .map_or_else(|| "?".to_string(), |i| format!("{} (inode {})", i.netns, i.netns_inode)),
        netns_inode: info.as_ref().map(|i| i.netns_inode),
        links,
        locks: slots(name).into_iter().map(|(_, lock)| lock).collect(),
        age: std::time::Duration::from_millis(
            info.map_or(0, |i| now.saturating_sub(i.created_unix_ms)),
        ),
        dead: links == 0,
    }
}

/// Removes base `name` completely: links (each closed through its own fd,
/// so the kernel detaches it before this returns), programs, maps, state.
/// Refused while a live lock owns a slot, unless `force`.
pub(crate) fn release(name: &str, force: bool) -> Result<(), NetlockError> {
    release_if(name, |name| {
        let users: Vec<String> = slots(name)
            .into_iter()
            .map(|(_, lock)| lock)
            .filter(|lock| crate::record::lock_dir(lock).exists())
            .collect();
        if !force && !users.is_empty() {
            return Err(NetlockError::BaseInUse {
                base: name.to_string(),
                locks: users.join(", "),
            });
        }
        Ok(true)
    })
    .map(|_| ())
}

/// Removes base `name` if `decide`, run under the base's flock (so never
/// halfway through another process's install), says so.
fn release_if(
    name: &str,
    decide: impl FnOnce(&str) -> Result<bool, NetlockError>,
) -> Result<bool, NetlockError> {
    let state = state_dir(name);
    let (_file, _held) = open_locked(name, name)?;
    if !decide(name)? {
        return Ok(false);
    }
    crate::reuse::forget_base(name);
    remove_pins(name, &pin_dir(name))?;
    match std::fs::remove_dir_all(&state) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(source) => Err(io_error(name, "removing", &state)(source)),
    }
}

/// Unpins everything under `pins`, links first (they hold the programs).
pub(crate) fn remove_pins(lock: &str, pins: &Path) -> Result<(), NetlockError> {
    let entries = match std::fs::read_dir(pins) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(io_error(lock, "reading pin directory", pins)(source)),
    };
    let is_link =
        |p: &Path| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("link-"));
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort_by_key(|p| (!is_link(p), p.clone()));
    for path in paths {
        if is_link(&path) {
            if let Ok(pinned) = aya::programs::links::PinnedLink::from_pin(&path) {
                // Unpinned, then closed: the last reference goes here, and
                // the kernel detaches before close returns (a bare unlink
                // would defer the detach to a work item).
                let link = pinned.unpin().map_err(io_error(lock, "unpinning", &path))?;
                drop(link);
                continue;
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(io_error(lock, "removing pin", &path)(source)),
        }
    }
    match std::fs::remove_dir(pins) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(io_error(lock, "removing pin directory", pins)(source)),
    }
}

/// Removes bases whose namespace is gone or that another ferry build left
/// with no user. Returns the names of the bases removed.
pub(crate) fn release_useless() -> Vec<String> {
    let mut removed = Vec::new();
    let ours = format!("-{:08x}", object_hash());
    let useless = |name: &str| {
        let dead = !has_live_link(&pin_dir(name));
        dead || (!name.ends_with(&ours) && slots(name).is_empty())
    };
    for name in list() {
        if !useless(&name) {
            continue;
        }
        match release_if(&name, |name| Ok(useless(name))) {
            Ok(true) => {
                tracing::info!(base = %name, "released network lock base");
                removed.push(name);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(base = %name, "releasing network lock base: {e}"),
        }
    }
    removed
}

/// The base of the namespace at `netns_path` (None: the caller's), if any.
pub(crate) fn name_of(netns_path: Option<&Path>) -> Result<String, NetlockError> {
    netns::run_in("base", netns_path, || {
        ferry_sys::netns::netns_cookie()
            .map(base_name)
            .map_err(sys_error("base", "reading the network namespace's cookie".to_string()))
    })
}
