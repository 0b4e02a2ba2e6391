//! ferry's network lock: while TCP connections are captured and re-created,
//! every packet of those connections is dropped, in both directions, so the
//! stack never answers one with a reset and the peer simply retransmits.
//!
//! A lock covers a set of 4-tuples in one network namespace. The tuples go
//! into one kernel object (a BPF table written through memory, an nftables
//! set, an iptables chain) in one step.
//!
//! # Phases
//!
//! The lock's life is split so that only a cheap part falls inside the
//! service's pause:
//!
//! * [`NetworkLock::prepare`], before the pause: everything slow (eBPF: load
//!   the program, create the maps, attach to every interface, pin); drops
//!   nothing.
//! * [`NetworkLock::engage`], start of the pause: the tuples go in and
//!   dropping starts (eBPF: ~0.5 ms for 10,000 tuples, no syscall per tuple).
//! * [`NetworkLock::disengage`], end of the pause: dropping stops (eBPF: one
//!   bpf syscall); the lock still exists.
//! * [`NetworkLock::thaw`], after the pause: everything is removed.
//!
//! [`NetworkLock::freeze`] is prepare + engage in one call.
//!
//! A tuple whose remote is `0.0.0.0:0` or `[::]:0`
//! ([`Tuple::new_connections_to`]) is a wildcard: it drops only incoming SYNs
//! without ACK to its local address and port (new connection attempts to a
//! listener); established connections to that port need their own tuples.
//!
//! # Methods
//!
//! * [`Method::Ebpf`] (default): a tcx program on ingress and egress of every
//!   interface of the namespace (loopback included). It does nothing while
//!   the one-element array `active` is 0; when it is 1 it drops every TCP
//!   packet whose 4-tuple is in `table`, an open-addressing hash table that
//!   user space writes straight into the map's memory (`BPF_F_MMAPABLE`),
//!   with a `BPF_F_NO_PREALLOC` hash map for the rare tuple the table has no
//!   room for. Maps and links are pinned under `/sys/fs/bpf/ferry/<name>/`.
//! * [`Method::Nftables`]: table `inet ferry_<name>`, sets of concatenated
//!   4-tuples, input/output chains; one `nft -f -` transaction at engage,
//!   deleted at disengage.
//! * [`Method::Iptables`]: chain `FERRY_<name>` (per family) jumped to from
//!   INPUT and OUTPUT; one `iptables-restore --noflush` batch at engage,
//!   removed at disengage.
//!
//! # Lifetime
//!
//! A lock outlives the process that made it: checkpoint prepares, engages
//! and hands the lock over, a later restore adopts, disengages and thaws it.
//! Every lock has a record in `/run/ferry/locks/<name>/` (0600): `record.json`
//! with its method, namespace, state (`owned` by a running process, or
//! `handed-over`), owner PID and start time, number of tuples and creation
//! time, and `phase` (prepared / engaged / disengaged, rewritten in place
//! with one pwrite). A lock whose owner died while it was `owned`, in any
//! phase, is stale: [`release_stale`] removes it completely.
//!
//! ```no_run
//! use ferry_netlock::{Method, Netns, NetworkLock, Tuple};
//! # fn demo(tuples: &[Tuple]) -> Result<(), ferry_netlock::NetlockError> {
//! ferry_netlock::release_stale();                 // start of every ferry run
//! let mut lock = NetworkLock::prepare(Method::Ebpf, &Netns::Current, "ckpt")?;
//! // ... freeze the service (the pause starts) ...
//! lock.engage(tuples)?;
//! // ... capture the connections ...
//! let name = lock.hand_over();                    // stays after exit; store `name` in the image
//! // later, in another process:
//! let mut lock = NetworkLock::adopt(&name)?;
//! // ... re-create the connections ...
//! lock.disengage()?;                              // the pause ends
//! lock.thaw()?;                                   // off the critical path
//! # Ok(()) }
//! ```
//!
//! # API
//!
//! ```text
//! pub enum Method { Ebpf, Nftables, Iptables }            // FromStr / Display: "ebpf" "nftables" "iptables"
//! pub struct Tuple { pub local: SocketAddr, pub remote: SocketAddr }
//! Tuple::new_connections_to(local) -> Tuple               // wildcard; Tuple::is_wildcard(&self)
//! pub enum Netns { Current, Path(PathBuf) }
//! pub enum Phase { Prepared, Engaged, Disengaged }
//! NetworkLock::prepare(Method, &Netns, purpose: &str) -> Result<NetworkLock, NetlockError>
//! NetworkLock::engage(&mut self, &[Tuple]) -> Result<(), NetlockError>      // once, on a prepared lock
//! NetworkLock::disengage(&mut self) -> Result<(), NetlockError>
//! NetworkLock::rearm(&mut self) -> Result<(), NetlockError>         // disengaged -> prepared, record and slot kept
//! NetworkLock::keep_on_drop(&mut self, Option<OnDrop>)      // dropped unreleased: given to OnDrop, not released
//! OnDrop::new(impl FnOnce(NetworkLock) + Send + Sync) -> OnDrop
//! NetworkLock::freeze(Method, &Netns, &[Tuple], purpose: &str) -> Result<NetworkLock, NetlockError>  // prepare + engage
//! NetworkLock::thaw(self) -> Result<(), NetlockError>     // disengage if needed, detach, unpin, remove the record
//! NetworkLock::name(&self) -> &str
//! NetworkLock::phase(&self) -> Option<Phase>
//! NetworkLock::hand_over(self) -> String
//! NetworkLock::adopt(name: &str) -> Result<NetworkLock, NetlockError>
//! impl Drop for NetworkLock                                // thaws unless handed over or kept (OnDrop); errors logged
//! status() -> Vec<LockStatus>                              // LockStatus.phase
//! release(name: &str) -> Result<(), NetlockError>
//! release_stale() -> Vec<String>
//! MAX_TUPLES                                               // eBPF capacity (2^20)
//! send_peer_fins(&Netns, &[PeerFin]) -> Result<usize, NetlockError>  // a closed peer's FIN to a rebuilt connection
//! ```

