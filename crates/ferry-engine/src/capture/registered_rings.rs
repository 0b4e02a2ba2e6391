//! io_uring rings registered in a thread's own table
//! (IORING_REGISTER_RING_FDS, or IORING_SETUP_REGISTERED_FD_ONLY, which
//! never makes an fd). Such a ring may have no fd and, with
//! IORING_SETUP_NO_MMAP, no mapping of its own: only the thread's
//! io_uring context holds it, and only an injected probe finds it.
//! io_uring is not restored, so a thread holding one is refused.

use crate::error::{EngineError, Result};
use crate::inject::Call;

/// IO_RINGFD_REG_MAX: the size of a thread's registered-ring table.
const SLOTS: u64 = 16;
const IORING_ENTER_REGISTERED_RING: u64 = 16;

/// io_uring_enter on `slot` of the calling thread's table, submitting
/// and waiting for nothing. The kernel answers EINVAL when the thread
/// has no io_uring context at all, EBADF for an empty slot, and for a
/// ring 0 or an error of the ring itself (EBADFD, EEXIST...).
pub fn probe(slot: u64) -> Call {
    Call::new(libc::SYS_io_uring_enter, &[slot, 0, 0, IORING_ENTER_REGISTERED_RING, 0, 0])
}

/// Whether slot 0's answer says the thread has an io_uring context,
/// which then needs every slot probed.
pub fn has_context(slot0: i64) -> bool {
    slot0 != -(libc::EINVAL as i64)
}

/// The first slot whose answer shows a ring.
fn first_ring(results: &[i64]) -> Option<usize> {
    let empty = [-(libc::EINVAL as i64), -(libc::EBADF as i64)];
    results.iter().position(|r| !empty.contains(r))
}

/// Refuses thread `tid` (with an io_uring context) when a slot of its
/// table holds a ring.
pub fn check(ctx: &super::Ctx, tid: i32) -> Result<()> {
    let calls: Vec<Call> = (0..SLOTS).map(probe).collect();
    let r = ctx.remote.batch(tid, ctx.scratch, &calls)?;
    match first_ring(&r) {
        None => Ok(()),
        Some(slot) => Err(EngineError::unsupported(
            ctx.pid,
            format!("thread {tid}: a registered io_uring ring (slot {slot})"),
            "the ring is registered in the thread's own table (it may have no fd and no \
             mapping of its own); io_uring rings and their requests are not restored",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_slots_and_no_context_are_not_rings() {
        assert_eq!(first_ring(&[-(libc::EBADF as i64); 16]), None);
        assert_eq!(first_ring(&[-(libc::EINVAL as i64)]), None);
        assert!(!has_context(-(libc::EINVAL as i64)));
        assert!(has_context(-(libc::EBADF as i64)));
    }

    #[test]
    fn a_ring_answers_zero_or_its_own_error() {
        let mut r = vec![-(libc::EBADF as i64); 16];
        r[3] = 0;
        assert_eq!(first_ring(&r), Some(3));
        r[1] = -(libc::EBADFD as i64);
        assert_eq!(first_ring(&r), Some(1));
        assert!(has_context(0));
    }
}
