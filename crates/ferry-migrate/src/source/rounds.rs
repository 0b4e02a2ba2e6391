//! Pre-copy, the source's side of it: where the root's anonymous memory
//! lies (Layout), then rounds of pages while the tree runs (see
//! [`crate::precopy`]), until the policy says freeze.

use super::{peer_reason, MigrateOptions};
use crate::error::Result;
use crate::precopy::Precopy;
use crate::protocol::{self, Msg};
use ferry_transport::Channel;

/// The rounds sent, or None when this migration has none (stop-and-copy,
/// or post-copy, whose freeze sends no private anonymous page at all).
pub(super) fn precopy(o: &MigrateOptions, ch: &mut Channel) -> Result<Option<Precopy>> {
    if !o.lazy {
        send_layout(ch, o.pid)?;
    }
    if !o.precopy || o.lazy {
        return Ok(None);
    }
    Precopy::run(o.pid, ch, &o.policy, |s| (o.progress)(s))
        .map(Some)
        .map_err(|e| peer_reason(ch, e))
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
