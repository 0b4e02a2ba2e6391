//! The channel over real TCP on 127.0.0.1, each test with its own listener.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use ferry_transport::{Channel, Key, Mode, TransportError, MAX_MESSAGE};

const T: Duration = Duration::from_secs(10);
/// Bytes the initiator sends before its first data frame: version and mode,
/// handshake message 1 (2 + 48), key confirmation (2 + 13 + 16).
const INITIATOR_HANDSHAKE: u64 = 2 + 2 + 48 + 2 + 13 + 16;

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = l.local_addr().expect("local_addr");
    (l, addr)
}

/// Runs `server` on an accepted channel in a thread and returns the
/// connected client channel with the thread's handle.
fn serve<R: Send + 'static>(
    server_key: Key,
    server: impl FnOnce(Result<Channel, TransportError>) -> R + Send + 'static,
) -> (SocketAddr, thread::JoinHandle<R>) {
    let (l, addr) = listener();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().expect("accept");
        server(Channel::accept(s, &server_key))
    });
    (addr, h)
}

fn connect(addr: SocketAddr, key: &Key, mode: Mode) -> Result<Channel, TransportError> {
    let s = TcpStream::connect(addr).expect("connect");
    Channel::connect(s, key, mode)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8).collect()
}

fn echo_server(ch: Result<Channel, TransportError>) -> Mode {
    let mut ch = ch.expect("server handshake");
    ch.set_timeout(Some(T)).expect("timeout");
    loop {
        match ch.recv() {
            Ok(m) => ch.send(&m).expect("echo"),
            Err(TransportError::Closed) => return ch.mode(),
            Err(e) => panic!("server: {e}"),
        }
    }
}

#[test]
fn round_trip_small_and_large_both_modes() {
    for mode in [Mode::Encrypted, Mode::Insecure] {
        let key = Key::generate().unwrap();
        let (addr, h) = serve(key.clone(), echo_server);
        let mut ch = connect(addr, &key, mode).expect("client handshake");
        ch.set_timeout(Some(T)).unwrap();
        assert_eq!(ch.mode(), mode);
        assert_eq!(ch.peer(), Some(addr));
        let big = pattern(40 << 20, 7);
        let msgs: Vec<Vec<u8>> = vec![
            vec![],
            b"hello".to_vec(),
            pattern(65519 - 4, 1),
            pattern(65519 - 3, 2),
            pattern(65519 * 3, 3),
            big,
        ];
        for m in &msgs {
            ch.send(m).unwrap();
            let back = ch.recv().unwrap();
            assert!(back == *m, "{mode:?}: echo of {} bytes differs", m.len());
        }
        assert!(ch.bytes_sent() > (40 << 20) && ch.bytes_received() > (40 << 20));
        drop(ch);
        assert_eq!(h.join().unwrap(), mode);
    }
}

#[test]
fn send_parts_concatenates() {
    let key = Key::generate().unwrap();
    let (addr, h) = serve(key.clone(), echo_server);
    let mut ch = connect(addr, &key, Mode::Encrypted).unwrap();
    ch.set_timeout(Some(T)).unwrap();
    let big = pattern(300_000, 9);
    let odd = pattern(65517, 4);
    let cases: Vec<Vec<&[u8]>> = vec![
        vec![],
        vec![b"", b""],
        vec![b"HDR1", &big],
        vec![b"h", b"", &odd, b"x", &big, b"tail"],
        vec![&big[..65515], &big[65515..65516], &big[65516..]],
    ];
    for parts in &cases {
        ch.send_parts(parts).unwrap();
        assert_eq!(ch.recv().unwrap(), parts.concat());
    }
    drop(ch);
    h.join().unwrap();
}