mod base;
mod ebpf;
mod error;
mod held;
mod iptables;
pub mod netns;
mod nft;
mod packet;
mod peer_fin;
mod record;
mod reuse;

pub use base::{BaseStatus, MAX_TUPLES};
pub use error::NetlockError;
pub use netns::Netns;
pub use peer_fin::{send_peer_fins, PeerFin};
pub use record::{LockState, Owner, Phase, LOCKS_DIR};
pub use reuse::keep_mappings;

use record::{NetnsRecord, Record};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};

/// How packets are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    #[default]
    Ebpf,
    Nftables,
    Iptables,
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Ebpf => "ebpf",
            Method::Nftables => "nftables",
            Method::Iptables => "iptables",
        })
    }
}

impl std::str::FromStr for Method {
    type Err = NetlockError;
    fn from_str(s: &str) -> Result<Method, NetlockError> {
        match s {
            "ebpf" => Ok(Method::Ebpf),
            "nftables" => Ok(Method::Nftables),
            "iptables" => Ok(Method::Iptables),
            other => Err(NetlockError::BadMethod(other.to_string())),
        }
    }
}

/// One TCP connection as seen from the locked namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

impl Tuple {
    /// A wildcard: new connection attempts to `local` (incoming SYN without
    /// ACK), whatever their source. Established connections to the same
    /// port are not affected (lock them with their own exact tuples).
    pub fn new_connections_to(local: SocketAddr) -> Tuple {
        let remote = match local {
            SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0),
            SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0),
        };
        Tuple { local, remote }
    }

    /// The remote side is `0.0.0.0:0` or `[::]:0`.
    pub fn is_wildcard(&self) -> bool {
        self.remote.ip().is_unspecified() && self.remote.port() == 0
    }
}

impl std::fmt::Display for Tuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} <-> {}", self.local, self.remote)
    }
}

/// What `status()` reports about one lock.
#[derive(Debug, Clone)]
pub struct LockStatus {
    pub name: String,
    /// None when the record is missing or unreadable.
    pub method: Option<Method>,
    pub state: Option<LockState>,
    /// Prepared, engaged or disengaged.
    pub phase: Option<Phase>,
    pub owner: Option<Owner>,
    pub purpose: String,
    pub tuples: usize,
    pub age: std::time::Duration,
    pub netns: String,
    /// Its owner died while owning it: `release_stale()` would remove it.
    pub stale: bool,
}

/// A lock this process owns. Dropped without `hand_over`, it is thawed.
#[derive(Debug)]
pub struct NetworkLock {
    /// None once thawed or handed over.
    record: Option<Record>,
    name: String,
    /// eBPF: the maps' fds, open from prepare or adopt on.
    ebpf: Option<ebpf::Handles>,
    /// The record's phase file, open for one-pwrite updates.
    phase_file: Option<std::fs::File>,
    /// The namespace the lock was prepared in, open (None for an adopted
    /// lock): held packets go back there even once every process of the
    /// namespace is gone.
    netns_file: Option<std::fs::File>,
    /// Dropped while still this process's (neither thawed nor handed
    /// over), the lock goes there instead of being released
    /// ([`NetworkLock::keep_on_drop`]).
    on_drop: Option<OnDrop>,
}

/// Where a lock dropped on an error path goes, rather than being
/// released: a process that keeps its lock from one use to the next
/// (`ferry replicate`'s syncs) takes it back, disengaged and rearmed, so
/// that a failed use does not cost it the lock ([`NetworkLock::keep_on_drop`]).
pub struct OnDrop(Box<dyn FnOnce(NetworkLock) + Send + Sync>);

impl OnDrop {
    pub fn new(keep: impl FnOnce(NetworkLock) + Send + Sync + 'static) -> OnDrop {
        OnDrop(Box::new(keep))
    }
}

impl std::fmt::Debug for OnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnDrop")
    }
}

/// Record directories with no record yet are a freeze in progress for this
/// long; older ones were left by a crash.
const RECORDLESS_GRACE_MS: u64 = 10_000;

static NEXT_LOCK: AtomicU32 = AtomicU32::new(0);

/// Names are used in nft table names and iptables chain names (at most 28
/// characters with the `FERRY_` prefix), hence short and [a-z0-9_].
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 22
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// An IPv4-mapped IPv6 address is IPv4 on the wire.
pub(crate) fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

fn canonical_tuples(lock: &str, tuples: &[Tuple]) -> Result<Vec<Tuple>, NetlockError> {
    tuples.iter().map(|t| canonical_tuple(lock, t)).collect()
}

/// Checks every tuple without copying them; returns how many are IPv6.
fn validate_tuples(lock: &str, tuples: &[Tuple]) -> Result<usize, NetlockError> {
    let mut v6 = 0;
    for t in tuples {
        if canonical_tuple(lock, t)?.local.is_ipv6() {
            v6 += 1;
        }
    }
    Ok(v6)
}

