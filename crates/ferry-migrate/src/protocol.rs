//! The messages two agents exchange during a migration, over one
//! [`ferry_transport::Channel`].
//!
//! Every channel message is `[u32 LE header length][postcard header][data]`:
//! the header is a [`Msg`], the data the raw bytes some messages carry
//! (page contents), so pages need no copy into the header's encoding.
//!
//! ```text
//! source                                 destination
//!   Hello (with the running tree's IDs
//!          and sockets) ---------------->  checks versions, arch, address,
//!                                          and what only it can refuse
//!         <-------------------------------  Welcome | Refused | Unfit
//!   [--dry-run: the source stops here]
//!   Pages (round 0: all memory) ------->    into the page store
//!   RoundDone --------------------------->
//!         <-------------------------------  RoundStored (all of it stored)
//!   Pages (round n: pages written since)    ...
//!   [freeze] Pages (final dirty pages)
//!   Image (metadata, parent pages) ----->   lock, address, restore (held)
//!         <-------------------------------  Ready | Failed
//!   Commit ------------------------------>  release the tree, announce
//!         <-------------------------------  Running | Failed
//!   [kill the source's copy]
//! ```
//!
//! The source aborts by closing the connection (or sending Abort); the
//! destination then kills whatever it restored. Post-copy adds
//! PageRequest (destination to source) and Pages answering them.

use crate::error::{MigrateError, Result};
use ferry_transport::Channel;
use serde::{Deserialize, Serialize};

/// Bumped when a message changes meaning; two agents must agree on it.
/// 2: the destination answers each RoundDone with RoundStored.
/// 3: Hello carries the running tree and dry_run; Unfit; Welcome's notes.
/// 4: the running tree carries the files it maps or holds open by path.
/// 5: Hello may ask for a standby (replication); SyncDone, SyncStored,
///    Heartbeat and Unprotect. (DataDirs and DirStream came later, at
///    the end: a peer that lacks them fails to decode them, by name.)
pub const PROTOCOL_VERSION: u32 = 5;

pub use ferry_engine::running_sockets::{RunningSocket, RunningTree, SocketRole};

pub use crate::problem::Problem;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Hello {
    pub protocol: u32,
    pub ferry_version: String,
    /// Image format (major, minor) the source writes.
    pub format: (u32, u32),
    pub arch: String,
    pub kernel_release: String,
    pub migration_id: u64,
    /// The tree's root as the source sees it (as Pages messages name it).
    pub root_pid: i32,
    /// Post-copy: resume at the destination before the memory is there.
    pub lazy: bool,
    /// The service address that moves with the process: (address, prefix).
    pub address: Option<(std::net::IpAddr, u8)>,
    /// The tree's IDs and sockets, read while it runs, for the checks
    /// only the destination can make (destination/checks.rs).
    pub tree: RunningTree,
    /// Only the checks: the source closes after the answer.
    pub dry_run: bool,
    /// Replication: the agent keeps a standby copy, synced again and
    /// again, instead of restoring the tree once.
    pub replica: Option<ReplicaHello>,
}

