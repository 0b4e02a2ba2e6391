//! Before anything moves: what the source was asked to move is checked,
//! the running tree's IDs and sockets are listed, and the destination's
//! agent is connected and greeted (Hello, answered by Welcome, Refused,
//! or Unfit with every problem its checks found).

use super::MigrateOptions;
use crate::error::{MigrateError, Result};
use crate::protocol::{self, Hello, Msg, RunningTree};
use ferry_transport::Channel;
use std::net::TcpStream;

/// Refusals that need no destination: nothing is frozen or sent yet.
pub fn check_source(o: &MigrateOptions) -> Result<()> {
    if let Some((addr, _)) = o.address {
        crate::address::locate(addr)?;
    }
    if !std::path::Path::new(&format!("/proc/{}", o.pid)).exists() {
        return Err(MigrateError::Invalid(format!("pid {}: no such process", o.pid)));
    }
    if o.lazy {
        crate::postcopy::check_single_process(o.pid)?;
    }
    // Before any pre-copy round: the capture checks it again.
    let opts = ferry_engine::capture::CaptureOptions {
        parent_sees_exit: o.parent_sees_exit,
        ..Default::default()
    };
    ferry_engine::capture::check_part_of_tree(o.pid, &opts)?;
    Ok(())
}

/// The channel to the destination's agent once it welcomed this
/// migration.
pub struct Connected {
    pub ch: Channel,
    /// The final image's parent ID.
    pub migration_id: u64,
    /// What the destination's checks noted (no problem, worth saying).
    pub notes: Vec<String>,
    /// How many IDs and sockets the destination checked.
    pub checked: (usize, usize),
}

/// Lists the running tree, connects, and sends the Hello: the
/// destination answers Welcome, or refuses with every problem it found
/// (MigrateError::Unfit), before anything is frozen.
pub(super) fn connect(o: &MigrateOptions, dry_run: bool) -> Result<Connected> {
    connect_with(o, dry_run, None)
}

/// [`connect`], for a migration (`replica` None) or to a standby.
pub fn connect_with(
    o: &MigrateOptions,
    dry_run: bool,
    replica: Option<crate::protocol::ReplicaHello>,
) -> Result<Connected> {
    connect_shipping(o, dry_run, replica, &|_| false)
}

/// [`connect_with`], for a tree some of whose files travel with it
/// (`shipped(path)`: replication's data directories): the destination
/// does not look for those, it gets them.
pub fn connect_shipping(
    o: &MigrateOptions,
    dry_run: bool,
    replica: Option<crate::protocol::ReplicaHello>,
    shipped: &dyn Fn(&str) -> bool,
) -> Result<Connected> {
    let list = || {
        let mut tree = ferry_engine::running_sockets::running_tree_sockets(o.pid);
        tree.files.retain(|f| !shipped(&f.path));
        tree
    };
    let tree = list();
    let sent: Vec<String> = tree.files.iter().map(|f| f.path.clone()).collect();
    match hello_once(o, dry_run, replica.clone(), tree) {
        // The files were listed while the tree ran: one it held for a
        // moment (a file written and renamed into place) may be gone
        // when the destination looks. Asked once more, with what the
        // tree holds now, when that changed.
        Err(MigrateError::Unfit(problems)) => {
            let tree = list();
            let now: Vec<String> = tree.files.iter().map(|f| f.path.clone()).collect();
            if now == sent {
                return Err(MigrateError::Unfit(problems));
            }
            (o.progress)(
                "the tree's open files changed while the destination checked them: asking again",
            );
            hello_once(o, dry_run, replica, tree)
        }
        other => other,
    }
}

/// One Hello with `tree` on a new connection, and its answer.
fn hello_once(
    o: &MigrateOptions,
    dry_run: bool,
    replica: Option<crate::protocol::ReplicaHello>,
    tree: RunningTree,
) -> Result<Connected> {
    let checked = (tree.ids.len(), tree.sockets.len());
    (o.progress)(&format!("connecting to {}", o.to));
    let stream = TcpStream::connect_timeout(&o.to, o.timeout)
        .map_err(|e| MigrateError::Invalid(format!("connecting to ferryd at {}: {e}", o.to)))?;
    let _ = stream.set_nodelay(true);
    crate::link::watch(&stream)?;
    let mut ch = Channel::connect(stream, &o.key, o.mode)?;
    ch.set_timeout(Some(o.timeout))?;
    let migration_id = random_id();
    let mut hello = hello(o, migration_id, tree, dry_run);
    hello.replica = replica;
    protocol::send(&mut ch, &Msg::Hello(hello))?;
    let welcome = protocol::expect(&mut ch, &["Welcome"])?;
    let Msg::Welcome(welcome) = welcome.msg else { unreachable!("expect checked the kind") };
    for note in &welcome.notes {
        (o.progress)(&format!("destination: {note}"));
    }
    Ok(Connected { ch, migration_id, notes: welcome.notes, checked })
}

fn hello(o: &MigrateOptions, migration_id: u64, tree: RunningTree, dry_run: bool) -> Hello {
    let (major, minor) = crate::FORMAT;
    Hello {
        protocol: protocol::PROTOCOL_VERSION,
        ferry_version: env!("CARGO_PKG_VERSION").to_string(),
        format: (major, minor),
        arch: std::env::consts::ARCH.to_string(),
        kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        migration_id,
        root_pid: o.pid,
        lazy: o.lazy,
        address: o.address,
        tree,
        dry_run,
        replica: None,
    }
}

fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b) ^ std::process::id() as u64
}
