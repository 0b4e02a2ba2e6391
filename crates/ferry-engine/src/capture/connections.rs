//! Phase "network freeze": the tree's established TCP connections are
//! stopped on the network (the lock prepared before the freeze takes
//! their tuples), then read in repair mode, which stays on until the tree
//! is killed or resumed.

use super::survey::TreeSurvey;
use super::{files, network, tree::FrozenTree, CaptureOptions};
use crate::error::Result;
use crate::guard::Guard;

/// Connections held still: the lock that drops their packets and the
/// sockets in repair mode.
pub(super) struct FrozenConnections {
    pub lock: Option<ferry_netlock::NetworkLock>,
    pub repaired: files::tcp::Repaired,
}

/// The network lock engaged on the tree's established connections.
pub(super) struct Engaged {
    pub lock: Option<ferry_netlock::NetworkLock>,
    established: Vec<files::tcp::Established>,
}

/// Phase "network freeze": engages `prepared` on the tree's connections
/// and checks the listeners' accept queues.
pub(super) fn engage_lock(
    prepared: Option<ferry_netlock::NetworkLock>,
    tree: &FrozenTree,
    survey: &TreeSurvey,
    opts: &CaptureOptions,
    guard: &mut Guard,
) -> Result<Engaged> {
    let established = files::tcp::established(&survey.file_views());
    let procs: Vec<(i32, &[ferry_image::OpenFile])> =
        survey.procs.iter().map(|s| (s.pid, s.files.as_slice())).collect();
    let kept = opts.kept_lock.as_ref();
    let mut lock = network::engage(prepared, &established, &procs, opts.network_lock, kept)?;
    if let Some(l) = &mut lock {
        // A lock made here (none was prepared) is lent as a kept one is.
        if let Some(kept) = kept {
            kept.lend(l);
        }
        guard.lock(l.name());
    }
    let pidfd_of =
        |pid: i32| tree.procs.iter().find(|p| p.frozen.pid == pid).map(|p| &p.frozen.pidfd);
    network::check_accept_queues(&survey.file_views(), pidfd_of)?;
    Ok(Engaged { lock, established })
}

/// Phase "tcp connections": every connection read in repair mode, its
/// state stored in the file that owns it.
pub(super) fn read_connections(
    engaged: Engaged,
    tree: &FrozenTree,
    survey: &mut TreeSurvey,
    guard: &mut Guard,
) -> Result<FrozenConnections> {
    let Engaged { lock, established } = engaged;
    let pidfd_of =
        |pid: i32| tree.procs.iter().find(|p| p.frozen.pid == pid).map(|p| &p.frozen.pidfd);
    // The survey's duplicates, taken over (each connection once).
    let kept: Vec<Option<std::os::fd::OwnedFd>> = established
        .iter()
        .map(|c| survey.procs.get_mut(c.proc_index)?.kept.remove(&c.fd))
        .collect();
    let (repaired, states) =
        files::tcp::capture(&established, kept, pidfd_of, |socks| guard.repair(socks))?;
    let mut files_of: Vec<&mut Vec<ferry_image::OpenFile>> =
        survey.procs.iter_mut().map(|s| &mut s.files).collect();
    files::tcp::store(&established, states, &mut files_of);
    Ok(FrozenConnections { lock, repaired })
}
