//! An image as one byte stream: round trips through memory, a real socket
//! and image directories, and every kind of broken stream rejected with a
//! sensible error (never a panic, a huge allocation or a hang).

use ferry_image::container::{self, checksum, encode_meta, MAX_SECTION_LEN, SECTION_HEADER_LEN};
use ferry_image::dir::{META_FILE, PAGES_FILE};
use ferry_image::model::*;
use ferry_image::stream::{dir_to_stream, is_stream_error, read_stream, write_stream};
use ferry_image::{ImageDir, ImageError, FORMAT_VERSION};
use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

const PID: i32 = 777;
const PAGE: usize = 4096;

// ---------------------------------------------------------------- fixture

fn thread(tid: i32) -> ThreadImage {
    ThreadImage {
        tid,
        comm: "streamed".into(),
        regs: (0..27).collect(),
        xstate: vec![0xa5; 576],
        sigmask: 0,
        pending: vec![],
        altstack: AltStack::default(),
        rseq: None,
        robust_list: RobustList::default(),
        clear_child_tid: 0,
        timer_slack_ns: 50_000,
        sched: Default::default(),
        sleep_remaining_ns: None,
    }
}

fn anon(start: u64, end: u64) -> Vma {
    Vma {
        start,
        end,
        prot: PROT_READ | PROT_WRITE,
        shared: false,
        flags: 0,
        pgoff: 0,
        backing: VmaBacking::Anonymous,
    }
}