/// What a standby needs to know of the service it protects.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReplicaHello {
    /// The service's name in the fencing store (its owner key).
    pub service: String,
    /// The primary's name there, and the epoch it holds the service at.
    pub holder: String,
    pub epoch: u64,
    /// The standby takes over when it hears nothing for this long.
    pub heartbeat_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Welcome {
    pub ferry_version: String,
    pub kernel_release: String,
    /// The interface the service address will be put on.
    pub interface: Option<String>,
    /// What the checks found that is no problem but worth saying (a PID
    /// taken here, so the tree gets a PID namespace of its own).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Msg {
    Hello(Hello),
    Welcome(Welcome),
    Refused {
        reason: String,
    },
    /// The restore would fail here, for every one of these reasons.
    Unfit {
        problems: Vec<Problem>,
    },
    /// Page contents of process `pid` (as the source sees it): `ranges`
    /// are (address, bytes), their bytes concatenated in the data.
    Pages {
        pid: i32,
        ranges: Vec<(u64, u64)>,
    },
    /// The private anonymous mappings (start, end) of process `pid` as the
    /// source saw them before sending its pages: the destination reserves
    /// each as one placed region, so the restored root can inherit it as
    /// one mapping.
    Layout {
        pid: i32,
        mappings: Vec<(u64, u64)>,
    },
    /// A pre-copy round is complete.
    RoundDone {
        round: u32,
        bytes: u64,
    },
    /// The destination has stored every page of pre-copy round `round`.
    /// The source waits for it before it looks at what was written
    /// meanwhile (and before it freezes): pages still on their way would
    /// otherwise be stored inside the pause.
    RoundStored {
        round: u32,
    },
    /// The frozen tree's metadata (meta.img bytes, an incremental image
    /// when pre-copy rounds ran: its parent is the pages the destination
    /// holds from them); `host_pids` are the PIDs its processes had on the
    /// source (as Pages named them), in image order.
    Image {
        #[serde(with = "serde_bytes")]
        meta: Vec<u8>,
        host_pids: Vec<i32>,
    },
    /// The tree is restored and held stopped; the restore's phases in ms.
    Ready {
        phases: Vec<(String, f64)>,
    },
    Commit,
    /// The tree runs at the destination, as `host_pid` there.
    Running {
        pid: i32,
        host_pid: i32,
        phases: Vec<(String, f64)>,
    },
    Failed {
        error: String,
    },
    Abort {
        reason: String,
    },
    /// Post-copy: the destination needs these pages now.
    PageRequest {
        pid: i32,
        addr: u64,
        pages: u32,
    },
    /// Post-copy: every page has been sent.
    PagesDone,
    /// Replication: sync `seq` is complete (its pages and its Image sent).
    SyncDone {
        seq: u64,
    },
    /// Replication: the standby holds sync `seq` whole; the output it
    /// covers may leave.
    SyncStored {
        seq: u64,
    },
    /// Replication: both sides are alive; `seq` is the last sync the
    /// sender sent or stored.
    Heartbeat {
        seq: u64,
    },
    /// Replication ends on purpose: the service runs on at the primary,
    /// unprotected, and the standby drops its copy.
    Unprotect,
    /// Replication with `--data-dir`: the directories whose files are
    /// part of the replicated state (btrfs subvolumes, the same paths on
    /// both hosts); `DirStream`'s `dir` is an index into this list. Sent
    /// once, before the first sync.
    DataDirs {
        dirs: Vec<String>,
    },
    /// Replication: the next bytes (in the data) of the btrfs send stream
    /// of data directory `dir` for the sync on its way.
    DirStream {
        dir: u32,
    },
}

impl Msg {
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello(_) => "Hello",
            Msg::Welcome(_) => "Welcome",
            Msg::Refused { .. } => "Refused",
            Msg::Unfit { .. } => "Unfit",
            Msg::Pages { .. } => "Pages",
            Msg::RoundDone { .. } => "RoundDone",
            Msg::RoundStored { .. } => "RoundStored",
            Msg::Layout { .. } => "Layout",
            Msg::Image { .. } => "Image",
            Msg::Ready { .. } => "Ready",
            Msg::Commit => "Commit",
            Msg::Running { .. } => "Running",
            Msg::Failed { .. } => "Failed",
            Msg::Abort { .. } => "Abort",
            Msg::PageRequest { .. } => "PageRequest",
            Msg::PagesDone => "PagesDone",
            Msg::SyncDone { .. } => "SyncDone",
            Msg::SyncStored { .. } => "SyncStored",
            Msg::Heartbeat { .. } => "Heartbeat",
            Msg::Unprotect => "Unprotect",
            Msg::DataDirs { .. } => "DataDirs",
            Msg::DirStream { .. } => "DirStream",
        }
    }
}

