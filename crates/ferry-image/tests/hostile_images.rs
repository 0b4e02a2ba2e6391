//! Hostile and corrupted meta images: every one must be rejected with an
//! error (and the right kind of error), never a panic, a huge allocation or
//! a hang. Each test starts from a valid image built in code and breaks one
//! thing. The fuzz targets in fuzz/ explore the same ground at random.

use ferry_image::container::{
    self, file_header, section_header, section_header_raw, SectionKind, HEADER_LEN, MAX_SECTION_LEN, SECTION_HEADER_LEN,
};
use ferry_image::model::*;
use ferry_image::{decode_meta, encode_meta, ImageDir, ImageError, FORMAT_VERSION};

const PID: i32 = 4242;

fn pages_data() -> Vec<u8> {
    (0..3 * 4096u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect()
}

fn thread(tid: i32) -> ThreadImage {
    ThreadImage {
        tid,
        comm: "worker".into(),
        regs: vec![0; 27],
        xstate: vec![0; 576],
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
    Vma { start, end, prot: PROT_READ | PROT_WRITE, shared: false, flags: 0, pgoff: 0, backing: VmaBacking::Anonymous }
}

/// A small valid image: two threads, three mappings, two page runs over
/// three pages of data, a pipe, a socket and an epoll watching both.
fn valid() -> (Inventory, ProcessImage) {
    let pages = pages_data();
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
    let pipe = |write_end| PipeEnd { id: 9, write_end, capacity: 65536, data: vec![], peer_closed: false };
    let p = ProcessImage {
        pid: PID,
        ppid: 1,
        pgid: PID,
        sid: PID,
        comm: "victim".into(),
        exe: "/usr/bin/victim".into(),
        cwd: "/".into(),
        umask: 0o022,
        personality: 0,
        no_new_privs: false,
        creds: Creds { uids: [0; 4], gids: [0; 4], groups: vec![], caps: Default::default() },
        rlimits: vec![Rlimit { resource: 7, soft: 1024, hard: 4096 }],
        threads: vec![thread(PID), thread(PID + 1)],
        mm: MmLayout { auxv: vec![6, 4096, 0, 0], ..Default::default() },
        vmas: vec![
            Vma {
                start: 0x400000,
                end: 0x401000,
                prot: PROT_READ | PROT_EXEC,
                shared: false,
                flags: 0,
                pgoff: 0,
                backing: VmaBacking::File { path: "/usr/bin/victim".into(), dev: 1, ino: 2 },
            },
            anon(0x600000, 0x602000),
            anon(0x7ffd_0000_0000, 0x7ffd_0002_0000),
        ],
        page_runs: vec![
            PageRun { start: 0x600000, pages: 2, offset: 0, checksum: container::checksum(&pages[..8192]) },
            PageRun { start: 0x7ffd_0001_f000, pages: 1, offset: 8192, checksum: container::checksum(&pages[8192..]) },
        ],
        files: vec![
            OpenFile { flags: 0, pos: 0, locks: vec![], kind: FileKind::Pipe(pipe(false)) },
            OpenFile { flags: 1, pos: 0, locks: vec![], kind: FileKind::Pipe(pipe(true)) },
            OpenFile {
                flags: 2,
                pos: 0,
                locks: vec![],
                kind: FileKind::InetSocket(InetSocket {
                    family: 2,
                    sock_type: 1,
                    protocol: 6,
                    addr: vec![127, 0, 0, 1],
                    port: 8080,
                    listen_backlog: Some(16),
                    options: vec![],
                    peer: None,
                }),
            },
            OpenFile {
                flags: 0,
                pos: 0,
                locks: vec![],
                kind: FileKind::Epoll { entries: vec![EpollEntry { fd: 3, events: 1, data: 3 }, EpollEntry { fd: 5, events: 1, data: 5 }] },
            },
        ],
        fds: vec![
            FdSlot { fd: 3, file: 0, cloexec: false },
            FdSlot { fd: 4, file: 1, cloexec: false },
            FdSlot { fd: 5, file: 2, cloexec: true },
            FdSlot { fd: 6, file: 3, cloexec: true },
        ],
        signals: SignalState { actions: vec![SigAction::default(); 64], shared_pending: vec![] },
        itimers: vec![],
        posix_timers: vec![],
        misc: ProcessMisc::default(),
        memfds: vec![],
    };
    (inv, p)
}

fn valid_meta() -> Vec<u8> {
    let (inv, p) = valid();
    encode_meta(&inv, &p).expect("encode valid image")
}

/// The postcard payloads (inventory, process) of an encoded meta file.
fn payloads(meta: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (k1, inv, rest) = container::read_section(&meta[HEADER_LEN..]).expect("inventory section");
    let (k2, proc_, rest) = container::read_section(rest).expect("process section");
    assert_eq!((k1, k2, rest.len()), (SectionKind::Inventory, SectionKind::Process, 0));
    (inv.to_vec(), proc_.to_vec())
}

/// Frames payloads with correct lengths and checksums.
fn frame(sections: &[(SectionKind, &[u8])]) -> Vec<u8> {
    let mut out = file_header(0).to_vec();
    for (kind, payload) in sections {
        out.extend_from_slice(&section_header(*kind, payload));
        out.extend_from_slice(payload);
    }
    out
}

fn reject(bytes: &[u8]) -> ImageError {
    match decode_meta(bytes) {
        Ok(_) => panic!("hostile image was accepted"),
        Err(e) => {
            // Formatting the error must not panic either.
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

/// Encodes a mutated model and expects decode_meta to reject it as invalid.
fn reject_model(inv: &Inventory, p: &ProcessImage) -> String {
    let bytes = encode_meta(inv, p).expect("encode");
    match reject(&bytes) {
        ImageError::Invalid(msg) => msg,
        e => panic!("expected ImageError::Invalid, got {e:?}"),
    }
}

/// Appends `v` as a postcard varint (LEB128).
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

// ---------------------------------------------------------------------------

#[test]
fn valid_image_round_trips() {
    let (inv, p) = valid();
    let (inv2, p2) = decode_meta(&valid_meta()).expect("valid image must decode");
    assert_eq!(inv2, inv);
    assert_eq!(p2, p);
    ImageDir::verify_runs(&p2.page_runs, &pages_data()).expect("valid pages verify");
}

#[test]
fn truncated_header() {
    let meta = valid_meta();
    for n in [0, 1, 8, 12, HEADER_LEN - 1] {
        assert!(matches!(reject(&meta[..n]), ImageError::Truncated(_)), "prefix of {n} bytes");
    }
}

#[test]
fn every_truncation_is_rejected() {
    let meta = valid_meta();
    for n in 0..meta.len() {
        match reject(&meta[..n]) {
            ImageError::Truncated(_) => {}
            // Cut exactly between sections: no process section.
            ImageError::Invalid(msg) => assert!(msg.contains("no "), "prefix {n}: {msg}"),
            e => panic!("prefix of {n} bytes: unexpected {e:?}"),
        }
    }
}

#[test]
fn wrong_magic() {
    let mut meta = valid_meta();
    meta[0] = b'X';
    assert!(matches!(reject(&meta), ImageError::BadMagic(_)));
    assert!(matches!(reject(b"ELF\x7f\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00"), ImageError::BadMagic(_)));
}

#[test]
fn wrong_version() {
    let mut meta = valid_meta();
    meta[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    match reject(&meta) {
        ImageError::Version { found, supported } => assert_eq!((found, supported), (FORMAT_VERSION + 1, FORMAT_VERSION)),
        e => panic!("expected Version, got {e:?}"),
    }
    meta[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert!(matches!(reject(&meta), ImageError::Version { found: 0, .. }));
}

#[test]
fn wrong_version_in_inventory() {
    let (mut inv, p) = valid();
    inv.format_version = FORMAT_VERSION + 7;
    let bytes = encode_meta(&inv, &p).unwrap();
    assert!(matches!(reject(&bytes), ImageError::Version { .. }));
}

#[test]
fn section_length_larger_than_input() {
    let meta = valid_meta();
    let (inv, _) = payloads(&meta);
    // The process section claims one byte more than is there.
    let proc_hdr = HEADER_LEN + SECTION_HEADER_LEN + inv.len();
    let mut m = meta.clone();
    let len = u64::from_le_bytes(m[proc_hdr + 8..proc_hdr + 16].try_into().unwrap());
    m[proc_hdr + 8..proc_hdr + 16].copy_from_slice(&(len + 1).to_le_bytes());
    assert!(matches!(reject(&m), ImageError::Truncated(_)));
    // Claims of 1 GiB, just over the cap and u64::MAX, with a few bytes of
    // input: no allocation of that size, just an error.
    for claim in [MAX_SECTION_LEN, MAX_SECTION_LEN + 1, u64::MAX / 2, u64::MAX] {
        let mut m = file_header(0).to_vec();
        m.extend_from_slice(&section_header_raw(SectionKind::Inventory, claim, 0));
        m.extend_from_slice(&[0u8; 64]);
        assert!(matches!(reject(&m), ImageError::Truncated(_) | ImageError::Invalid(_)), "claim {claim}");
    }
}

#[test]
fn checksum_mismatch() {
    let meta = valid_meta();
    // A flipped payload byte in the last (process) section.
    let mut m = meta.clone();
    let last = m.len() - 1;
    m[last] ^= 0x40;
    assert!(matches!(reject(&m), ImageError::Checksum { .. }));
    // A flipped bit in the stored checksum of the first section.
    let mut m = meta.clone();
    m[HEADER_LEN + 16] ^= 1;
    assert!(matches!(reject(&m), ImageError::Checksum { .. }));
    // A flipped byte in the inventory payload.
    let mut m = meta;
    m[HEADER_LEN + SECTION_HEADER_LEN + 2] ^= 0xff;
    assert!(matches!(reject(&m), ImageError::Checksum { .. }));
}

#[test]
fn unknown_missing_and_misplaced_sections() {
    let meta = valid_meta();
    let (inv, proc_) = payloads(&meta);
    // Unknown section kind.
    let mut m = meta.clone();
    m[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&99u32.to_le_bytes());
    assert!(matches!(reject(&m), ImageError::Invalid(_)));
    // Only a header, or no process section: the image ends too early.
    assert!(matches!(reject(&file_header(0)), ImageError::Truncated(_)));
    assert!(matches!(reject(&frame(&[(SectionKind::Inventory, &inv)])), ImageError::Truncated(_)));
    // Missing inventory.
    assert!(matches!(reject(&frame(&[(SectionKind::Process, &proc_)])), ImageError::Invalid(_)));
    // A pages section has no place in meta.img.
    assert!(matches!(
        reject(&frame(&[(SectionKind::Inventory, &inv), (SectionKind::Pages, &[]), (SectionKind::Process, &proc_)])),
        ImageError::Invalid(_)
    ));
    // Payloads swapped between the sections: postcard decode error.
    match reject(&frame(&[(SectionKind::Inventory, &proc_), (SectionKind::Process, &inv)])) {
        ImageError::Decode { .. } | ImageError::Invalid(_) | ImageError::Version { .. } => {}
        e => panic!("unexpected {e:?}"),
    }
    // Trailing garbage after the sections.
    let mut m = meta;
    m.extend_from_slice(&[1, 2, 3]);
    assert!(matches!(reject(&m), ImageError::Invalid(_)));
}

#[test]
fn undecodable_payloads() {
    let meta = valid_meta();
    let (inv, proc_) = payloads(&meta);
    // Empty and cut payloads, with correct framing and checksums.
    assert!(matches!(reject(&frame(&[(SectionKind::Inventory, &[]), (SectionKind::Process, &proc_)])), ImageError::Decode { kind: "inventory", .. }));
    for cut in [0, 1, proc_.len() / 2, proc_.len() - 1] {
        match reject(&frame(&[(SectionKind::Inventory, &inv), (SectionKind::Process, &proc_[..cut])])) {
            ImageError::Decode { kind: "process", .. } => {}
            e => panic!("cut at {cut}: unexpected {e:?}"),
        }
    }
    // An invalid enum discriminant where a VmaBacking / FileKind is expected
    // cannot be placed precisely without a schema, but an all-0xff payload
    // is garbage for every field type.
    let garbage = vec![0xffu8; 200];
    assert!(matches!(reject(&frame(&[(SectionKind::Inventory, &inv), (SectionKind::Process, &garbage)])), ImageError::Decode { .. }));
}

#[test]
fn absurd_counts() {
    let meta = valid_meta();
    let (inv_ok, _) = payloads(&meta);
    let (_, p) = valid();

    // The process payload up to (not including) `rlimits`: postcard encodes
    // a struct as its fields in order, so a tuple of the leading fields gives
    // the same bytes.
    let prefix = postcard::to_stdvec(&(
        p.pid,
        p.ppid,
        p.pgid,
        p.sid,
        &p.comm,
        &p.exe,
        &p.cwd,
        p.umask,
        p.personality,
        p.no_new_privs,
        &p.creds,
    ))
    .unwrap();
    for count in [1u64 << 32, 1 << 40, u64::MAX >> 1, u64::MAX] {
        // Huge rlimits count with nothing behind it.
        let mut payload = prefix.clone();
        varint(&mut payload, count);
        payload.extend_from_slice(&[7, 1, 1]);
        assert!(
            matches!(reject(&frame(&[(SectionKind::Inventory, &inv_ok), (SectionKind::Process, &payload)])), ImageError::Decode { kind: "process", .. }),
            "rlimits count {count}"
        );
        // Huge threads count (after an empty rlimits vector).
        let mut payload = prefix.clone();
        varint(&mut payload, 0);
        varint(&mut payload, count);
        assert!(
            matches!(reject(&frame(&[(SectionKind::Inventory, &inv_ok), (SectionKind::Process, &payload)])), ImageError::Decode { kind: "process", .. }),
            "threads count {count}"
        );
        // One thread whose xstate claims `count` bytes.
        let mut payload = prefix.clone();
        varint(&mut payload, 0); // rlimits
        varint(&mut payload, 1); // threads
        let t = thread(PID);
        payload.extend_from_slice(&postcard::to_stdvec(&(t.tid, &t.comm, &t.regs)).unwrap());
        varint(&mut payload, count); // xstate length
        payload.extend_from_slice(&[0u8; 32]);
        assert!(
            matches!(reject(&frame(&[(SectionKind::Inventory, &inv_ok), (SectionKind::Process, &payload)])), ImageError::Decode { kind: "process", .. }),
            "xstate length {count}"
        );
        // A huge string length in the inventory (ferry_version).
        let mut inv = postcard::to_stdvec(&FORMAT_VERSION).unwrap();
        varint(&mut inv, count);
        inv.extend_from_slice(b"0.1.0");
        let (_, proc_ok) = payloads(&meta);
        assert!(
            matches!(reject(&frame(&[(SectionKind::Inventory, &inv), (SectionKind::Process, &proc_ok)])), ImageError::Decode { kind: "inventory", .. }),
            "string length {count}"
        );
    }
    // A varint longer than any u64.
    let mut payload = prefix;
    payload.extend_from_slice(&[0xff; 12]);
    assert!(matches!(reject(&frame(&[(SectionKind::Inventory, &inv_ok), (SectionKind::Process, &payload)])), ImageError::Decode { .. }));
}

#[test]
fn overlapping_mappings() {
    let (inv, mut p) = valid();
    p.vmas.insert(2, anon(0x601000, 0x603000)); // overlaps 0x600000-0x602000
    assert!(reject_model(&inv, &p).contains("overlapping"));

    let (inv, mut p) = valid();
    p.vmas.swap(0, 1); // out of order
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.vmas[1] = anon(0x600000, 0x600000); // empty
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.vmas[1].end = 0x601800; // misaligned
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.vmas.push(anon(0x7fff_ffff_f000, 0x8000_0000_0000)); // above user space
    reject_model(&inv, &p);
}

#[test]
fn page_run_outside_any_mapping() {
    let (inv, mut p) = valid();
    p.page_runs[0].start = 0x500000; // between the code and heap mappings
    assert!(reject_model(&inv, &p).contains("outside every mapping"));

    // Starts inside a mapping but runs past its end.
    let (inv, mut p) = valid();
    p.page_runs[0].start = 0x601000;
    reject_model(&inv, &p);

    // After the last mapping.
    let (inv, mut p) = valid();
    p.page_runs[1].start = 0x7ffd_0002_0000;
    reject_model(&inv, &p);

    // Length overflows the address space.
    let (inv, mut p) = valid();
    p.page_runs[1].pages = u64::MAX / 4096;
    reject_model(&inv, &p);
    let (inv, mut p) = valid();
    p.page_runs[1].pages = u64::MAX;
    assert!(reject_model(&inv, &p).contains("overflows"));

    // Empty and out-of-order runs.
    let (inv, mut p) = valid();
    p.page_runs[0].pages = 0;
    reject_model(&inv, &p);
    let (inv, mut p) = valid();
    p.page_runs.swap(0, 1);
    reject_model(&inv, &p);
}

#[test]
fn page_run_beyond_pages_bytes() {
    let (mut inv, p) = valid();
    inv.pages_bytes -= 4096;
    assert!(reject_model(&inv, &p).contains("past the end"));

    let (inv, mut p) = valid();
    p.page_runs[1].offset = 3 * 4096;
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.page_runs[1].offset = u64::MAX - 4095; // offset + length overflows
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.page_runs[1].offset = 100; // misaligned
    reject_model(&inv, &p);
}

#[test]
fn fd_pointing_at_missing_file() {
    let (inv, mut p) = valid();
    p.fds[1].file = p.files.len() as u32;
    assert!(reject_model(&inv, &p).contains("missing file"));

    let (inv, mut p) = valid();
    p.fds[1].file = u32::MAX;
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.fds[1].fd = -1;
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.fds[1].fd = p.fds[0].fd; // the same fd number twice
    reject_model(&inv, &p);
}

#[test]
fn epoll_entry_for_missing_fd() {
    let (inv, mut p) = valid();
    if let FileKind::Epoll { entries } = &mut p.files[3].kind {
        entries.push(EpollEntry { fd: 99, events: 1, data: 0 });
    }
    assert!(reject_model(&inv, &p).contains("epoll"));

    // The watched fd's slot removed from the table.
    let (inv, mut p) = valid();
    p.fds.retain(|s| s.fd != 5);
    reject_model(&inv, &p);
}

#[test]
fn malformed_threads_and_process() {
    let (inv, mut p) = valid();
    p.threads.clear();
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.threads.swap(0, 1); // leader not first
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.threads[1].tid = PID; // repeated tid
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.threads[1].regs.pop();
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.threads[0].xstate.truncate(100);
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.threads[0].pending.push(vec![0; 127]);
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.pid = 0;
    p.threads[0].tid = 0;
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.signals.actions.pop();
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    p.mm.auxv.push(1); // odd length
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    if let FileKind::InetSocket(s) = &mut p.files[2].kind {
        s.addr = vec![0; 16]; // IPv4 socket with an IPv6-sized address
    }
    reject_model(&inv, &p);

    let (inv, mut p) = valid();
    if let FileKind::InetSocket(s) = &mut p.files[2].kind {
        s.peer = Some((vec![10, 0, 0], 53)); // peer address of the wrong length
    }
    reject_model(&inv, &p);
}

#[test]
fn verify_runs_rejects_bad_page_data() {
    let (_, p) = valid();
    let data = pages_data();
    ImageDir::verify_runs(&p.page_runs, &data).unwrap();
    assert!(matches!(ImageDir::verify_runs(&p.page_runs, &data[..data.len() - 1]), Err(ImageError::Truncated(_))));
    assert!(matches!(ImageDir::verify_runs(&p.page_runs, &[]), Err(ImageError::Truncated(_))));
    let mut bad = data.clone();
    bad[5000] ^= 1;
    assert!(matches!(ImageDir::verify_runs(&p.page_runs, &bad), Err(ImageError::Checksum { .. })));
    let mut runs = p.page_runs.clone();
    runs[1].offset = 4096 * 3;
    assert!(matches!(ImageDir::verify_runs(&runs, &data), Err(ImageError::Truncated(_))));
}

// Regression tests for the overflow the fuzzer found in verify_runs
// (fuzz/artifacts-found/verify_runs-*): it computed `offset + pages * 4096`
// unchecked, so with overflow checks (debug builds, cargo fuzz) a hostile
// run panicked, and without them (release) the length wrapped and a run
// claiming 2^52 pages "verified" against zero bytes.

#[test]
fn verify_runs_huge_page_count_is_an_error() {
    let run = PageRun { start: 0x600000, pages: 1 << 52, offset: 0, checksum: container::checksum(&[]) };
    assert!(matches!(ImageDir::verify_runs(&[run], &[0u8; 4096]), Err(ImageError::Truncated(_))));
    let run = PageRun { start: 0x600000, pages: u64::MAX, offset: 0, checksum: 0 };
    assert!(matches!(ImageDir::verify_runs(&[run], &[0u8; 4096]), Err(ImageError::Truncated(_))));
}

#[test]
fn verify_runs_huge_offset_is_an_error() {
    let run = PageRun { start: 0x600000, pages: 1, offset: u64::MAX - 4095, checksum: 0 };
    assert!(matches!(ImageDir::verify_runs(&[run], &[0u8; 4096]), Err(ImageError::Truncated(_))));
}

// Regression test: validate once checked every memfd reference (files and
// mappings) with a linear search over `memfds`, so M memfds and F references
// cost M * F (a 1.3 MB meta.img with 100k of each took ~9 s).
#[test]
fn memfd_references_are_checked_in_linear_time() {
    let n = 100_000u64;
    let (inv, mut p) = valid();
    p.memfds = (0..n).map(|id| MemfdObject { id, name: String::new(), size: 0, seals: 0, extents: vec![] }).collect();
    p.files.extend((0..n).map(|_| OpenFile { flags: 0, pos: 0, locks: vec![], kind: FileKind::Memfd { id: n - 1 } }));
    let bytes = encode_meta(&inv, &p).unwrap();
    let t = std::time::Instant::now();
    decode_meta(&bytes).expect("a valid image");
    // Linear: about a second even in a debug build; quadratic: 1e10
    // comparisons.
    assert!(t.elapsed() < std::time::Duration::from_secs(3), "decoding {} bytes took {:?}", bytes.len(), t.elapsed());
}
