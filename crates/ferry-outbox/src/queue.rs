//! The nfqueue socket, what it has seen, and the thread that reads it.
//!
//! One lock covers the socket's reads and the bookkeeping: whoever holds
//! it (the reader thread, or a caller taking a mark or releasing) drains
//! every message the kernel has queued so far, so a packet queued before
//! a call is always counted by it. Requests wait for their answer with the
//! lock held, so the reader thread cannot consume it.

use crate::nfq::{self, Event};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a request waits for the kernel's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// A packet the kernel holds for us. Its kernel id is not kept: a release
/// sends the mark's id, and the kernel compares ids modulo 2^32 itself.
struct Held {
    seq: u64,
    at: Instant,
}

#[derive(Default)]
pub(crate) struct State {
    held: VecDeque<Held>,
    /// Packets seen so far; the seq of the newest.
    pub(crate) queued: u64,
    /// `queued` when the last mark was taken.
    pub(crate) marked: u64,
    last_id: u32,
    acks: Vec<(u32, i32)>,
    pub(crate) released: u64,
    pub(crate) releases: u64,
    pub(crate) longest_hold: Duration,
    /// Queue messages lost to a full socket buffer (ENOBUFS): the kernel
    /// dropped those packets instead of holding them.
    pub(crate) overruns: u64,
    events: Vec<Event>,
}

impl State {
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }
}

/// Why a request failed: a socket errno or the kernel's answer.
pub(crate) enum RequestError {
    Socket(i32),
    Kernel(i32),
    NoAnswer,
}

pub(crate) struct Queue {
    sock: File,
    pub(crate) num: u16,
    state: Mutex<State>,
    pub(crate) output: Condvar,
}

impl Queue {
    /// `sock` is a non-blocking NETLINK_NETFILTER socket.
    pub(crate) fn new(sock: File, num: u16) -> Queue {
        Queue { sock, num, state: Mutex::new(State::default()), output: Condvar::new() }
    }

    pub(crate) fn fd(&self) -> i32 {
        self.sock.as_raw_fd()
    }

    /// The state, with every message queued so far read into it.
    pub(crate) fn drained(&self) -> Result<MutexGuard<'_, State>, i32> {
        let mut st = self.lock();
        self.drain(&mut st)?;
        Ok(st)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (each
        // update is a single push or pop): keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads every message waiting on the socket into `st`; the errno of a
    /// read that failed for another reason than an empty socket.
    pub(crate) fn drain(&self, st: &mut State) -> Result<(), i32> {
        let mut buf = [0u8; 8192];
        loop {
            match (&self.sock).read(&mut buf) {
                Ok(n) => {
                    let mut events = std::mem::take(&mut st.events);
                    nfq::parse(&buf[..n], &mut events);
                    for e in events.drain(..) {
                        record(st, e);
                    }
                    st.events = events;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => st.overruns += 1,
                Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
            }
        }
    }

    /// Sends `msg` (a request with sequence number `seq`) and waits for
    /// the kernel's answer, with the lock held.
    pub(crate) fn request(&self, st: &mut State, msg: &[u8], seq: u32) -> Result<(), RequestError> {
        (&self.sock)
            .write_all(msg)
            .map_err(|e| RequestError::Socket(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let deadline = Instant::now() + ANSWER_WAIT;
        loop {
            self.drain(st).map_err(RequestError::Socket)?;
            if let Some(i) = st.acks.iter().position(|&(s, _)| s == seq) {
                let (_, errno) = st.acks.swap_remove(i);
                return if errno == 0 { Ok(()) } else { Err(RequestError::Kernel(errno)) };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RequestError::NoAnswer);
            }
            let mut fds = [libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 }];
            match ferry_sys::fd::poll(&mut fds, left.as_millis().max(1) as i32) {
                Ok(_) => {}
                Err(e) if e.errno == libc::EINTR => {}
                Err(e) => return Err(RequestError::Socket(e.errno)),
            }
        }
    }

    /// Accepts every held packet seen up to `seq` (whose id is `id`): one
    /// batch verdict. How many were released.
    pub(crate) fn release(
        &self,
        st: &mut State,
        id: u32,
        seq: u64,
        msg_seq: u32,
    ) -> Result<usize, RequestError> {
        let count = st.held.iter().take_while(|h| h.seq <= seq).count();
        if count == 0 {
            return Ok(0);
        }
        let released = match self.request(st, &nfq::accept_through(self.num, msg_seq, id), msg_seq)
        {
            Ok(()) => count,
            // None of them is queued any more: the kernel dropped them
            // (their interface went away).
            Err(RequestError::Kernel(libc::ENOENT)) => 0,
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        for h in st.held.drain(..count) {
            st.longest_hold = st.longest_hold.max(now - h.at);
        }
        st.released += released as u64;
        st.releases += 1;
        Ok(released)
    }
}

fn record(st: &mut State, e: Event) {
    match e {
        Event::Packet(id) => {
            st.queued += 1;
            st.last_id = id;
            st.held.push_back(Held { seq: st.queued, at: Instant::now() });
        }
        Event::Ack { seq, errno } => st.acks.push((seq, errno)),
    }
}

/// The newest packet seen: (kernel id, seq); seq 0 when none was.
pub(crate) fn newest(st: &State) -> (u32, u64) {
    (st.last_id, st.queued)
}

/// Without a reader thread: reads the socket until a packet newer than
/// the last mark was seen (true) or `deadline` passed (false).
pub(crate) fn wait_unread(queue: &Queue, deadline: Instant) -> bool {
    loop {
        {
            let mut st = queue.lock();
            if queue.drain(&mut st).is_err() {
                return false;
            }
            if st.queued > st.marked {
                return true;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut fds = [libc::pollfd { fd: queue.fd(), events: libc::POLLIN, revents: 0 }];
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        if let Err(e) = ferry_sys::fd::poll(&mut fds, ms) {
            if e.errno != libc::EINTR {
                return false;
            }
        }
    }
}

/// The reader thread: drains the socket whenever it has messages, wakes
/// the waiters of new output, ends when `stop` becomes readable.
pub(crate) fn reader(queue: &Queue, mut stop: File) -> Result<(), i32> {
    loop {
        let mut fds = [
            libc::pollfd { fd: queue.fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        match ferry_sys::fd::poll(&mut fds, -1) {
            Ok(_) => {}
            Err(e) if e.errno == libc::EINTR => continue,
            Err(e) => return Err(e.errno),
        }
        if fds[1].revents != 0 {
            let _ = stop.read(&mut [0u8; 1]);
            return Ok(());
        }
        let mut st = queue.lock();
        let before = st.queued;
        queue.drain(&mut st)?;
        if st.queued != before {
            queue.output.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_are_kept_in_the_order_seen() {
        let mut st = State::default();
        for id in [7, 8, 9] {
            record(&mut st, Event::Packet(id));
        }
        record(&mut st, Event::Ack { seq: 3, errno: 0 });
        assert_eq!(newest(&st), (9, 3));
        assert_eq!(st.held.front().map(|h| h.seq), Some(1));
        assert_eq!(st.held(), 3);
        assert_eq!(st.acks, [(3, 0)]);
    }
}
