//! Parsers for the /proc files the engine reads. Each returns an error
//! naming the file instead of panicking on content it does not expect.

use crate::error::{EngineError, Result};
use ferry_image::CgroupMembership;
use std::collections::HashMap;
use std::os::fd::AsRawFd;

pub fn read_string(path: &str) -> Result<String> {
    read_whole(path).map_err(|e| EngineError::io(path, e))
}

/// A /proc file's whole text in reads of 4 KiB and more: the standard
/// reader asks the file's size first (0 here) and then probes with 32,
/// 32, 64... bytes, ten system calls for a 300-byte stat file, each
/// taken in the pause for the files read in the freeze.
fn read_whole(path: &str) -> std::io::Result<String> {
    read_rest(&mut std::fs::File::open(path)?, 4096)
}

/// The rest of an open /proc file, read into a buffer of `first` bytes
/// that doubles when full (see [`read_whole`] for why not the standard
/// reader).
pub(crate) fn read_rest(f: &mut std::fs::File, first: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; first.max(1)];
    let mut len = 0;
    loop {
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

pub fn read_link(path: &str) -> Result<String> {
    std::fs::read_link(path)
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| EngineError::io(path, e))
}

fn parse_err(path: &str, what: impl Into<String>) -> EngineError {
    EngineError::Parse { path: path.to_string(), what: what.into() }
}

/// The state letter of /proc/PID/stat ('R', 'S', 'Z', ...), if the
/// process exists.
pub fn state(pid: i32) -> Option<char> {
    let stat = read_whole(&format!("/proc/{pid}/stat")).ok()?;
    stat.get(stat.rfind(')')? + 2..)?.chars().next()
}

/// The parent PID in /proc/PID/stat, if the process exists.
pub fn ppid(pid: i32) -> Option<i32> {
    let stat = read_whole(&format!("/proc/{pid}/stat")).ok()?;
    stat.get(stat.rfind(')')? + 2..)?.split_whitespace().nth(1)?.parse().ok()
}

/// Thread ids of a process, leader first.
pub fn tids(pid: i32) -> Result<Vec<i32>> {
    let path = format!("/proc/{pid}/task");
    let mut v: Vec<i32> = std::fs::read_dir(&path)
        .map_err(|e| EngineError::io(&path, e))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable_by_key(|&t| (t != pid, t));
    Ok(v)
}

/// One line of /proc/PID/smaps (or maps) with its VmFlags.
#[derive(Debug, Clone)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub perms: [u8; 4],
    pub offset: u64,
    pub dev: u64,
    pub inode: u64,
    pub path: String,
    pub vm_flags: Vec<String>,
}

impl MapsEntry {
    pub fn readable(&self) -> bool {
        self.perms[0] == b'r'
    }
    pub fn shared(&self) -> bool {
        self.perms[3] == b's'
    }
    pub fn has_flag(&self, f: &str) -> bool {
        self.vm_flags.iter().any(|x| x == f)
    }
}

fn parse_maps_line(path: &str, line: &str) -> Result<MapsEntry> {
    let mut it = line.splitn(6, ' ');
    let range = it.next().unwrap_or_default();
    let perms = it.next().unwrap_or_default();
    let offset = it.next().unwrap_or_default();
    let dev = it.next().unwrap_or_default();
    let inode = it.next().unwrap_or_default();
    let name = it.next().unwrap_or_default().trim_start().to_string();
    let (s, e) =
        range.split_once('-').ok_or_else(|| parse_err(path, format!("bad range in {line:?}")))?;
    let hex = |v: &str| {
        u64::from_str_radix(v, 16).map_err(|_| parse_err(path, format!("bad number in {line:?}")))
    };
    let (maj, min) =
        dev.split_once(':').ok_or_else(|| parse_err(path, format!("bad device in {line:?}")))?;
    let pb = perms.as_bytes();
    if pb.len() != 4 {
        return Err(parse_err(path, format!("bad permissions in {line:?}")));
    }
    Ok(MapsEntry {
        start: hex(s)?,
        end: hex(e)?,
        perms: [pb[0], pb[1], pb[2], pb[3]],
        offset: hex(offset)?,
        dev: (hex(maj)? << 8) | hex(min)?,
        inode: inode.parse().map_err(|_| parse_err(path, format!("bad inode in {line:?}")))?,
        path: name,
        vm_flags: Vec::new(),
    })
}

fn is_maps_line(line: &str) -> bool {
    line.split(' ')
        .next()
        .is_some_and(|r| r.contains('-') && r.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
}

/// Parses /proc/PID/smaps, keeping only the range line and VmFlags.
pub fn smaps(pid: i32) -> Result<Vec<MapsEntry>> {
    let path = format!("/proc/{pid}/smaps");
    let text = read_string(&path)?;
    let mut out: Vec<MapsEntry> = Vec::new();
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(last) = out.last_mut() {
                let pkey = std::mem::take(&mut last.vm_flags);
                last.vm_flags = flags.split_whitespace().map(str::to_string).collect();
                last.vm_flags.extend(pkey);
            }
        } else if let Some(key) = line.strip_prefix("ProtectionKey:") {
            // Shown only on CPUs with protection keys, before VmFlags. A key
            // other than 0 is kept as a pseudo-flag the catalog refuses.
            if let Some(last) = out.last_mut().filter(|_| key.trim() != "0") {
                last.vm_flags.push("ProtectionKey".to_string());
            }
        } else if is_maps_line(line) {
            out.push(parse_maps_line(&path, line)?);
        }
    }
    Ok(out)
}

