//! Before anything moves: what the source was asked to move is checked,
//! and the destination's agent is connected and greeted (Hello, answered
//! by Welcome or Refused).

use super::MigrateOptions;
use crate::error::{MigrateError, Result};
use crate::protocol::{self, Hello, Msg};
use ferry_transport::Channel;
use std::net::TcpStream;

/// Refusals that need no destination: nothing is frozen or sent yet.
pub(super) fn check_source(o: &MigrateOptions) -> Result<()> {
    if let Some((addr, _)) = o.address {
        crate::address::locate(addr)?;
    }
    if !std::path::Path::new(&format!("/proc/{}", o.pid)).exists() {
        return Err(MigrateError::Invalid(format!("pid {}: no such process", o.pid)));
    }
    if o.lazy {
        crate::postcopy::check_single_process(o.pid)?;
    }
    Ok(())
}

/// The channel to the destination's agent once it welcomed this
/// migration, and the migration's ID (the final image's parent ID).
pub(super) fn connect(o: &MigrateOptions) -> Result<(Channel, u64)> {
    (o.progress)(&format!("connecting to {}", o.to));
    let stream = TcpStream::connect_timeout(&o.to, o.timeout)
        .map_err(|e| MigrateError::Invalid(format!("connecting to ferryd at {}: {e}", o.to)))?;
    let _ = stream.set_nodelay(true);
    let mut ch = Channel::connect(stream, &o.key, o.mode)?;
    ch.set_timeout(Some(o.timeout))?;
    let migration_id = random_id();
    protocol::send(&mut ch, &Msg::Hello(hello(o, migration_id)))?;
    protocol::expect(&mut ch, &["Welcome"])?;
    Ok((ch, migration_id))
}

fn hello(o: &MigrateOptions, migration_id: u64) -> Hello {
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
    }
}

fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b) ^ std::process::id() as u64
}
