//! The network lock a command that captures the same tree again and
//! again keeps from one capture to the next (`ferry replicate`, a sync
//! many times a second): prepared once (its record, directory and eBPF
//! slot), then per capture only engaged, extended and disengaged. Between
//! captures it is disengaged and holds no tuple ([`ferry_netlock::NetworkLock::rearm`]).
//!
//! A capture takes it at phase "network lock prepared" (or prepares one
//! when none is kept, which it then lends the same way), and
//! [`super::Captured::resume`] gives it back once the tree runs again.
//! A capture that ends any other way (refused for a passing state and
//! tried again, any error, a [`super::Captured`] dropped) gives it back
//! too, disengaged, its held packets sent again and rearmed: a lent lock
//! dropped goes home ([`ferry_netlock::NetworkLock::keep_on_drop`])
//! instead of being released. Only a lock that cannot be disengaged or
//! rearmed is released; the next capture prepares a new one and says
//! why. The lock is released by [`KeptLock::release`] (replication ends),
//! or when the last [`KeptLock`] is dropped; should ferry die meanwhile
//! its record, `owned` by a dead process, is stale: the next ferry run
//! releases it, as does `ferry network-lock --release-stale`.

use ferry_netlock::{NetworkLock, OnDrop};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

#[derive(Clone, Default)]
pub struct KeptLock(Arc<Mutex<Slot>>);

#[derive(Default)]
struct Slot {
    /// The lock between captures: prepared, holding nothing.
    lock: Option<NetworkLock>,
    /// The name of the lock a capture holds now (taken or prepared).
    lent: Option<String>,
    /// How many locks were prepared for these captures (1 when all went
    /// well).
    prepared: u32,
    /// Why the last lock was released rather than kept.
    lost: Option<String>,
}

impl std::fmt::Debug for KeptLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptLock")
    }
}

impl KeptLock {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives a lent lock dropped unreleased back to this [`KeptLock`]
    /// (released if it is gone).
    fn home(&self) -> OnDrop {
        let home: Weak<Mutex<Slot>> = Arc::downgrade(&self.0);
        OnDrop::new(move |lock| match home.upgrade() {
            Some(home) => KeptLock(home).give_back(lock),
            // Dropped: released (its `OnDrop` is spent).
            None => drop(lock),
        })
    }

    /// The kept lock, prepared (engaged by nobody), lent to one capture.
    pub(super) fn take(&self) -> Option<NetworkLock> {
        let mut slot = self.slot();
        let mut lock = slot.lock.take()?;
        slot.lent = Some(lock.name().to_string());
        drop(slot);
        lock.keep_on_drop(Some(self.home()));
        Some(lock)
    }

    /// Lends `lock` to the capture that holds it: a lock the capture
    /// prepared (none was kept) is kept from now on, and the line says
    /// why one was prepared. The lock [`KeptLock::take`] gave is lent
    /// already.
    pub(super) fn lend(&self, lock: &mut NetworkLock) {
        let mut slot = self.slot();
        if slot.lent.as_deref() == Some(lock.name()) {
            return;
        }
        slot.lent = Some(lock.name().to_string());
        slot.prepared += 1;
        let (n, lost) = (slot.prepared, slot.lost.take());
        drop(slot);
        match lost {
            None if n == 1 => {
                tracing::debug!(lock = %lock.name(), "network lock prepared, kept from capture to capture")
            }
            lost => tracing::info!(
                lock = %lock.name(),
                "network lock prepared again (lock {n} of these captures): {}",
                lost.as_deref().unwrap_or("the lock kept before was not given back")
            ),
        }
        lock.keep_on_drop(Some(self.home()));
    }

    /// A lock a capture did not finish with (it may be engaged): let go,
    /// what it held sent again, then kept ([`KeptLock::keep`]).
    fn give_back(&self, mut lock: NetworkLock) {
        let name = lock.name().to_string();
        if let Err(e) = lock.disengage() {
            tracing::warn!(lock = %name, "disengaging the network lock of a capture that did not finish: {e}; released");
            self.lost(lock, format!("the capture before did not finish and its lock {name} could not be disengaged: {e}"));
            return;
        }
        match lock.deliver_held(None) {
            Ok(n) => tracing::debug!(packets = n, "held packets sent again"),
            Err(e) => tracing::warn!("sending the packets the network lock held: {e}"),
        }
        tracing::debug!(lock = %name, "network lock given back by a capture that did not finish");
        self.keep(lock);
    }

    /// Keeps `lock` (disengaged) for the next capture: emptied (rearmed),
    /// or released should that fail.
    pub(super) fn keep(&self, mut lock: NetworkLock) {
        match lock.rearm() {
            Ok(()) => self.put(lock),
            Err(e) => {
                let name = lock.name().to_string();
                tracing::warn!(lock = %name, "keeping the network lock for the next capture: {e}; released");
                self.lost(lock, format!("lock {name} could not be rearmed: {e}"));
            }
        }
    }

    /// Keeps `lock` (prepared, holding nothing) for the next capture.
    pub(super) fn put(&self, mut lock: NetworkLock) {
        // Between captures it is released when dropped (the last
        // KeptLock gone).
        lock.keep_on_drop(None);
        let mut slot = self.slot();
        slot.lent = None;
        // A lock kept already (there is none: one capture at a time) is
        // released, outside the mutex.
        let before = slot.lock.replace(lock);
        drop(slot);
        drop(before);
    }

    /// Releases `lock`, noting `why` for the next preparation's line.
    fn lost(&self, mut lock: NetworkLock, why: String) {
        lock.keep_on_drop(None);
        if let Err(e) = lock.thaw() {
            tracing::warn!("releasing the network lock: {e}");
        }
        let mut slot = self.slot();
        slot.lent = None;
        slot.lost = Some(why);
    }

    /// How many locks were prepared for these captures so far.
    pub fn prepared(&self) -> u32 {
        self.slot().prepared
    }

    /// Releases the kept lock now, if there is one (replication ends).
    pub fn release(&self) -> Result<(), ferry_netlock::NetlockError> {
        let lock = self.slot().lock.take();
        match lock {
            Some(lock) => lock.thaw(),
            None => Ok(()),
        }
    }
}