fn canonical_tuple(lock: &str, t: &Tuple) -> Result<Tuple, NetlockError> {
    {
        {
            let local = canonical(t.local);
            // A wildcard's remote ([::]:0) follows its local address: a
            // listener of an IPv6 socket on an IPv4-mapped address (the
            // JVM's default) takes IPv4 connections only.
            let remote = match canonical(t.remote) {
                r if t.is_wildcard() && local.is_ipv4() && r.is_ipv6() => {
                    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0)
                }
                r => r,
            };
            let c = Tuple { local, remote };
            let invalid = |why| {
                Err(NetlockError::InvalidTuple {
                    lock: lock.to_string(),
                    tuple: t.to_string(),
                    why,
                })
            };
            if c.local.is_ipv4() != c.remote.is_ipv4() {
                return invalid("local and remote address families differ");
            }
            if c.local.ip().is_unspecified() || c.local.port() == 0 {
                return invalid("the local address and port must be given");
            }
            if c.remote.ip().is_unspecified() != (c.remote.port() == 0) {
                return invalid("a wildcard has both remote address and port unspecified (0.0.0.0:0 or [::]:0), a connection neither");
            }
            Ok(c)
        }
    }
}

/// The record of a lock being prepared, before any of it exists.
fn new_record(name: &str, method: Method, owner: Owner, purpose: &str, netns: &Netns) -> Record {
    Record {
        name: name.to_string(),
        method,
        state: LockState::Owned,
        phase: Phase::Prepared,
        owner: Some(owner),
        purpose: purpose.to_string(),
        tuples: 0,
        tuples_v6: 0,
        created_unix_ms: record::now_unix_ms(),
        netns: NetnsRecord {
            requested: netns.describe(),
            inode: 0,
            enter_path: None,
            bind_mounted: false,
        },
        ebpf: None,
        waits_for: None,
    }
}

/// What a prepared lock holds open.
struct Prepared {
    ebpf: Option<ebpf::Handles>,
    phase_file: std::fs::File,
}

/// Prepare's steps after the record is made: on error the caller undoes
/// them with release_record.
fn prepare_parts(
    record: &mut Record,
    netns: &Netns,
    ns_path: &std::path::Path,
    dir: &std::path::Path,
) -> Result<Prepared, NetlockError> {
    let name = record.name.clone();
    let method = record.method;
    record.netns.inode = netns::inode(&name, ns_path)?;
    if method != Method::Ebpf {
        // nftables/iptables objects are made and removed from inside
        // the namespace, possibly by a later process: keep a path to it.
        if ns_path.starts_with("/run/netns") {
            record.netns.enter_path = Some(ns_path.to_path_buf());
        } else {
            let target = dir.join("netns");
            record.netns.enter_path = Some(target.clone());
            record.netns.bind_mounted = true;
        }
    }
    record::write(record)?;
    let phase_file = record::open_phase(&name)?;
    record::write_phase(&name, &phase_file, Phase::Prepared)?;
    if record.netns.bind_mounted {
        if let Some(target) = &record.netns.enter_path {
            bind_mount_netns(&name, ns_path, target)?;
        }
    }
    let ebpf = match method {
        Method::Ebpf => {
            let enter = match netns {
                Netns::Current => None,
                Netns::Path(p) => Some(p.as_path()),
            };
            let handles = ebpf::prepare(&name, enter, &record.netns.requested, record.netns.inode)?;
            let (base, slot, generation) = ebpf::slot_of(&handles);
            record.ebpf = Some(record::EbpfSlot { base, slot, generation });
            record::write(record)?;
            Some(handles)
        }
        Method::Nftables | Method::Iptables => None,
    };
    Ok(Prepared { ebpf, phase_file })
}

/// Binds the namespace on `target` (created empty first), in the lock's
/// directory, so that later processes can enter it.
fn bind_mount_netns(
    name: &str,
    ns_path: &std::path::Path,
    target: &std::path::Path,
) -> Result<(), NetlockError> {
    std::fs::File::create(target).map_err(|source| NetlockError::Io {
        lock: name.to_string(),
        what: "creating",
        path: target.to_path_buf(),
        source,
    })?;
    ferry_sys::netns::bind_mount(ns_path, target).map_err(|source| NetlockError::Sys {
        lock: name.to_string(),
        what: format!("bind-mounting {} on {}", ns_path.display(), target.display()),
        source,
    })
}

/// Engage for eBPF: the table filled, then the switch turned on.
fn engage_ebpf(
    name: &str,
    record: &mut Record,
    phase_file: &std::fs::File,
    handles: Option<&mut ebpf::Handles>,
    tuples: &[Tuple],
) -> Result<(), NetlockError> {
    let tuples_v6 = validate_tuples(name, tuples)?;
    let Some(handles) = handles else {
        return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
    };
    let overflow = ebpf::fill(name, handles, tuples)?;
    if overflow > 0 {
        tracing::debug!(lock = %name, overflow, "tuples in the overflow map");
    }
    // Recorded before the switch: the record never claims less than is in force.
    record::write_phase(name, phase_file, Phase::Engaged)?;
    record.phase = Phase::Engaged;
    record.tuples = tuples.len();
    record.tuples_v6 = tuples_v6;
    ebpf::set_active(name, handles, true)?;
    // The counts are for `status` only: written once dropping has begun,
    // not before.
    record::write(record)?;
    Ok(())
}

