//! The ways back when the switch-over fails. Before the commit the
//! source is put back as it was and the tree runs on here; after it, the
//! destination may run the tree already, and the source's copy is only
//! kept, stopped.

use super::freeze::Frozen;
use super::{peer_reason, MigrateOptions};
use crate::address;
use crate::error::MigrateError;
use ferry_transport::Channel;

impl Frozen {
    /// Before the commit: the address returns, the tracker goes, the
    /// connections leave repair mode, the lock thaws, the tree runs on.
    pub(super) fn roll_back(
        self,
        ch: &mut Channel,
        taken: Option<address::Taken>,
        e: MigrateError,
    ) -> MigrateError {
        let e = peer_reason(ch, e);
        ch.shutdown();
        drop(taken);
        let Frozen { precopy, captured, .. } = self;
        drop(precopy);
        match captured.resume() {
            Ok(_) => e,
            Err(resuming) => resuming.into(),
        }
    }

    /// After the commit: the destination may have released the tree:
    /// running it here as well would put the service in two places. It
    /// is kept, stopped, for the operator to decide.
    pub(super) fn keep_stopped(
        self,
        o: &MigrateOptions,
        taken: Option<address::Taken>,
        e: MigrateError,
    ) -> MigrateError {
        let Frozen { precopy, captured, .. } = self;
        let pids = captured.pids();
        for &p in &pids {
            let _ = ferry_sys::process::kill(p.0, libc::SIGSTOP);
        }
        if let Some(t) = taken {
            t.keep_off();
        }
        drop(precopy);
        let _ = captured.resume();
        MigrateError::Aborted(format!(
            "{e}; the destination did not confirm that the service runs there. The source's copy is kept stopped (pid {}): kill it if the service runs at {}, or `kill -CONT` it and put the address back if not",
            o.pid, o.to
        ))
    }
}
