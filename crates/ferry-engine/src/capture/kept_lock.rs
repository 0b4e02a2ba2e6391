//! The network lock a command that captures the same tree again and
//! again keeps from one capture to the next (`ferry replicate`, a sync
//! many times a second): prepared once (its record, directory and eBPF
//! slot), then per capture only engaged, extended and disengaged. Between
//! captures it is disengaged and holds no tuple ([`ferry_netlock::NetworkLock::rearm`]).
//!
//! A capture takes it at phase "network lock prepared" (or prepares one
//! when none is kept), and [`super::Captured::resume`] gives it back once
//! the tree runs again. A capture that fails lets its lock go (released,
//! as any capture's): the next one prepares a new lock. The lock is
//! released when the last [`KeptLock`] is dropped, and should ferry die
//! meanwhile its record, `owned` by a dead process, is stale: the next
//! ferry run releases it, as does `ferry network-lock --release-stale`.

use ferry_netlock::NetworkLock;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

#[derive(Clone, Default)]
pub struct KeptLock(Arc<Mutex<Option<NetworkLock>>>);

impl std::fmt::Debug for KeptLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptLock")
    }
}

impl KeptLock {
    fn slot(&self) -> MutexGuard<'_, Option<NetworkLock>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kept lock, prepared (engaged by nobody), for one capture.
    pub(super) fn take(&self) -> Option<NetworkLock> {
        self.slot().take()
    }

    /// Keeps `lock` (prepared, holding nothing) for the next capture.
    pub(super) fn put(&self, lock: NetworkLock) {
        // A lock kept already (there is none: one capture at a time)
        // would be released as it is dropped.
        *self.slot() = Some(lock);
    }

    /// Releases the kept lock now, if there is one (replication ends).
    pub fn release(&self) -> Result<(), ferry_netlock::NetlockError> {
        match self.take() {
            Some(lock) => lock.thaw(),
            None => Ok(()),
        }
    }
}
