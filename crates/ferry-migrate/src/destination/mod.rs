//! The destination side of a migration (run by ferryd for each
//! connection), as named phases: hello → pages into the store, round
//! after round → image → network lock and address → restore, held →
//! Ready → on Commit: release, announce → Running.
//!
//! Anything short of Commit (an error, the source gone, a timeout) kills
//! what was restored and takes the address and the lock back down: the
//! service stays at the source.
//!
//! [`serve`] composes the phases and times them; each lives in the file
//! named after it: `hello.rs` (checks, Welcome, Refused or Unfit, with
//! `checks.rs`: what only this host can refuse), `rounds.rs`
//! (pages into the page store, RoundStored), `image.rs` (the image decoded,
//! its page runs resolved in the store), `lock.rs` (the network lock
//! engaged), `restore.rs` (address on, restore held, Ready's phases),
//! `commit.rs` (Commit, release, announce, Running, post-copy's pager);
//! a standby's takeover (`takeover.rs`) also ends the sockets a dead copy
//! left with the tree's connections' addresses (`stale_sockets.rs`).

mod checks;
mod commit;
mod hello;
mod image;
mod lock;
mod restore;
mod rounds;
mod stale_sockets;
mod takeover;

pub use rounds::ImageReceived;
pub use takeover::{restore_and_run, welcome};

use crate::error::Result;
use crate::protocol::{self, Hello, Msg};
use ferry_engine::phases::Phases;
use ferry_netlock::Method;
use ferry_transport::Channel;
use std::time::Duration;

pub struct DestinationConfig {
    /// The interface a moved service address goes on.
    pub interface: Option<u32>,
    /// How long to wait for the source between messages.
    pub timeout: Duration,
    pub network_lock: Method,
}

#[derive(Debug, Clone)]
pub struct Served {
    /// The root's PID as the tree sees it, and as this agent sees it.
    pub pid: ferry_engine::TreePid,
    pub host_pid: ferry_engine::HostPid,
    pub page_bytes: u64,
    pub phases: Vec<(String, f64)>,
}

/// Serves one migration on an accepted, authenticated channel; None when
/// the source only asked for the checks (a dry run) and they passed.
pub fn serve(mut ch: Channel, cfg: &DestinationConfig) -> Result<Option<Served>> {
    let r = greet(&mut ch, cfg).and_then(|(hello, notes)| serve_inner(&mut ch, cfg, hello, notes));
    report_failure(ch, r)
}

/// The first step of every connection: the source's Hello, checked (a
/// refusal is answered there). The caller serves a migration with
/// [`serve_after_hello`] or, when the Hello asks for a standby, keeps one.
pub fn greet(ch: &mut Channel, cfg: &DestinationConfig) -> Result<(Hello, Vec<String>)> {
    ch.set_timeout(Some(cfg.timeout))?;
    hello::receive(ch, cfg)
}

/// A migration, after [`greet`].
pub fn serve_after_hello(
    mut ch: Channel,
    cfg: &DestinationConfig,
    hello: Hello,
    notes: Vec<String>,
) -> Result<Option<Served>> {
    let r = serve_inner(&mut ch, cfg, hello, notes);
    report_failure(ch, r)
}

/// Best effort: the source learns why, if it still listens; what it
/// still sends is drained so that the report is not lost to a reset.
pub fn report_failure<T>(mut ch: Channel, r: Result<T>) -> Result<T> {
    if let Err(e) = &r {
        let _ = protocol::send(&mut ch, &Msg::Failed { error: e.to_string() });
        ch.close_after_report(std::time::Duration::from_secs(3));
    }
    r
}

/// The phases in order. Every undo is a value dropped on the way out:
/// declared in this order, an error before the release kills the held
/// tree first, then removes the address, then releases the lock.
fn serve_inner(
    ch: &mut Channel,
    cfg: &DestinationConfig,
    hello: Hello,
    notes: Vec<String>,
) -> Result<Option<Served>> {
    let mut ph = Phases::start("destination");
    if hello.replica.is_some() {
        return Err(crate::error::MigrateError::Refused(
            "this agent serves migrations only, not a standby".into(),
        ));
    }
    if hello.dry_run {
        hello::welcome(ch, cfg, notes)?;
        return Ok(None);
    }
    let lock = hello::prepare_lock(cfg)?;
    ph.mark("network lock prepared");
    hello::welcome(ch, cfg, notes)?;
    ph.mark("hello");

    let mut store = rounds::page_store(&hello)?;
    let image = rounds::receive(ch, &mut store, |round| {
        ph.mark(&format!("round {round} received"));
    })?;
    ph.mark("final pages + image received");
    let image = image::resolve(image, &hello, &mut store)?;
    ph.mark("page runs resolved");

    let mut lock = lock::engage(lock, &image.tree)?;
    ph.mark("network lock");
    let placed = restore::address_on(&hello, cfg)?;
    ph.mark("address on");
    let pages = store.map()?;
    ph.mark("page store mapped");
    let held = restore::restore_held(
        image.tree,
        &image.lazy,
        hello.lazy,
        &pages,
        &mut store,
        lock.adopt_name(),
    )?;
    let mut phases = held.ready_phases(&ph);
    ph.mark("restored (held)");
    protocol::send(ch, &Msg::Ready { phases: phases.clone() })?;

    commit::await_commit(ch)?;
    let (restored, released) = commit::release(ch, held.tree, placed)?;
    lock.taken_by_tree();
    ph.mark("released");
    released.reported?;
    phases.extend(released.phases);
    drop(released.announce_socket);
    drop(held.unmapper);
    lock.thaw_unneeded()?;
    if hello.lazy {
        phases.push(commit::serve_lazy_pages(ch, held.uffds, &image.lazy, &restored)?);
    }
    Ok(Some(Served {
        pid: restored.pid,
        host_pid: restored.host_pid,
        page_bytes: store.bytes(),
        phases,
    }))
}
