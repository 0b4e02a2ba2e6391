//! eBPF method: one hash map of frozen 4-tuples and a tcx program on ingress
//! and egress of every interface of the namespace, all pinned under
//! /sys/fs/bpf/ferry/<name>/ so they outlive the process that froze.

use crate::{netns, NetlockError, Tuple};
use aya::maps::Map;
use aya::programs::links::{FdLink, LinkOrder, PinnedLink};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::programs::tc::TcAttachOptions;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// The BPF object compiled by build.rs from bpf/netlock.bpf.c.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/netlock.bpf.o"));

const BPFFS: &str = "/sys/fs/bpf";
const PIN_ROOT: &str = "/sys/fs/bpf/ferry";
const MAP_PIN: &str = "map";

/// `struct tuple_key` of netlock.bpf.c: 40 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy)]
struct TupleKey {
    family: u8,
    pad: [u8; 3],
    local_addr: [u8; 16],
    remote_addr: [u8; 16],
    /// Network byte order, as in the packet.
    local_port: [u8; 2],
    remote_port: [u8; 2],
}

// SAFETY: repr(C), every field a byte array, 1+3+16+16+2+2 = 40 bytes with
// alignment 1: no padding; any bit pattern is valid.
unsafe impl ferry_sys::bpf::MapPod for TupleKey {}

fn addr_bytes(ip: IpAddr) -> (u8, [u8; 16]) {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => {
            out[..4].copy_from_slice(&v4.octets());
            (libc::AF_INET as u8, out)
        }
        IpAddr::V6(v6) => (libc::AF_INET6 as u8, v6.octets()),
    }
}

fn key(tuple: &Tuple) -> TupleKey {
    let (family, local_addr) = addr_bytes(tuple.local.ip());
    let (_, remote_addr) = addr_bytes(tuple.remote.ip());
    TupleKey {
        family,
        pad: [0; 3],
        local_addr,
        remote_addr,
        local_port: tuple.local.port().to_be_bytes(),
        remote_port: tuple.remote.port().to_be_bytes(),
    }
}

pub(crate) fn pin_dir(name: &str) -> PathBuf {
    Path::new(PIN_ROOT).join(name)
}

fn ensure_bpffs(lock: &str) -> Result<(), NetlockError> {
    let bpffs = Path::new(BPFFS);
    let sys = |what: &str, source| NetlockError::Sys { lock: lock.to_string(), what: format!("{what} {BPFFS}"), source };
    if !ferry_sys::netns::is_bpffs(bpffs).map_err(|e| sys("checking", e))? {
        ferry_sys::netns::mount_bpffs(bpffs).map_err(|e| sys("mounting bpffs on", e))?;
    }
    Ok(())
}