/// The header of a message, encoded with its length in front.
pub fn encode_header(msg: &Msg) -> Result<Vec<u8>> {
    let body = postcard::to_allocvec(msg)
        .map_err(|e| MigrateError::Protocol(format!("encoding {}: {e}", msg.name())))?;
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Splits a received channel message into its header and its data.
pub fn decode(bytes: &[u8]) -> Result<(Msg, &[u8])> {
    let len = bytes.get(..4).ok_or_else(|| {
        MigrateError::Protocol(format!("message of {} bytes has no header", bytes.len()))
    })?;
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let body = bytes.get(4..4 + len).ok_or_else(|| {
        MigrateError::Protocol(format!("header of {len} bytes in a message of {}", bytes.len()))
    })?;
    let msg: Msg = postcard::from_bytes(body)
        .map_err(|e| MigrateError::Protocol(format!("undecodable message: {e}")))?;
    Ok((msg, &bytes[4 + len..]))
}

pub fn send(ch: &mut Channel, msg: &Msg) -> Result<()> {
    let head = encode_header(msg)?;
    ch.send(&head)?;
    Ok(())
}

pub fn send_with_data(ch: &mut Channel, msg: &Msg, data: &[u8]) -> Result<()> {
    let head = encode_header(msg)?;
    ch.send_parts(&[&head, data])?;
    Ok(())
}

/// Receives one message; its data (if any) stays in the returned buffer
/// after `data_start`.
pub struct Received {
    pub msg: Msg,
    pub buf: Vec<u8>,
    pub data_start: usize,
}

impl Received {
    pub fn data(&self) -> &[u8] {
        &self.buf[self.data_start..]
    }
}

/// [`send_with_data`] on the sending half of a split channel (post-copy).
pub fn send_half(tx: &mut ferry_transport::SendHalf, msg: &Msg, data: &[u8]) -> Result<()> {
    let head = encode_header(msg)?;
    tx.send_parts(&[&head, data])?;
    Ok(())
}

/// [`recv`] on the receiving half of a split channel (post-copy).
pub fn recv_half(rx: &mut ferry_transport::RecvHalf) -> Result<Received> {
    let buf = rx.recv()?;
    let (msg, data) = decode(&buf)?;
    let data_start = buf.len() - data.len();
    Ok(Received { msg, buf, data_start })
}

pub fn recv(ch: &mut Channel) -> Result<Received> {
    let buf = ch.recv()?;
    let (msg, data) = decode(&buf)?;
    let data_start = buf.len() - data.len();
    Ok(Received { msg, buf, data_start })
}

/// Receives one message that must be one of those `expect` names; a
/// Failed or Refused from the peer becomes that error.
pub fn expect(ch: &mut Channel, expect: &[&str]) -> Result<Received> {
    let r = recv(ch)?;
    match &r.msg {
        m if expect.contains(&m.name()) => Ok(r),
        Msg::Failed { error } => Err(MigrateError::DestinationFailed(error.clone())),
        Msg::Refused { reason } => Err(MigrateError::Refused(reason.clone())),
        Msg::Unfit { problems } => Err(MigrateError::Unfit(problems.clone())),
        Msg::Abort { reason } => Err(MigrateError::Aborted(reason.clone())),
        m => Err(MigrateError::Protocol(format!(
            "expected {} from the peer, got {}",
            expect.join(" or "),
            m.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_data_round_trip() {
        let msg = Msg::Pages { pid: 7, ranges: vec![(0x1000, 8192)] };
        let mut wire = encode_header(&msg).unwrap();
        wire.extend_from_slice(&[1u8; 8192]);
        let (back, data) = decode(&wire).unwrap();
        assert_eq!(back, msg);
        assert_eq!(data.len(), 8192);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [&[][..], &[1, 0], &[200, 0, 0, 0, 1], &[3, 0, 0, 0, 0xff, 0xff, 0xff]] {
            assert!(decode(bad).is_err());
        }
    }
}
