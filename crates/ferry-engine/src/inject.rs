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

#[derive(Clone, Copy)]
pub struct Remote {
    pub pid: i32,
    /// Address of a `syscall` instruction in the process.
    pub syscall_ip: u64,
    /// After injected work, leave the thread in a trap stop instead of the
    /// SIGTRAP's signal-delivery stop that ended the work ([`Remote::settle`]).
    /// A tracer that dies resumes its tracees with the signal they stopped
    /// on, and SIGTRAP kills: capture's tree must survive a ferry that dies
    /// (the checkpoint guard puts it back), a restored tree dies with ferry
    /// anyway (PTRACE_O_EXITKILL).
    pub settle: bool,
}

thread_local! {
    /// Threads of a restore kept on the CPU of the ferry thread driving
    /// them ([`colocate`]), with the CPU each was last put on.
    static COLOCATED: std::cell::RefCell<std::collections::HashMap<i32, usize>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Keeps thread `tid` (a restore's, stopped under ptrace) on the CPU the
/// calling ferry thread runs on: set now, and again before an injected
/// call resumes it whenever ferry has moved to another CPU. Each
/// injected call is a round trip between the two; one whose wakeups
/// cross to another CPU cost 40-150 µs on a 2-vCPU VM against about
/// 20 µs on ferry's own (an idle vCPU is woken through the host). The
/// restore sets each thread's own CPU mask back with its final registers
/// ([`forget_colocated`] first). Best effort: a mask the kernel refuses
/// (a cpuset without that CPU) leaves the thread as it was.
pub fn colocate(tid: i32) {
    COLOCATED.with(|c| c.borrow_mut().insert(tid, usize::MAX));
    follow_ferry(tid);
}

/// Stops keeping `tid` with ferry (its own CPU mask is set next).
pub fn forget_colocated(tid: i32) {
    COLOCATED.with(|c| c.borrow_mut().remove(&tid));
}

/// Forgets every thread [`colocate`] keeps (a restore ended).
pub fn forget_all_colocated() {
    COLOCATED.with(|c| c.borrow_mut().clear());
}

/// Moves `tid`, if ferry keeps it with itself, to ferry's CPU now.
fn follow_ferry(tid: i32) {
    COLOCATED.with(|c| {
        let mut c = c.borrow_mut();
        let Some(at) = c.get_mut(&tid) else { return };
        let Some(cpu) = ferry_sys::process::current_cpu() else { return };
        if *at == cpu {
            return;
        }
        match ferry_sys::process::pin_to_cpu(tid, cpu) {
            Ok(()) => *at = cpu,
            Err(e) => {
                tracing::debug!("thread {tid}: not kept on ferry's CPU {cpu}: {e}");
                c.remove(&tid);
            }
        }
    });
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
        let slots = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.r10,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (slot, &a) in slots.into_iter().zip(args) {
            *slot = a;
        }
        ptrace::set_regs(tid, &regs).map_err(|e| kerr("setting registers", e))?;
        follow_ferry(tid);
        ptrace::single_step(tid, 0).map_err(|e| kerr("single-stepping", e))?;
        if let Err(e) =
            self.wait_trap(tid, |t| ptrace::single_step(t, 0), &format!("injected syscall {nr}"))
        {
            let _ = ptrace::set_regs(tid, &saved);
            return Err(e);
        }
        let ret = ptrace::get_regs(tid).map_err(|e| kerr("reading result", e))?.rax as i64;
        ptrace::set_regs(tid, &saved).map_err(|e| kerr("restoring registers", e))?;
        self.settle(tid)?;
        Ok(ret)
    }

    /// Moves thread `tid` from the SIGTRAP stop that ended injected work
    /// into a PTRACE_EVENT_STOP trap, the stop the freeze left it in: the
    /// SIGTRAP is cancelled (resumed with signal 0) and the pending
    /// interrupt traps the thread again before it returns to user space,
    /// so it runs none of its own instructions.
    fn settle(&self, tid: i32) -> Result<()> {
        if !self.settle {
            return Ok(());
        }
        let pid = self.pid;
        let kerr = |what: &str, e| EngineError::kernel(pid, format!("thread {tid}: {what}"), e);
        ptrace::interrupt(tid).map_err(|e| kerr("interrupting after injected work", e))?;
        ptrace::cont(tid, 0).map_err(|e| kerr("cancelling the injected work's SIGTRAP", e))?;
        loop {
            match ptrace::wait_tid(tid, 0).map_err(|e| kerr("waiting", e))? {
                Some((_, WaitEvent::Stopped { event: ptrace::PTRACE_EVENT_STOP, .. })) => {
                    return Ok(())
                }
                Some((_, WaitEvent::Exited(_) | WaitEvent::Signaled(_))) => {
                    return Err(EngineError::Gone {
                        pid,
                        what: format!("thread {tid} died after injected work"),
                    })
                }
                Some((_, WaitEvent::Stopped { sig, event })) => {
                    return Err(EngineError::restore(
                        pid,
                        format!("thread {tid}: unexpected stop (signal {sig}, event {event}) after injected work"),
                    ))
                }
                None => {}
            }
        }
    }

    /// Waits for the SIGTRAP that ends injected work (single-step trap or
    /// the batch's int3), resuming with `resume` across clone events.
    fn wait_trap(
        &self,
        tid: i32,
        resume: impl Fn(i32) -> ferry_sys::SysResult<()>,
        what: &str,
    ) -> Result<()> {
        let pid = self.pid;
        let mut interrupts = 0;
        loop {
            match ptrace::wait_tid(tid, 0)
                .map_err(|e| EngineError::kernel(pid, format!("thread {tid}: waiting"), e))?
            {
                Some((_, WaitEvent::Stopped { sig: libc::SIGTRAP, event: 0 })) => return Ok(()),
                Some((_, WaitEvent::Stopped { event, .. }))
                    if event == ptrace::PTRACE_EVENT_CLONE
                        || event == ptrace::PTRACE_EVENT_FORK =>
                {
                    resume(tid).map_err(|e| {
                        EngineError::kernel(pid, format!("thread {tid}: resuming"), e)
                    })?;
                }
                // A thread seized in a job-control stop reports the stop
                // once more (the PTRACE_INTERRUPT trap queued while it was
                // already stopped) the first time it is resumed.
                Some((_, WaitEvent::Stopped { event: ptrace::PTRACE_EVENT_STOP, .. }))
                    if interrupts < 4 =>
                {
                    interrupts += 1;
                    resume(tid).map_err(|e| {
                        EngineError::kernel(pid, format!("thread {tid}: resuming"), e)
                    })?;
                }
                Some((_, WaitEvent::Stopped { sig, event })) => {
                    let rip = ptrace::get_regs(tid).map(|r| r.rip).unwrap_or(0);
                    return Err(EngineError::restore(pid, format!("thread {tid}: unexpected stop (signal {sig}, event {event}) at {rip:#x} in {what}")));
                }
                Some((_, WaitEvent::Exited(_) | WaitEvent::Signaled(_))) => {
                    return Err(EngineError::Gone {
                        pid,
                        what: format!("thread {tid} died in {what}"),
                    })
                }
                None => {}
            }
        }
    }

    /// Like [`raw`](Self::raw), but a negative result becomes an error
    /// naming `call`.
    pub fn call(&self, tid: i32, call: &str, nr: i64, args: &[u64]) -> Result<u64> {
        let r = self.raw(tid, nr, args)?;
        if (-4095..0).contains(&r) {
            return Err(EngineError::Remote {
                pid: self.pid,
                tid,
                call: call.to_string(),
                errno: (-r) as i32,
            });
        }
        Ok(r as u64)
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        vm::write_remote(self.pid, data, &[RemoteRange { addr, len: data.len() }]).map_err(
            |e| {
                EngineError::kernel(
                    self.pid,
                    format!("writing {} bytes at {addr:#x}", data.len()),
                    e,
                )
            },
        )?;
        Ok(())
    }

    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        vm::read_remote(self.pid, &mut buf, &[RemoteRange { addr, len }]).map_err(|e| {
            EngineError::kernel(self.pid, format!("reading {len} bytes at {addr:#x}"), e)
        })?;
        Ok(buf)
    }
}

