//! The destination's first answer: the source's Hello checked (protocol,
//! image format, architecture, a service address it can carry, then what
//! only this host can refuse: `checks.rs`) and answered with Welcome,
//! Refused with the reason, or Unfit with every problem.

use super::DestinationConfig;
use crate::error::{MigrateError, Result};
use crate::protocol::{self, Hello, Msg, Welcome};
use ferry_netlock::NetworkLock;
use ferry_transport::Channel;

/// The source's Hello, once this agent can serve what it asks and this
/// host can take the tree, with the checks' notes for the Welcome.
pub(super) fn receive(ch: &mut Channel, cfg: &DestinationConfig) -> Result<(Hello, Vec<String>)> {
    let hello = protocol::expect(ch, &["Hello"])?;
    let Msg::Hello(hello) = hello.msg else { unreachable!("expect checked the kind") };
    if let Err(reason) = check_hello(&hello, cfg) {
        protocol::send(ch, &Msg::Refused { reason: reason.clone() })?;
        return Err(MigrateError::Refused(reason));
    }
    let verdict = super::checks::check(&hello, cfg);
    if !verdict.problems.is_empty() {
        protocol::send(ch, &Msg::Unfit { problems: verdict.problems.clone() })?;
        return Err(MigrateError::Unfit(verdict.problems));
    }
    Ok((hello, verdict.notes))
}

/// Loading and attaching the lock's program takes tens of ms: done
/// before the source is welcomed, so it never falls in the freeze (a
/// stop-and-copy or post-copy source freezes right after Welcome);
/// engaged with the image's connections later.
pub(super) fn prepare_lock(cfg: &DestinationConfig) -> Result<NetworkLock> {
    Ok(NetworkLock::prepare(cfg.network_lock, &ferry_netlock::Netns::Current, "migrate")?)
}

pub(super) fn welcome(ch: &mut Channel, cfg: &DestinationConfig, notes: Vec<String>) -> Result<()> {
    let interface = cfg.interface.map(|i| format!("ifindex {i}"));
    protocol::send(
        ch,
        &Msg::Welcome(Welcome {
            ferry_version: env!("CARGO_PKG_VERSION").to_string(),
            kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            interface,
            notes,
        }),
    )
}

fn check_hello(h: &Hello, cfg: &DestinationConfig) -> std::result::Result<(), String> {
    if h.protocol != protocol::PROTOCOL_VERSION {
        return Err(format!(
            "migration protocol {} (this ferryd speaks {})",
            h.protocol,
            protocol::PROTOCOL_VERSION
        ));
    }
    let (major, minor) = crate::FORMAT;
    if h.format.0 != major || h.format.1 > minor {
        return Err(format!(
            "the source writes image format {}.{}, this ferryd reads {major}.0 to {major}.{minor}: upgrade ferry here",
            h.format.0, h.format.1
        ));
    }
    if h.arch != std::env::consts::ARCH {
        return Err(format!("the source is {}, this host {}", h.arch, std::env::consts::ARCH));
    }
    if h.address.is_some() && cfg.interface.is_none() {
        return Err("this ferryd has no interface for a service address (start it with --interface, or listen on an interface's address)".into());
    }
    Ok(())
}
