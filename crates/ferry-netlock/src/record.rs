//! The persistent record of a lock: /run/ferry/locks/<name>/record.json.
//!
//! The record is written before any kernel object is created, so a process
//! killed half-way through a freeze still leaves something that names what
//! may need removing; release tolerates every missing piece.

use crate::{Method, NetlockError};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Root of every lock's record directory. /run is a tmpfs: records vanish
/// at reboot, together with the kernel objects they describe.
pub const LOCKS_DIR: &str = "/run/ferry/locks";
const RECORD_FILE: &str = "record.json";
/// The phase, apart from record.json so that engage and disengage change it
/// with one pwrite(2) of a fixed-size word on a file kept open (a rewrite of
/// record.json plus rename costs ~0.2 ms here). Overrides record.json's
/// `phase` when present.
const PHASE_FILE: &str = "phase";

/// Who holds a lock right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockState {
    /// A running ferry process owns it; if that process dies, the lock is stale.
    Owned,
    /// Kept on purpose after its creator exited (e.g. a checkpoint image
    /// waiting for restore); never stale, released by adopt + thaw or by hand.
    HandedOver,
}

impl std::fmt::Display for LockState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LockState::Owned => "owned",
            LockState::HandedOver => "handed-over",
        })
    }
}

/// How far a lock has gone; independent of who holds it ([`LockState`]).
/// Written before the kernel state changes on the way in (engage) and after
/// it on the way out (disengage), so the record never claims less than is
/// in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Objects exist (eBPF: program attached, switch off); nothing is dropped.
    Prepared,
    /// Packets of the tuples are dropped (records of older ferry versions,
    /// which had no phase, were always engaged).
    #[default]
    Engaged,
    /// Dropping stopped; the lock still exists until thawed.
    Disengaged,
}

impl Phase {
    /// Fixed-width (11 bytes) form for the phase file.
    fn word(self) -> &'static [u8; 11] {
        match self {
            Phase::Prepared => b"prepared  \n",
            Phase::Engaged => b"engaged   \n",
            Phase::Disengaged => b"disengaged\n",
        }
    }

    fn from_word(word: &str) -> Option<Phase> {
        match word.trim() {
            "prepared" => Some(Phase::Prepared),
            "engaged" => Some(Phase::Engaged),
            "disengaged" => Some(Phase::Disengaged),
            _ => None,
        }
    }
}

/// Opens (creating, 0600) the phase file of lock `name` for `write_phase`.
pub fn open_phase(name: &str) -> Result<std::fs::File, NetlockError> {
    let path = lock_dir(name).join(PHASE_FILE);
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|source| NetlockError::Io {
            lock: name.to_string(),
            what: "opening",
            path,
            source,
        })
}

/// Overwrites the phase file in place: one pwrite(2).
pub fn write_phase(name: &str, file: &std::fs::File, phase: Phase) -> Result<(), NetlockError> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(phase.word(), 0).map_err(|source| NetlockError::Io {
        lock: name.to_string(),
        what: "writing",
        path: lock_dir(name).join(PHASE_FILE),
        source,
    })
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Prepared => "prepared",
            Phase::Engaged => "engaged",
            Phase::Disengaged => "disengaged",
        })
    }
}

/// A process identity that survives PID reuse: PID plus its start time in
/// clock ticks since boot (field 22 of /proc/PID/stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: i32,
    pub start_time: u64,
}

impl Owner {
    pub fn current() -> Option<Owner> {
        let pid = std::process::id() as i32;
        Some(Owner { pid, start_time: process_start_time(pid)? })
    }

    /// True while the very process that took the lock is running.
    pub fn is_alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time)
    }
}

fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: the
    // fields after it start after the last ')'. starttime is field 22, the
    // 20th after the name.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let state = after_name.split_whitespace().next()?;
    if state == "Z" || state == "X" {
        return None; // a zombie owns nothing any more
    }
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// How the lock's network namespace can be reached by a later process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetnsRecord {
    /// What the caller asked for: "current" or the path it gave.
    pub requested: String,
    /// Inode of the namespace's nsfs file (what `ip netns identify` and
    /// `ls -l /proc/PID/ns/net` show), for humans.
    pub inode: u64,
    /// Path a later process opens to enter the namespace (nftables and
    /// iptables release); None for eBPF, whose release only unpins.
    pub enter_path: Option<PathBuf>,
    /// enter_path is a bind mount of the nsfs file made for this lock, to be
    /// unmounted on release.
    pub bind_mounted: bool,
}