/// Machine code that runs a table of syscalls in one go and stops on
/// int3: one ptrace round trip for any number of calls instead of one per
/// call. On entry rbx points at the table, r12 holds the entry count.
/// Each 64-byte entry is `nr, a0..a5, result`.
///
/// ```text
/// loop: mov rax,[rbx]      ; mov rdi,[rbx+8] ; mov rsi,[rbx+16]
///       mov rdx,[rbx+24]   ; mov r10,[rbx+32]; mov r8,[rbx+40]
///       mov r9,[rbx+48]    ; syscall         ; mov [rbx+56],rax
///       add rbx,64         ; dec r12         ; jnz loop
///       int3
/// ```
const BATCH_CODE: &[u8] = &[
    0x48, 0x8b, 0x03, 0x48, 0x8b, 0x7b, 0x08, 0x48, 0x8b, 0x73, 0x10, 0x48, 0x8b, 0x53, 0x18, 0x4c,
    0x8b, 0x53, 0x20, 0x4c, 0x8b, 0x43, 0x28, 0x4c, 0x8b, 0x4b, 0x30, 0x0f, 0x05, 0x48, 0x89, 0x43,
    0x38, 0x48, 0x83, 0xc3, 0x40, 0x49, 0xff, 0xcc, 0x75, 0xd6, 0xcc,
];

