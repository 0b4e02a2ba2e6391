//! Resource limits and credentials, set last: lowering them earlier would
//! get in the way of the restore itself.

use super::Session;
use crate::error::{EngineError, Result};
use ferry_image::ProcessImage;

pub fn restore_limits(pid: i32, image: &ProcessImage) -> Result<()> {
    for r in &image.rlimits {
        ferry_sys::process::set_rlimit(pid, r.resource, r.soft, r.hard)
            .map_err(|e| EngineError::kernel(pid, format!("setting rlimit {}", r.resource), e))?;
    }
    Ok(())
}

pub fn restore_creds(s: &mut Session) -> Result<()> {
    let c = &s.image.creds;
    if c.uids == [0; 4] && c.gids == [0; 4] && c.groups.is_empty() {
        return Ok(());
    }
    let groups: Vec<u8> = c.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
    s.remote.write(s.scratch, &groups)?;
    s.call("setgroups", libc::SYS_setgroups, &[c.groups.len() as u64, s.scratch])?;
    s.call("setresgid", libc::SYS_setresgid, &[c.gids[0] as u64, c.gids[1] as u64, c.gids[2] as u64])?;
    s.call("setresuid", libc::SYS_setresuid, &[c.uids[0] as u64, c.uids[1] as u64, c.uids[2] as u64])?;
    Ok(())
}