/// Where an eBPF lock's tuples live: see src/base.rs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EbpfSlot {
    pub base: String,
    pub slot: u8,
    #[serde(default)]
    pub generation: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    pub method: Method,
    pub state: LockState,
    #[serde(default)]
    pub phase: Phase,
    /// Set while `state` is Owned.
    pub owner: Option<Owner>,
    pub purpose: String,
    /// Tuples given to engage (0 before), wildcards included.
    pub tuples: usize,
    /// Tuples of each family (iptables keeps one chain per family).
    pub tuples_v6: usize,
    pub created_unix_ms: u64,
    pub netns: NetnsRecord,
    /// eBPF: the namespace's base and the lock's owner slot in it (set by
    /// prepare once the slot is claimed).
    #[serde(default)]
    pub ebpf: Option<EbpfSlot>,
    /// The image a handed-over lock waits for: once that file is gone,
    /// no restore can come and the lock is stale.
    #[serde(default)]
    pub waits_for: Option<PathBuf>,
}

impl Record {
    /// Owned by a process that died, or handed over to an image that is
    /// gone.
    pub fn is_stale(&self) -> bool {
        match self.state {
            LockState::Owned => !self.owner.is_some_and(|o| o.is_alive()),
            LockState::HandedOver => self.waits_for.as_ref().is_some_and(|f| !f.exists()),
        }
    }
}

pub fn lock_dir(name: &str) -> PathBuf {
    Path::new(LOCKS_DIR).join(name)
}

pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Emptied record directories kept for the next locks: on a /run that is
/// not a tmpfs (ext4 mounted with `discard` on this machine kind) removing
/// a directory waits for the discard of its block, 0.3-5 ms, in every
/// restore's thaw. At most [`SPARES`] are kept; outside LOCKS_DIR, so no
/// lock listing (of any ferry build) sees them.
pub const SPARE_DIRS: &str = "/run/ferry/spare-lock-dirs";
const SPARES: usize = 16;

fn c_path(path: &Path) -> Option<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).ok()
}

/// Creates the lock's record directory (0700), failing if it exists: a
/// spare one moved into place, else a new one.
pub fn create_dir(name: &str) -> Result<PathBuf, std::io::Error> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(LOCKS_DIR)?;
    let dir = lock_dir(name);
    if claim_spare(&dir)? {
        return Ok(dir);
    }
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Moves a spare directory to `dir`; false when there is none. Its time
/// is set to now first: in LOCKS_DIR a directory without a record counts
/// as abandoned by its age.
fn claim_spare(dir: &Path) -> Result<bool, std::io::Error> {
    let Ok(entries) = std::fs::read_dir(SPARE_DIRS) else {
        return Ok(false);
    };
    let Some(to) = c_path(dir) else {
        return Ok(false);
    };
    for spare in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let fresh =
            std::fs::File::open(&spare).and_then(|f| f.set_modified(std::time::SystemTime::now()));
        let Some(from) = c_path(&spare).filter(|_| fresh.is_ok()) else {
            continue; // taken by another process meanwhile
        };
        match ferry_sys::fd::rename_noreplace(&from, &to) {
            Ok(()) => return Ok(true),
            Err(e) if e.errno == libc::EEXIST => {
                return Err(std::io::ErrorKind::AlreadyExists.into())
            }
            Err(_) => continue,
        }
    }
    Ok(false)
}