/// One syscall of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub nr: i64,
    pub args: [u64; 6],
}

impl Call {
    pub fn new(nr: i64, a: &[u64]) -> Call {
        let mut args = [0u64; 6];
        args[..a.len()].copy_from_slice(a);
        Call { nr, args }
    }
}

/// A private anonymous mapping in the process for syscall arguments and
/// the batch code. Layout: code at 0, call table at TABLE, data at DATA.
pub struct Scratch {
    pub addr: u64,
    pub len: u64,
}

pub const SCRATCH_LEN: u64 = 64 * 1024;
const TABLE: u64 = 0x1000;
pub const MAX_BATCH: usize = 256;
/// Start of the area callers may use for syscall arguments.
pub const SCRATCH_DATA: u64 = TABLE + (MAX_BATCH as u64) * 64;

impl Remote {
    /// Runs `calls` in thread `tid` with one round trip, through the batch
    /// code in `scratch`. Returns each call's raw result.
    pub fn batch(&self, tid: i32, scratch: u64, calls: &[Call]) -> Result<Vec<i64>> {
        let mut results = Vec::with_capacity(calls.len());
        for chunk in calls.chunks(MAX_BATCH) {
            results.extend(self.batch_chunk(tid, scratch, chunk)?);
        }
        Ok(results)
    }

    fn batch_chunk(&self, tid: i32, scratch: u64, calls: &[Call]) -> Result<Vec<i64>> {
        let pid = self.pid;
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let kerr = |what: &str, e| EngineError::kernel(pid, format!("thread {tid}: {what}"), e);
        let mut table = Vec::with_capacity(calls.len() * 64);
        for c in calls {
            table.extend_from_slice(&(c.nr as u64).to_le_bytes());
            for a in c.args {
                table.extend_from_slice(&a.to_le_bytes());
            }
            table.extend_from_slice(&0u64.to_le_bytes());
        }
        self.write(scratch + TABLE, &table)?;
        let saved = ptrace::get_regs(tid).map_err(|e| kerr("reading registers", e))?;
        let mut regs = saved;
        regs.rip = scratch;
        regs.rbx = scratch + TABLE;
        regs.r12 = calls.len() as u64;
        regs.orig_rax = u64::MAX;
        regs.rsp = 0;
        ptrace::set_regs(tid, &regs).map_err(|e| kerr("setting registers", e))?;
        follow_ferry(tid);
        ptrace::cont(tid, 0).map_err(|e| kerr("running batch", e))?;
        if let Err(e) = self.wait_trap(tid, |t| ptrace::cont(t, 0), "injected code") {
            let _ = ptrace::set_regs(tid, &saved);
            return Err(e);
        }
        ptrace::set_regs(tid, &saved).map_err(|e| kerr("restoring registers", e))?;
        self.settle(tid)?;
        let out = self.read(scratch + TABLE, table.len())?;
        Ok(out
            .chunks_exact(64)
            .map(|e| i64::from_le_bytes(e[56..64].try_into().expect("8 bytes")))
            .collect())
    }
}

/// Turns a raw batch result into an error naming the call.
pub fn check(pid: i32, tid: i32, call: &str, r: i64) -> Result<u64> {
    if (-4095..0).contains(&r) {
        return Err(EngineError::Remote { pid, tid, call: call.to_string(), errno: (-r) as i32 });
    }
    Ok(r as u64)
}

impl Scratch {
    pub fn map(remote: &Remote, tid: i32) -> Result<Scratch> {
        let prot = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let addr = remote.call(
            tid,
            "mmap(scratch)",
            libc::SYS_mmap,
            &[0, SCRATCH_LEN, prot, flags, u64::MAX, 0],
        )?;
        remote.write(addr, BATCH_CODE)?;
        Ok(Scratch { addr, len: SCRATCH_LEN })
    }

    /// Maps the scratch area at `addr` exactly (MAP_FIXED_NOREPLACE).
    pub fn map_at(remote: &Remote, tid: i32, addr: u64) -> Result<Scratch> {
        const MAP_FIXED_NOREPLACE: u64 = 0x100000;
        let prot = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64 | MAP_FIXED_NOREPLACE;
        let got = remote.call(
            tid,
            "mmap(scratch)",
            libc::SYS_mmap,
            &[addr, SCRATCH_LEN, prot, flags, u64::MAX, 0],
        )?;
        remote.write(got, BATCH_CODE)?;
        Ok(Scratch { addr: got, len: SCRATCH_LEN })
    }

    pub fn unmap(self, remote: &Remote, tid: i32) -> Result<()> {
        remote.call(tid, "munmap(scratch)", libc::SYS_munmap, &[self.addr, self.len])?;
        Ok(())
    }
}
