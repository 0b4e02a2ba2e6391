//! The source side of a migration, as a pipeline of named phases:
//! connect → pre-copy rounds → freeze and capture (final pages streamed)
//! → address off → image sent → destination restores and holds → commit
//! → destination runs → source's copy killed.
//!
//! Until the destination reports the tree running, every failure puts
//! the source back as it was: the address returns, the connections leave
//! repair mode, the lock thaws, the tree runs on. The service runs in one
//! place at every moment.

use crate::error::{MigrateError, Result};
use crate::precopy::{Decision, Precopy, Round, RoundPolicy};
use crate::protocol::{self, Hello, Msg};
use crate::stream_sink::StreamSink;
use crate::{address, Progress};
use ferry_engine::capture::{CaptureHooks, CaptureOptions, LockAfterKill};
use ferry_transport::{Channel, Key, Mode};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub struct MigrateOptions {
    pub pid: i32,
    pub to: SocketAddr,
    pub key: Key,
    pub mode: Mode,
    /// The service address that moves with the process, with its prefix.
    pub address: Option<(IpAddr, u8)>,
    pub lazy: bool,
    pub precopy: bool,
    pub policy: RoundPolicy,
    /// For every step that waits on the destination.
    pub timeout: Duration,
    pub network_lock: ferry_netlock::Method,
    pub progress: Progress,
}

#[derive(Debug, Clone)]
pub struct MigrationReport {
    pub pid: i32,
    /// The root's PID at the destination, as its tree sees it, and as the
    /// destination's agent sees it.
    pub dest_pid: i32,
    pub dest_host_pid: i32,
    /// From the freeze at the source to the destination's report that
    /// the tree runs.
    pub pause_ms: f64,
    pub total_ms: f64,
    /// Bytes on the wire (after encryption and framing).
    pub bytes_sent: u64,
    /// Page bytes sent during the freeze.
    pub final_page_bytes: u64,
    pub rounds: Vec<Round>,
    pub precopy_stop: Option<Decision>,
    /// The source's phases and the destination's restore phases, in ms.
    pub source_phases: Vec<(String, f64)>,
    pub dest_phases: Vec<(String, f64)>,
    /// Post-copy: what was left behind in the freeze and sent afterwards.
    pub postcopy: Option<PostcopyReport>,
}

#[derive(Debug, Clone)]
pub struct PostcopyReport {
    /// Bytes of pages the freeze left at the source.
    pub lazy_bytes: u64,
    pub push: crate::postcopy::PushReport,
}

fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b) ^ std::process::id() as u64
}

