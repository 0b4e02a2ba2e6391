//! Output commit for hot-standby replication: every packet a service sends
//! from its address is held in the kernel until the standby has the state
//! that produced it.
//!
//! An [`Outbox`] puts a rule first in the `mangle OUTPUT` chain of the
//! service's network namespace that sends each packet with the service's
//! source address to an NFQUEUE, and binds that queue with metadata-only
//! copies: the kernel keeps the packets, ferry reads only their ids. The
//! replication loop freezes the service, takes a [`Mark`], reads the state,
//! ships it, and once the standby acknowledged it calls
//! [`Outbox::release_through`]: one batch verdict lets every packet up to
//! the mark go, in the order it was sent. [`Outbox::wait_output`] tells
//! the loop that new output waits, i.e. that a sync is due.
//!
//! Fail closed: the rule has no `--queue-bypass`. When nobody reads the
//! queue (ferry died, or the outbox was dropped without a release) the
//! kernel drops what was held and every packet that still matches, and TCP
//! sends it again later. Held output never leaves without a release.
//! [`Outbox::remove_stale`] (called by [`Outbox::hold`]) removes the rules
//! of a ferry process that is gone.

mod error;
mod exec;
mod nfq;
mod queue;
mod rule;

pub use error::OutboxError;
pub use rule::Hook;

use queue::{Queue, RequestError};
use rule::Owner;
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub type Result<T> = std::result::Result<T, OutboxError>;

/// The socket receive buffer asked for (SO_RCVBUFFORCE): about 20,000
/// queue messages, so the reader thread can be late by that many.
const RCVBUF: i32 = 16 << 20;

/// How an outbox binds its queue.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// NFQA_CFG_QUEUE_MAXLEN: packets held at most; beyond it the kernel
    /// drops (TCP sends again after the next release).
    pub queue_maxlen: u32,
    /// NFQA_CFG_F_GSO: a GSO packet is held whole instead of being cut
    /// into segments first, each queued on its own.
    pub gso: bool,
    /// Which packets are held, and where.
    pub hook: Hook,
    /// A thread reads the queue as packets come. Without it the queue is
    /// read in [`Outbox::mark`], [`Outbox::release_through`] and
    /// [`Outbox::wait_output`] only, and the caller stays single-threaded
    /// (ferry's capture forks, which a process with threads must not);
    /// the socket buffer holds what arrives in between.
    pub reader_thread: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { queue_maxlen: 65536, gso: true, hook: Hook::Output, reader_thread: true }
    }
}

/// A point in the outbox's output: every packet queued before
/// [`Outbox::mark`] returned it. Only meaningful to the outbox that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The kernel's id of the newest packet (0 when none was queued yet).
    id: u32,
    /// How many packets the outbox had seen.
    seq: u64,
}

/// Counters of an outbox since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Packets held now.
    pub held: usize,
    /// Packets queued so far.
    pub queued: u64,
    /// Packets released so far.
    pub released: u64,
    /// Batch verdicts sent.
    pub releases: u64,
    /// The longest time a released packet was held.
    pub longest_hold: Duration,
    /// Queue messages lost to a full socket buffer: the kernel dropped
    /// those packets instead of holding them (TCP sends them again).
    pub overruns: u64,
}

/// Output commit for one address in one network namespace; see the crate
/// documentation.
pub struct Outbox {
    queue: Arc<Queue>,
    reader: Option<JoinHandle<std::result::Result<(), i32>>>,
    stop: File,
    netns: Option<PathBuf>,
    address: IpAddr,
    hook: Hook,
    comment: String,
    context: String,
    removed: bool,
}

fn next_seq() -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

fn describe(netns: Option<&Path>) -> String {
    netns.map_or_else(|| "the current netns".to_string(), |p| format!("netns {}", p.display()))
}