#[test]
fn split_halves_from_two_threads() {
    const N: usize = 300;
    let msg = |who: &str, i: usize| {
        let mut m = format!("{who} {i} ").into_bytes();
        m.extend(pattern(1000 + i * 997, i as u8));
        m
    };
    fn run(ch: Channel, me: &'static str, peer: &'static str, msg: fn(&str, usize) -> Vec<u8>) {
        ch.set_timeout(Some(T)).unwrap();
        let (mut tx, mut rx) = ch.split().unwrap();
        let sender = thread::spawn(move || {
            for i in 0..N {
                tx.send_parts(&[&msg(me, i)[..5], &msg(me, i)[5..]]).unwrap();
            }
            tx
        });
        for i in 0..N {
            assert_eq!(rx.recv().unwrap(), msg(peer, i));
        }
        let tx = sender.join().unwrap();
        assert!(tx.bytes_sent() > 0 && rx.bytes_received() > 0);
    }
    for mode in [Mode::Encrypted, Mode::Insecure] {
        let key = Key::generate().unwrap();
        let (addr, h) = serve(key.clone(), move |ch| run(ch.unwrap(), "srv", "cli", msg));
        run(connect(addr, &key, mode).unwrap(), "cli", "srv", msg);
        h.join().unwrap();
    }
}

fn assert_handshake_refused(r: Result<Channel, TransportError>, side: &str, expect: &str) {
    match r {
        Err(e @ TransportError::Handshake { .. }) => {
            let text = e.to_string();
            assert!(text.contains(expect), "{side}: {text}");
        }
        Err(e) => panic!("{side}: wrong error {e:?}"),
        Ok(_) => panic!("{side}: handshake accepted"),
    }
}

#[test]
fn wrong_key_refused_on_both_sides() {
    for mode in [Mode::Encrypted, Mode::Insecure] {
        let (addr, h) = serve(Key::generate().unwrap(), |ch| match ch {
            Ok(mut ch) => Some(ch.recv()),
            Err(e) => {
                assert!(e.to_string().contains("does not hold the same key"), "{e}");
                None
            }
        });
        let r = connect(addr, &Key::generate().unwrap(), mode);
        assert_handshake_refused(r, "initiator", "does not hold the same key");
        assert!(h.join().unwrap().is_none(), "the responder accepted a stranger");
    }
}

/// Forwards one connection to `target`, letting `tamper` rewrite the
/// initiator's bytes (with their offset in the stream) and cut the stream
/// when it returns false.
fn proxy(
    target: SocketAddr,
    tamper: impl FnMut(u64, &mut [u8]) -> bool + Send + 'static,
) -> (SocketAddr, thread::JoinHandle<()>) {
    let (l, addr) = listener();
    let h = thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = TcpStream::connect(target).unwrap();
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let back = thread::spawn(move || {
            let _ = std::io::copy(&mut s2, &mut c2);
            let _ = c2.shutdown(Shutdown::Write);
        });
        let (mut client, mut server) = (client, server);
        let mut tamper = tamper;
        let mut offset = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match client.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let keep_going = tamper(offset, &mut buf[..n]);
            offset += n as u64;
            if server.write_all(&buf[..n]).is_err() || !keep_going {
                break;
            }
        }
        let _ = server.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
        let _ = back.join();
    });
    (addr, h)
}

fn flip_at(at: u64) -> impl FnMut(u64, &mut [u8]) -> bool + Send {
    move |offset, buf| {
        if (offset..offset + buf.len() as u64).contains(&at) {
            buf[(at - offset) as usize] ^= 0x40;
        }
        true
    }
}

#[test]
fn flipped_byte_after_handshake_is_corrupt_in_both_modes() {
    for mode in [Mode::Encrypted, Mode::Insecure] {
        // Inside the first data frame's payload, then deep in a later frame.
        for at in [INITIATOR_HANDSHAKE + 2 + 10, INITIATOR_HANDSHAKE + 300_000] {
            let key = Key::generate().unwrap();
            let (addr, h) = serve(key.clone(), |ch| {
                let mut ch = ch.unwrap();
                ch.set_timeout(Some(T)).unwrap();
                ch.recv()
            });
            let (paddr, ph) = proxy(addr, flip_at(at));
            let mut ch = connect(paddr, &key, mode).unwrap();
            ch.set_timeout(Some(T)).unwrap();
            // The responder drops the connection as soon as it sees the bad
            // frame, so this send may fail part-way.
            let _ = ch.send(&pattern(1 << 20, 5));
            match h.join().unwrap() {
                Err(e @ TransportError::Corrupt { .. }) => {
                    assert!(e.to_string().contains("message 1 failed authentication"), "{e}")
                }
                other => panic!("{mode:?} flip at {at}: {other:?}"),
            }
            drop(ch);
            ph.join().unwrap();
        }
    }
}

