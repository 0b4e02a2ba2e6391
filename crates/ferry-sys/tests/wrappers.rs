//! Round trips through the wrappers the engine's file, SysV and staging
//! code uses. None needs root; every SysV object is private and removed.

use ferry_sys::{anonfd, epoll, fd, lock, socket, sysv};
use std::io::Read;
use std::os::fd::AsRawFd;

#[test]
fn sysv_semaphores_round_trip() {
    let id = sysv::sem_get(libc::IPC_PRIVATE, 3, libc::IPC_CREAT | 0o600).unwrap();
    sysv::sem_set_values(id, &[1, 2, 3]).unwrap();
    assert_eq!(sysv::sem_values(id).unwrap(), vec![1, 2, 3]);
    assert_eq!(sysv::sem_set_values(id, &[1]).unwrap_err().errno, libc::EINVAL);
    assert_eq!(sysv::sem_last_pid(id, 0).unwrap(), std::process::id() as i32);
    let mut ds = sysv::sem_stat(id).unwrap();
    ds.sem_perm.mode = 0o640;
    sysv::sem_set(id, &ds).unwrap();
    assert_eq!(sysv::sem_stat(id).unwrap().sem_perm.mode & 0o777, 0o640);
    sysv::sem_remove(id).unwrap();
    assert!(sysv::sem_values(id).is_err());
}

#[test]
fn sysv_messages_copied_in_place() {
    let id = sysv::msg_get(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600).unwrap();
    sysv::msg_send(id, 7, b"hello", libc::IPC_NOWAIT).unwrap();
    sysv::msg_send(id, 9, b"", libc::IPC_NOWAIT).unwrap();
    let mut buf = vec![0u8; 8 + 64];
    let copy = sysv::msg_copy(id, 0, &mut buf).map(|(t, m)| (t, m.to_vec()));
    // MSG_COPY needs CONFIG_CHECKPOINT_RESTORE; ENOSYS without it.
    if copy.as_ref().is_err_and(|e| e.errno == libc::ENOSYS) {
        sysv::msg_remove(id).unwrap();
        return;
    }
    assert_eq!(copy.unwrap(), (7, b"hello".to_vec()));
    assert_eq!(sysv::msg_copy(id, 1, &mut buf).unwrap().0, 9);
    assert_eq!(sysv::msg_stat(id).unwrap().msg_qnum, 2, "MSG_COPY leaves the messages queued");
    assert!(sysv::msg_copy(id, 0, &mut [0u8; 4]).is_err());
    sysv::msg_remove(id).unwrap();
}

#[test]
fn sysv_segment_attach_and_fill() {
    let id = sysv::shm_get(libc::IPC_PRIVATE, 10_000, libc::IPC_CREAT | 0o600).unwrap();
    {
        let mut at = sysv::ShmAttachment::attach(id).unwrap();
        let seg = at.bytes_mut();
        assert_eq!(seg.len(), 10_000);
        seg[9_990..].copy_from_slice(b"0123456789");
    }
    let at = sysv::ShmAttachment::attach(id).unwrap();
    drop(at);
    let mut again = sysv::ShmAttachment::attach(id).unwrap();
    assert_eq!(&again.bytes_mut()[9_990..], b"0123456789");
    drop(again);
    sysv::shm_remove(id).unwrap();
}

#[test]
fn memfd_seals_and_extents() {
    let m = fd::memfd_create(c"wrappers", libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING).unwrap();
    let f = std::fs::File::from(m);
    f.set_len(1 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"x", 512 << 10).unwrap();
    let data = fd::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA).unwrap();
    assert!(data <= 512 << 10);
    assert!(fd::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE).unwrap() > 512 << 10);
    assert_eq!(fd::get_seals(f.as_raw_fd()).unwrap(), 0);
    fd::fcntl_int(
        f.as_raw_fd(),
        libc::F_ADD_SEALS,
        libc::F_SEAL_GROW as libc::c_long,
        "fcntl(F_ADD_SEALS)",
    )
    .unwrap();
    assert_eq!(fd::get_seals(f.as_raw_fd()).unwrap(), libc::F_SEAL_GROW);
    let high = fd::dup_above(f.as_raw_fd(), 500).unwrap();
    assert!(high.as_raw_fd() >= 500);
    assert!(fd::open(c"/nonexistent/ferry", libc::O_RDONLY, 0).is_err());
}

#[test]
fn eventfd_timerfd_signalfd_epoll() {
    let e = anonfd::eventfd(0, libc::EFD_CLOEXEC).unwrap();
    anonfd::eventfd_write(e.as_raw_fd(), 5).unwrap();
    let mut n = [0u8; 8];
    std::fs::File::from(e).read_exact(&mut n).unwrap();
    assert_eq!(u64::from_ne_bytes(n), 5);

    let t = anonfd::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC).unwrap();
    anonfd::timerfd_settime(t.as_raw_fd(), 0, 60_000_000_000, 1_000_000_000).unwrap();
    let (value, interval) = anonfd::timerfd_gettime(t.as_raw_fd()).unwrap();
    assert!(value > 59_000_000_000 && value <= 60_000_000_000);
    assert_eq!(interval, 1_000_000_000);
    assert!(anonfd::clock_gettime(libc::CLOCK_MONOTONIC).unwrap() > 0);

    let s = anonfd::signalfd(1 << (libc::SIGUSR1 - 1), libc::SFD_CLOEXEC).unwrap();
    assert!(s.as_raw_fd() >= 0);
    assert!(epoll::create(libc::EPOLL_CLOEXEC).is_ok());
}

