//! After the destination reports the tree running: post-copy's pages
//! pushed, then the source's copy killed.

use super::freeze::Frozen;
use super::{MigrateOptions, PostcopyReport};
use crate::error::{MigrateError, Result};
use ferry_engine::capture::LockAfterKill;
use ferry_transport::Channel;

impl Frozen {
    /// Post-copy: the frozen copy holds the only copy of the lazy pages;
    /// it is killed once they are all at the destination. None when this
    /// migration is not post-copy.
    pub(super) fn push_lazy_pages(
        &self,
        o: &MigrateOptions,
        ch: &mut Channel,
    ) -> Option<Result<PostcopyReport>> {
        let l = self.lazy.as_ref()?;
        // Should this process die during the transfer, ptrace lets go of
        // the tree: a queued SIGSTOP keeps it from running here.
        for p in self.captured.pids() {
            let _ = ferry_sys::process::kill(p.0, libc::SIGSTOP);
        }
        let pushed = crate::postcopy::push(ch, &l.lazy, o.timeout, &*o.progress);
        Some(pushed.map(|push| PostcopyReport { lazy_bytes: push.lazy_bytes, push }))
    }

    /// Post-copy failed after the resume: nothing can roll back.
    pub(super) fn lost_in_postcopy(self, o: &MigrateOptions, e: MigrateError) -> MigrateError {
        let _ = self.captured.kill(LockAfterKill::Release);
        MigrateError::Aborted(format!(
            "{e}; the tree had resumed at {} before all its memory was there: the destination kills it, and the source's copy was killed (post-copy cannot roll back): the service is lost",
            o.to
        ))
    }

    /// The tree runs at the destination: the source's copy ends.
    pub(super) fn kill_source(self) -> Result<()> {
        let Frozen { precopy, captured, .. } = self;
        captured.kill(LockAfterKill::Release)?;
        drop(precopy);
        Ok(())
    }
}