#[test]
fn tampered_handshake_is_refused() {
    // Offset 1 is the mode byte (a downgrade to Insecure); 10 is inside the
    // initiator's ephemeral key; 60 is inside the key confirmation.
    for at in [1u64, 10, 60] {
        let key = Key::generate().unwrap();
        let (addr, h) = serve(key.clone(), |ch| ch.map(|_| ()));
        let (paddr, ph) = proxy(addr, flip_at(at));
        let r = connect(paddr, &key, Mode::Encrypted);
        let server = h.join().unwrap();
        assert!(
            matches!(server, Err(TransportError::Handshake { .. })),
            "flip at {at}: responder got {server:?}"
        );
        if at != 60 {
            // The confirmation is the initiator's last word: only the
            // responder can see it was tampered with.
            assert_handshake_refused(r, "initiator", "");
        } else {
            drop(r);
        }
        ph.join().unwrap();
    }
}

#[test]
fn truncated_stream_is_an_error_not_a_hang() {
    for mode in [Mode::Encrypted, Mode::Insecure] {
        let key = Key::generate().unwrap();
        let (addr, h) = serve(key.clone(), |ch| {
            let mut ch = ch.unwrap();
            ch.set_timeout(Some(T)).unwrap();
            let first = ch.recv();
            (first, ch.recv())
        });
        let cut = INITIATOR_HANDSHAKE + 2 + 16 + 4 + 3 + 100_000;
        let (paddr, ph) = proxy(addr, move |offset, buf| offset + (buf.len() as u64) < cut);
        let mut ch = connect(paddr, &key, mode).unwrap();
        ch.set_timeout(Some(T)).unwrap();
        let start = Instant::now();
        ch.send(b"one").unwrap();
        // The proxy may close while we still send; what matters is the receiver.
        let _ = ch.send(&pattern(4 << 20, 1));
        let (first, second) = h.join().unwrap();
        assert_eq!(first.unwrap(), b"one");
        match second {
            Err(e @ TransportError::Corrupt { .. }) => {
                assert!(e.to_string().contains("truncated"), "{e}")
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        assert!(start.elapsed() < T);
        ph.join().unwrap();
    }
}

#[test]
fn clean_close_between_messages_is_closed() {
    let key = Key::generate().unwrap();
    let (addr, h) = serve(key.clone(), |ch| {
        let mut ch = ch.unwrap();
        ch.set_timeout(Some(T)).unwrap();
        (ch.recv().unwrap(), ch.recv())
    });
    let mut ch = connect(addr, &key, Mode::Encrypted).unwrap();
    ch.send(b"last").unwrap();
    ch.shutdown();
    let (first, second) = h.join().unwrap();
    assert_eq!(first, b"last");
    assert!(matches!(second, Err(TransportError::Closed)), "{second:?}");
}

#[test]
fn garbage_or_silent_initiator_is_refused() {
    let key = Key::generate().unwrap();
    let cases: [(&[u8], &str); 5] = [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "protocol version 71"),
        (&[1, 9, 0, 48], "unknown mode 0x09"),
        (&[1, 1, 0, 48, 1, 2, 3], "timed out"),
        (&[1, 1, 0, 48], "timed out"),
        (b"", "timed out"),
    ];
    for (bytes, expect) in cases {
        let (l, addr) = listener();
        let k = key.clone();
        let h = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            // A caller's own timeout wins over the default handshake timeout.
            s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            let start = Instant::now();
            (Channel::accept(s, &k), start.elapsed())
        });
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(bytes).unwrap();
        let (r, took) = h.join().unwrap();
        assert_handshake_refused(r, "responder", expect);
        assert!(took < Duration::from_secs(3), "took {took:?}");
        if bytes.starts_with(b"GET") {
            let mut answer = [0u8; 2];
            raw.read_exact(&mut answer).unwrap();
            assert_eq!(answer, [1, 0xf0], "the responder tells which version it speaks");
        }
    }
    // Random bytes shaped like a first message: the tag does not verify.
    let (addr, h) = serve(key.clone(), |ch| ch.map(|_| ()));
    let mut raw = TcpStream::connect(addr).unwrap();
    let mut junk = vec![1u8, 1, 0, 48];
    junk.extend(pattern(48, 3));
    raw.write_all(&junk).unwrap();
    assert_handshake_refused(
        h.join().unwrap().map(|_| unreachable!()),
        "responder",
        "failed authentication",
    );
    let mut answer = [0u8; 2];
    raw.read_exact(&mut answer).unwrap();
    assert_eq!(answer, [1, 0xf2], "the responder tells the initiator its key was refused");
}

