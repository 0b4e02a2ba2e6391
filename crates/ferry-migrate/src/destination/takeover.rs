//! A standby's takeover: the last complete sync restored from the page
//! store and run here, as a migration's destination does after Commit,
//! with nobody to report to. The service address goes on this host and
//! is announced once the tree runs.

use super::image;
use super::rounds::ImageReceived;
use super::stale_sockets;
use super::{commit, hello, lock, restore, DestinationConfig, Served};
use crate::error::Result;
use crate::page_store::PageStore;
use crate::protocol::Hello;
use ferry_engine::phases::Phases;
use ferry_transport::Channel;

/// Welcome for a source whose Hello [`super::greet`] accepted.
pub fn welcome(ch: &mut Channel, cfg: &DestinationConfig, notes: Vec<String>) -> Result<()> {
    hello::welcome(ch, cfg, notes)
}

/// Restores the tree of `image` from `store` (pages under the primary's
/// PIDs, as its syncs sent them) and runs it here. On error nothing of
/// it is left: no process, no address, no lock.
pub fn restore_and_run(
    image: ImageReceived,
    hello: &Hello,
    store: &mut PageStore,
    cfg: &DestinationConfig,
) -> Result<Served> {
    let mut ph = Phases::start("takeover");
    let lock = hello::prepare_lock(cfg)?;
    ph.mark("network lock prepared");
    let image = image::resolve(image, hello, store)?;
    ph.mark("page runs resolved");
    let ended = stale_sockets::remove(&image.tree)?;
    if ended > 0 {
        eprintln!(
            "ferryd: ended {ended} socket(s) a dead copy of the service left here with its \
             connections' addresses"
        );
    }
    ph.mark("stale sockets ended");
    let mut lock = lock::engage(lock, &image.tree)?;
    ph.mark("network lock");
    let placed = restore::address_on(hello, cfg)?;
    ph.mark("address on");
    let pages = store.map()?;
    ph.mark("page store mapped");
    let held =
        restore::restore_held(image.tree, &image.lazy, false, &pages, store, lock.adopt_name())?;
    let mut phases = held.ready_phases(&ph);
    let (restored, released) = commit::release_reporting(held.tree, placed, |_, _| Ok(()))?;
    lock.taken_by_tree();
    phases.extend(released.phases);
    drop(released.announce_socket);
    drop(held.unmapper);
    lock.thaw_unneeded()?;
    Ok(Served { pid: restored.pid, host_pid: restored.host_pid, page_bytes: store.bytes(), phases })
}