/// Page data that is different on every page (so misplaced runs show).
fn fill_pages(npages: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..npages * PAGE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A valid image of one process with `npages` (>= 2) pages of data in two runs: the first
/// run (lower address) is stored *after* the second in the data area, so
/// offsets and addresses do not go the same way.
fn image(npages: usize) -> (Inventory, TreeImage, Vec<u8>) {
    assert!(npages >= 2);
    let pages = fill_pages(npages);
    let low_pages = npages - 1;
    let heap = 0x60_0000u64;
    let stack_top = 0x7ffd_0002_0000u64;
    let low_off = PAGE; // the single high page sits at offset 0
    let runs = vec![
        PageRun {
            start: heap,
            pages: low_pages as u64,
            offset: low_off as u64,
            checksum: checksum(&pages[low_off..low_off + low_pages * PAGE]),
        },
        PageRun {
            start: stack_top - PAGE as u64,
            pages: 1,
            offset: 0,
            checksum: checksum(&pages[..PAGE]),
        },
    ];
    let inv = Inventory {
        format_version: FORMAT_VERSION,
        ferry_version: "0.1.0".into(),
        kernel_release: "6.1.0".into(),
        arch: "x86_64".into(),
        xsave_size: 576,
        created_unix_ms: 1_700_000_000_000,
        source_pid: PID,
        pages_bytes: pages.len() as u64,
    };
    let p = ProcessImage {
        pid: PID,
        ppid: 1,
        pgid: PID,
        sid: PID,
        comm: "streamed".into(),
        exe: "/usr/bin/streamed".into(),
        cwd: "/".into(),
        umask: 0o022,
        personality: 0,
        no_new_privs: false,
        creds: Creds {
            uids: [1000; 4],
            gids: [1000; 4],
            groups: vec![1000],
            caps: Default::default(),
        },
        rlimits: vec![Rlimit { resource: 7, soft: 1024, hard: 4096 }],
        threads: vec![thread(PID), thread(PID + 1)],
        mm: MmLayout { auxv: vec![6, 4096, 0, 0], ..Default::default() },
        vmas: vec![
            Vma {
                start: 0x40_0000,
                end: 0x40_1000,
                prot: PROT_READ | PROT_EXEC,
                shared: false,
                flags: 0,
                pgoff: 0,
                backing: VmaBacking::File { path: "/usr/bin/streamed".into(), dev: 1, ino: 2 },
            },
            anon(heap, heap + (low_pages + 3) as u64 * PAGE as u64),
            anon(stack_top - 0x20000, stack_top),
        ],
        page_runs: runs,
        files: vec![OpenFile {
            id: 1,
            flags: 0,
            pos: 0,
            locks: vec![],
            kind: FileKind::EventFd { count: 3, semaphore: false },
        }],
        fds: vec![FdSlot { fd: 3, file: 0, cloexec: true }],
        signals: SignalState { actions: vec![SigAction::default(); 64], shared_pending: vec![] },
        itimers: vec![],
        posix_timers: vec![],
        misc: ProcessMisc::default(),
        memfds: vec![],
        inherited: vec![],
        root: None,
        fidelity: Default::default(),
    };
    let t = TreeImage::single(p);
    ferry_image::validate::validate(&inv, &t).expect("fixture is valid");
    (inv, t, pages)
}

fn stream_of(inv: &Inventory, t: &TreeImage, pages: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let n = write_stream(&mut out, inv, t, pages).expect("write_stream");
    assert_eq!(n, out.len() as u64);
    out
}

// ------------------------------------------------- raw section surgery

/// A stream taken apart: the 16-byte header and (kind, payload) sections.
struct Raw {
    header: Vec<u8>,
    sections: Vec<(u32, Vec<u8>)>,
}

fn split(stream: &[u8]) -> Raw {
    let header = stream[..16].to_vec();
    let mut rest = &stream[16..];
    let mut sections = Vec::new();
    while !rest.is_empty() {
        let kind = u32::from_le_bytes(rest[0..4].try_into().unwrap());
        let len = u64::from_le_bytes(rest[8..16].try_into().unwrap()) as usize;
        sections.push((kind, rest[SECTION_HEADER_LEN..SECTION_HEADER_LEN + len].to_vec()));
        rest = &rest[SECTION_HEADER_LEN + len..];
    }
    Raw { header, sections }
}

fn section_bytes(kind: u32, len: u64, sum: u64) -> [u8; SECTION_HEADER_LEN] {
    let mut h = [0u8; SECTION_HEADER_LEN];
    h[..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&len.to_le_bytes());
    h[16..24].copy_from_slice(&sum.to_le_bytes());
    h
}

/// Puts sections back together with correct lengths and checksums.
fn join(header: &[u8], sections: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = header.to_vec();
    for (kind, payload) in sections {
        out.extend_from_slice(&section_bytes(*kind, payload.len() as u64, checksum(payload)));
        out.extend_from_slice(payload);
    }
    out
}

/// Offsets where each section header starts, and the stream's end.
fn boundaries(stream: &[u8]) -> Vec<usize> {
    let raw = split(stream);
    let mut at = 16;
    let mut b = vec![at];
    for (_, payload) in &raw.sections {
        at += SECTION_HEADER_LEN + payload.len();
        b.push(at);
    }
    b
}

const INV: u32 = 1;
const TREE: u32 = 2;
const PAGES: u32 = 3;

fn read(bytes: &[u8]) -> Result<(Inventory, TreeImage, Vec<u8>), ImageError> {
    read_stream(&mut Cursor::new(bytes), None)
}

fn expect_err(bytes: &[u8]) -> ImageError {
    match read(bytes) {
        Ok(_) => panic!("stream of {} bytes was accepted", bytes.len()),
        Err(e) => e,
    }
}

// ------------------------------------------------------ temp directories

/// A unique directory under the system temp dir, removed when dropped
/// (also when the test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let path = std::env::temp_dir().join(format!(
            "ferry-stream-test-{}-{tag}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes an image directory with ImageDir's own API (not via streams).
fn write_dir(dir: &Path, inv: &Inventory, t: &TreeImage, pages: &[u8]) {
    let image = ImageDir::new(dir);
    let mut w = image.create_pages().unwrap();
    w.append_runs(&[], pages).unwrap();
    assert_eq!(w.finish().unwrap(), pages.len() as u64);
    image.write_meta(inv, t).unwrap();
}

// ------------------------------------------------------------ round trips

#[test]
fn stream_is_meta_then_pages_section() {
    let (inv, t, pages) = image(3);
    let s = stream_of(&inv, &t, &pages);
    let meta = encode_meta(&inv, &t).unwrap();
    assert_eq!(&s[..meta.len()], &meta[..], "metadata framed exactly as encode_meta");
    let ph = &s[meta.len()..meta.len() + SECTION_HEADER_LEN];
    assert_eq!(ph, &container::section_header(container::SectionKind::Pages, &pages)[..]);
    assert_eq!(&s[meta.len() + SECTION_HEADER_LEN..], &pages[..]);
}

#[test]
fn round_trip_through_memory() {
    let (inv, t, pages) = image(5);
    let s = stream_of(&inv, &t, &pages);
    let (inv2, t2, pages2) = read(&s).unwrap();
    assert_eq!(inv2, inv);
    assert_eq!(t2, t);
    assert_eq!(pages2, pages);
}

#[test]
fn round_trip_without_pages() {
    let (mut inv, mut t, _) = image(2);
    inv.pages_bytes = 0;
    t.processes[0].page_runs.clear();
    let s = stream_of(&inv, &t, &[]);
    let (inv2, t2, pages2) = read(&s).unwrap();
    assert_eq!((inv2, t2), (inv, t));
    assert!(pages2.is_empty());
}

#[test]
fn reader_stops_exactly_at_the_end_of_the_image() {
    let (inv, t, pages) = image(2);
    let mut s = stream_of(&inv, &t, &pages);
    let len = s.len();
    s.extend_from_slice(b"next message");
    let mut c = Cursor::new(&s[..]);
    read_stream(&mut c, None).unwrap();
    assert_eq!(c.position() as usize, len);
    // Two images back to back on one stream.
    let mut two = stream_of(&inv, &t, &pages);
    two.extend(stream_of(&inv, &t, &pages));
    let mut c = Cursor::new(&two[..]);
    read_stream(&mut c, None).unwrap();
    read_stream(&mut c, None).unwrap();
    assert_eq!(c.position() as usize, two.len());
}

/// Hands out a few bytes at a time and is sometimes interrupted, like a
/// slow socket.
struct Trickle<'a> {
    data: &'a [u8],
    calls: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.calls += 1;
        if self.calls.is_multiple_of(7) {
            return Err(std::io::Error::new(std::io::ErrorKind::Interrupted, "signal"));
        }
        let n = (self.calls % 13 + 1).min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn round_trip_with_short_and_interrupted_reads() {
    let (inv, t, pages) = image(3);
    let s = stream_of(&inv, &t, &pages);
    let (inv2, t2, pages2) = read_stream(&mut Trickle { data: &s, calls: 0 }, None).unwrap();
    assert_eq!((inv2, t2, pages2), (inv, t, pages));
}

#[test]
fn round_trip_through_a_socket() {
    use std::os::unix::net::UnixStream;
    // 8 MiB of pages: far more than the socket buffer, so both sides block
    // and the reader sees many partial reads.
    let (inv, t, pages) = image(2048);
    let (mut tx, mut rx) = UnixStream::pair().unwrap();
    let (inv_w, t_w, pages_w) = (inv.clone(), t.clone(), pages.clone());
    let writer = std::thread::spawn(move || {
        let a = write_stream(&mut tx, &inv_w, &t_w, &pages_w).unwrap();
        // A second image on the same connection.
        let b = write_stream(&mut tx, &inv_w, &t_w, &pages_w[..]).unwrap();
        a + b
    });
    let first = read_stream(&mut rx, None);
    let second = read_stream(&mut rx, None);
    let sent = writer.join().unwrap();
    let (inv2, t2, pages2) = first.unwrap();
    assert_eq!(inv2, inv);
    assert_eq!(t2, t);
    assert!(pages2 == pages);
    assert!(second.unwrap().2 == pages);
    assert_eq!(sent, 2 * stream_of(&inv, &t, &pages).len() as u64);
    // Nothing left over: the writer's end was dropped with its thread.
    let mut rest = Vec::new();
    rx.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

#[test]
fn socket_closed_mid_image_is_truncated() {
    use std::os::unix::net::UnixStream;
    let (inv, t, pages) = image(64);
    let s = stream_of(&inv, &t, &pages);
    let (mut tx, mut rx) = UnixStream::pair().unwrap();
    let cut = s.len() - 5000;
    let writer = std::thread::spawn(move || {
        tx.write_all(&s[..cut]).unwrap();
        // tx dropped here: the reader sees EOF in the middle of the pages.
    });
    let e = read_stream(&mut rx, None).unwrap_err();
    writer.join().unwrap();
    assert!(matches!(e, ImageError::Truncated(_)), "{e:?}");
}

#[test]
fn dir_to_stream_to_dir() {
    let (inv, t, pages) = image(9);
    let a = TempDir::new("src");
    let b = TempDir::new("dst");
    let b_img = b.path().join("image"); // does not exist yet: read_stream creates it
    write_dir(a.path(), &inv, &t, &pages);

    let mut s = Vec::new();
    let n = dir_to_stream(a.path(), &mut s).unwrap();
    assert_eq!(n, s.len() as u64);
    assert_eq!(
        s,
        stream_of(&inv, &t, &pages),
        "a directory streams to the same bytes as write_stream"
    );

    let (inv2, t2, pages2) = read_stream(&mut Cursor::new(&s), Some(&b_img)).unwrap();
    assert_eq!((&inv2, &t2, &pages2), (&inv, &t, &pages));

    // The new directory is byte for byte what ImageDir wrote, and reads back.
    for f in [META_FILE, PAGES_FILE] {
        let x = std::fs::read(a.path().join(f)).unwrap();
        let y = std::fs::read(b_img.join(f)).unwrap();
        assert!(x == y, "{f} differs");
    }
    assert!(!b_img.join("meta.img.tmp").exists());
    let received = ImageDir::new(&b_img);
    assert!(ImageDir::exists(&b_img));
    let (inv3, t3) = received.read_meta().unwrap();
    assert_eq!((&inv3, &t3), (&inv, &t));
    received.check_pages_file(&inv3).unwrap();
    let on_disk = std::fs::read(received.pages_path()).unwrap();
    ImageDir::verify_runs(&t3.processes[0].page_runs, &on_disk[4096..]).unwrap();

    // Receiving into a directory that already holds a (different) image
    // replaces it completely.
    let (inv4, t4, pages4) = image(4);
    let s4 = stream_of(&inv4, &t4, &pages4);
    read_stream(&mut Cursor::new(&s4), Some(&b_img)).unwrap();
    assert_eq!(ImageDir::new(&b_img).read_meta().unwrap(), (inv4.clone(), t4.clone()));
    let mut s5 = Vec::new();
    dir_to_stream(&b_img, &mut s5).unwrap();
    assert!(s5 == s4);
    read_stream(&mut Cursor::new(&s), Some(&b_img)).unwrap();

    // And back out again: identical stream.
    let mut s2 = Vec::new();
    dir_to_stream(&b_img, &mut s2).unwrap();
    assert!(s2 == s);
}

#[test]
fn dir_to_stream_refuses_a_broken_directory() {
    let (inv, t, pages) = image(3);
    let d = TempDir::new("broken");
    write_dir(d.path(), &inv, &t, &pages);
    // pages.img one page short of what the inventory says.
    let pf = d.path().join(PAGES_FILE);
    let f = std::fs::OpenOptions::new().write(true).open(&pf).unwrap();
    f.set_len((4096 + pages.len() - PAGE) as u64).unwrap();
    let mut out = Vec::new();
    let e = dir_to_stream(d.path(), &mut out).unwrap_err();
    assert!(matches!(e, ImageError::Truncated(_)), "{e:?}");
    assert!(out.is_empty(), "nothing sent for a broken image");
    // No directory at all.
    let e = dir_to_stream(&d.path().join("missing"), &mut out).unwrap_err();
    assert!(matches!(e, ImageError::Io { .. }), "{e:?}");
    assert!(!is_stream_error(&e));
}

#[test]
fn rejected_stream_leaves_no_directory() {
    let (inv, t, pages) = image(3);
    let mut s = stream_of(&inv, &t, &pages);
    let last = s.len() - 1;
    s[last] ^= 1;
    let d = TempDir::new("rejected");
    let target = d.path().join("image");
    let e = read_stream(&mut Cursor::new(&s), Some(&target)).unwrap_err();
    assert!(matches!(e, ImageError::Checksum { .. }), "{e:?}");
    assert!(!target.exists());
}

#[test]
fn write_errors_are_stream_io_errors() {
    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "peer went away"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let (inv, t, pages) = image(2);
    let e = write_stream(&mut Broken, &inv, &t, &pages).unwrap_err();
    assert!(is_stream_error(&e), "{e:?}");
}

#[test]
fn write_stream_refuses_page_data_of_the_wrong_size() {
    let (inv, t, pages) = image(3);
    let mut out = Vec::new();
    let e = write_stream(&mut out, &inv, &t, &pages[..pages.len() - 1]).unwrap_err();
    assert!(matches!(e, ImageError::Invalid(_)), "{e:?}");
    assert!(out.is_empty());
}

// ------------------------------------------------------------- rejections

#[test]
fn truncated_at_every_section_boundary() {
    let (inv, t, pages) = image(3);
    let s = stream_of(&inv, &t, &pages);
    let b = boundaries(&s);
    assert_eq!(b.len(), 4);
    let mut cuts = vec![0, 8, 15];
    for &x in &b[..3] {
        cuts.extend([x, x + 1, x + SECTION_HEADER_LEN - 1, x + SECTION_HEADER_LEN]);
    }
    cuts.extend([b[3] - 1, b[2] + SECTION_HEADER_LEN + pages.len() / 2]);
    for cut in cuts {
        let e = expect_err(&s[..cut]);
        assert!(matches!(e, ImageError::Truncated(_)), "cut at {cut}: {e:?}");
    }
}

#[test]
fn truncated_anywhere() {
    let (inv, t, pages) = image(3);
    let s = stream_of(&inv, &t, &pages);
    let meta_end = boundaries(&s)[2] + SECTION_HEADER_LEN;
    // Every byte of the metadata, then every 61st byte of page data.
    for cut in (0..meta_end).chain((meta_end..s.len()).step_by(61)) {
        let e = expect_err(&s[..cut]);
        assert!(matches!(e, ImageError::Truncated(_)), "cut at {cut}: {e:?}");
    }
}

#[test]
fn flipped_byte_in_each_section() {
    let (inv, t, pages) = image(3);
    let s = stream_of(&inv, &t, &pages);
    let b = boundaries(&s);
    let names = ["inventory", "process tree", "pages"];
    for i in 0..3 {
        let payload_start = b[i] + SECTION_HEADER_LEN;
        let payload_len = b[i + 1] - payload_start;
        // First, middle and last byte of the payload.
        for at in [payload_start, payload_start + payload_len / 2, b[i + 1] - 1] {
            let mut bad = s.clone();
            bad[at] ^= 0x40;
            match expect_err(&bad) {
                ImageError::Checksum { what } => assert!(what.contains(names[i]), "{what}"),
                e => panic!("flip at {at} in {}: {e:?}", names[i]),
            }
        }
        // The checksum field itself.
        let mut bad = s.clone();
        bad[b[i] + 17] ^= 1;
        assert!(matches!(expect_err(&bad), ImageError::Checksum { .. }));
        // The kind field: unknown kind.
        let mut bad = s.clone();
        bad[b[i]] = 0x7f;
        assert!(matches!(expect_err(&bad), ImageError::Invalid(_)));
    }
    let mut bad = s.clone();
    bad[0] ^= 1;
    assert!(matches!(expect_err(&bad), ImageError::BadMagic(_)));
    let mut bad = s.clone();
    bad[8] = 99;
    assert!(matches!(expect_err(&bad), ImageError::Version { found: 99, .. }));
}

#[test]
fn corrupt_page_run_with_matching_section_checksum() {
    // The sender computed the section checksum over already-corrupt data:
    // only the run's own checksum can catch it.
    let (inv, t, pages) = image(3);
    let mut raw = split(&stream_of(&inv, &t, &pages));
    raw.sections[2].1[PAGE + 100] ^= 0xff; // inside the low run
    match expect_err(&join(&raw.header, &raw.sections)) {
        ImageError::Checksum { what } => assert!(what.contains("pages at 0x600000"), "{what}"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn pages_section_length_must_match_inventory() {
    let (inv, t, pages) = image(3);
    let raw = split(&stream_of(&inv, &t, &pages));
    // Longer (a whole extra page) and shorter (one byte less).
    let mut longer = raw.sections.clone();
    longer[2].1.extend_from_slice(&[0u8; PAGE]);
    let mut shorter = raw.sections.clone();
    shorter[2].1.pop();
    for (what, sections) in [("longer", longer), ("shorter", shorter)] {
        match expect_err(&join(&raw.header, &sections)) {
            ImageError::Invalid(m) => assert!(m.contains("inventory says"), "{what}: {m}"),
            e => panic!("{what}: {e:?}"),
        }
    }
}

#[test]
fn duplicate_sections() {
    let (inv, t, pages) = image(2);
    let raw = split(&stream_of(&inv, &t, &pages));
    let [i, pr, pg] = [raw.sections[0].clone(), raw.sections[1].clone(), raw.sections[2].clone()];
    for (what, sections) in [
        ("process tree", vec![i.clone(), pr.clone(), pr.clone(), pg.clone()]),
        ("inventory", vec![i.clone(), i.clone(), pr.clone(), pg.clone()]),
        ("inventory", vec![i.clone(), pr.clone(), i.clone(), pg.clone()]),
    ] {
        match expect_err(&join(&raw.header, &sections)) {
            ImageError::Invalid(m) => assert!(m.contains(&format!("duplicate {what}")), "{m}"),
            e => panic!("{e:?}"),
        }
    }
}

#[test]
fn sections_out_of_order() {
    let (inv, t, pages) = image(2);
    let raw = split(&stream_of(&inv, &t, &pages));
    let [i, pr, pg] = [raw.sections[0].clone(), raw.sections[1].clone(), raw.sections[2].clone()];
    for sections in [
        vec![pr.clone(), i.clone(), pg.clone()],
        vec![i.clone(), pg.clone(), pr.clone()],
        vec![pg.clone(), i.clone(), pr.clone()],
        vec![pg.clone()],
    ] {
        let e = expect_err(&join(&raw.header, &sections));
        assert!(matches!(e, ImageError::Invalid(_)), "{e:?}");
    }
    // Missing the pages section altogether: the stream just ends.
    let e = expect_err(&join(&raw.header, &[i, pr]));
    assert!(matches!(e, ImageError::Truncated(_)), "{e:?}");
}

#[test]
fn unknown_section_kind() {
    let (inv, t, pages) = image(2);
    let raw = split(&stream_of(&inv, &t, &pages));
    let mut sections = raw.sections.clone();
    sections.insert(1, (13, vec![1, 2, 3]));
    let e = expect_err(&join(&raw.header, &sections));
    assert!(
        matches!(e, ImageError::Invalid(ref m) if m.contains("unknown section kind 13")),
        "{e:?}"
    );
}

#[test]
fn hostile_metadata_lengths() {
    let (inv, t, pages) = image(2);
    let raw = split(&stream_of(&inv, &t, &pages));
    let inv_payload = &raw.sections[0].1;
    // Above the limit: refused before reading anything.
    let mut s = raw.header.clone();
    s.extend_from_slice(&section_bytes(INV, MAX_SECTION_LEN + 1, 0));
    s.extend_from_slice(inv_payload);
    assert!(matches!(expect_err(&s), ImageError::Invalid(_)));
    let mut s = raw.header.clone();
    s.extend_from_slice(&section_bytes(INV, u64::MAX, 0));
    assert!(matches!(expect_err(&s), ImageError::Invalid(_)));
    // At the limit but with only a few bytes behind it: truncated, and
    // quickly (the reader must not allocate the claimed gigabyte).
    let mut s = raw.header.clone();
    s.extend_from_slice(&section_bytes(INV, MAX_SECTION_LEN, 0));
    s.extend_from_slice(inv_payload);
    assert!(matches!(expect_err(&s), ImageError::Truncated(_)));
    // Same for the process tree section.
    let mut s = join(&raw.header, &raw.sections[..1]);
    s.extend_from_slice(&section_bytes(TREE, MAX_SECTION_LEN, 0));
    s.extend_from_slice(&[0u8; 100]);
    assert!(matches!(expect_err(&s), ImageError::Truncated(_)));
}

#[test]
fn hostile_page_data_length() {
    // The inventory claims a terabyte (or everything) of pages and the
    // pages section agrees, but only a little data follows: the reader must
    // report truncation without trying to allocate the claimed size.
    let (mut inv, t, pages) = image(2);
    for claim in [1u64 << 40, !4095u64, u64::MAX] {
        inv.pages_bytes = claim;
        let meta = encode_meta(&inv, &t).unwrap();
        let mut s = meta.clone();
        s.extend_from_slice(&section_bytes(PAGES, claim, 0));
        s.extend_from_slice(&pages);
        s.extend_from_slice(&vec![0u8; 1 << 20]);
        let e = expect_err(&s);
        assert!(matches!(e, ImageError::Truncated(_)), "{claim:#x}: {e:?}");
    }
}

#[test]
fn invalid_metadata_is_rejected_before_page_data() {
    let (inv, mut t, pages) = image(3);
    t.processes[0].pid = 0; // validate() refuses this
    let raw = split(&stream_of(&inv, &t, &pages));
    let s = join(&raw.header, &raw.sections);
    let mut c = Cursor::new(&s[..]);
    let e = read_stream(&mut c, None).unwrap_err();
    assert!(matches!(e, ImageError::Invalid(ref m) if m.contains("pid")), "{e:?}");
    // Nothing of the pages section was consumed.
    assert_eq!(c.position() as usize, boundaries(&s)[2]);

    // A page run pointing past the page data is also metadata-invalid.
    let (inv, mut t, pages) = image(3);
    t.processes[0].page_runs[1].offset = inv.pages_bytes;
    let s = stream_of(&inv, &t, &pages);
    assert!(matches!(expect_err(&s), ImageError::Invalid(_)));
}

#[test]
fn undecodable_metadata() {
    let (inv, t, pages) = image(2);
    let raw = split(&stream_of(&inv, &t, &pages));
    for which in [0usize, 1] {
        let mut sections = raw.sections.clone();
        sections[which].1 = vec![0xff; 7]; // correct checksum, garbage inside
        let e = expect_err(&join(&raw.header, &sections));
        assert!(matches!(e, ImageError::Decode { .. }), "{e:?}");
    }
}

// ------------------------------------------------------- process trees

const CHILD: i32 = PID + 100;
const GRANDCHILD: i32 = PID + 200;
const SHM_ANON: u64 = 0x5151;
const SYSV_ID: i32 = 65538;

/// A valid tree of three processes with five pages of data: the root of
/// `image(3)` (pages 0-2; it also maps an anonymous shared region and a
/// SysV segment), a child that inherited the heap and stores one page of
/// its own (page 3), a grandchild that inherited the stack, detached the
/// SysV segment and stores one page (page 4); two zombies, the shared
/// memory object and the SysV segment.
fn tree_image() -> (Inventory, TreeImage, Vec<u8>) {
    let (mut inv, t, _) = image(3);
    let pages = fill_pages(5);
    inv.pages_bytes = pages.len() as u64;
    let mut root = t.processes.into_iter().next().unwrap();
    let shared = |start: u64, pages: u64, backing| Vma {
        start,
        end: start + pages * PAGE as u64,
        prot: PROT_READ | PROT_WRITE,
        shared: true,
        flags: 0,
        pgoff: 0,
        backing,
    };
    root.vmas.insert(2, shared(0x7f00_0000_0000, 2, VmaBacking::SharedAnon { id: SHM_ANON }));
    root.vmas.insert(3, shared(0x7f00_1000_0000, 4, VmaBacking::SysvShm { id: SYSV_ID }));
    let heap = root.vmas[1].clone();
    let stack = root.vmas[4].clone();
    let run = |start: u64, page: usize| PageRun {
        start,
        pages: 1,
        offset: (page * PAGE) as u64,
        checksum: checksum(&pages[page * PAGE..(page + 1) * PAGE]),
    };

    let mut child = root.clone();
    child.pid = CHILD;
    child.ppid = PID;
    child.comm = "child".into();
    child.threads = vec![thread(CHILD)];
    child.inherited = vec![InheritedVma {
        start: heap.start,
        end: heap.end,
        shared_pages: vec![ferry_image::PageSpan::new(heap.start, 1)],
    }];
    child.page_runs = vec![run(heap.start + PAGE as u64, 3)];

    let mut grandchild = child.clone();
    grandchild.pid = GRANDCHILD;
    grandchild.ppid = CHILD;
    grandchild.comm = "grandchild".into();
    grandchild.threads = vec![thread(GRANDCHILD), thread(GRANDCHILD + 1), thread(GRANDCHILD + 2)];
    grandchild.vmas.retain(|v| !matches!(v.backing, VmaBacking::SysvShm { .. }));
    grandchild.inherited =
        vec![InheritedVma { start: stack.start, end: stack.end, shared_pages: vec![] }];
    grandchild.page_runs = vec![run(stack.end - PAGE as u64, 4)];
    grandchild.root = Some("/jail".into());

    let t = TreeImage {
        processes: vec![root, child, grandchild],
        zombies: vec![
            Zombie { pid: PID + 300, ppid: PID, pgid: PID, sid: PID, wait_status: 7 << 8 },
            Zombie { pid: PID + 301, ppid: GRANDCHILD, pgid: PID, sid: PID, wait_status: 15 },
        ],
        shared_anon: vec![MemfdObject {
            id: SHM_ANON,
            name: "/dev/zero (deleted)".into(),
            size: 2 * PAGE as u64,
            seals: 0,
            extents: vec![(0, b"both see this".to_vec())],
        }],
        sysv_shm: vec![SysvShm {
            id: SYSV_ID,
            key: 0x00c0_ffee,
            size: 4 * PAGE as u64,
            mode: 0o640,
            uid: 1000,
            gid: 1000,
            extents: vec![(PAGE as u64, vec![0x5a; 100])],
        }],
        sysv_sem: vec![SysvSem {
            id: 11,
            key: 0x77,
            mode: 0o640,
            uid: 1000,
            gid: 1000,
            values: vec![1; 64],
        }],
        sysv_msg: vec![SysvMsgQueue {
            id: 12,
            key: 0x78,
            mode: 0o600,
            uid: 1000,
            gid: 1000,
            max_bytes: 16384,
            messages: vec![(2, b"queued".to_vec())],
        }],
        own_pid_namespace: true,
        network_lock: Some(NetworkLockRef { method: "ebpf".into(), name: "ckpt_1_0".into() }),
        cgroups: Some(CgroupImage {
            processes: vec![ProcessCgroups {
                pid: GRANDCHILD,
                memberships: vec![CgroupMembership {
                    hierarchy: 0,
                    controllers: String::new(),
                    path: "/jailed".into(),
                }],
            }],
        }),
        unix_peers: None,
        unix_dead_peers: None,
        unix_in_flight_files: None,
        ptys: None,
        process_attrs: Some(ProcessAttrsImage {
            processes: vec![
                ProcessAttrs { coredump_filter: 0x33, ..Default::default() },
                ProcessAttrs {
                    coredump_filter: 0x3f,
                    netns: Some(4_026_532_001),
                    autogroup_nice: Some(-3),
                    audit: Some((1000, 7)),
                    ..Default::default()
                },
                ProcessAttrs::default(),
            ],
        }),
        unix_socket_options: None,
        uts: None,
    };
    ferry_image::validate::validate(&inv, &t).expect("tree fixture is valid");
    (inv, t, pages)
}

#[test]
fn tree_round_trips_through_memory_and_a_slow_reader() {
    let (inv, t, pages) = tree_image();
    let s = stream_of(&inv, &t, &pages);
    assert_eq!(&s[..encode_meta(&inv, &t).unwrap().len()], &encode_meta(&inv, &t).unwrap()[..]);
    let (inv2, t2, pages2) = read(&s).unwrap();
    assert_eq!((&inv2, &t2, &pages2), (&inv, &t, &pages));
    assert_eq!(t2.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), [PID, CHILD, GRANDCHILD]);
    assert_eq!(t2.zombies.len(), 2);
    assert_eq!(t2.shared_anon[0].extents[0].1, b"both see this");
    assert_eq!(t2.sysv_shm[0].key, 0x00c0_ffee);
    let (inv3, t3, pages3) = read_stream(&mut Trickle { data: &s, calls: 0 }, None).unwrap();
    assert_eq!((inv3, t3, pages3), (inv, t, pages));
}

#[test]
fn tree_dir_to_stream_to_dir() {
    let (inv, t, pages) = tree_image();
    let a = TempDir::new("tree-src");
    let b = TempDir::new("tree-dst");
    let b_img = b.path().join("image");
    write_dir(a.path(), &inv, &t, &pages);
    assert_eq!(ImageDir::new(a.path()).read_meta().unwrap(), (inv.clone(), t.clone()));

    let mut s = Vec::new();
    dir_to_stream(a.path(), &mut s).unwrap();
    assert!(s == stream_of(&inv, &t, &pages));
    let (inv2, t2, _) = read_stream(&mut Cursor::new(&s), Some(&b_img)).unwrap();
    assert_eq!((&inv2, &t2), (&inv, &t));
    let received = ImageDir::new(&b_img);
    assert_eq!(received.read_meta().unwrap(), (inv.clone(), t.clone()));
    let on_disk = std::fs::read(received.pages_path()).unwrap();
    for p in &t.processes {
        ImageDir::verify_runs(&p.page_runs, &on_disk[4096..]).unwrap();
    }
    for f in [META_FILE, PAGES_FILE] {
        assert!(
            std::fs::read(a.path().join(f)).unwrap() == std::fs::read(b_img.join(f)).unwrap(),
            "{f} differs"
        );
    }
}

#[test]
fn tree_corrupt_page_of_a_child_is_caught() {
    // Only the grandchild's run covers page 4: read_stream must verify the
    // runs of every process, not only the root's.
    let (inv, t, pages) = tree_image();
    let mut raw = split(&stream_of(&inv, &t, &pages));
    raw.sections.last_mut().expect("pages").1[4 * PAGE + 7] ^= 1;
    let d = TempDir::new("tree-corrupt");
    let target = d.path().join("image");
    match read_stream(&mut Cursor::new(join(&raw.header, &raw.sections)), Some(&target)) {
        Err(ImageError::Checksum { what }) => {
            assert!(what.contains("pages at 0x7ffd0001f000"), "{what}")
        }
        r => panic!("{:?}", r.map(|_| ())),
    }
    assert!(!target.exists());
    // The child's page (3) likewise.
    let mut raw = split(&stream_of(&inv, &t, &pages));
    raw.sections.last_mut().expect("pages").1[3 * PAGE] ^= 1;
    match expect_err(&join(&raw.header, &raw.sections)) {
        ImageError::Checksum { what } => assert!(what.contains("pages at 0x601000"), "{what}"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn invalid_tree_is_rejected_before_page_data() {
    let (inv, t, pages) = tree_image();
    let mut bad = Vec::new();
    // Child before its parent.
    let mut x = t.clone();
    x.processes.swap(1, 2);
    bad.push((x, "before its parent"));
    // A zombie whose parent is not in the tree.
    let mut x = t.clone();
    x.zombies[1].ppid = 4242;
    bad.push((x, "no parent"));
    // A mapping of a SysV segment the image does not hold.
    let mut x = t.clone();
    x.sysv_shm.clear();
    bad.push((x, "does not hold"));
    // Two processes with one pid.
    let mut x = t.clone();
    x.processes[2].threads[2].tid = CHILD;
    bad.push((x, "repeat"));
    for (x, want) in bad {
        let s = stream_of(&inv, &x, &pages);
        let mut c = Cursor::new(&s[..]);
        let e = read_stream(&mut c, None).unwrap_err();
        assert!(matches!(e, ImageError::Invalid(ref m) if m.contains(want)), "{want}: {e:?}");
        assert_eq!(c.position() as usize, boundaries(&s)[2], "{want}: page data was read");
    }
}
