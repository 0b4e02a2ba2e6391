//! The primary's side of replication (`ferry replicate`), as named
//! phases: checks → the service claimed in the fencing store → connect
//! to the standby's agent → pre-copy rounds → first sync ("in sync") →
//! syncs on output, heartbeats between them → the end.
//!
//! From the first sync on, every packet the service sends waits in the
//! output commit ([`ferry_outbox`]) until the standby has stored the sync
//! that covers it. The ways out (`end.rs`): stopped on purpose, the
//! standby gets Unprotect and the output flows again; the standby lost,
//! the output stays held until this side wins the service in the
//! fencing store (then it runs on unprotected) or loses it (then the
//! standby runs the service and this copy is killed, its output never
//! having left).

mod buffer;
mod data_dir;
mod end;
mod files;
mod sync;

pub use sync::SyncReport;

use crate::error::{ReplicateError, Result};
use crate::status::{Status, Window};
use ferry_migrate::precopy::{Precopy, RoundPolicy};
use ferry_migrate::protocol::{self, Msg, ReplicaHello};
use ferry_migrate::source::hello::Connected;
use ferry_migrate::MigrateOptions;
use ferry_transport::Key;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct ReplicateOptions {
    pub pid: i32,
    pub to: SocketAddr,
    pub key: Key,
    /// The service address, with its prefix: the standby puts it on its
    /// interface when it takes over.
    pub address: (IpAddr, u8),
    pub etcd: Vec<String>,
    /// A sync at least this often, output or not.
    pub max_interval: Duration,
    pub heartbeat_interval: Duration,
    /// The standby takes over after this long without a word.
    pub heartbeat_timeout: Duration,
    /// For the first sync and each call to the fencing store.
    pub timeout: Duration,
    pub parent_sees_exit: bool,
    /// Files the tree may write although their content is not replicated
    /// (logs).
    pub ignore_writes: Vec<std::path::PathBuf>,
    /// Directories whose files are part of the replicated state (btrfs
    /// subvolumes, see `data_dir.rs`).
    pub data_dirs: Vec<std::path::PathBuf>,
    /// The NFQUEUE number of the output commit.
    pub queue: u16,
    /// Set (by a signal handler) to end protection.
    pub stop: &'static AtomicBool,
    pub progress: Arc<dyn Fn(&str) + Send + Sync>,
}

/// How replication ended, with the service's fate.
#[derive(Debug)]
pub enum Ended {
    /// Stopped on purpose: the service runs on here, unprotected.
    Stopped { syncs: u64 },
    /// The standby was lost and this side won the service: it runs on
    /// here, unprotected.
    Unprotected { syncs: u64, why: String },
}

/// The primary's state between syncs.
struct Primary<'a> {
    o: &'a ReplicateOptions,
    ch: ferry_transport::Channel,
    precopy: Precopy,
    outbox: ferry_outbox::Outbox,
    fence: ferry_fence::Fence,
    service: String,
    holder: String,
    epoch: u64,
    replica_id: u64,
    seq: u64,
    window: Window,
    status: Status,
    data_dirs: data_dir::DataDirs,
    /// The tree's presurveyed mappings, kept from sync to sync.
    presurveyed: HashMap<i32, ferry_engine::capture::vma_flags::Presurveyed>,
    /// The tree's setsockopt and fd calls, counted from sync to sync,
    /// and the sockets the sync before checked.
    watch: (
        ferry_engine::capture::KeptWatch,
        ferry_engine::capture::KeptChecks,
        ferry_engine::capture::KeptInjected,
    ),
    /// The network lock every sync engages: prepared once, released when
    /// replication ends ([`Primary`]'s drop, whichever way it ends).
    lock: ferry_engine::capture::KeptLock,
    /// FERRY_SYNC_TRACE is set: each sync's report goes to stderr.
    trace: bool,
}

impl Drop for Primary<'_> {
    fn drop(&mut self) {
        tracing::debug!("{} network lock(s) prepared for {} syncs", self.lock.prepared(), self.seq);
        if let Err(e) = self.lock.release() {
            tracing::warn!("releasing the network lock of the syncs: {e}");
        }
    }
}

pub fn replicate(o: &ReplicateOptions) -> Result<Ended> {
    // Every sync locks the same namespace: its mappings are kept. And
    // one checkpoint guard serves every sync (forked now, while this
    // process is small and has no other thread).
    ferry_netlock::keep_mappings();
    let _guard = ferry_engine::guard::keep()?;
    let mo = migrate_options(o);
    ferry_migrate::source::hello::check_source(&mo)?;
    let service = crate::identity::service_name(o.address.0);
    let holder = crate::identity::holder();
    // Refused by name before anything else runs.
    let data_dirs = data_dir::DataDirs::open(&o.data_dirs)?;
    let fence = ferry_fence::Fence::connect(&o.etcd, o.timeout)?;
    let epoch = claim(&fence, &service, &holder)?;
    (o.progress)(&format!("holding {service} at epoch {epoch} as {holder}"));
    let replica = ReplicaHello {
        service: service.clone(),
        holder: holder.clone(),
        epoch,
        heartbeat_timeout_ms: o.heartbeat_timeout.as_millis() as u64,
    };
    let dirs = data_dirs.paths();
    let shipped = |p: &str| dirs.iter().any(|d| crate::data_dir::is_under(d, p));
    let Connected { mut ch, migration_id, .. } =
        ferry_migrate::source::hello::connect_shipping(&mo, false, Some(replica), &shipped)?;
    if !data_dirs.is_empty() {
        data_dirs.announce(&mut ch)?;
    }
    let precopy = Precopy::run(o.pid, &mut ch, &mo.policy, |s| (o.progress)(s))?;
    // Output before the first sync needs no hold: no standby could take
    // over before it is stored.
    // No reader thread: the capture forks, which a process with threads
    // must not do.
    let config = ferry_outbox::Config { reader_thread: false, ..Default::default() };
    let outbox = ferry_outbox::Outbox::hold_with(None, o.address.0, o.queue, config)?;
    let status = Status {
        service: service.clone(),
        role: "primary".into(),
        state: "syncing".into(),
        peer: o.to.to_string(),
        epoch,
        ..Default::default()
    };
    let mut p = Primary {
        o,
        ch,
        precopy,
        outbox,
        fence,
        service,
        holder,
        epoch,
        replica_id: migration_id,
        seq: 0,
        window: Window::default(),
        status,
        data_dirs,
        presurveyed: HashMap::new(),
        watch: Default::default(),
        lock: Default::default(),
        trace: std::env::var_os("FERRY_SYNC_TRACE").is_some(),
    };
    p.run()
}