#[test]
fn garbage_or_silent_responder_is_refused() {
    let key = Key::generate().unwrap();
    let cases: [(&[u8], &str); 3] = [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "protocol version 83"),
        (&[1, 1, 0, 48, 9, 9, 9], "timed out"),
        (b"", "timed out"),
    ];
    for (bytes, expect) in cases {
        let (l, addr) = listener();
        let h = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(bytes).unwrap();
            // Stay connected until the initiator gives up and closes.
            s.set_read_timeout(Some(T)).unwrap();
            while matches!(s.read(&mut [0u8; 256]), Ok(n) if n > 0) {}
        });
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let start = Instant::now();
        assert_handshake_refused(Channel::connect(s, &key, Mode::Encrypted), "initiator", expect);
        assert!(start.elapsed() < Duration::from_secs(2));
        h.join().unwrap();
    }
}

#[test]
fn replayed_first_message_is_refused() {
    let key = Key::generate().unwrap();
    // Record a genuine initiator's first bytes.
    let (l, addr) = listener();
    let recorder = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut first = [0u8; 52];
        s.read_exact(&mut first).unwrap();
        first
    });
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    assert!(Channel::connect(s, &key, Mode::Encrypted).is_err());
    let first = recorder.join().unwrap();

    let (addr, h) = serve(key.clone(), |ch| ch.map(|_| ()));
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(&first).unwrap();
    let mut answer = [0u8; 2 + 2 + 48];
    raw.read_exact(&mut answer).unwrap();
    assert_eq!(answer[..2], [1, 1], "message 1 alone is accepted");
    // Without the ephemeral secret the replayer can only guess the
    // confirmation.
    let mut fake = vec![0u8, 29];
    fake.extend(pattern(29, 8));
    raw.write_all(&fake).unwrap();
    assert_handshake_refused(
        h.join().unwrap().map(|_| unreachable!()),
        "responder",
        "key confirmation",
    );
}

