use ferry_sys::SysError;
use std::path::PathBuf;

/// What went wrong, on which lock and which object.
#[derive(Debug, thiserror::Error)]
pub enum NetlockError {
    #[error("network lock {lock}: {what} {}: {source}", path.display())]
    Io { lock: String, what: &'static str, path: PathBuf, source: std::io::Error },

    #[error("network lock {lock}: {what}: {source}")]
    Sys { lock: String, what: String, source: SysError },

    #[error("network lock {lock}: record {} is not valid: {source}", path.display())]
    Record { lock: String, path: PathBuf, source: serde_json::Error },

    #[error("network lock {lock}: entering network namespace {netns}: {source}")]
    Netns { lock: String, netns: String, source: SysError },

    #[error("network lock {lock}: loading the BPF program: {source}")]
    BpfLoad { lock: String, source: Box<aya::EbpfError> },

    #[error("network lock {lock}: BPF {what}: {source}")]
    BpfProgram { lock: String, what: String, source: Box<aya::programs::ProgramError> },

    #[error("network lock {lock}: BPF map {what}: {source}")]
    BpfMap { lock: String, what: &'static str, source: Box<aya::maps::MapError> },

    #[error("network lock {lock}: attaching to interface {interface} ({direction}) in network namespace {netns}: {source}")]
    BpfAttach {
        lock: String,
        interface: String,
        direction: &'static str,
        netns: String,
        source: Box<aya::programs::ProgramError>,
    },

    #[error("network lock {lock}: pinning {}: {source}", path.display())]
    BpfPin { lock: String, path: PathBuf, source: Box<aya::pin::PinError> },

    #[error("network lock {lock}: BPF link {}: {source}", path.display())]
    BpfLink { lock: String, path: PathBuf, source: Box<aya::programs::links::LinkError> },

    #[error("network lock {lock}: `{command}` could not be started: {source}")]
    Spawn { lock: String, command: String, source: std::io::Error },

    #[error("network lock {lock}: `{command}` failed ({status}): {stderr}")]
    Command { lock: String, command: String, status: String, stderr: String },

    #[error("network lock {lock}: invalid tuple {tuple}: {why}")]
    InvalidTuple { lock: String, tuple: String, why: &'static str },

    #[error("network lock {lock}: {count} tuples, more than the {max} the eBPF map holds")]
    TooManyTuples { lock: String, count: usize, max: usize },

    #[error("network lock {lock}: cannot {action} a lock that is {phase}")]
    WrongPhase { lock: String, action: &'static str, phase: crate::Phase },

    #[error("network lock {lock}: the BPF base {base} of its network namespace is gone (the namespace was deleted, or the base released by hand)")]
    BaseGone { lock: String, base: String },

    #[error("network lock {lock}: all {slots} lock slots of BPF base {base} are taken by running locks (see `ferry network-lock --status`)")]
    NoFreeSlot { lock: String, base: String, slots: u8 },

    #[error("network lock {lock}: its record names no slot in a BPF base (it was made by an older ferry or its prepare was interrupted); release it and checkpoint again")]
    NoSlot { lock: String },

    #[error("BPF base {base} is used by network locks {locks}: release them first")]
    BaseInUse { base: String, locks: String },

    #[error("no network lock named {0:?}")]
    NotFound(String),

    #[error("network lock {lock} is owned by running process {pid}")]
    Busy { lock: String, pid: i32 },

    #[error("network lock {lock} was already handed over or released by this process")]
    AlreadyReleased { lock: String },

    #[error("{0:?} is not a valid network lock name (letters, digits and '_' only, at most 22)")]
    BadName(String),

    #[error("unknown network lock method {0:?} (expected ebpf, nftables or iptables)")]
    BadMethod(String),
}