/// Engage for nftables/iptables: their one transaction; on failure the
/// lock goes back to prepared.
fn engage_rules(
    name: &str,
    record: &mut Record,
    phase_file: &std::fs::File,
    tuples: &[Tuple],
) -> Result<(), NetlockError> {
    let tuples = canonical_tuples(name, tuples)?;
    let enter = record.netns.enter_path.clone();
    let previous = record.clone();
    record.tuples = tuples.len();
    record.tuples_v6 = tuples.iter().filter(|t| t.local.is_ipv6()).count();
    record.phase = Phase::Engaged;
    // Counts first: the iptables release needs to know about IPv6.
    record::write(record)?;
    record::write_phase(name, phase_file, Phase::Engaged)?;
    let enter = enter.as_deref();
    let made = if record.method == Method::Nftables {
        nft::engage(name, enter, &tuples)
    } else {
        iptables::engage(name, enter, &tuples)
    };
    if let Err(e) = made {
        // Back to prepared: remove whatever part was made.
        let undone = remove_objects(record)
            .and_then(|()| record::write(&previous))
            .and_then(|()| record::write_phase(name, phase_file, Phase::Prepared));
        match undone {
            Ok(()) => *record = previous,
            Err(cleanup) => {
                tracing::error!(lock = %name, "undoing a failed engage: {cleanup}")
            }
        }
        return Err(e);
    }
    Ok(())
}

impl NetworkLock {
    /// Everything slow, done before the service is frozen; drops nothing yet.
    /// eBPF: loads the program, creates the empty tuple map (room for
    /// [`MAX_TUPLES`]) and the switch (off), attaches ingress and egress of
    /// every interface of `netns`, pins it all. nftables/iptables: only the
    /// record (and a way back into the namespace); their objects are made by
    /// [`NetworkLock::engage`]. `purpose` (e.g. "ckpt") starts the generated
    /// name, for humans.
    pub fn prepare(
        method: Method,
        netns: &Netns,
        purpose: &str,
    ) -> Result<NetworkLock, NetlockError> {
        let (name, dir) = new_lock_dir(purpose)?;
        let ns_path = netns.path();
        // Without an owner identity the record would look stale at once and
        // another ferry run could release a lock still in use.
        let Some(owner) = Owner::current() else {
            let _ = std::fs::remove_dir(&dir);
            return Err(NetlockError::Io {
                lock: name,
                what: "reading own start time from",
                path: "/proc/self/stat".into(),
                source: std::io::ErrorKind::InvalidData.into(),
            });
        };
        let mut record = new_record(&name, method, owner, purpose, netns);
        // From here on every failure goes through release_record, which
        // undoes whatever part exists.
        match prepare_parts(&mut record, netns, &ns_path, &dir) {
            Ok(Prepared { ebpf, phase_file }) => {
                tracing::debug!(lock = %name, %method, "network lock prepared");
                let netns_file = std::fs::File::open(&ns_path).ok();
                Ok(NetworkLock {
                    record: Some(record),
                    name,
                    ebpf,
                    phase_file: Some(phase_file),
                    netns_file,
                    on_drop: None,
                })
            }
            Err(e) => {
                if let Err(cleanup) = release_record(&record, None) {
                    tracing::error!(lock = %name, "undoing a failed prepare: {cleanup}");
                }
                Err(e)
            }
        }
    }

    /// Starts dropping every packet of `tuples` (the start of the pause).
    /// A tuple whose remote is `0.0.0.0:0` or `[::]:0` is a wildcard: it
    /// drops only new connection attempts (incoming SYN without ACK) to its
    /// local address and port. eBPF: one `BPF_MAP_UPDATE_BATCH` and one
    /// update of the switch; nftables/iptables: their one transaction.
    /// Allowed once, on a prepared lock.
    pub fn engage(&mut self, tuples: &[Tuple]) -> Result<(), NetlockError> {
        let name = self.name.as_str();
        let Some(record) = self.record.as_mut() else {
            return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
        };
        if record.phase != Phase::Prepared {
            return Err(NetlockError::WrongPhase {
                lock: name.to_string(),
                action: "engage",
                phase: record.phase,
            });
        }
        let Some(phase_file) = &self.phase_file else {
            return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
        };
        match record.method {
            Method::Ebpf => engage_ebpf(name, record, phase_file, self.ebpf.as_mut(), tuples)?,
            Method::Nftables | Method::Iptables => engage_rules(name, record, phase_file, tuples)?,
        }
        tracing::debug!(lock = %name, method = %record.method, tuples = record.tuples, "network lock engaged");
        Ok(())
    }

