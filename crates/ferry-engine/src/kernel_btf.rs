//! What ferry's BPF iterators need to know of the running kernel's types
//! (a function's BTF id, where a structure member lies), read from
//! /sys/kernel/btf/vmlinux and kept in [`CACHE`] under the boot id.
//!
//! Parsing the 5 MiB of BTF takes tens of milliseconds (over 100 under
//! load), and the iterators are loaded inside a checkpoint's freeze and a
//! restore's own check: without the cache every command would pay it,
//! in the pause. The BTF cannot change without a reboot, so the boot id
//! keys the entries; a stale or damaged file is ignored. A wrong entry
//! could only make a program fail to load (then ferry reads what it
//! needs another way) or disagree with what /proc shows, which every
//! user of an iterator treats as "read it the slow way".

use crate::btf::{Btf, KIND_FUNC, KIND_STRUCT};
use std::collections::BTreeMap;

pub const CACHE: &str = "/run/ferry/btf-facts";
const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The facts asked for, from the cache or the BTF (parsed at most once).
pub struct KernelBtf {
    boot: Option<String>,
    known: BTreeMap<String, u32>,
    parsed: Option<Btf>,
    added: bool,
}

impl KernelBtf {
    pub fn open() -> KernelBtf {
        let boot = boot_id();
        let known = boot
            .as_deref()
            .and_then(|b| parse_cache(&std::fs::read_to_string(CACHE).ok()?, b))
            .unwrap_or_default();
        KernelBtf { boot, known, parsed: None, added: false }
    }

    /// The BTF id of the kernel function `name`.
    pub fn func(&mut self, name: &str) -> Result<u32, String> {
        self.fact(format!("func {name}"), |btf| {
            btf.find(KIND_FUNC, name).ok_or_else(|| format!("the kernel's BTF has no {name}"))
        })
    }

    /// The bit offset of `member` in `struct strukt` (anonymous members
    /// looked into, bitfields too).
    pub fn bits(&mut self, strukt: &str, member: &str) -> Result<u32, String> {
        self.fact(format!("bits {strukt}.{member}"), |btf| {
            let id = btf
                .find(KIND_STRUCT, strukt)
                .ok_or_else(|| format!("the kernel's BTF has no struct {strukt}"))?;
            btf.member_bit_offset(id, member)
                .ok_or_else(|| format!("the kernel's BTF has no {strukt}.{member}"))
        })
    }

    /// The byte offset of `member` in `struct strukt`, as `T`.
    pub fn byte<T: TryFrom<u32>>(&mut self, strukt: &str, member: &str) -> Result<T, String> {
        let bits = self.bits(strukt, member)?;
        if bits % 8 != 0 {
            return Err(format!("{strukt}.{member} is not byte-aligned"));
        }
        T::try_from(bits / 8).map_err(|_| format!("{strukt}.{member} lies at byte {}", bits / 8))
    }

    fn fact(
        &mut self,
        key: String,
        read: impl FnOnce(&Btf) -> Result<u32, String>,
    ) -> Result<u32, String> {
        if let Some(&v) = self.known.get(&key) {
            return Ok(v);
        }
        if self.parsed.is_none() {
            let bytes = std::fs::read(VMLINUX).map_err(|e| format!("{VMLINUX}: {e}"))?;
            self.parsed = Some(Btf::parse(&bytes).map_err(|e| format!("{VMLINUX}: {e}"))?);
        }
        let v = read(self.parsed.as_ref().ok_or("no BTF")?)?;
        self.known.insert(key, v);
        self.added = true;
        Ok(v)
    }

    /// Keeps what was read from the BTF for the next run (best effort:
    /// without the cache the next run parses the BTF again).
    pub fn save(&self) {
        if !self.added {
            return;
        }
        let Some(boot) = &self.boot else { return };
        if let Err(e) = write_cache(&cache_text(boot, &self.known)) {
            tracing::debug!("keeping kernel type facts in {CACHE}: {e}");
        }
    }
}

fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string())
}

/// First line the boot id, then one `key = value` line per fact.
fn cache_text(boot: &str, known: &BTreeMap<String, u32>) -> String {
    let mut text = format!("{boot}\n");
    for (k, v) in known {
        text.push_str(&format!("{k} = {v}\n"));
    }
    text
}

fn parse_cache(text: &str, boot: &str) -> Option<BTreeMap<String, u32>> {
    let mut lines = text.lines();
    if lines.next()? != boot {
        return None;
    }
    lines
        .map(|l| {
            let (k, v) = l.split_once(" = ")?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn write_cache(text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let dir = std::path::Path::new(CACHE).parent().unwrap_or(std::path::Path::new("/"));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let tmp = format!("{CACHE}.{}", std::process::id());
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, CACHE));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_reads_back_only_for_its_boot_and_only_whole() {
        let known: BTreeMap<String, u32> =
            [("func bpf_iter_task_vma".to_string(), 64261), ("bits file.f_ref".into(), 448)]
                .into_iter()
                .collect();
        let text = cache_text("boot-a", &known);
        assert_eq!(parse_cache(&text, "boot-a"), Some(known));
        assert_eq!(parse_cache(&text, "boot-b"), None, "another boot's kernel");
        assert_eq!(parse_cache(&format!("{text}junk\n"), "boot-a"), None, "damaged");
        assert_eq!(parse_cache(&text.replace("448", "-1"), "boot-a"), None, "not a number");
    }

    #[test]
    fn facts_match_the_parsed_btf_and_come_back_from_the_cache_text() {
        let mut k = KernelBtf { boot: None, known: BTreeMap::new(), parsed: None, added: false };
        let Ok(id) = k.func("bpf_iter_task_vma") else {
            eprintln!("skipped: no kernel BTF");
            return;
        };
        let flags: i16 = k.byte("vm_area_struct", "vm_flags").expect("vm_flags");
        assert!(k.added && flags > 0);
        let known = parse_cache(&cache_text("b", &k.known), "b").expect("parse");
        let mut cached = KernelBtf { boot: None, known, parsed: None, added: false };
        assert_eq!(cached.func("bpf_iter_task_vma"), Ok(id));
        assert!(cached.parsed.is_none() && !cached.added, "answered without the BTF");
    }
}
