//! Running system calls inside a stopped process.
//!
//! Some state can only be read or set by the process itself (signal
//! handlers, timers, the alternate signal stack, PR_SET_MM...). The engine
//! points a stopped thread at a `syscall` instruction in the vDSO, loads
//! the arguments, single-steps it and reads the result; then the thread's
//! registers are put back. Pointer arguments live in a scratch mapping
//! that the engine creates in the process and removes afterwards.

use crate::error::{EngineError, Result};
use ferry_sys::ptrace::{self, WaitEvent};
use ferry_sys::vm::{self, RemoteRange};

pub struct Remote {
    pub pid: i32,
    /// Address of a `syscall` instruction in the process.
    pub syscall_ip: u64,
}

/// Finds a `syscall` (0f 05) instruction in the process's [vdso].
pub fn find_syscall_insn(pid: i32, vdso_start: u64, vdso_end: u64) -> Result<u64> {
    let len = (vdso_end - vdso_start) as usize;
    let mut buf = vec![0u8; len];
    vm::read_remote(pid, &mut buf, &[RemoteRange { addr: vdso_start, len }])
        .map_err(|e| EngineError::kernel(pid, "reading the vDSO", e))?;
    buf.windows(2)
        .position(|w| w == [0x0f, 0x05])
        .map(|off| vdso_start + off as u64)
        .ok_or_else(|| EngineError::restore(pid, "no syscall instruction in the vDSO"))
}

impl Remote {
    /// Runs syscall `nr` with `args` in thread `tid`, which must be in a
    /// ptrace stop. Returns the raw result (negative errno on failure).
    pub fn raw(&self, tid: i32, nr: i64, args: &[u64]) -> Result<i64> {
        let pid = self.pid;
        let kerr = |what: &str, e| EngineError::kernel(pid, format!("thread {tid}: {what}"), e);
        let saved = ptrace::get_regs(tid).map_err(|e| kerr("reading registers", e))?;
        let mut regs = saved;
        regs.rax = nr as u64;
        regs.orig_rax = u64::MAX;
        regs.rip = self.syscall_ip;
        // No stack is needed by a syscall; a zero rsp also keeps
        // sigaltstack() from thinking the thread runs on its alt stack.
        regs.rsp = 0;
        let slots = [&mut regs.rdi, &mut regs.rsi, &mut regs.rdx, &mut regs.r10, &mut regs.r8, &mut regs.r9];
        for (slot, &a) in slots.into_iter().zip(args) {
            *slot = a;
        }
        ptrace::set_regs(tid, &regs).map_err(|e| kerr("setting registers", e))?;
        ptrace::single_step(tid, 0).map_err(|e| kerr("single-stepping", e))?;
        loop {
            match ptrace::wait_tid(tid, 0).map_err(|e| kerr("waiting", e))? {
                Some((_, WaitEvent::Stopped { sig: libc::SIGTRAP, event: 0 })) => break,
                Some((_, WaitEvent::Stopped { event, .. })) if event == ptrace::PTRACE_EVENT_CLONE => {
                    ptrace::single_step(tid, 0).map_err(|e| kerr("single-stepping", e))?;
                }
                Some((_, WaitEvent::Stopped { sig, event })) => {
                    return Err(EngineError::restore(pid, format!("thread {tid}: unexpected stop (signal {sig}, event {event}) in injected syscall {nr}")))
                }
                Some((_, WaitEvent::Exited(_) | WaitEvent::Signaled(_))) => {
                    return Err(EngineError::Gone { pid, what: format!("thread {tid} died in injected syscall {nr}") })
                }
                None => {}
            }
        }
        let ret = ptrace::get_regs(tid).map_err(|e| kerr("reading result", e))?.rax as i64;
        ptrace::set_regs(tid, &saved).map_err(|e| kerr("restoring registers", e))?;
        Ok(ret)
    }

    /// Like [`raw`](Self::raw), but a negative result becomes an error
    /// naming `call`.
    pub fn call(&self, tid: i32, call: &str, nr: i64, args: &[u64]) -> Result<u64> {
        let r = self.raw(tid, nr, args)?;
        if (-4095..0).contains(&r) {
            return Err(EngineError::Remote { pid: self.pid, tid, call: call.to_string(), errno: (-r) as i32 });
        }
        Ok(r as u64)
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        vm::write_remote(self.pid, data, &[RemoteRange { addr, len: data.len() }])
            .map_err(|e| EngineError::kernel(self.pid, format!("writing {} bytes at {addr:#x}", data.len()), e))?;
        Ok(())
    }

    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        vm::read_remote(self.pid, &mut buf, &[RemoteRange { addr, len }])
            .map_err(|e| EngineError::kernel(self.pid, format!("reading {len} bytes at {addr:#x}"), e))?;
        Ok(buf)
    }
}

/// A private anonymous mapping in the process for syscall arguments.
pub struct Scratch {
    pub addr: u64,
    pub len: u64,
}

pub const SCRATCH_LEN: u64 = 64 * 1024;

impl Scratch {
    pub fn map(remote: &Remote, tid: i32) -> Result<Scratch> {
        let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let addr = remote.call(tid, "mmap(scratch)", libc::SYS_mmap, &[0, SCRATCH_LEN, prot, flags, u64::MAX, 0])?;
        Ok(Scratch { addr, len: SCRATCH_LEN })
    }

    pub fn unmap(self, remote: &Remote, tid: i32) -> Result<()> {
        remote.call(tid, "munmap(scratch)", libc::SYS_munmap, &[self.addr, self.len])?;
        Ok(())
    }
}
