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

/// Creates the lock's record directory (0700), failing if it exists.
pub fn create_dir(name: &str) -> Result<PathBuf, std::io::Error> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(LOCKS_DIR)?;
    let dir = lock_dir(name);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
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
    std::fs::rename(&tmp, &path).map_err(io("renaming into place", &path))?;
    Ok(())
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