#[test]
fn locks_on_a_file() {
    let path = std::env::temp_dir().join(format!("ferry-sys-lock-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    lock::flock(f.as_raw_fd(), true).unwrap();
    lock::set_record_lock(f.as_raw_fd(), true, false, 0, 10).unwrap();
    lock::set_record_lock(f.as_raw_fd(), false, true, 100, 0).unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn unix_pair_and_abstract_bind() {
    let (a, b) = socket::socketpair(libc::AF_UNIX, libc::SOCK_STREAM).unwrap();
    assert_eq!(
        ferry_sys::unix::send(a.as_raw_fd(), b"ping", &[], None, libc::MSG_DONTWAIT).unwrap(),
        4
    );
    assert_eq!(ferry_sys::fd::bytes_readable(b.as_raw_fd()).unwrap(), 4);
    let l = socket::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0).unwrap();
    let name = format!("\0ferry-sys-test-{}", std::process::id());
    socket::unix_bind(l.as_raw_fd(), name.as_bytes()).unwrap();
    assert_eq!(socket::unix_name(l.as_raw_fd(), false).unwrap(), name.as_bytes());
    assert!(socket::unix_bind(l.as_raw_fd(), &[b'x'; socket::UNIX_PATH_MAX]).is_err());
}

#[test]
fn shared_anon_reachable_through_map_files() {
    let m = ferry_sys::process::SharedAnon::map(8192).unwrap();
    let path = format!("/proc/self/map_files/{:x}-{:x}", m.start(), m.start() + m.len() as u64);
    // Opening map_files needs CAP_SYS_ADMIN in older kernels; the link is there anyway.
    assert!(std::fs::symlink_metadata(&path).is_ok());
}

/// SO_MEMINFO's buffer sizes are SO_SNDBUF's and SO_RCVBUF's, and
/// TCP_INFO's not-sent count is SIOCOUTQNSD's, on a connection with
/// data it could not send (the peer's receive window full): the
/// repair capture takes each in place of the other.
#[test]
fn one_call_reads_what_two_read() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let mut client =
        std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    let fd = client.as_raw_fd();
    socket::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 300_000).expect("sndbuf");
    socket::setsockopt_int(server.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096)
        .expect("rcvbuf");
    client.set_nonblocking(true).expect("nonblocking");
    let chunk = vec![7u8; 65536];
    while client.write(&chunk).is_ok() {}
    let (snd, rcv) = socket::buffer_sizes(fd).expect("SO_MEMINFO");
    assert_eq!(snd, socket::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).expect("snd"));
    assert_eq!(rcv, socket::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).expect("rcv"));
    // The kernel may still send while the peer's window closes: the
    // two reads must agree once it stands still.
    let mut seen = Vec::new();
    for _ in 0..50 {
        let unsent = socket::outq_unsent(fd).expect("SIOCOUTQNSD");
        let info = socket::tcp_info(fd).expect("TCP_INFO").tcpi_notsent_bytes;
        if unsent > 0 && info == unsent && socket::outq_unsent(fd) == Ok(unsent) {
            seen.clear();
            break;
        }
        seen.push((unsent, info));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(seen.is_empty(), "SIOCOUTQNSD and tcpi_notsent_bytes never agreed: {seen:?}");
    drop(server);
}

/// In repair mode, one peek of a queue into a buffer large enough gives
/// what its length (SIOCINQ, SIOCOUTQ) and a peek of that length give,
/// both queues filled beyond one segment; a buffer too small says so;
/// an empty queue gives 0.
#[test]
fn one_peek_reads_a_whole_repair_queue() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let mut client =
        std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (mut server, _) = listener.accept().expect("accept");
    socket::setsockopt_int(server.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096)
        .expect("rcvbuf");
    // The client's receive queue: 100,000 bytes from the server.
    server.write_all(&(0..100_000u32).map(|i| i as u8).collect::<Vec<_>>()).expect("to client");
    // The client's send queue: what the server's small window holds back.
    client.set_nonblocking(true).expect("nonblocking");
    let chunk: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    while client.write(&chunk).is_ok() {}
    std::thread::sleep(std::time::Duration::from_millis(50));
    let fd = client.as_raw_fd();
    socket::set_repair(fd, 1).expect("repair");
    let mut big = vec![0u8; 8 << 20];
    for (queue, len) in [
        (socket::TCP_RECV_QUEUE, socket::inq(fd).expect("SIOCINQ")),
        (socket::TCP_SEND_QUEUE, socket::outq(fd).expect("SIOCOUTQ")),
    ] {
        socket::set_repair_queue(fd, queue).expect("queue");
        assert!(len > 1500, "queue {queue} holds only {len} bytes");
        let want = socket::peek_queue(fd, len as usize).expect("peek");
        let n = socket::peek_whole_queue(fd, &mut big).expect("peek whole").expect("fits");
        assert_eq!(&big[..n], &want[..], "queue {queue}");
        let mut small = vec![0u8; len as usize];
        assert_eq!(socket::peek_whole_queue(fd, &mut small).expect("small"), None);
    }
    socket::set_repair(fd, 0).expect("repair off");
    // Empty queues.
    let idle = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("idle");
    let _accepted = listener.accept().expect("accept idle");
    let fd = idle.as_raw_fd();
    socket::set_repair(fd, 1).expect("repair idle");
    for queue in [socket::TCP_RECV_QUEUE, socket::TCP_SEND_QUEUE] {
        socket::set_repair_queue(fd, queue).expect("queue");
        assert_eq!(socket::peek_whole_queue(fd, &mut big).expect("empty"), Some(0));
    }
    socket::set_repair(fd, 0).expect("repair off");
}