/// Removes the record directory `dir` (its files, then the directory,
/// kept as a spare while there are fewer than [`SPARES`]).
pub fn remove_dir(dir: &Path) -> Result<(), std::io::Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            // Not made by ferry: nothing to keep.
            return std::fs::remove_dir_all(dir);
        }
        match std::fs::remove_file(entry.path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    if keep_spare(dir) {
        return Ok(());
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Moves the empty directory `dir` among the spares unless there are
/// enough; true when moved.
fn keep_spare(dir: &Path) -> bool {
    let spares = Path::new(SPARE_DIRS);
    let count = match std::fs::read_dir(spares) {
        Ok(entries) => entries.take(SPARES).count(),
        Err(_) => {
            if std::fs::DirBuilder::new().mode(0o700).create(spares).is_err() {
                return false;
            }
            0
        }
    };
    let (Some(name), true) = (dir.file_name(), count < SPARES) else {
        return false;
    };
    match (c_path(dir), c_path(&spares.join(name))) {
        (Some(from), Some(to)) => ferry_sys::fd::rename_noreplace(&from, &to).is_ok(),
        _ => false,
    }
}

/// Writes the record atomically (temporary file + rename), mode 0600.
pub fn write(record: &Record) -> Result<(), NetlockError> {
    let dir = lock_dir(&record.name);
    let tmp = dir.join("record.json.tmp");
    let path = dir.join(RECORD_FILE);
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| NetlockError::Io { lock: record.name.clone(), what, path, source }
    };
    let json = serde_json::to_vec_pretty(record).map_err(|source| NetlockError::Record {
        lock: record.name.clone(),
        path: path.clone(),
        source,
    })?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io("creating", &tmp))?;
    file.write_all(&json).map_err(io("writing", &tmp))?;
    drop(file);
    replace(&record.name, &tmp, &path)
}