pub fn migrate(o: &MigrateOptions) -> Result<MigrationReport> {
    let t0 = Instant::now();
    let mut phases: Vec<(String, f64)> = Vec::new();
    let mut mark = {
        let mut last = Instant::now();
        move |phases: &mut Vec<(String, f64)>, name: &str| {
            let now = Instant::now();
            phases.push((name.to_string(), (now - last).as_secs_f64() * 1e3));
            last = now;
        }
    };
    if let Some((addr, _)) = o.address {
        address::locate(addr)?;
    }
    if !std::path::Path::new(&format!("/proc/{}", o.pid)).exists() {
        return Err(MigrateError::Invalid(format!("pid {}: no such process", o.pid)));
    }
    if o.lazy {
        crate::postcopy::check_single_process(o.pid)?;
    }
    (o.progress)(&format!("connecting to {}", o.to));
    let stream = TcpStream::connect_timeout(&o.to, o.timeout)
        .map_err(|e| MigrateError::Invalid(format!("connecting to ferryd at {}: {e}", o.to)))?;
    let _ = stream.set_nodelay(true);
    let mut ch = Channel::connect(stream, &o.key, o.mode)?;
    ch.set_timeout(Some(o.timeout))?;
    let (major, minor) = crate::FORMAT;
    let migration_id = random_id();
    let hello = Hello {
        protocol: protocol::PROTOCOL_VERSION,
        ferry_version: env!("CARGO_PKG_VERSION").to_string(),
        format: (major, minor),
        arch: std::env::consts::ARCH.to_string(),
        kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        migration_id,
        root_pid: o.pid,
        lazy: o.lazy,
        address: o.address,
    };
    protocol::send(&mut ch, &Msg::Hello(hello))?;
    protocol::expect(&mut ch, &["Welcome"])?;
    mark(&mut phases, "connect");

    if !o.lazy {
        send_layout(&mut ch, o.pid)?;
    }
    let mut precopy = if o.precopy && !o.lazy {
        let p = Precopy::run(o.pid, &mut ch, &o.policy, |s| (o.progress)(s))
            .map_err(|e| peer_reason(&mut ch, e))?;
        mark(&mut phases, "pre-copy");
        Some(p)
    } else {
        None
    };

    // Read the mappings' flags once now, while the tree runs, so that the
    // freeze can read them without walking every page table again (see
    // ferry_engine::capture::vma_flags).
    let presurveyed = ferry_engine::capture::vma_flags::presurvey_tree(o.pid);
    mark(&mut phases, "presurvey");
    (o.progress)("freezing");
    let copts = CaptureOptions { network_lock: o.network_lock, presurveyed, ..Default::default() };
    let mut lazy = o.lazy.then(crate::postcopy::LazyHooks::default);
    // A refusal for a passing state (a connection closing, a client
    // between handshake and accept) comes before any page is sent: the
    // tree runs on, and the capture is tried again.
    let captured = ferry_engine::capture::retry_transient(
        || {
            let mut sink = StreamSink::new(&mut ch);
            let hooks = match (precopy.as_mut(), lazy.as_mut()) {
                (Some(p), _) => Some(p as &mut dyn CaptureHooks),
                (None, Some(l)) => Some(l as &mut dyn CaptureHooks),
                (None, None) => None,
            };
            match ferry_engine::capture::capture(o.pid, &mut sink, &copts, hooks) {
                Ok(c) => Ok((c, sink.page_bytes())),
                // Pages already on their way: not a clean retry.
                Err(e) if e.is_transient() && sink.page_bytes() > 0 => {
                    Err(ferry_engine::EngineError::restore(o.pid, e.to_string()))
                }
                Err(e) => Err(e),
            }
        },
        |n, e| (o.progress)(&format!("freeze attempt {n} refused, trying again: {e}")),
    );
    let (captured, final_page_bytes) = captured.map_err(|e| peer_reason(&mut ch, e.into()))?;
    // The tracker stays registered until the outcome is known: closing
    // its userfaultfd makes the kernel walk every tracked page table (tens
    // of ms per GiB), which must not count in the pause. It goes before
    // the tree runs here again, or once it is killed.
    let (rounds, precopy_stop) = match precopy.as_ref() {
        Some(p) => (p.rounds.clone(), p.stopped_because),
        None => (Vec::new(), None),
    };
    let frozen_at = captured.frozen_at();
    phases.extend(captured.phases.done().iter().map(|(n, ms)| (format!("capture: {n}"), *ms)));
    mark(&mut phases, "freeze+capture");

    let mut taken: Option<address::Taken> = None;
    let mut commit_sent = false;
    let outcome = (|| -> Result<(i32, i32, Vec<(String, f64)>)> {
        if let Some((addr, prefix)) = o.address {
            taken = Some(address::take(addr, prefix)?);
            mark(&mut phases, "address off");
        }
        let incremental = (!captured.parent_pages.is_empty()).then(|| ferry_image::Incremental {
            parent_id: migration_id,
            parent_pages: captured
                .parent_pages
                .iter()
                .map(|(pid, ranges)| ferry_image::ParentPages { pid: *pid, ranges: ranges.clone() })
                .collect(),
        });
        let meta = ferry_image::encode_meta_with(
            &captured.inventory,
            &captured.tree,
            incremental.as_ref(),
        )?;
        let msg = Msg::Image { meta, host_pids: captured.pids() };
        protocol::send(&mut ch, &msg)?;
        mark(&mut phases, "image sent");
        (o.progress)("restoring at the destination");
        let ready = protocol::expect(&mut ch, &["Ready"])?;
        let Msg::Ready { phases: mut dest_phases } = ready.msg else {
            unreachable!("expect checked the kind")
        };
        mark(&mut phases, "destination restore");
        protocol::send(&mut ch, &Msg::Commit)?;
        commit_sent = true;
        let running = protocol::expect(&mut ch, &["Running"])?;
        let Msg::Running { pid, host_pid, phases: release } = running.msg else {
            unreachable!("expect checked the kind")
        };
        dest_phases.extend(release);
        mark(&mut phases, "destination release");
        Ok((pid, host_pid, dest_phases))
    })();
    let pause_ms = frozen_at.elapsed().as_secs_f64() * 1e3;
    match outcome {
        Ok((dest_pid, dest_host_pid, dest_phases)) => {
            if let Some(t) = taken {
                t.keep_off();
            }
            // Post-copy: the frozen copy holds the only copy of the lazy
            // pages; it is killed once they are all at the destination.
            let postcopy = match &lazy {
                Some(l) => {
                    // Should this process die during the transfer, ptrace lets
                    // go of the tree: a queued SIGSTOP keeps it from running here.
                    for p in captured.pids() {
                        let _ = ferry_sys::process::kill(p, libc::SIGSTOP);
                    }
                    (o.progress)(&format!(
                        "running at the destination; post-copy of {:.1} MiB",
                        l.bytes() as f64 / 1048576.0
                    ));
                    let pushed = crate::postcopy::push(&mut ch, &l.lazy, o.timeout, &*o.progress);
                    mark(&mut phases, "post-copy");
                    match pushed {
                        Ok(push) => Some(PostcopyReport { lazy_bytes: l.bytes(), push }),
                        Err(e) => {
                            let _ = captured.kill(LockAfterKill::Release);
                            return Err(MigrateError::Aborted(format!(
                                "{e}; the tree had resumed at {} before all its memory was there: the destination kills it, and the source's copy was killed (post-copy cannot roll back): the service is lost",
                                o.to
                            )));
                        }
                    }
                }
                None => None,
            };
            captured.kill(LockAfterKill::Release)?;
            drop(precopy);
            mark(&mut phases, "source killed");
            Ok(MigrationReport {
                pid: o.pid,
                dest_pid,
                dest_host_pid,
                pause_ms,
                total_ms: t0.elapsed().as_secs_f64() * 1e3,
                bytes_sent: ch.bytes_sent(),
                final_page_bytes,
                rounds,
                precopy_stop,
                source_phases: phases,
                dest_phases,
                postcopy,
            })
        }
        Err(e) if commit_sent => {
            // The destination may have released the tree: running it here
            // as well would put the service in two places. It is kept,
            // stopped, for the operator to decide.
            let pids = captured.pids();
            for &p in &pids {
                let _ = ferry_sys::process::kill(p, libc::SIGSTOP);
            }
            if let Some(t) = taken {
                t.keep_off();
            }
            drop(precopy);
            let _ = captured.resume();
            Err(MigrateError::Aborted(format!(
                "{e}; the destination did not confirm that the service runs there. The source's copy is kept stopped (pid {}): kill it if the service runs at {}, or `kill -CONT` it and put the address back if not",
                o.pid, o.to
            )))
        }
        Err(e) => {
            let e = peer_reason(&mut ch, e);
            ch.shutdown();
            drop(taken);
            drop(precopy);
            captured.resume()?;
            Err(e)
        }
    }
}