    /// Adds `tuples` to an engaged lock: their packets are dropped from
    /// now on too, the ones already there stay dropped. Lets a checkpoint
    /// hold new connection attempts to its listeners first (while the
    /// service still runs and empties its accept queues) and add the
    /// established connections once the service is frozen. eBPF: the
    /// tuples are written into the table (no syscall unless some overflow);
    /// nftables: one `add element` transaction; iptables: one batch of
    /// rules appended to the lock's chain.
    pub fn extend(&mut self, tuples: &[Tuple]) -> Result<(), NetlockError> {
        let name = self.name.as_str();
        let Some(record) = self.record.as_mut() else {
            return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
        };
        if record.phase != Phase::Engaged {
            return Err(NetlockError::WrongPhase {
                lock: name.to_string(),
                action: "extend",
                phase: record.phase,
            });
        }
        if tuples.is_empty() {
            return Ok(());
        }
        let tuples_v6 = validate_tuples(name, tuples)?;
        match record.method {
            Method::Ebpf => {
                let Some(handles) = &mut self.ebpf else {
                    return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
                };
                ebpf::fill(name, handles, tuples)?;
                record.tuples += tuples.len();
                record.tuples_v6 += tuples_v6;
                record::write(record)?;
            }
            Method::Nftables | Method::Iptables => {
                let tuples = canonical_tuples(name, tuples)?;
                let had_v6 = record.tuples_v6 > 0;
                // Counts first: the iptables release needs to know about IPv6.
                record.tuples += tuples.len();
                record.tuples_v6 += tuples_v6;
                record::write(record)?;
                let enter = record.netns.enter_path.clone();
                let enter = enter.as_deref();
                if record.method == Method::Nftables {
                    nft::extend(name, enter, &tuples)?;
                } else {
                    iptables::extend(name, enter, &tuples, had_v6)?;
                }
            }
        }
        tracing::debug!(lock = %name, added = tuples.len(), tuples = record.tuples, "network lock extended");
        Ok(())
    }

    /// Stops dropping (the end of the pause); the lock (record, pins, links)
    /// stays until [`NetworkLock::thaw`]. eBPF: one update of the switch (a
    /// single bpf syscall), done even when the record says prepared or
    /// disengaged (an engage killed half-way); nftables/iptables: removes
    /// their objects. Also works on an adopted lock.
    pub fn disengage(&mut self) -> Result<(), NetlockError> {
        let name = self.name.as_str();
        let Some(record) = self.record.as_mut() else {
            return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
        };
        match record.method {
            Method::Ebpf => {
                let Some(handles) = &self.ebpf else {
                    return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
                };
                ebpf::set_active(name, handles, false)?;
            }
            Method::Nftables | Method::Iptables => {
                if record.phase != Phase::Engaged {
                    return Ok(());
                }
                remove_objects(record)?;
            }
        }
        if record.phase == Phase::Engaged {
            let Some(phase_file) = &self.phase_file else {
                return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
            };
            record::write_phase(name, phase_file, Phase::Disengaged)?;
            record.phase = Phase::Disengaged;
        }
        tracing::debug!(lock = %name, "network lock disengaged");
        Ok(())
    }

    /// Makes a disengaged (or prepared) lock ready for another
    /// [`NetworkLock::engage`], keeping its record, directory and eBPF
    /// slot: for a process that locks the same namespace again and again
    /// (`ferry replicate`, one engage per sync) and pays for the
    /// preparation once. eBPF: its entries removed from the table (bit
    /// off first), a new generation; nftables/iptables: their objects
    /// went at disengage already. The record says `prepared`, 0 tuples.
    /// Refused while engaged.
    pub fn rearm(&mut self) -> Result<(), NetlockError> {
        let name = self.name.as_str();
        let Some(record) = self.record.as_mut() else {
            return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
        };
        if record.phase == Phase::Engaged {
            return Err(NetlockError::WrongPhase {
                lock: name.to_string(),
                action: "rearm",
                phase: record.phase,
            });
        }
        let Some(phase_file) = &self.phase_file else {
            return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
        };
        if record.method == Method::Ebpf {
            let Some(handles) = &mut self.ebpf else {
                return Err(NetlockError::AlreadyReleased { lock: name.to_string() });
            };
            let generation = ebpf::rearm(name, handles)?;
            if let Some(slot) = &mut record.ebpf {
                slot.generation = generation;
            }
        }
        record.phase = Phase::Prepared;
        record.tuples = 0;
        record.tuples_v6 = 0;
        // Written once nothing is held any more: the record never claims
        // less than is in force.
        record::write(record)?;
        record::write_phase(name, phase_file, Phase::Prepared)?;
        tracing::debug!(lock = %name, "network lock rearmed");
        Ok(())
    }

    /// What becomes of this lock should it be dropped while still this
    /// process's (an error path: neither [`NetworkLock::thaw`] nor a
    /// hand-over): given to `keep` (None: released, the default). `keep`
    /// gets the lock as it is, possibly engaged; whatever it does not
    /// keep, it releases (dropping the lock it is given releases it).
    pub fn keep_on_drop(&mut self, keep: Option<OnDrop>) {
        self.on_drop = keep;
    }