/// Puts `tmp` in place of `path` atomically. Over an existing record the
/// two are exchanged and the old one (now at `tmp`) removed: a rename over
/// an existing file makes ext4 (a /run that is not a tmpfs) write the new
/// file's data out first, ~150 us here, five times per checkpoint.
fn replace(lock: &str, tmp: &Path, path: &Path) -> Result<(), NetlockError> {
    let c = c_path;
    if let (Some(a), Some(b)) = (c(tmp), c(path)) {
        match ferry_sys::fd::rename_exchange(&a, &b) {
            Ok(()) => {
                // The old record, now at `tmp`, goes at once: its data
                // was never written out, so removing it frees no block.
                // (Truncating it for the next write instead would make
                // ext4 write the new data out at close, and the block
                // freed later would wait for its discard, ms here.)
                let _ = std::fs::remove_file(tmp);
                return Ok(());
            }
            // No record yet (the first write), or a file system without
            // RENAME_EXCHANGE: a plain rename.
            Err(e) if e.errno == libc::ENOENT || e.errno == libc::EINVAL => {}
            Err(source) => {
                return Err(NetlockError::Sys {
                    lock: lock.to_string(),
                    what: format!("exchanging {} with {}", tmp.display(), path.display()),
                    source,
                })
            }
        }
    }
    std::fs::rename(tmp, path).map_err(|source| NetlockError::Io {
        lock: lock.to_string(),
        what: "renaming into place",
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a lock's record; Ok(None) when the directory exists without one
/// (its creator died between mkdir and the first write).
pub fn read(name: &str) -> Result<Option<Record>, NetlockError> {
    let dir = lock_dir(name);
    let path = dir.join(RECORD_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let mut record: Record = serde_json::from_slice(&bytes)
                .map_err(|source| NetlockError::Record { lock: name.to_string(), path, source })?;
            if let Some(phase) = std::fs::read_to_string(dir.join(PHASE_FILE))
                .ok()
                .as_deref()
                .and_then(Phase::from_word)
            {
                record.phase = phase;
            }
            Ok(Some(record))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.is_dir() {
                Ok(None)
            } else {
                Err(NetlockError::NotFound(name.to_string()))
            }
        }
        Err(source) => {
            Err(NetlockError::Io { lock: name.to_string(), what: "reading", path, source })
        }
    }
}

/// Names of every lock directory, sorted; empty when there are none (one
/// failed read_dir, which keeps `release_stale` cheap).
pub fn list_names() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(LOCKS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// Time the record directory was created (for record-less directories).
pub fn dir_age_ms(name: &str) -> Option<u64> {
    let modified = std::fs::metadata(lock_dir(name)).ok()?.modified().ok()?;
    modified.elapsed().ok().map(|d| d.as_millis() as u64)
}

/// Where a handed-over eBPF lock wrote its entries (see `ebpf::Written`),
/// so that the process that adopts it clears only there at thaw instead
/// of looking through the whole table (and mapping it): `written` in the
/// lock's directory, "FWH1", the overflow flag and 3 bytes of padding,
/// the number of home slots (u32), then the home slots (u32), host order.
/// Written in place (a new file): a file of another length is not
/// believed.
const WRITTEN_FILE: &str = "written";
const WRITTEN_MAGIC: &[u8; 4] = b"FWH1";

/// Records (or with None, forgets) where the lock wrote. Best effort: a
/// lock without the file is cleared by looking through the whole table.
pub fn write_written(name: &str, written: Option<(bool, &[u32])>) {
    let dir = lock_dir(name);
    let path = dir.join(WRITTEN_FILE);
    let Some((overflowed, homes)) = written else {
        let _ = std::fs::remove_file(&path);
        return;
    };
    let mut bytes = Vec::with_capacity(12 + 4 * homes.len());
    bytes.extend_from_slice(WRITTEN_MAGIC);
    bytes.extend_from_slice(&[u8::from(overflowed), 0, 0, 0]);
    bytes.extend_from_slice(&(homes.len() as u32).to_ne_bytes());
    for home in homes {
        bytes.extend_from_slice(&home.to_ne_bytes());
    }
    if let Err(e) = std::fs::write(&path, &bytes) {
        tracing::debug!(lock = %name, "noting where the lock wrote: {e}");
        let _ = std::fs::remove_file(&path);
    }
}

/// What [`write_written`] recorded: (overflowed, home slots); None when
/// nothing (or something unreadable) was.
pub fn read_written(name: &str) -> Option<(bool, Vec<u32>)> {
    let bytes = std::fs::read(lock_dir(name).join(WRITTEN_FILE)).ok()?;
    let (head, homes) = (bytes.get(..12)?, bytes.get(12..)?);
    let count = u32::from_ne_bytes([head[8], head[9], head[10], head[11]]) as usize;
    if &head[..4] != WRITTEN_MAGIC || homes.len() != 4 * count {
        return None;
    }
    let homes =
        homes.chunks_exact(4).map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]])).collect();
    Some((head[4] != 0, homes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A removed record directory is gone from LOCKS_DIR (kept as a spare
    /// or removed); the next one made is empty, with a fresh time (else
    /// another ferry could take it for one its maker abandoned), and a
    /// name in use is still refused.
    #[test]
    fn record_directories_are_removed_and_made_again_empty() {
        let first = format!("sparetest_{}_0", std::process::id());
        let Ok(dir) = create_dir(&first) else {
            return; // not root: no /run/ferry
        };
        std::fs::write(dir.join("record.json"), b"{}").expect("write");
        std::fs::write(dir.join("phase"), b"engaged   \n").expect("write");
        std::thread::sleep(std::time::Duration::from_millis(1100));
        remove_dir(&dir).expect("remove");
        assert!(!dir.exists(), "{} left", dir.display());
        let second = format!("sparetest_{}_1", std::process::id());
        let made = create_dir(&second).expect("create");
        let age = std::fs::metadata(&made).and_then(|m| m.modified()).expect("mtime");
        assert!(age.elapsed().map_or(true, |a| a.as_millis() < 1000), "an old time: {age:?}");
        assert_eq!(std::fs::read_dir(&made).expect("list").count(), 0, "files left in it");
        let again = create_dir(&second).map(|_| ()).map_err(|e| e.kind());
        assert_eq!(again, Err(std::io::ErrorKind::AlreadyExists));
        remove_dir(&made).expect("remove");
        assert!(!made.exists());
    }

    #[test]
    fn where_a_lock_wrote_round_trips() {
        let name = format!("wtest_{}_0", std::process::id());
        let Ok(dir) = create_dir(&name) else {
            return; // not root: no /run/ferry
        };
        assert_eq!(read_written(&name), None);
        write_written(&name, Some((true, &[7, 65_535, 0])));
        assert_eq!(read_written(&name), Some((true, vec![7, 65_535, 0])));
        write_written(&name, Some((false, &[])));
        assert_eq!(read_written(&name), Some((false, vec![])));
        write_written(&name, Some((false, &[1, 2])));
        let whole = std::fs::read(dir.join(WRITTEN_FILE)).expect("read");
        std::fs::write(dir.join(WRITTEN_FILE), &whole[..whole.len() - 4]).expect("write");
        assert_eq!(read_written(&name), None, "a torn file is not believed");
        write_written(&name, None);
        assert!(!dir.join(WRITTEN_FILE).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