/// The service, held by this agent: a first claim, or this agent's own
/// claim again (after it took the service over as a standby).
fn claim(fence: &ferry_fence::Fence, service: &str, holder: &str) -> Result<u64> {
    match fence.claim_initial(service, holder)? {
        ferry_fence::Claim::Won { epoch } => Ok(epoch),
        ferry_fence::Claim::Lost { owner } => Err(ReplicateError::Fenced(format!(
            "{service} is held by {} at epoch {}: it runs there, not here",
            owner.holder, owner.epoch
        ))),
    }
}

fn migrate_options(o: &ReplicateOptions) -> MigrateOptions {
    let progress = o.progress.clone();
    MigrateOptions {
        pid: o.pid,
        to: o.to,
        key: o.key.clone(),
        mode: ferry_transport::Mode::Encrypted,
        address: Some(o.address),
        lazy: false,
        precopy: true,
        policy: RoundPolicy::default(),
        timeout: o.timeout,
        network_lock: ferry_netlock::Method::Ebpf,
        parent_sees_exit: o.parent_sees_exit,
        progress: Box::new(move |s| progress(s)),
    }
}

impl Primary<'_> {
    fn run(&mut self) -> Result<Ended> {
        let first = self.sync()?;
        (self.o.progress)(&format!(
            "in sync: the standby holds a complete copy ({:.1} KiB in the first sync, pause {:.1} ms)",
            first.bytes as f64 / 1024.0,
            first.pause_ms
        ));
        self.status.state = "in sync".into();
        self.publish(true);
        let mut last_sync = Instant::now();
        let mut last_line = Instant::now();
        loop {
            if self.o.stop.load(Ordering::Relaxed) {
                return self.stop(None);
            }
            let due = last_sync + self.o.max_interval;
            let wait = due.saturating_duration_since(Instant::now()).min(self.o.heartbeat_interval);
            let output = self.outbox.wait_output(wait);
            let step = if output || Instant::now() >= due {
                self.sync().map(|_| last_sync = Instant::now())
            } else {
                self.heartbeat()
            };
            match step {
                Ok(()) => {}
                Err(e @ ReplicateError::Unreplicable(_)) => return self.stop(Some(e.to_string())),
                Err(e) => return self.standby_lost(e),
            }
            if last_line.elapsed() >= Duration::from_secs(10) {
                self.publish(true);
                last_line = Instant::now();
            } else {
                self.publish(false);
            }
        }
    }

    fn sync(&mut self) -> Result<SyncReport> {
        self.seq += 1;
        let mut ctx = sync::SyncCtx {
            pid: self.o.pid,
            parent_sees_exit: self.o.parent_sees_exit,
            precopy: &mut self.precopy,
            outbox: &self.outbox,
            heartbeat: self.o.heartbeat_interval,
            replica_id: self.replica_id,
            timeout: if self.seq == 1 { self.o.timeout } else { self.o.heartbeat_timeout * 4 },
            ignore_writes: &self.o.ignore_writes,
            data_dirs: &mut self.data_dirs,
            presurveyed: &mut self.presurveyed,
            watch: &self.watch,
            lock: &self.lock,
        };
        let r = sync::sync(&mut ctx, &mut self.ch, self.seq)?;
        self.window.add(r.total_ms, r.pause_ms, r.bytes);
        self.status.syncs = self.seq;
        if self.trace {
            eprintln!("sync {}: {r:?}", r.seq);
        }
        Ok(r)
    }

    /// Asks the standby whether it is there; any answer within the
    /// timeout will do.
    fn heartbeat(&mut self) -> Result<()> {
        protocol::send(&mut self.ch, &Msg::Heartbeat { seq: self.seq })?;
        self.ch
            .set_timeout(Some(self.o.heartbeat_timeout))
            .map_err(ferry_migrate::MigrateError::from)?;
        protocol::expect(&mut self.ch, &["Heartbeat"])
            .map_err(|e| ReplicateError::StandbyLost(format!("no heartbeat: {e}")))?;
        Ok(())
    }

    /// The status file and, when `print`, the line: always when `print`
    /// (a change of state, or the line due every 10 s), else only when the
    /// file is a second old.
    fn publish(&mut self, print: bool) {
        if !print && !self.status.stale() {
            return;
        }
        self.window.fill(&mut self.status);
        self.status.publish();
        if print {
            (self.o.progress)(&self.status.line());
        }
    }
}