    /// Sends again, in the namespace `netns` (None: the one the lock was
    /// prepared in, or the caller's for an adopted lock), every packet this
    /// lock dropped (eBPF: kept in the base's ring), in the order they were
    /// dropped; returns how many were sent. For after the connections exist
    /// again and the lock is disengaged: the peers need not wait for their
    /// retransmission timers. nftables/iptables keep nothing: Ok(0).
    pub fn deliver_held(&mut self, netns: Option<&Netns>) -> Result<usize, NetlockError> {
        use std::os::fd::AsRawFd;
        let name = self.name.as_str();
        let Some(handles) = &self.ebpf else {
            return Ok(0);
        };
        let own = self
            .netns_file
            .as_ref()
            .map(|f| std::path::PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())));
        let path = match netns {
            Some(Netns::Current) => None,
            Some(Netns::Path(p)) => Some(p.as_path()),
            None => own.as_deref(),
        };
        ebpf::deliver_held(name, handles, path)
    }

    /// True when every packet this lock dropped since its last engage was
    /// kept (eBPF; [`deliver_held`](Self::deliver_held) sends them all),
    /// so a peer misses nothing the delivery does not bring. False for
    /// nftables and iptables, which keep nothing; when the count cannot
    /// be read (a base an earlier ferry installed has none); and when a
    /// packet was only dropped (the ring full, a packet over 64 KiB, a
    /// tuple in the overflow map).
    pub fn kept_every_dropped_packet(&self) -> bool {
        let Some(handles) = &self.ebpf else { return false };
        match ebpf::lost(&self.name, handles) {
            Ok(n) => n == Some(0),
            Err(e) => {
                tracing::debug!(lock = %self.name, "the count of packets dropped without keeping: {e}");
                false
            }
        }
    }

    /// `prepare` then `engage`: the whole cost inside the caller's window.
    /// On error nothing is left behind.
    pub fn freeze(
        method: Method,
        netns: &Netns,
        tuples: &[Tuple],
        purpose: &str,
    ) -> Result<NetworkLock, NetlockError> {
        let mut lock = NetworkLock::prepare(method, netns, purpose)?;
        // Dropping `lock` on error releases it.
        lock.engage(tuples)?;
        Ok(lock)
    }

    /// The lock's phase as this process knows it (None once released).
    pub fn phase(&self) -> Option<Phase> {
        self.record.as_ref().map(|r| r.phase)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Full release: disengages if needed, then removes the lock's objects
    /// and its record. eBPF: the bit, the entries and the slot go (well
    /// under a millisecond); the namespace's base stays for the next lock.
    pub fn thaw(mut self) -> Result<(), NetlockError> {
        let mut handles = self.ebpf.take();
        self.phase_file = None;
        match self.record.take() {
            Some(record) => release_record(&record, handles.as_mut()),
            None => Err(NetlockError::AlreadyReleased { lock: self.name.clone() }),
        }
    }

    /// Keeps the lock after this process exits (state `handed-over`, never
    /// stale) and returns its name, for a later [`NetworkLock::adopt`].
    /// If the record cannot be rewritten the lock stays `owned` and will be
    /// found stale once this process exits (the error is logged).
    pub fn hand_over(self) -> String {
        self.hand_over_to(None)
    }

    /// Like [`NetworkLock::hand_over`], for the image `waits_for` (a file
    /// of it): once that file is gone, the lock counts as stale and the
    /// next `release_stale` removes it.
    pub fn hand_over_to(mut self, waits_for: Option<&std::path::Path>) -> String {
        if let Some(handles) = &self.ebpf {
            // For the adopter's release: it clears only where this lock wrote.
            record::write_written(&self.name, ebpf::written(handles));
        }
        self.ebpf = None;
        self.phase_file = None;
        if let Some(mut record) = self.record.take() {
            record.state = LockState::HandedOver;
            record.owner = None;
            record.waits_for = waits_for.map(|p| p.to_path_buf());
            if let Err(e) = record::write(&record) {
                tracing::error!(lock = %self.name, "handing over: {e}");
            }
        }
        self.name.clone()
    }

    /// Takes ownership of a lock that was handed over (or whose owner died)
    /// in this process. Refused while another live process owns it.
    pub fn adopt(name: &str) -> Result<NetworkLock, NetlockError> {
        if !valid_name(name) {
            return Err(NetlockError::BadName(name.to_string()));
        }
        let Some(mut record) = record::read(name)? else {
            return Err(NetlockError::NotFound(name.to_string()));
        };
        if let (LockState::Owned, Some(owner)) = (record.state, record.owner) {
            if owner.is_alive() && owner.pid != std::process::id() as i32 {
                return Err(NetlockError::Busy { lock: name.to_string(), pid: owner.pid });
            }
        }
        // The maps are opened now so that disengage is one syscall.
        let ebpf = match record.method {
            Method::Ebpf => {
                let Some(slot) = &record.ebpf else {
                    return Err(NetlockError::NoSlot { lock: name.to_string() });
                };
                let mut handles = ebpf::open(name, &slot.base, slot.slot, slot.generation)?;
                if let Some((overflowed, homes)) = record::read_written(name) {
                    // The file goes before this process writes more
                    // (ebpf::fill): a release from the file alone must
                    // never miss an entry.
                    ebpf::set_written(&mut handles, overflowed, homes, Some(name));
                }
                Some(handles)
            }
            Method::Nftables | Method::Iptables => None,
        };
        let phase_file = record::open_phase(name)?;
        record.state = LockState::Owned;
        record.owner = Owner::current();
        record::write(&record)?;
        record::write_phase(name, &phase_file, record.phase)?;
        Ok(NetworkLock {
            record: Some(record),
            name: name.to_string(),
            ebpf,
            phase_file: Some(phase_file),
            netns_file: None,
            on_drop: None,
        })
    }
}

impl Drop for NetworkLock {
    fn drop(&mut self) {
        if let Some(keep) = self.on_drop.take().filter(|_| self.record.is_some()) {
            // The same lock, moved out of `self`: `keep` owns it now (and
            // releases it with thaw, or by dropping it, if it cannot keep it).
            let lock = NetworkLock {
                record: self.record.take(),
                name: std::mem::take(&mut self.name),
                ebpf: self.ebpf.take(),
                phase_file: self.phase_file.take(),
                netns_file: self.netns_file.take(),
                on_drop: None,
            };
            (keep.0)(lock);
            return;
        }
        let mut handles = self.ebpf.take();
        self.phase_file = None;
        if let Some(record) = self.record.take() {
            if let Err(e) = release_record(&record, handles.as_mut()) {
                tracing::error!(lock = %self.name, "thawing on drop: {e}");
            }
        }
    }
}