pub fn maps(pid: i32) -> Result<Vec<MapsEntry>> {
    let path = format!("/proc/{pid}/maps");
    parse_maps(&path, &read_string(&path)?)
}

/// Parses the text of a maps file read some other way (`path` names it
/// in errors).
pub fn parse_maps(path: &str, text: &str) -> Result<Vec<MapsEntry>> {
    text.lines().map(|l| parse_maps_line(path, l)).collect()
}

/// "Key:\tvalue" files (status, fdinfo, timers...).
pub fn key_values(text: &str) -> HashMap<&str, &str> {
    text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim(), v.trim())).collect()
}

/// Fields of /proc/PID/stat after the command name, 1-based as in proc(5).
pub struct Stat {
    fields: Vec<u64>,
}

impl Stat {
    pub fn read(pid: i32) -> Result<Stat> {
        let path = format!("/proc/{pid}/stat");
        let text = read_string(&path)?;
        let after =
            text.rfind(')').map(|i| &text[i + 2..]).ok_or_else(|| parse_err(&path, "no ')'"))?;
        // Field 3 (state) is a letter; keep positions by mapping it to 0.
        let fields = after
            .split_whitespace()
            .map(|f| f.parse::<i64>().map(|v| v as u64).unwrap_or(0))
            .collect();
        Ok(Stat { fields })
    }
    /// How many fields the line has (pid and comm included).
    pub fn count(&self) -> usize {
        self.fields.len() + 2
    }
    /// Field number `n` as listed in proc(5) (n >= 3).
    pub fn field(&self, n: usize) -> u64 {
        self.fields.get(n - 3).copied().unwrap_or(0)
    }
}

pub fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

pub fn parse_octal(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim(), 8).ok()
}

/// Parses /proc/PID/cgroup: `hierarchy-id:controllers:path` per line.
pub fn parse_cgroup(text: &str) -> Option<Vec<CgroupMembership>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut it = l.splitn(3, ':');
            let hierarchy = it.next()?.parse().ok()?;
            let controllers = it.next()?.to_string();
            let path = it.next()?.to_string();
            Some(CgroupMembership { hierarchy, controllers, path })
        })
        .collect()
}

/// Waits (at most `limit`) until none of `pids` exists any more, not even
/// as a zombie. Returns whether they are all gone.
///
/// A replacement's restore waits here, in the service's pause, for the old
/// root's parent to reap it: on the zombie's pidfd, which polls POLLHUP
/// once the process is reaped (the kernel wakes its waiters then), so the
/// wait ends within the reap's own microseconds, with no sleep in steps.
pub fn wait_reaped(pids: &[i32], limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    pids.iter().all(|&p| wait_one_reaped(p, deadline))
}

fn wait_one_reaped(pid: i32, deadline: std::time::Instant) -> bool {
    let gone = || !std::path::Path::new(&format!("/proc/{pid}")).exists();
    // ESRCH: already reaped. The state read after the open tells whether
    // the pidfd is the zombie's, not a new process's under a reused PID.
    let pidfd = match ferry_sys::pidfd::pidfd_open(pid) {
        Ok(fd) if state(pid) == Some('Z') => fd,
        Ok(_) | Err(_) => return gone(),
    };
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
        let mut fds = [libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLHUP, revents: 0 }];
        match ferry_sys::fd::poll(&mut fds, ms) {
            Ok(_) if fds[0].revents & libc::POLLHUP != 0 => return true,
            Err(e) if e.errno == libc::EINTR && !left.is_zero() => {}
            // POLLIN alone never wakes a poll for POLLHUP: a timeout, or an
            // error (then /proc says whether it is gone).
            _ if left.is_zero() => return gone(),
            Ok(_) => {}
            Err(_) => return gone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_is_waited_for_until_its_reap_and_no_longer() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id() as i32;
        child.kill().expect("killing our sleep");
        let t = std::time::Instant::now();
        while state(pid) != Some('Z') {
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "pid {pid} is no zombie");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Not reaped within the limit: false, after the limit.
        let t = std::time::Instant::now();
        assert!(!wait_reaped(&[pid], std::time::Duration::from_millis(50)));
        assert!(t.elapsed() >= std::time::Duration::from_millis(50));
        // Reaped by another thread 50 ms on: true, soon after the reap.
        let reaper = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            child.wait().expect("reaping our sleep");
            std::time::Instant::now()
        });
        let t = std::time::Instant::now();
        assert!(wait_reaped(&[pid], std::time::Duration::from_secs(5)));
        let woke = std::time::Instant::now();
        let reaped = reaper.join().expect("reaper");
        assert!(t.elapsed() >= std::time::Duration::from_millis(50));
        assert!(woke.saturating_duration_since(reaped) < std::time::Duration::from_secs(1));
        // Gone already: at once.
        assert!(wait_reaped(&[pid], std::time::Duration::ZERO));
    }

    #[test]
    fn parses_v1_and_v2_lines() {
        let m =
            parse_cgroup("12:memory:/a/b\n1:name=systemd:/user.slice\n0::/x:y\n").expect("parses");
        assert_eq!(m.len(), 3);
        assert_eq!(
            (m[0].hierarchy, m[0].controllers.as_str(), m[0].path.as_str()),
            (12, "memory", "/a/b")
        );
        assert_eq!(m[1].controllers, "name=systemd");
        // A colon in the path stays in the path.
        assert_eq!(
            (m[2].hierarchy, m[2].controllers.as_str(), m[2].path.as_str()),
            (0, "", "/x:y")
        );
    }

    #[test]
    fn refuses_garbage() {
        assert!(parse_cgroup("memory:/a\n").is_none());
        assert!(parse_cgroup("x:memory:/a\n").is_none());
    }
}
