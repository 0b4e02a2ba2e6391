//! The TIME_WAIT connections of a network namespace with their socket's
//! SO_REUSEADDR, which sock_diag does not report, read by a BPF tcp
//! iterator ([`ferry_sys::tcp_iter`]) created inside that namespace. A
//! socket with SO_REUSEADDR binds beside a TIME_WAIT connection only if
//! that connection's socket had it too (an accepted connection takes the
//! listener's at accept: a listener that set it only after accepting left
//! connections without it).

use crate::error::{EngineError, Result};
use ferry_sys::tcp_iter::{TcpIterLayout, TcpIterProgram, TimeWait};
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;

static PROGRAM: OnceLock<Option<TcpIterProgram>> = OnceLock::new();

/// This iterator as loaded here (loading it first), for the setsockopt
/// watch (`capture/sockopt_watch.rs`): any program of the same tag, which
/// runs the same instructions, only reads and sets no socket option.
pub(crate) fn own_program() -> Option<ferry_sys::bpf::ProgInfo> {
    program()?.info().ok()
}

fn program() -> Option<&'static TcpIterProgram> {
    PROGRAM
        .get_or_init(|| match load_program() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::info!(
                    "TIME_WAIT connections made without SO_REUSEADDR are not checked: {e}"
                );
                None
            }
        })
        .as_ref()
}

fn load_program() -> std::result::Result<TcpIterProgram, String> {
    let mut btf = crate::kernel_btf::KernelBtf::open();
    let (sc, ctx) = ("sock_common", "bpf_iter__tcp");
    let v6: usize = btf.byte(sc, "skc_v6_rcv_saddr")?;
    let layout = TcpIterLayout {
        attach_btf_id: btf.func("bpf_iter_tcp")?,
        ctx_meta: btf.byte(ctx, "meta")?,
        ctx_sk_common: btf.byte(ctx, "sk_common")?,
        meta_seq: btf.byte("bpf_iter_meta", "seq")?,
        skc_state: btf.byte(sc, "skc_state")?,
        copy: i16::try_from((v6 + 16).div_ceil(8) * 8)
            .map_err(|_| format!("{sc}.skc_v6_rcv_saddr lies at byte {v6}"))?,
        skc_family: btf.byte(sc, "skc_family")?,
        skc_num: btf.byte(sc, "skc_num")?,
        skc_rcv_saddr: btf.byte(sc, "skc_rcv_saddr")?,
        skc_v6_rcv_saddr: v6,
        skc_reuse_bit: btf.bits(sc, "skc_reuse")? as usize,
        skc_reuseport_bit: btf.bits(sc, "skc_reuseport")? as usize,
    };
    if layout.copy > 256 {
        return Err(format!("{sc}'s fields lie past byte 256"));
    }
    let program = TcpIterProgram::load(&layout).map_err(|e| e.to_string())?;
    btf.save();
    Ok(program)
}

/// The TIME_WAIT connections of network namespace `ns` (`pid`'s), or None
/// when the kernel refused the program (logged once).
pub(super) fn time_wait_in(pid: i32, ns: BorrowedFd) -> Result<Option<Vec<TimeWait>>> {
    let Some(prog) = program() else { return Ok(None) };
    let started = std::time::Instant::now();
    let tws = ferry_sys::sockdiag::in_netns(ns, || prog.time_wait()).map_err(|e| {
        EngineError::kernel(pid, "listing TIME_WAIT connections (BPF tcp iterator)", e)
    })?;
    tracing::debug!(
        "pid {pid}: {} TIME_WAIT connections read in {:.2} ms",
        tws.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(Some(tws))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A connection closed first by the side an accepting listener gave
    /// it (the listener had no SO_REUSEADDR then, sets it after): its
    /// TIME_WAIT entry shows no SO_REUSEADDR. One accepted after shows it.
    #[test]
    fn a_time_wait_connection_shows_its_sockets_so_reuseaddr() {
        if !ferry_testkit::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        if program().is_none() {
            eprintln!("skipped: the tcp iterator does not load here");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr().expect("addr");
        let reuse = |on: i32| {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
            ferry_sys::socket::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, on)
                .expect("SO_REUSEADDR");
        };
        // std sets SO_REUSEADDR on its listeners.
        reuse(0);
        let close_accepted_first = |l: &std::net::TcpListener| {
            let c = std::net::TcpStream::connect(addr).expect("connect");
            let (s, _) = l.accept().expect("accept");
            let peer = c.local_addr().expect("client addr");
            drop(s);
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(c);
            peer
        };
        let first = close_accepted_first(&listener);
        reuse(1);
        let second = close_accepted_first(&listener);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let ns = std::fs::File::open("/proc/self/ns/net").expect("netns");
        let me = std::process::id() as i32;
        let tws = time_wait_in(me, ns.as_fd()).expect("read").expect("loaded");
        let on_port: Vec<&TimeWait> = tws.iter().filter(|t| t.local == addr).collect();
        assert_eq!(on_port.len(), 2, "{tws:?} (clients {first} {second})");
        assert_eq!(on_port.iter().filter(|t| t.reuse).count(), 1, "{on_port:?}");
    }
}