/// Creates a fresh record directory named `<purpose>_<pid>_<n>`.
fn new_lock_dir(purpose: &str) -> Result<(String, std::path::PathBuf), NetlockError> {
    let prefix: String = purpose
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(6)
        .collect::<String>()
        .to_ascii_lowercase();
    let prefix = if prefix.is_empty() { "lock".to_string() } else { prefix };
    let pid = std::process::id();
    // Bounded: a name is taken only if a record with it exists already.
    for _ in 0..1000 {
        let n = NEXT_LOCK.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}_{pid}_{n}");
        match record::create_dir(&name) {
            Ok(dir) => return Ok((name, dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => {
                return Err(NetlockError::Io {
                    lock: name.clone(),
                    what: "creating record directory",
                    path: record::lock_dir(&name),
                    source,
                })
            }
        }
    }
    Err(NetlockError::Io {
        lock: prefix,
        what: "finding a free name under",
        path: LOCKS_DIR.into(),
        source: std::io::ErrorKind::AlreadyExists.into(),
    })
}

/// Removes everything of a lock: its kernel objects, the namespace bind
/// mount, the record directory. Every step tolerates a missing piece.
/// Works in every phase and from any process (eBPF: through the pins).
/// `handles`: the eBPF lock's open base, when this process has it.
fn release_record(
    record: &Record,
    handles: Option<&mut ebpf::Handles>,
) -> Result<(), NetlockError> {
    match record.method {
        // The switch goes off first, then links and maps are unpinned.
        Method::Ebpf => ebpf::release_named(
            &record.name,
            record.ebpf.as_ref().map(|e| (e.base.as_str(), e.slot, e.generation)),
            handles,
        )?,
        // Prepared: nothing was made (the record says engaged before
        // anything is); disengaged: already removed.
        Method::Nftables | Method::Iptables if record.phase == Phase::Engaged => {
            remove_objects(record)?
        }
        Method::Nftables | Method::Iptables => {}
    }
    remove_record_dir(&record.name, record.netns.bind_mounted)
}

/// nftables/iptables: deletes the table or chains, tolerating missing ones.
fn remove_objects(record: &Record) -> Result<(), NetlockError> {
    let name = &record.name;
    let enter = record.netns.enter_path.as_deref();
    // Without a way into the namespace (it is gone, and with it the table or
    // chains), there is nothing left to delete.
    if !enter.is_some_and(|p| p.exists()) {
        return Ok(());
    }
    match record.method {
        Method::Nftables => nft::release(name, enter),
        Method::Iptables => iptables::release(name, enter, record.tuples_v6 > 0),
        Method::Ebpf => Ok(()),
    }
}

fn remove_record_dir(name: &str, bind_mounted: bool) -> Result<(), NetlockError> {
    let dir = record::lock_dir(name);
    let netns_file = dir.join("netns");
    if bind_mounted || netns_file.exists() {
        // EINVAL: not a mount point (never mounted or already unmounted).
        match ferry_sys::netns::unmount(&netns_file) {
            Ok(()) => {}
            Err(e) if e.errno == libc::EINVAL || e.errno == libc::ENOENT => {}
            Err(source) => {
                return Err(NetlockError::Sys {
                    lock: name.to_string(),
                    what: format!("unmounting {}", netns_file.display()),
                    source,
                })
            }
        }
    }
    match record::remove_dir(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NetlockError::Io {
            lock: name.to_string(),
            what: "removing record directory",
            path: dir,
            source,
        }),
    }
}

/// Every lock on this machine, sorted by name.
pub fn status() -> Vec<LockStatus> {
    let now = record::now_unix_ms();
    record::list_names()
        .into_iter()
        .map(|name| match record::read(&name) {
            Ok(Some(r)) => LockStatus {
                stale: r.is_stale(),
                method: Some(r.method),
                state: Some(r.state),
                phase: Some(r.phase),
                owner: r.owner,
                purpose: r.purpose.clone(),
                tuples: r.tuples,
                age: std::time::Duration::from_millis(now.saturating_sub(r.created_unix_ms)),
                netns: r.netns.requested.clone(),
                name,
            },
            _ => {
                let age = record::dir_age_ms(&name).unwrap_or(0);
                LockStatus {
                    stale: age > RECORDLESS_GRACE_MS,
                    method: None,
                    state: None,
                    phase: None,
                    owner: None,
                    purpose: String::new(),
                    tuples: 0,
                    age: std::time::Duration::from_millis(age),
                    netns: String::new(),
                    name,
                }
            }
        })
        .collect()
}

/// Installs the eBPF base of `netns` now, as the first eBPF lock there
/// would: a lock prepared and thawed at once holds nothing, and the base
/// it installed stays for the locks after it. Loads nothing when the
/// namespace has a base.
pub fn install_base(netns: &Netns) -> Result<(), NetlockError> {
    NetworkLock::prepare(Method::Ebpf, netns, "base").and_then(NetworkLock::thaw)
}

/// The live eBPF base of the network namespace whose inode is
/// `netns_inode`, if it has one.
pub fn base_of(netns_inode: u64) -> Option<BaseStatus> {
    base_status().into_iter().find(|b| !b.dead && b.netns_inode == Some(netns_inode))
}

