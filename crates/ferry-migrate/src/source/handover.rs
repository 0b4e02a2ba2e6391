//! The switch-over, from the frozen tree to the destination's report
//! that it runs there: the address comes off this host, the image goes,
//! the destination restores and holds the tree (Ready), the source
//! commits, the destination releases it (Running). A failure before the
//! commit is undone by [`super::rollback`].

use super::MigrateOptions;
use crate::address;
use crate::error::Result;
use crate::protocol::{self, Msg};
use ferry_engine::capture::Captured;
use ferry_transport::Channel;

/// The destination's report that the tree runs there.
pub(super) struct Running {
    pub pid: i32,
    pub host_pid: i32,
    /// Its restore phases (from Ready) and its release phases.
    pub dest_phases: Vec<(String, f64)>,
}

/// The service address, off this host until the migration commits or
/// the returned guard is dropped.
pub(super) fn address_off(o: &MigrateOptions) -> Result<Option<address::Taken>> {
    match o.address {
        Some((addr, prefix)) => Ok(Some(address::take(addr, prefix)?)),
        None => Ok(None),
    }
}

/// Phase "write image" into the migration stream: the metadata, as an
/// incremental image whose parent is this migration's earlier rounds,
/// with the source's PIDs; the same sink the pages went through.
pub(super) fn send_image(
    ch: &mut Channel,
    captured: &mut Captured,
    migration_id: u64,
) -> Result<()> {
    let mut sink = crate::stream_sink::StreamSink::new(ch);
    sink.set_host_pids(captured.pids().into_iter().map(|p| p.0).collect());
    let parent_id = (!captured.parent_pages.is_empty()).then_some(migration_id);
    captured.write_image(&mut sink, parent_id)?;
    Ok(())
}

/// The tree restored and held at the destination: its restore phases.
pub(super) fn await_ready(ch: &mut Channel) -> Result<Vec<(String, f64)>> {
    let ready = protocol::expect(ch, &["Ready"])?;
    let Msg::Ready { phases } = ready.msg else { unreachable!("expect checked the kind") };
    Ok(phases)
}

/// From here on the destination may release the tree.
pub(super) fn commit(ch: &mut Channel) -> Result<()> {
    protocol::send(ch, &Msg::Commit)
}

pub(super) fn await_running(
    ch: &mut Channel,
    mut dest_phases: Vec<(String, f64)>,
) -> Result<Running> {
    let running = protocol::expect(ch, &["Running"])?;
    let Msg::Running { pid, host_pid, phases: release } = running.msg else {
        unreachable!("expect checked the kind")
    };
    dest_phases.extend(release);
    Ok(Running { pid, host_pid, dest_phases })
}