fn own_start_time(context: &str) -> Result<u64> {
    let path = Path::new("/proc/self/stat");
    let stat = std::fs::read_to_string(path).map_err(|source| OutboxError::Io {
        context: context.to_string(),
        what: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    rule::start_time(&stat).ok_or_else(|| OutboxError::Io {
        context: context.to_string(),
        what: "parsing",
        path: path.to_path_buf(),
        source: std::io::ErrorKind::InvalidData.into(),
    })
}

/// Whether the process a rule names still runs (same PID, same start).
fn owner_alive(owner: &Owner) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", owner.pid))
        .ok()
        .and_then(|s| rule::start_time(&s))
        .is_some_and(|start| start == owner.start)
}

impl Outbox {
    /// Holds every packet sent from `address` in the network namespace at
    /// `netns` (an nsfs file such as /run/netns/NAME or /proc/PID/ns/net;
    /// None: the caller's), on NFQUEUE `queue_num`, with [`Config`]'s
    /// defaults. Packets already sent are not held.
    pub fn hold(netns: Option<&Path>, address: IpAddr, queue_num: u16) -> Result<Outbox> {
        Outbox::hold_with(netns, address, queue_num, Config::default())
    }

    /// [`Outbox::hold`] with a chosen queue configuration.
    pub fn hold_with(
        netns: Option<&Path>,
        address: IpAddr,
        queue_num: u16,
        config: Config,
    ) -> Result<Outbox> {
        let context = format!("outbox of {address} on nfqueue {queue_num} in {}", describe(netns));
        Outbox::remove_stale(netns)?;
        let owner =
            Owner { pid: std::process::id(), start: own_start_time(&context)?, queue: queue_num };
        let sock = exec::run_in(&context, netns, || {
            let sys = |source| OutboxError::Sys { context: context.clone(), source };
            let fd = ferry_sys::socket::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK,
                nfq::NETLINK_NETFILTER,
            )
            .map_err(sys)?;
            set_rcvbuf(&fd).map_err(sys)?;
            Ok(fd)
        })?;
        let queue = Arc::new(Queue::new(File::from(sock), queue_num));
        {
            let mut st = queue.lock();
            let seq = next_seq();
            let msg = nfq::bind(queue_num, seq, config.queue_maxlen, config.gso);
            queue
                .request(&mut st, &msg, seq)
                .map_err(|e| request_error(&context, "NFQNL_CFG_CMD_BIND", queue_num, e))?;
        }
        let (stop_rx, stop_tx) = ferry_sys::fd::pipe2(libc::O_CLOEXEC)
            .map_err(|source| OutboxError::Sys { context: context.clone(), source })?;
        let reader = if config.reader_thread {
            let reader_queue = Arc::clone(&queue);
            let stop_rx = File::from(stop_rx);
            Some(
                std::thread::Builder::new()
                    .name(format!("outbox-q{queue_num}"))
                    .spawn(move || queue::reader(&reader_queue, stop_rx))
                    .map_err(|source| OutboxError::Spawn {
                        context: context.clone(),
                        command: "the queue reader thread".into(),
                        source,
                    })?,
            )
        } else {
            None
        };
        let mut outbox = Outbox {
            queue,
            reader,
            stop: File::from(stop_tx),
            netns: netns.map(Path::to_path_buf),
            address,
            hook: config.hook,
            comment: owner.comment(),
            context,
            removed: true,
        };
        let batch = rule::insert_batch(config.hook, address, queue_num, &outbox.comment);
        outbox.iptables_restore(&batch)?;
        outbox.removed = false;
        Ok(outbox)
    }

    /// Removes every outbox rule in the namespace whose owner (a ferry
    /// process, named in the rule's comment) no longer runs: after a crash
    /// its service's output would otherwise be dropped for good. The
    /// number of rules removed.
    pub fn remove_stale(netns: Option<&Path>) -> Result<usize> {
        Self::remove_stale_counting(netns).map(|(removed, _)| removed)
    }

    /// [`Outbox::remove_stale`], also counting the outbox rules it left
    /// (their owners run): (removed, left).
    pub fn remove_stale_counting(netns: Option<&Path>) -> Result<(usize, usize)> {
        let context = format!("removing stale outbox rules in {}", describe(netns));
        let (mut removed, mut left) = (0, 0);
        for v6 in [false, true] {
            let tool = if v6 { "ip6tables" } else { "iptables" };
            let listing =
                exec::run_command(&context, netns, tool, &["-w", "5", "-t", "mangle", "-S"], "")?;
            let deletes = rule::stale_deletes(&listing, owner_alive);
            left += rule::stale_deletes(&listing, |_| false).len() - deletes.len();
            if deletes.is_empty() {
                continue;
            }
            let batch = format!("*mangle\n{}\nCOMMIT\n", deletes.join("\n"));
            exec::run_command(
                &context,
                netns,
                rule::restore_tool(v6),
                &["-w", "5", "--noflush"],
                &batch,
            )?;
            removed += deletes.len();
        }
        Ok((removed, left))
    }

    /// The newest packet queued so far: every packet queued before this
    /// call is at or before the mark. Take it while the service is frozen
    /// and before its state is read: whatever the kernel sends after the
    /// mark (an ACK for data that arrived meanwhile) then waits for the
    /// next sync, whose state covers it.
    pub fn mark(&self) -> Result<Mark> {
        let mut st = self.queue.drained().map_err(|errno| self.read_error(errno))?;
        let (id, seq) = queue::newest(&st);
        st.marked = seq;
        Ok(Mark { id, seq })
    }

    /// Lets every held packet up to `mark` go, in order, with one batch
    /// verdict (NFQNL_MSG_VERDICT_BATCH); packets queued after the mark
    /// stay held. How many were released.
    pub fn release_through(&self, mark: Mark) -> Result<usize> {
        let mut st = self.queue.drained().map_err(|errno| self.read_error(errno))?;
        self.queue
            .release(&mut st, mark.id, mark.seq, next_seq())
            .map_err(|e| request_error(&self.context, "NFQNL_MSG_VERDICT_BATCH", self.queue.num, e))
    }

    /// Waits until a packet newer than the last mark is queued (true) or
    /// `timeout` passed (false).
    pub fn wait_output(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if self.reader.is_none() {
            return queue::wait_unread(&self.queue, deadline);
        }
        let mut st = self.queue.lock();
        loop {
            if st.queued > st.marked {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = match self.queue.output.wait_timeout(st, left) {
                Ok((st, _)) => st,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Packets held now.
    pub fn held(&self) -> Result<usize> {
        let st = self.queue.drained().map_err(|errno| self.read_error(errno))?;
        Ok(st.held())
    }

    pub fn stats(&self) -> OutboxStats {
        let st = self.queue.lock();
        OutboxStats {
            held: st.held(),
            queued: st.queued,
            released: st.released,
            releases: st.releases,
            longest_hold: st.longest_hold,
            overruns: st.overruns,
        }
    }

    /// Removes the rule, then unbinds the queue: packets still held are
    /// dropped by the kernel and never leave (the fencing property of
    /// output commit); the service's later packets flow freely. Dropping
    /// the outbox does the same and ignores errors.
    pub fn remove(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let rule = if self.removed {
            Ok(())
        } else {
            let batch = rule::delete_batch(self.hook, self.address, self.queue.num, &self.comment);
            let r = self.iptables_restore(&batch);
            self.removed = r.is_ok();
            r
        };
        if let Some(reader) = self.reader.take() {
            // The reader sleeps in poll on the socket and this pipe.
            let _ = self.stop.write_all(&[1]);
            let _ = reader.join();
            let mut st = self.queue.lock();
            let seq = next_seq();
            let msg = nfq::unbind(self.queue.num, seq);
            // Closing the socket unbinds too; this only reports errors.
            let unbind = self.queue.request(&mut st, &msg, seq);
            drop(st);
            rule?;
            return unbind.map_err(|e| {
                request_error(&self.context, "NFQNL_CFG_CMD_UNBIND", self.queue.num, e)
            });
        }
        rule
    }

    fn iptables_restore(&self, batch: &str) -> Result<()> {
        let tool = rule::restore_tool(self.address.is_ipv6());
        exec::run_command(
            &self.context,
            self.netns.as_deref(),
            tool,
            &["-w", "5", "--noflush"],
            batch,
        )
        .map(drop)
    }

    fn read_error(&self, errno: i32) -> OutboxError {
        OutboxError::Sys {
            context: self.context.clone(),
            source: ferry_sys::SysError::new("read(nfqueue socket)", errno),
        }
    }
}

/// [`Outbox::remove`] with errors ignored: the rule goes, the queue is
/// unbound and the kernel drops what it still held (never sent).
impl Drop for Outbox {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

fn request_error(context: &str, request: &'static str, queue: u16, e: RequestError) -> OutboxError {
    let context = context.to_string();
    match e {
        RequestError::Socket(errno) => OutboxError::Netlink { context, request, queue, errno },
        RequestError::Kernel(errno) => OutboxError::Netlink { context, request, queue, errno },
        RequestError::NoAnswer => OutboxError::NoAnswer { context, request, queue },
    }
}

/// A receive buffer above net.core.rmem_max (root may, SO_RCVBUFFORCE);
/// the plain option, capped at rmem_max, for anyone else.
fn set_rcvbuf(fd: &OwnedFd) -> ferry_sys::SysResult<()> {
    use std::os::fd::AsRawFd;
    let raw = fd.as_raw_fd();
    ferry_sys::socket::setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF).or_else(
        |e| match e.errno {
            libc::EPERM => {
                ferry_sys::socket::setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF)
            }
            _ => Err(e),
        },
    )
}