/// Every eBPF base (one per network namespace that had an eBPF lock),
/// sorted by name.
pub fn base_status() -> Vec<BaseStatus> {
    base::list().iter().map(|name| base::status(name)).collect()
}

/// Removes the eBPF base of a namespace (its programs are detached from
/// every interface), refused while a lock uses it. Nothing to do when the
/// namespace has none. For tools and tests that delete a namespace: a base
/// left behind is removed by the next [`release_stale`] anyway.
pub fn release_base_of(netns: &Netns) -> Result<(), NetlockError> {
    let path = match netns {
        Netns::Current => None,
        Netns::Path(p) => Some(p.as_path()),
    };
    let name = base::name_of(path)?;
    if base::list().contains(&name) {
        base::release(&name, false)?;
    }
    Ok(())
}

/// Releases the named lock whoever holds it (an operator's decision), or
/// the named eBPF base (refused while a lock uses it).
pub fn release(name: &str) -> Result<(), NetlockError> {
    if base::is_base_name(name) {
        return base::release(name, false);
    }
    if !valid_name(name) {
        return Err(NetlockError::BadName(name.to_string()));
    }
    match record::read(name)? {
        Some(record) => release_record(&record, None),
        None => release_recordless(name),
    }
}

/// A record directory without a record: its creator died before writing
/// it, so at most the directory (and a pin directory) exists.
fn release_recordless(name: &str) -> Result<(), NetlockError> {
    ebpf::release_named(name, None, None)?;
    remove_record_dir(name, false)
}

/// Removes every lock whose owner died while owning it, then the eBPF bases
/// of namespaces that are gone (and those another ferry build left unused),
/// and returns their names. One read_dir each when there are none.
pub fn release_stale() -> Vec<String> {
    let mut released = release_stale_locks();
    released.extend(release_dead_bases());
    released
}

/// The bases' part of [`release_stale`]: frees the slots of locks that are
/// gone, then removes the bases of namespaces that are gone (and those
/// another ferry build left unused); returns the bases' names.
pub fn release_dead_bases() -> Vec<String> {
    for name in base::list() {
        ebpf::free_orphan_slots(&name);
    }
    base::release_useless()
}

/// The locks' part of [`release_stale`]: locks whose owner died while
/// holding them (these drop a service's packets until released).
pub fn release_stale_locks() -> Vec<String> {
    let mut released = Vec::new();
    for name in record::list_names() {
        let result = match record::read(&name) {
            Ok(Some(record)) if record.is_stale() => release_record(&record, None),
            Ok(Some(_)) => continue,
            Ok(None) if record::dir_age_ms(&name).unwrap_or(0) > RECORDLESS_GRACE_MS => {
                release_recordless(&name)
            }
            Ok(None) => continue,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                tracing::info!(lock = %name, "released stale network lock");
                released.push(name);
            }
            // Released by its owner, or by another run's sweep, since it
            // was listed: nothing is left to do, nothing to report.
            Err(NetlockError::NotFound(_)) => continue,
            Err(e) => tracing::warn!(lock = %name, "releasing stale network lock: {e}"),
        }
    }
    released
}

/// True when nothing of lock `name` is left (record, pins); for tests and
/// diagnostics. nftables/iptables objects live in a namespace and are
/// checked by the caller there.
pub fn is_gone(name: &str) -> bool {
    !record::lock_dir(name).exists()
        && !base::pin_root().join(name).exists()
        && base::list().iter().all(|b| base::slots(b).iter().all(|(_, lock)| lock != name))
}

/// For tests: the eBPF table's home slot of `tuple` and how many slots a
/// key may use from there before it goes to the overflow map.
#[doc(hidden)]
pub fn ebpf_table_home(tuple: &Tuple) -> (u32, u32) {
    (ebpf::table_home(tuple), ebpf::PROBES)
}

/// The nftables table and iptables chain names of lock `name`.
pub fn kernel_object_names(name: &str) -> (String, String) {
    (nft::table(name), iptables::chain(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(local: &str, remote: &str) -> Tuple {
        Tuple { local: local.parse().expect("local"), remote: remote.parse().expect("remote") }
    }

    #[test]
    fn ipv4_mapped_tuples_are_ipv4_on_the_wire() {
        // A JVM listener: an IPv6 socket on an IPv4-mapped address.
        let c = canonical_tuple("t", &tuple("[::ffff:127.0.0.1]:18434", "[::]:0")).expect("ok");
        assert_eq!(c, tuple("127.0.0.1:18434", "0.0.0.0:0"));
        assert!(c.is_wildcard());
        // A connection it accepted.
        let c = canonical_tuple("t", &tuple("[::ffff:10.0.0.1]:80", "[::ffff:10.0.0.2]:5000"))
            .expect("ok");
        assert_eq!(c, tuple("10.0.0.1:80", "10.0.0.2:5000"));
        // A plain IPv6 wildcard stays IPv6.
        let c = canonical_tuple("t", &tuple("[fd00::1]:80", "[::]:0")).expect("ok");
        assert_eq!(c, tuple("[fd00::1]:80", "[::]:0"));
    }

    #[test]
    fn a_connection_across_families_is_refused() {
        let err = canonical_tuple("t", &tuple("[::ffff:10.0.0.1]:80", "[fd00::2]:5000"))
            .expect_err("families differ");
        assert!(err.to_string().contains("families differ"), "{err}");
    }
}