/// Loads the program, fills the map with one batch call and attaches to both
/// directions of every interface. On error the caller releases the pins.
pub(crate) fn freeze(lock: &str, netns_path: Option<&Path>, netns_desc: &str, tuples: &[Tuple]) -> Result<(), NetlockError> {
    ensure_bpffs(lock)?;
    let pins = pin_dir(lock);
    std::fs::create_dir_all(&pins).map_err(|source| NetlockError::Io { lock: lock.to_string(), what: "creating pin directory", path: pins.clone(), source })?;

    let max_entries = u32::try_from(tuples.len().max(1)).unwrap_or(u32::MAX);
    // The program needs no CO-RE relocation: btf(None) skips it. (aya
    // 0.13's EbpfLoader::new() still reads and parses the kernel's BTF,
    // /sys/kernel/btf/vmlinux, about 19 ms of the fixed cost.)
    let mut bpf = aya::EbpfLoader::new()
        .btf(None)
        .set_max_entries("frozen", max_entries)
        .load(OBJECT)
        .map_err(|source| NetlockError::BpfLoad { lock: lock.to_string(), source: Box::new(source) })?;

    let map = bpf.take_map("frozen").ok_or_else(|| NetlockError::BpfLoad { lock: lock.to_string(), source: Box::new(aya::EbpfError::MapError(aya::maps::MapError::InvalidName { name: "frozen".into() })) })?;
    let Map::HashMap(map) = map else {
        return Err(NetlockError::BpfMap { lock: lock.to_string(), what: "frozen has the wrong type", source: Box::new(aya::maps::MapError::InvalidName { name: "frozen".into() }) });
    };
    let map_pin = pins.join(MAP_PIN);
    map.pin(&map_pin).map_err(|source| NetlockError::BpfPin { lock: lock.to_string(), path: map_pin.clone(), source: Box::new(source) })?;
    let keys: Vec<TupleKey> = tuples.iter().map(key).collect();
    let values = vec![1u8; keys.len()];
    ferry_sys::bpf::map_update_batch(map.fd().as_fd(), &keys, &values)
        .map_err(|source| NetlockError::Sys { lock: lock.to_string(), what: format!("filling map with {} tuples", keys.len()), source })?;

    for (program, direction) in [("ferry_ingress", TcAttachType::Ingress), ("ferry_egress", TcAttachType::Egress)] {
        let prog_error = |what: &str, source| NetlockError::BpfProgram { lock: lock.to_string(), what: format!("{what} {program}"), source: Box::new(source) };
        let classifier: &mut SchedClassifier = bpf
            .program_mut(program)
            .ok_or_else(|| prog_error("finding", aya::programs::ProgramError::UnexpectedProgramType))?
            .try_into()
            .map_err(|e| prog_error("finding", e))?;
        classifier.load().map_err(|e| prog_error("loading", e))?;
        let direction_name = if direction == TcAttachType::Ingress { "ingress" } else { "egress" };
        // The link is created from a thread inside the target namespace:
        // the kernel resolves the ifindex in the caller's namespace.
        netns::run_in(lock, netns_path, || {
            let interfaces = ferry_sys::netns::interfaces().map_err(|source| NetlockError::Sys { lock: lock.to_string(), what: format!("listing interfaces of {netns_desc}"), source })?;
            for (index, interface) in interfaces {
                let attach_error = |source| NetlockError::BpfAttach {
                    lock: lock.to_string(),
                    interface: interface.clone(),
                    direction: direction_name,
                    netns: netns_desc.to_string(),
                    source: Box::new(source),
                };
                // First in the tcx chain: no other program sees a frozen packet.
                let link_id = classifier.attach_with_options(&interface, direction, TcAttachOptions::TcxOrder(LinkOrder::first())).map_err(attach_error)?;
                let link = classifier.take_link(link_id).map_err(attach_error)?;
                let path = pins.join(format!("link-{index}-{direction_name}"));
                let link = FdLink::try_from(link).map_err(|source| NetlockError::BpfLink { lock: lock.to_string(), path: path.clone(), source: Box::new(source) })?;
                link.pin(&path).map_err(|source| NetlockError::BpfPin { lock: lock.to_string(), path: path.clone(), source: Box::new(source) })?;
            }
            Ok(())
        })?;
    }
    // Dropping `bpf` closes the program and map fds here; the pins keep the
    // links (hence the programs) and the map alive.
    Ok(())
}

/// Removes the pins: links first, each closed through its own fd so the
/// kernel detaches it before this returns, then the map and the directory.
/// Missing pins are not an error (a freeze killed half-way).
pub(crate) fn release(lock: &str) -> Result<(), NetlockError> {
    let pins = pin_dir(lock);
    let entries = match std::fs::read_dir(&pins) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(NetlockError::Io { lock: lock.to_string(), what: "reading pin directory", path: pins, source }),
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    // "link-*" sorts before "map".
    paths.sort();
    for path in paths {
        let io = |what, source| NetlockError::Io { lock: lock.to_string(), what, path: path.clone(), source };
        let is_link = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("link-"));
        if is_link {
            if let Ok(pinned) = PinnedLink::from_pin(&path) {
                // unpin removes the file; dropping the FdLink then closes the
                // last reference, which detaches synchronously (a bare
                // unlink would defer the detach to a kernel work item).
                let link = pinned.unpin().map_err(|e| io("unpinning", e))?;
                drop(link);
                continue;
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing pin", e)),
        }
    }
    match std::fs::remove_dir(&pins) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NetlockError::Io { lock: lock.to_string(), what: "removing pin directory", path: pins, source }),
    }
}
