//! prctl attributes recorded since format 4: each thread's parent-death
//! signal. Set after the credentials: the kernel clears it whenever a
//! thread's effective or filesystem ids change. (The securebits are part
//! of the credentials, in `process.rs`.)

use super::Session;
use crate::error::Result;
use crate::inject::Call;

const PR_SET_PDEATHSIG: u64 = 1;

pub fn restore_pdeathsig(s: &mut Session) -> Result<()> {
    let threads: Vec<(i32, i32)> = s
        .image
        .fidelity
        .threads
        .iter()
        .filter(|t| t.pdeathsig != 0)
        .map(|t| (t.tid, t.pdeathsig))
        .collect();
    for (tid, sig) in threads {
        s.run(
            tid,
            &[(
                format!("prctl(PR_SET_PDEATHSIG, {sig})"),
                Call::new(libc::SYS_prctl, &[PR_SET_PDEATHSIG, sig as u64]),
            )],
        )?;
    }
    Ok(())
}