/// When sending failed, the destination has usually said why before it
/// closed the connection (a corrupted message, a failed restore): that
/// reason is the error to report, not our broken pipe.
fn peer_reason(ch: &mut Channel, e: MigrateError) -> MigrateError {
    if !matches!(e, MigrateError::Transport(_) | MigrateError::Engine(_) | MigrateError::Image(_)) {
        return e;
    }
    if ch.set_timeout(Some(Duration::from_secs(1))).is_err() {
        return e;
    }
    for _ in 0..8 {
        match protocol::recv(ch) {
            Ok(r) => match r.msg {
                Msg::Failed { error } => {
                    return MigrateError::DestinationFailed(format!("{error} (here: {e})"))
                }
                Msg::Refused { reason } => return MigrateError::Refused(reason),
                _ => continue,
            },
            Err(_) => break,
        }
    }
    e
}

/// Tells the destination where the root's private anonymous mappings are
/// (see Msg::Layout). Read while the tree runs: a mapping that changes
/// before the freeze only costs the destination a copy of its pages.
fn send_layout(ch: &mut Channel, pid: i32) -> Result<()> {
    let maps = ferry_engine::procfs::maps(pid)?;
    let mappings: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| {
            m.path.is_empty() && m.perms[3] == b'p' && m.perms[0] == b'r' && m.perms[1] == b'w'
        })
        .map(|m| (m.start, m.end))
        .collect();
    protocol::send(ch, &Msg::Layout { pid, mappings })
}
