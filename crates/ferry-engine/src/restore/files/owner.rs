//! fd owners and signals (F_SETOWN_EX, F_SETSIG), set from inside the
//! process once its threads exist (an owner may be one of them, or
//! another process of the tree, which exists by then too).

use crate::error::{EngineError, Result};
use crate::inject::Call;
use crate::restore::Session;

const F_SETSIG: u64 = 10;
const F_SETOWN_EX: u64 = 15;

pub fn restore(s: &mut Session) -> Result<()> {
    let image = s.image;
    for o in &image.fidelity.file_owners {
        let slot = image.fds.iter().find(|f| f.file == o.file).ok_or_else(|| {
            EngineError::restore(s.pid, format!("fd owner for file {} that no fd uses", o.file))
        })?;
        let fd = slot.fd as u64;
        let mut calls = Vec::new();
        if o.signal != 0 {
            calls.push((
                format!("fcntl(fd {fd}, F_SETSIG, {})", o.signal),
                Call::new(libc::SYS_fcntl, &[fd, F_SETSIG, o.signal as u64]),
            ));
        }
        if o.owner != 0 {
            let mut owner = Vec::with_capacity(8);
            owner.extend_from_slice(&o.owner_type.to_le_bytes());
            owner.extend_from_slice(&o.owner.to_le_bytes());
            s.remote.write(s.data, &owner)?;
            calls.push((
                format!("fcntl(fd {fd}, F_SETOWN_EX, type {} id {})", o.owner_type, o.owner),
                Call::new(libc::SYS_fcntl, &[fd, F_SETOWN_EX, s.data]),
            ));
        }
        s.run(s.pid, &calls)?;
    }
    Ok(())
}