#[test]
fn timeout_then_resume_and_too_large() {
    let key = Key::generate().unwrap();
    let (addr, h) = serve(key.clone(), |ch| {
        let mut ch = ch.unwrap();
        ch.set_timeout(Some(Duration::from_millis(200))).unwrap();
        let first = ch.recv();
        ch.set_timeout(Some(T)).unwrap();
        (first, ch.recv())
    });
    let mut ch = connect(addr, &key, Mode::Encrypted).unwrap();
    let too_big = vec![0u8; MAX_MESSAGE + 1];
    assert!(
        matches!(ch.send(&too_big), Err(TransportError::TooLarge { len }) if len == MAX_MESSAGE as u64 + 1)
    );
    assert!(matches!(
        ch.send_parts(&[&too_big[..MAX_MESSAGE], b"x"]),
        Err(TransportError::TooLarge { .. })
    ));
    thread::sleep(Duration::from_millis(600));
    ch.send(b"after the timeout").unwrap();
    let (first, second) = h.join().unwrap();
    assert!(matches!(first, Err(TransportError::Timeout { .. })), "{first:?}");
    assert_eq!(second.unwrap(), b"after the timeout");
}

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferry-transport-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn key_file_write_load_and_refusals() {
    let path = temp_path("key");
    let key = Key::write_new(&path).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.len(), 65);
    assert!(text.ends_with('\n') && text[..64].bytes().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(Key::load(&path).unwrap(), key);
    assert!(!format!("{key:?}").contains(&text[..8]), "Debug shows the key");

    let again = Key::write_new(&path).unwrap_err().to_string();
    assert!(again.contains("already exists") && again.contains(path.to_str().unwrap()), "{again}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "existing key overwritten");

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Key::load(&path).unwrap_err().to_string();
    assert!(e.contains("readable by group or others (mode 0644): chmod 600"), "{e}");
    assert!(e.contains(path.to_str().unwrap()), "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o620)).unwrap();
    assert!(Key::load(&path).unwrap_err().to_string().contains("writable"));

    let bad: [(&str, &str); 4] = [
        ("abc\n", "holds 4 characters"),
        (&"a".repeat(66), "holds 66 characters"),
        (&format!("{}g\n", "a".repeat(63)), "offset 63 is not a hex digit"),
        ("", "holds 0 characters"),
    ];
    for (content, expect) in bad {
        let p = temp_path("bad");
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Key::load(&p).unwrap_err();
        assert!(matches!(e, TransportError::KeyFile { .. }));
        let e = e.to_string();
        assert!(e.contains(expect) && e.contains(p.to_str().unwrap()), "{e}");
    }
    let p = temp_path("upper");
    std::fs::write(&p, format!("{}\r\n", "AB".repeat(32))).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
    assert_eq!(Key::load(&p).unwrap(), Key::from_bytes([0xab; 32]));
    let e = Key::load(&temp_path("missing")).unwrap_err().to_string();
    assert!(e.contains("cannot be opened"), "{e}");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

const TOTAL: usize = 256 << 20;
const CHUNK: usize = 4 << 20;

/// Plain TCP over the same loopback, for scale: the channel cannot beat it.
fn raw_tcp_mb_per_s() -> f64 {
    let (l, addr) = listener();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 4 * 65537];
        let mut got = 0;
        while got < TOTAL {
            got += s.read(&mut buf).unwrap();
        }
        s.write_all(b"k").unwrap();
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let data = pattern(CHUNK, 11);
    let start = Instant::now();
    for _ in 0..TOTAL / CHUNK {
        s.write_all(&data).unwrap();
    }
    s.read_exact(&mut [0u8]).unwrap();
    let secs = start.elapsed().as_secs_f64();
    h.join().unwrap();
    TOTAL as f64 / secs / 1e6
}

#[test]
fn throughput_256_mib() {
    println!("throughput raw TCP (no channel): {:.0} MB/s", raw_tcp_mb_per_s());
    for mode in [Mode::Encrypted, Mode::Insecure] {
        let key = Key::generate().unwrap();
        let (addr, h) = serve(key.clone(), |ch| {
            let mut ch = ch.unwrap();
            ch.set_timeout(Some(T)).unwrap();
            let mut got = 0usize;
            let mut sum = 0u64;
            while got < TOTAL {
                let m = ch.recv().unwrap();
                sum = sum.wrapping_add(u64::from(m[16]) + u64::from(m[m.len() - 1]));
                got += m.len() - 16;
            }
            ch.send(&sum.to_le_bytes()).unwrap();
            got
        });
        let mut ch = connect(addr, &key, mode).unwrap();
        ch.set_timeout(Some(T)).unwrap();
        let data = pattern(CHUNK, 11);
        let header = [7u8; 16];
        let start = Instant::now();
        let mut expect = 0u64;
        for _ in 0..TOTAL / CHUNK {
            ch.send_parts(&[&header, &data]).unwrap();
            expect = expect.wrapping_add(u64::from(data[0]) + u64::from(data[CHUNK - 1]));
        }
        let reply = ch.recv().unwrap();
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(reply, expect.to_le_bytes());
        assert_eq!(h.join().unwrap(), TOTAL);
        println!(
            "throughput {mode:?}: {:.0} MB/s ({} MiB in {secs:.2}s, {} wire bytes)",
            TOTAL as f64 / secs / 1e6,
            TOTAL >> 20,
            ch.bytes_sent()
        );
    }
}
