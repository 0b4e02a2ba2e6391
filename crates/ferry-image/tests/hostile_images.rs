//! Hostile and corrupted meta images: every one must be rejected with an
//! error (and the right kind of error), never a panic, a huge allocation or
//! a hang. Each test starts from a valid image built in code and breaks one
//! thing. The fuzz targets in fuzz/ explore the same ground at random.

use ferry_image::container::{
    self, file_header, section_header, section_header_raw, SectionKind, HEADER_LEN,
    MAX_SECTION_LEN, SECTION_HEADER_LEN,
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
    let pipe =
        |write_end| PipeEnd { id: 9, write_end, capacity: 65536, data: vec![], peer_closed: false };
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
            PageRun {
                start: 0x600000,
                pages: 2,
                offset: 0,
                checksum: container::checksum(&pages[..8192]),
            },
            PageRun {
                start: 0x7ffd_0001_f000,
                pages: 1,
                offset: 8192,
                checksum: container::checksum(&pages[8192..]),
            },
        ],
        files: vec![
            OpenFile {
                id: 101,
                flags: 0,
                pos: 0,
                locks: vec![],
                kind: FileKind::Pipe(pipe(false)),
            },
            OpenFile { id: 102, flags: 1, pos: 0, locks: vec![], kind: FileKind::Pipe(pipe(true)) },
            OpenFile {
                id: 103,
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
                    connection: None,
                }),
            },
            OpenFile {
                id: 104,
                flags: 0,
                pos: 0,
                locks: vec![],
                kind: FileKind::Epoll {
                    entries: vec![
                        EpollEntry { fd: 3, events: 1, data: 3 },
                        EpollEntry { fd: 5, events: 1, data: 5 },
                    ],
                },
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
        inherited: vec![],
        root: None,
        fidelity: Default::default(),
    };
    (inv, p)
}

fn valid_meta() -> Vec<u8> {
    let (inv, p) = valid();
    encode_meta(&inv, &TreeImage::single(p)).expect("encode valid image")
}

/// The postcard payloads (inventory, process tree) of an encoded meta file.
fn payloads(meta: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (k1, inv, rest) = container::read_section(&meta[HEADER_LEN..]).expect("inventory section");
    let (k2, proc_, rest) = container::read_section(rest).expect("process tree section");
    assert_eq!((k1, k2, rest.len()), (SectionKind::Inventory, SectionKind::Tree, 0));
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

/// Encodes a mutated tree and expects decode_meta to reject it as invalid.
fn reject_tree(inv: &Inventory, t: &TreeImage) -> String {
    let bytes = encode_meta(inv, t).expect("encode");
    match reject(&bytes) {
        ImageError::Invalid(msg) => msg,
        e => panic!("expected ImageError::Invalid, got {e:?}"),
    }
}

/// Encodes a mutated process (as a tree of one) and expects decode_meta to
/// reject it as invalid.
fn reject_model(inv: &Inventory, p: &ProcessImage) -> String {
    reject_tree(inv, &TreeImage::single(p.clone()))
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
    let (inv2, t2) = decode_meta(&valid_meta()).expect("valid image must decode");
    assert_eq!(inv2, inv);
    assert_eq!(t2.processes.len(), 1);
    assert_eq!(t2.root(), Some(&p));
    assert_eq!(t2, TreeImage::single(p));
    ImageDir::verify_runs(&t2.processes[0].page_runs, &pages_data()).expect("valid pages verify");
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
            // Cut exactly between sections: no process tree section.
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
    assert!(matches!(
        reject(b"ELF\x7f\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
        ImageError::BadMagic(_)
    ));
}

#[test]
fn wrong_version() {
    let mut meta = valid_meta();
    meta[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    match reject(&meta) {
        ImageError::Version { found, supported } => {
            assert_eq!((found, supported), (FORMAT_VERSION + 1, FORMAT_VERSION))
        }
        e => panic!("expected Version, got {e:?}"),
    }
    meta[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert!(matches!(reject(&meta), ImageError::Version { found: 0, .. }));
}

#[test]
fn wrong_version_in_inventory() {
    let (mut inv, p) = valid();
    inv.format_version = FORMAT_VERSION + 7;
    let bytes = encode_meta(&inv, &TreeImage::single(p)).unwrap();
    assert!(matches!(reject(&bytes), ImageError::Version { .. }));
}

#[test]
fn section_length_larger_than_input() {
    let meta = valid_meta();
    let (inv, _) = payloads(&meta);
    // The process tree section claims one byte more than is there.
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
        assert!(
            matches!(reject(&m), ImageError::Truncated(_) | ImageError::Invalid(_)),
            "claim {claim}"
        );
    }
}

#[test]
fn checksum_mismatch() {
    let meta = valid_meta();
    // A flipped payload byte in the last (process tree) section.
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
    // Only a header, or no process tree section: the image ends too early.
    assert!(matches!(reject(&file_header(0)), ImageError::Truncated(_)));
    assert!(matches!(reject(&frame(&[(SectionKind::Inventory, &inv)])), ImageError::Truncated(_)));
    // Missing inventory.
    assert!(matches!(reject(&frame(&[(SectionKind::Tree, &proc_)])), ImageError::Invalid(_)));
    // A pages section has no place in meta.img.
    assert!(matches!(
        reject(&frame(&[
            (SectionKind::Inventory, &inv),
            (SectionKind::Pages, &[]),
            (SectionKind::Tree, &proc_)
        ])),
        ImageError::Invalid(_)
    ));
    // Payloads swapped between the sections: postcard decode error.
    match reject(&frame(&[(SectionKind::Inventory, &proc_), (SectionKind::Tree, &inv)])) {
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
    assert!(matches!(
        reject(&frame(&[(SectionKind::Inventory, &[]), (SectionKind::Tree, &proc_)])),
        ImageError::Decode { kind: "inventory", .. }
    ));
    for cut in [0, 1, proc_.len() / 2, proc_.len() - 1] {
        match reject(&frame(&[(SectionKind::Inventory, &inv), (SectionKind::Tree, &proc_[..cut])]))
        {
            ImageError::Decode { kind: "process", .. } => {}
            e => panic!("cut at {cut}: unexpected {e:?}"),
        }
    }
    // An invalid enum discriminant where a VmaBacking / FileKind is expected
    // cannot be placed precisely without a schema, but an all-0xff payload
    // is garbage for every field type.
    let garbage = vec![0xffu8; 200];
    assert!(matches!(
        reject(&frame(&[(SectionKind::Inventory, &inv), (SectionKind::Tree, &garbage)])),
        ImageError::Decode { .. }
    ));
}

#[test]
fn absurd_counts() {
    let meta = valid_meta();
    let (inv_ok, _) = payloads(&meta);
    let (_, p) = valid();

    // The tree payload up to (not including) the first process's
    // `rlimits`: the `processes` count (1), then the process's leading
    // fields. Postcard encodes a struct as its fields in order, so a tuple
    // of the leading fields gives the same bytes.
    let mut prefix = Vec::new();
    varint(&mut prefix, 1);
    prefix.extend(
        postcard::to_stdvec(&(
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
        .unwrap(),
    );
    for count in [1u64 << 32, 1 << 40, u64::MAX >> 1, u64::MAX] {
        // Huge rlimits count with nothing behind it.
        let mut payload = prefix.clone();
        varint(&mut payload, count);
        payload.extend_from_slice(&[7, 1, 1]);
        assert!(
            matches!(
                reject(&frame(&[(SectionKind::Inventory, &inv_ok), (SectionKind::Tree, &payload)])),
                ImageError::Decode { kind: "process", .. }
            ),
            "rlimits count {count}"
        );
        // Huge threads count (after an empty rlimits vector).
        let mut payload = prefix.clone();
        varint(&mut payload, 0);
        varint(&mut payload, count);
        assert!(
            matches!(
                reject(&frame(&[(SectionKind::Inventory, &inv_ok), (SectionKind::Tree, &payload)])),
                ImageError::Decode { kind: "process", .. }
            ),
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
            matches!(
                reject(&frame(&[(SectionKind::Inventory, &inv_ok), (SectionKind::Tree, &payload)])),
                ImageError::Decode { kind: "process", .. }
            ),
            "xstate length {count}"
        );
        // A huge string length in the inventory (ferry_version).
        let mut inv = postcard::to_stdvec(&FORMAT_VERSION).unwrap();
        varint(&mut inv, count);
        inv.extend_from_slice(b"0.1.0");
        let (_, proc_ok) = payloads(&meta);
        assert!(
            matches!(
                reject(&frame(&[(SectionKind::Inventory, &inv), (SectionKind::Tree, &proc_ok)])),
                ImageError::Decode { kind: "inventory", .. }
            ),
            "string length {count}"
        );
    }
    // A varint longer than any u64.
    let mut payload = prefix;
    payload.extend_from_slice(&[0xff; 12]);
    assert!(matches!(
        reject(&frame(&[(SectionKind::Inventory, &inv_ok), (SectionKind::Tree, &payload)])),
        ImageError::Decode { .. }
    ));
}

/// Absurd counts in the tree-level vectors (processes, zombies, shared
/// memory objects, SysV segments and their extents, inherited mappings):
/// a decode error, no huge allocation.
#[test]
fn absurd_tree_counts() {
    let meta = valid_meta();
    let (inv_ok, _) = payloads(&meta);
    let (_, t) = valid_tree();
    let (_, p) = valid();
    let single = postcard::to_stdvec(&TreeImage::single(p)).unwrap();
    // [processes count = 1] process [inherited = 0] [root = None] [0 zombies] [0 shm] [0 sysv]
    assert_eq!(&single[single.len() - 5..], &[0, 0, 0, 0, 0]);
    let process_up_to_inherited = &single[..single.len() - 5];
    let rejects = |payload: &[u8], what: &str| match reject(&frame(&[
        (SectionKind::Inventory, &inv_ok),
        (SectionKind::Tree, payload),
    ])) {
        ImageError::Decode { kind: "process", .. } => {}
        e => panic!("{what}: unexpected {e:?}"),
    };
    for count in [1u64 << 32, 1 << 40, u64::MAX >> 1, u64::MAX] {
        let mut payload = Vec::new();
        varint(&mut payload, count);
        payload.extend_from_slice(&[0u8; 32]);
        rejects(&payload, &format!("processes count {count}"));

        let mut payload = postcard::to_stdvec(&t.processes).unwrap();
        varint(&mut payload, count);
        payload.extend_from_slice(&[1, 2, 3]);
        rejects(&payload, &format!("zombies count {count}"));

        let mut payload = postcard::to_stdvec(&(&t.processes, &t.zombies)).unwrap();
        varint(&mut payload, count);
        payload.extend_from_slice(&[1, 2, 3]);
        rejects(&payload, &format!("shared_anon count {count}"));

        let mut payload = postcard::to_stdvec(&(&t.processes, &t.zombies, &t.shared_anon)).unwrap();
        varint(&mut payload, count);
        payload.extend_from_slice(&[1, 2, 3]);
        rejects(&payload, &format!("sysv_shm count {count}"));

        // One SysV segment whose extents vector claims `count` entries.
        let s = &t.sysv_shm[0];
        let mut payload = postcard::to_stdvec(&(&t.processes, &t.zombies, &t.shared_anon)).unwrap();
        varint(&mut payload, 1);
        payload.extend(postcard::to_stdvec(&(s.id, s.key, s.size, s.mode, s.uid, s.gid)).unwrap());
        varint(&mut payload, count);
        payload.extend_from_slice(&[0u8; 16]);
        rejects(&payload, &format!("sysv extents count {count}"));

        // The process's `inherited` vector claims `count` entries.
        let mut payload = process_up_to_inherited.to_vec();
        varint(&mut payload, count);
        payload.extend_from_slice(&[0u8; 16]);
        rejects(&payload, &format!("inherited count {count}"));
    }
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

/// An inotify watch on "PATH (deleted)" needs exactly one deleted file
/// of the tree under that name to go on.
#[test]
fn inotify_watch_on_a_deleted_file_the_tree_does_not_hold() {
    let watch = |path: &str| ferry_image::InotifyWatch { wd: 1, path: path.into(), mask: 2 };
    let deleted = |id: u64| OpenFile {
        id,
        flags: 2,
        pos: 0,
        locks: vec![],
        kind: FileKind::Deleted { path: "/w/f".into(), mode: 0o644, content: vec![] },
    };
    let (inv, mut p) = valid();
    p.files.push(OpenFile {
        id: 900,
        flags: 0,
        pos: 0,
        locks: vec![],
        kind: FileKind::Inotify { watches: vec![watch("/w/f (deleted)")] },
    });
    assert!(reject_model(&inv, &p).contains("not exactly one deleted file"));
    p.files.push(deleted(901));
    let meta = encode_meta(&inv, &TreeImage::single(p.clone())).expect("encode");
    decode_meta(&meta).expect("a watch on the one deleted file of that name is valid");
    p.files.push(deleted(902));
    assert!(reject_model(&inv, &p).contains("not exactly one deleted file"));
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
    assert!(matches!(
        ImageDir::verify_runs(&p.page_runs, &data[..data.len() - 1]),
        Err(ImageError::Truncated(_))
    ));
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
    let run =
        PageRun { start: 0x600000, pages: 1 << 52, offset: 0, checksum: container::checksum(&[]) };
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
    p.memfds = (0..n)
        .map(|id| MemfdObject { id, name: String::new(), size: 0, seals: 0, extents: vec![] })
        .collect();
    p.files.extend((0..n).map(|i| OpenFile {
        id: 1000 + i,
        flags: 0,
        pos: 0,
        locks: vec![],
        kind: FileKind::Memfd { id: n - 1 },
    }));
    let bytes = encode_meta(&inv, &TreeImage::single(p)).unwrap();
    let t = std::time::Instant::now();
    decode_meta(&bytes).expect("a valid image");
    // Linear: about a second even in a debug build; quadratic: 1e10
    // comparisons.
    assert!(
        t.elapsed() < std::time::Duration::from_secs(3),
        "decoding {} bytes took {:?}",
        bytes.len(),
        t.elapsed()
    );
}

// ---------------------------------------------------------------------------
// Process trees

const CHILD: i32 = PID + 100;
const GRANDCHILD: i32 = PID + 200;
const ZOMBIE: i32 = PID + 300;
const SHM_ANON: u64 = 0x5151;
const SYSV_ID: i32 = 32769;

fn shared(start: u64, end: u64, backing: VmaBacking) -> Vma {
    Vma { start, end, prot: PROT_READ | PROT_WRITE, shared: true, flags: 0, pgoff: 0, backing }
}

/// A valid tree: the process of `valid()` (which also maps an anonymous
/// shared region and a SysV segment), its child (inherits the heap, shares
/// its first page with the parent, and all its open files), a grandchild
/// (detached the SysV segment, chrooted, inherits the stack), two zombies
/// (one the root's, one the child's), the shared memory object and the
/// SysV segment.
fn valid_tree() -> (Inventory, TreeImage) {
    let (inv, mut root) = valid();
    let pages = pages_data();
    // Between the heap (0x600000-0x602000) and the stack (0x7ffd...).
    root.vmas.insert(
        2,
        shared(0x7f00_0000_0000, 0x7f00_0000_2000, VmaBacking::SharedAnon { id: SHM_ANON }),
    );
    root.vmas
        .insert(3, shared(0x7f00_1000_0000, 0x7f00_1000_4000, VmaBacking::SysvShm { id: SYSV_ID }));

    let mut child = root.clone();
    child.pid = CHILD;
    child.ppid = PID;
    child.comm = "victim-child".into();
    child.threads = vec![thread(CHILD)];
    // The first heap page is still shared with the parent; the second was
    // written by the child and is stored for it.
    child.inherited = vec![InheritedVma {
        start: 0x600000,
        end: 0x602000,
        shared_pages: vec![PageSpan::new(0x600000, 1)],
    }];
    child.page_runs = vec![
        PageRun {
            start: 0x601000,
            pages: 1,
            offset: 4096,
            checksum: container::checksum(&pages[4096..8192]),
        },
        PageRun {
            start: 0x7ffd_0001_f000,
            pages: 1,
            offset: 8192,
            checksum: container::checksum(&pages[8192..]),
        },
    ];

    let mut grandchild = child.clone();
    grandchild.pid = GRANDCHILD;
    grandchild.ppid = CHILD;
    grandchild.comm = "victim-grandchild".into();
    grandchild.threads = vec![thread(GRANDCHILD), thread(GRANDCHILD + 1)];
    grandchild.vmas.retain(|v| !matches!(v.backing, VmaBacking::SysvShm { .. })); // shmdt
    grandchild.inherited = vec![InheritedVma {
        start: 0x7ffd_0000_0000,
        end: 0x7ffd_0002_0000,
        shared_pages: vec![PageSpan::new(0x7ffd_0001_f000, 1)],
    }];
    grandchild.page_runs = vec![PageRun {
        start: 0x600000,
        pages: 2,
        offset: 0,
        checksum: container::checksum(&pages[..8192]),
    }];
    grandchild.root = Some("/srv/jail".into());

    let t = TreeImage {
        processes: vec![root, child, grandchild],
        zombies: vec![
            Zombie { pid: ZOMBIE, ppid: CHILD, pgid: PID, sid: PID, wait_status: 3 << 8 },
            Zombie { pid: ZOMBIE + 1, ppid: PID, pgid: PID, sid: PID, wait_status: 9 },
        ],
        shared_anon: vec![MemfdObject {
            id: SHM_ANON,
            name: "/dev/zero (deleted)".into(),
            size: 8192,
            seals: 0,
            extents: vec![(0, b"shared".to_vec()), (4096, vec![7; 4096])],
        }],
        sysv_shm: vec![SysvShm {
            id: SYSV_ID,
            key: 0x1234,
            size: 16384,
            mode: 0o600,
            uid: 0,
            gid: 0,
            extents: vec![(8192, b"sysv".to_vec())],
        }],
        sysv_sem: vec![SysvSem {
            id: 7,
            key: 0x55,
            mode: 0o600,
            uid: 0,
            gid: 0,
            values: vec![5, 0, 2],
        }],
        sysv_msg: vec![SysvMsgQueue {
            id: 9,
            key: 0,
            mode: 0o600,
            uid: 0,
            gid: 0,
            max_bytes: 16384,
            messages: vec![(1, b"one".to_vec()), (5, vec![9; 3000])],
        }],
        own_pid_namespace: false,
        network_lock: None,
        cgroups: Some(CgroupImage {
            processes: vec![
                ProcessCgroups {
                    pid: PID,
                    memberships: vec![
                        CgroupMembership {
                            hierarchy: 4,
                            controllers: "memory".into(),
                            path: "/svc".into(),
                        },
                        CgroupMembership {
                            hierarchy: 1,
                            controllers: "name=systemd".into(),
                            path: "/system.slice/svc.service".into(),
                        },
                        CgroupMembership {
                            hierarchy: 0,
                            controllers: String::new(),
                            path: "/system.slice/svc.service".into(),
                        },
                    ],
                },
                ProcessCgroups {
                    pid: CHILD,
                    memberships: vec![CgroupMembership {
                        hierarchy: 0,
                        controllers: String::new(),
                        path: "/".into(),
                    }],
                },
            ],
        }),
        unix_peers: None,
        unix_dead_peers: None,
        unix_in_flight_files: None,
        ptys: None,
        process_attrs: None,
        unix_socket_options: None,
        uts: None,
    };
    (inv, t)
}

/// The cgroups section decides where restore writes PIDs: a path that
/// leaves its hierarchy, or an entry for a process outside the tree, is
/// refused.
#[test]
fn hostile_cgroups_are_rejected() {
    let (inv, t) = valid_tree();
    let with = |f: &dyn Fn(&mut CgroupImage)| {
        let mut t = t.clone();
        f(t.cgroups.as_mut().expect("fixture has cgroups"));
        reject_tree(&inv, &t)
    };
    for path in ["/../etc", "/a/../../b", "relative", "", "/a/./b", "/a\nb", "/a\0b"] {
        let msg = with(&|c| c.processes[0].memberships[0].path = path.into());
        assert!(msg.contains("bad cgroup"), "{path:?}: {msg}");
    }
    let msg = with(&|c| c.processes[0].memberships[0].controllers = "memory/../x".into());
    assert!(msg.contains("bad cgroup"), "{msg}");
    let msg = with(&|c| c.processes[1].pid = 3_999_999);
    assert!(msg.contains("not a process of the tree"), "{msg}");
    let msg = with(&|c| c.processes[1].pid = PID);
    assert!(msg.contains("listed twice"), "{msg}");
    let msg = with(&|c| c.processes[0].memberships = vec![CgroupMembership::default(); 65]);
    assert!(msg.contains("hierarchies"), "{msg}");
}

#[test]
fn valid_tree_round_trips() {
    let (inv, t) = valid_tree();
    ferry_image::validate::validate(&inv, &t).expect("the tree fixture is valid");
    let bytes = encode_meta(&inv, &t).unwrap();
    let (inv2, t2) = decode_meta(&bytes).expect("a valid tree must decode");
    assert_eq!(inv2, inv);
    assert_eq!(t2, t);
    assert_eq!(t2.root().map(|p| p.pid), Some(PID));
    assert_eq!(
        t2.processes.iter().map(|p| (p.pid, p.ppid)).collect::<Vec<_>>(),
        [(PID, 1), (CHILD, PID), (GRANDCHILD, CHILD)]
    );
    assert_eq!(t2.processes[2].root.as_deref(), Some("/srv/jail"));
    // The open file descriptions the child inherited keep their ids.
    assert_eq!(
        t2.processes[1].files.iter().map(|f| f.id).collect::<Vec<_>>(),
        t2.processes[0].files.iter().map(|f| f.id).collect::<Vec<_>>()
    );
    for p in &t2.processes {
        ImageDir::verify_runs(&p.page_runs, &pages_data()).expect("every process's pages verify");
    }
    // Every truncation of the tree is rejected too.
    for n in (0..bytes.len()).step_by(7) {
        reject(&bytes[..n]);
    }
}

#[test]
fn empty_tree() {
    let (inv, _) = valid();
    reject_tree(&inv, &TreeImage::default());
    // Zombies alone are not a tree.
    let (inv, mut t) = valid_tree();
    t.processes.clear();
    reject_tree(&inv, &t);
}

#[test]
fn too_many_processes() {
    let (inv, p) = valid();
    let max = ferry_image::validate::MAX_PROCESSES;
    let zombie = |i: usize| Zombie {
        pid: 100_000 + i as i32,
        ppid: PID,
        pgid: PID,
        sid: PID,
        wait_status: 0,
    };
    // One process and MAX_PROCESSES - 1 zombies: at the limit, accepted.
    let mut t = TreeImage::single(p);
    t.zombies = (0..max - 1).map(zombie).collect();
    decode_meta(&encode_meta(&inv, &t).unwrap()).expect("a tree at the process limit");
    // One more: refused.
    t.zombies.push(zombie(max));
    assert!(reject_tree(&inv, &t).contains("processes"));
}

#[test]
fn child_before_its_parent() {
    // Grandchild before its parent (the child).
    let (inv, mut t) = valid_tree();
    t.processes.swap(1, 2);
    assert!(reject_tree(&inv, &t).contains("before its parent"));

    // A child whose parent is not in the tree at all.
    let (inv, mut t) = valid_tree();
    t.processes[2].ppid = 999;
    assert!(reject_tree(&inv, &t).contains("before its parent"));

    // A process that is its own parent.
    let (inv, mut t) = valid_tree();
    t.processes[2].ppid = GRANDCHILD;
    assert!(reject_tree(&inv, &t).contains("before its parent"));

    // The root after its child (the child comes first, as the root).
    let (inv, mut t) = valid_tree();
    t.processes.swap(0, 1);
    reject_tree(&inv, &t);
    let (inv, mut t) = valid_tree();
    t.processes[1].inherited.clear();
    t.processes.swap(0, 1);
    assert!(reject_tree(&inv, &t).contains("before its parent"));

    // A zombie cannot be the parent of a live process.
    let (inv, mut t) = valid_tree();
    t.processes[2].ppid = ZOMBIE;
    assert!(reject_tree(&inv, &t).contains("before its parent"));
}

#[test]
fn duplicate_pid_across_processes() {
    // The grandchild has its parent's pid.
    let (inv, mut t) = valid_tree();
    t.processes[2].pid = CHILD;
    t.processes[2].threads[0].tid = CHILD;
    assert!(reject_tree(&inv, &t).contains("repeat"));

    // Two siblings with the same pid.
    let (inv, mut t) = valid_tree();
    t.processes[2].ppid = PID;
    t.processes[2].pid = CHILD;
    t.processes[2].threads[0].tid = CHILD;
    assert!(reject_tree(&inv, &t).contains("repeat"));

    // A thread of one process with the tid of another process's thread.
    let (inv, mut t) = valid_tree();
    t.processes[2].threads[1].tid = PID + 1;
    assert!(reject_tree(&inv, &t).contains("repeat"));

    // A thread with the pid of another process.
    let (inv, mut t) = valid_tree();
    t.processes[2].threads[1].tid = CHILD;
    assert!(reject_tree(&inv, &t).contains("repeat"));

    // A zombie with the pid of a live process, or of a thread.
    let (inv, mut t) = valid_tree();
    t.zombies[0].pid = GRANDCHILD;
    assert!(reject_tree(&inv, &t).contains("repeat"));
    let (inv, mut t) = valid_tree();
    t.zombies[0].pid = GRANDCHILD + 1;
    assert!(reject_tree(&inv, &t).contains("repeat"));

    // Two zombies with one pid.
    let (inv, mut t) = valid_tree();
    t.zombies[1].pid = ZOMBIE;
    assert!(reject_tree(&inv, &t).contains("repeat"));

    // A zombie pid out of range.
    for pid in [0, -1, 4_194_305, i32::MAX] {
        let (inv, mut t) = valid_tree();
        t.zombies[0].pid = pid;
        reject_tree(&inv, &t);
    }
}

#[test]
fn zombie_whose_parent_is_missing() {
    let (inv, mut t) = valid_tree();
    t.zombies[0].ppid = 999;
    assert!(reject_tree(&inv, &t).contains("no parent"));

    // A zombie's parent must be a live process, not another zombie.
    let (inv, mut t) = valid_tree();
    t.zombies[1].ppid = ZOMBIE;
    assert!(reject_tree(&inv, &t).contains("no parent"));

    // The root's parent is not in the tree either.
    let (inv, mut t) = valid_tree();
    t.zombies[0].ppid = 1;
    assert!(reject_tree(&inv, &t).contains("no parent"));
}

#[test]
fn mapping_of_missing_shared_memory() {
    // A shared anonymous mapping whose object is not in the tree.
    let (inv, mut t) = valid_tree();
    t.processes[0].vmas[2].backing = VmaBacking::SharedAnon { id: SHM_ANON + 1 };
    assert!(reject_tree(&inv, &t).contains("does not hold"));
    let (inv, mut t) = valid_tree();
    t.shared_anon.clear();
    assert!(reject_tree(&inv, &t).contains("does not hold"));
    // ... in a process other than the root.
    let (inv, mut t) = valid_tree();
    t.processes[2].vmas[2].backing = VmaBacking::SharedAnon { id: 0 };
    assert!(reject_tree(&inv, &t).contains("does not hold"));
    // A memfd is not a shared anonymous object (nor the other way round).
    let (inv, mut t) = valid_tree();
    t.processes[1].memfds.push(MemfdObject {
        id: 77,
        name: "memfd:x".into(),
        size: 0,
        seals: 0,
        extents: vec![],
    });
    t.processes[1].vmas[2].backing = VmaBacking::SharedAnon { id: 77 };
    assert!(reject_tree(&inv, &t).contains("does not hold"));
    let (inv, mut t) = valid_tree();
    t.processes[1].vmas[2].backing = VmaBacking::Memfd { id: SHM_ANON };
    assert!(reject_tree(&inv, &t).contains("memfd"));

    // A SysV mapping whose segment is not in the tree.
    let (inv, mut t) = valid_tree();
    t.processes[1].vmas[3].backing = VmaBacking::SysvShm { id: SYSV_ID + 1 };
    assert!(reject_tree(&inv, &t).contains("does not hold"));
    let (inv, mut t) = valid_tree();
    t.sysv_shm.clear();
    assert!(reject_tree(&inv, &t).contains("does not hold"));
    for id in [0, -1, i32::MAX] {
        let (inv, mut t) = valid_tree();
        t.processes[0].vmas[3].backing = VmaBacking::SysvShm { id };
        assert!(reject_tree(&inv, &t).contains("does not hold"));
    }
}

#[test]
fn shared_memory_data_beyond_its_size() {
    // Anonymous shared memory: the last extent runs one byte past the end.
    let (inv, mut t) = valid_tree();
    t.shared_anon[0].size = 8191;
    assert!(reject_tree(&inv, &t).contains("beyond its size"));
    let (inv, mut t) = valid_tree();
    t.shared_anon[0].extents.push((8190, vec![1, 2, 3]));
    assert!(reject_tree(&inv, &t).contains("beyond its size"));
    // Offset + length overflows.
    let (inv, mut t) = valid_tree();
    t.shared_anon[0].extents.push((u64::MAX, vec![1]));
    assert!(reject_tree(&inv, &t).contains("beyond its size"));
    // An object no mapping refers to is still checked.
    let (inv, mut t) = valid_tree();
    t.shared_anon.push(MemfdObject {
        id: 1,
        name: String::new(),
        size: 0,
        seals: 0,
        extents: vec![(0, vec![0])],
    });
    assert!(reject_tree(&inv, &t).contains("beyond its size"));

    // SysV segments.
    let (inv, mut t) = valid_tree();
    t.sysv_shm[0].size = 8192 + 3;
    assert!(reject_tree(&inv, &t).contains("beyond its size"));
    let (inv, mut t) = valid_tree();
    t.sysv_shm[0].extents.push((16383, vec![1, 2]));
    assert!(reject_tree(&inv, &t).contains("beyond its size"));
    let (inv, mut t) = valid_tree();
    t.sysv_shm[0].extents.push((u64::MAX - 1, vec![1, 2, 3]));
    assert!(reject_tree(&inv, &t).contains("beyond its size"));
    let (inv, mut t) = valid_tree();
    t.sysv_shm[0].size = 0;
    assert!(reject_tree(&inv, &t).contains("SysV segment"));

    // Exactly up to the size is fine.
    let (inv, mut t) = valid_tree();
    t.sysv_shm[0].extents.push((16380, vec![1, 2, 3, 4]));
    t.shared_anon[0].extents.push((8192, vec![]));
    decode_meta(&encode_meta(&inv, &t).unwrap()).expect("extents that end at the size");
}

#[test]
fn inherited_mapping_that_is_not_a_mapping() {
    // Bounds that match no mapping: one page longer, one page shorter, or
    // shifted.
    for (start, end) in
        [(0x600000, 0x603000), (0x600000, 0x601000), (0x601000, 0x602000), (0x5ff000, 0x602000)]
    {
        let (inv, mut t) = valid_tree();
        t.processes[1].inherited[0].start = start;
        t.processes[1].inherited[0].end = end;
        assert!(reject_tree(&inv, &t).contains("not one of its mappings"), "{start:#x}-{end:#x}");
    }
    // A mapping the parent has but this process does not (the grandchild
    // detached the SysV segment).
    let (inv, mut t) = valid_tree();
    t.processes[2].inherited.push(InheritedVma {
        start: 0x7f00_1000_0000,
        end: 0x7f00_1000_4000,
        shared_pages: vec![],
    });
    assert!(reject_tree(&inv, &t).contains("not one of its mappings"));
    // No mappings at all.
    let (inv, mut t) = valid_tree();
    t.processes[2].vmas.clear();
    t.processes[2].page_runs.clear();
    assert!(reject_tree(&inv, &t).contains("not one of its mappings"));
}

#[test]
fn inherited_mapping_on_the_root() {
    // The root has no parent to inherit from, even for a mapping it has.
    let (inv, mut t) = valid_tree();
    t.processes[0].inherited =
        vec![InheritedVma { start: 0x600000, end: 0x602000, shared_pages: vec![] }];
    assert!(reject_tree(&inv, &t).contains("root process cannot inherit"));
    // A tree of one.
    let (inv, mut p) = valid();
    p.inherited = vec![InheritedVma {
        start: 0x600000,
        end: 0x602000,
        shared_pages: vec![PageSpan::new(0x600000, 2)],
    }];
    assert!(reject_model(&inv, &p).contains("root process cannot inherit"));
}

#[test]
fn every_process_of_the_tree_is_checked() {
    // The per-process checks apply to every process, not only the root.
    let (inv, mut t) = valid_tree();
    t.processes[2].fds[0].file = 99;
    assert!(reject_tree(&inv, &t).contains("missing file"));
    let (inv, mut t) = valid_tree();
    t.processes[1].page_runs[1].offset = inv.pages_bytes;
    assert!(reject_tree(&inv, &t).contains("past the end"));
    let (inv, mut t) = valid_tree();
    t.processes[2].threads.clear();
    reject_tree(&inv, &t);
    let (inv, mut t) = valid_tree();
    t.processes[1].vmas.swap(0, 1);
    reject_tree(&inv, &t);
    let (inv, mut t) = valid_tree();
    t.processes[2].pid = 0;
    t.processes[2].threads[0].tid = 0;
    reject_tree(&inv, &t);
    let (inv, mut t) = valid_tree();
    t.processes[1].vmas[1].backing = VmaBacking::Memfd { id: 5 };
    assert!(reject_tree(&inv, &t).contains("memfd"));
}

// The same shape as the memfd regression above, for the tree-level
// references: every shared-memory mapping and every inherited mapping is
// looked up among the tree's objects / the process's mappings. With a
// linear search per reference, N references to N objects cost N * N.
// validate.rs sorts the ids once and looks them up; these 2.6-3.4 MB
// images would take ~8-10 s to decode with a linear search per reference
// (read_stream runs validate before any page data arrives).

#[test]
fn shared_memory_references_are_checked_in_linear_time() {
    let n = 100_000u64;
    let (inv, mut t) = valid_tree();
    t.shared_anon = (0..n)
        .map(|id| MemfdObject { id, name: String::new(), size: 0, seals: 0, extents: vec![] })
        .collect();
    t.sysv_shm = (0..n as i32)
        .map(|id| SysvShm { id, key: 0, size: 0, mode: 0, uid: 0, gid: 0, extents: vec![] })
        .collect();
    let p = &mut t.processes[2];
    p.vmas.retain(|v| !matches!(v.backing, VmaBacking::SharedAnon { .. }));
    let base = 0x1000_0000u64;
    let refs = (0..n).map(|i| {
        let backing = if i % 2 == 0 {
            VmaBacking::SharedAnon { id: n - 1 }
        } else {
            VmaBacking::SysvShm { id: n as i32 - 1 }
        };
        shared(base + i * 8192, base + i * 8192 + 4096, backing)
    });
    p.vmas.splice(2..2, refs); // between the heap and the stack
    let bytes = encode_meta(&inv, &t).unwrap();
    let start = std::time::Instant::now();
    decode_meta(&bytes).expect("a valid image");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(3),
        "decoding {} bytes took {:?}",
        bytes.len(),
        start.elapsed()
    );
}

#[test]
fn inherited_mappings_are_checked_in_linear_time() {
    let n = 100_000u64;
    let (inv, mut t) = valid_tree();
    let p = &mut t.processes[1];
    let base = 0x1000_0000u64;
    p.vmas.splice(2..2, (0..n).map(|i| anon(base + i * 8192, base + i * 8192 + 4096))); // between the heap and the shared mappings
    let last = n - 1;
    p.inherited = (0..n)
        .map(|_| InheritedVma {
            start: base + last * 8192,
            end: base + last * 8192 + 4096,
            shared_pages: vec![],
        })
        .collect();
    let bytes = encode_meta(&inv, &t).unwrap();
    let start = std::time::Instant::now();
    decode_meta(&bytes).expect("a valid image");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(3),
        "decoding {} bytes took {:?}",
        bytes.len(),
        start.elapsed()
    );
}

#[test]
fn bad_sysv_semaphores_and_queues() {
    let (inv, t) = valid_tree();
    assert_eq!(
        decode_meta(&encode_meta(&inv, &t).unwrap()).expect("valid").1.sysv_msg[0].messages.len(),
        2
    );
    // A semaphore value above SEMVMX, an empty set, a repeated id.
    let (inv, mut t) = valid_tree();
    t.sysv_sem[0].values[1] = 40_000;
    assert!(reject_tree(&inv, &t).contains("semaphore set 7"));
    let (inv, mut t) = valid_tree();
    t.sysv_sem[0].values.clear();
    assert!(reject_tree(&inv, &t).contains("semaphore set 7"));
    let (inv, mut t) = valid_tree();
    t.sysv_sem.push(t.sysv_sem[0].clone());
    assert!(reject_tree(&inv, &t).contains("appears twice"));
    // A message of type 0 (msgsnd refuses it), more bytes than the queue
    // holds, a repeated queue.
    let (inv, mut t) = valid_tree();
    t.sysv_msg[0].messages[0].0 = 0;
    assert!(reject_tree(&inv, &t).contains("message queue 9"));
    let (inv, mut t) = valid_tree();
    t.sysv_msg[0].max_bytes = 3002;
    assert!(reject_tree(&inv, &t).contains("message queue 9"));
    let (inv, mut t) = valid_tree();
    t.sysv_msg.push(t.sysv_msg[0].clone());
    assert!(reject_tree(&inv, &t).contains("appears twice"));
}

/// A valid image with format-4 state: two threads under seccomp (one
/// filter shared), a parent-death signal, an fd owner, inode attributes.
fn valid_fidelity() -> (Inventory, ProcessImage) {
    let (inv, mut p) = valid();
    let tids: Vec<i32> = p.threads.iter().map(|t| t.tid).collect();
    p.fidelity = Fidelity {
        seccomp_filters: vec![
            SeccompFilter { insns: vec![0x7fff_0000_0000_0006], log: false },
            SeccompFilter { insns: vec![0x0000_0004_0000_0020, 0x7fff_0000_0000_0006], log: true },
        ],
        threads: tids
            .iter()
            .map(|&tid| ThreadFidelity { tid, seccomp_mode: 2, seccomp: vec![0, 1], pdeathsig: 10 })
            .collect(),
        file_owners: vec![FileOwner { file: 0, owner_type: 1, owner: PID, signal: 35 }],
        inode_attrs: vec![],
        stopped: true,
        securebits: 0x10,
        exit_signal: 17,
        deleted_files: vec![],
        shares_files_with_parent: false,
        epoll_targets: vec![],
        unix_connects: vec![],
    };
    (inv, p)
}

#[test]
fn fidelity_state_round_trips() {
    let (inv, p) = valid_fidelity();
    let bytes = encode_meta(&inv, &TreeImage::single(p.clone())).expect("encode");
    let (_, t) = decode_meta(&bytes).expect("a valid format-4 image decodes");
    assert_eq!(t.processes[0].fidelity, p.fidelity);
}

#[test]
fn malformed_fidelity_state_is_rejected() {
    let (inv, mut p) = valid_fidelity();
    p.fidelity.seccomp_filters[0].insns.clear();
    assert!(reject_model(&inv, &p).contains("seccomp filter"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.seccomp_filters[0].insns = vec![6; 4097];
    assert!(reject_model(&inv, &p).contains("seccomp filter"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.threads[0].seccomp = vec![0, 2];
    assert!(reject_model(&inv, &p).contains("index out of range"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.threads[0].seccomp = vec![u32::MAX];
    assert!(reject_model(&inv, &p).contains("index out of range"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.threads[1].seccomp_mode = 1; // strict with filters
    assert!(reject_model(&inv, &p).contains("seccomp mode"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.threads[0].seccomp.clear(); // filter mode without filters
    assert!(reject_model(&inv, &p).contains("seccomp mode"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.threads[0].seccomp_mode = 7;
    assert!(reject_model(&inv, &p).contains("seccomp mode"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.threads[0].tid = 999_999;
    assert!(reject_model(&inv, &p).contains("does not have"));

    let (inv, mut p) = valid_fidelity();
    let extra = p.fidelity.threads[0].clone();
    p.fidelity.threads.push(extra);
    assert!(reject_model(&inv, &p).contains("more seccomp/thread entries"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.exit_signal = 99;
    assert!(reject_model(&inv, &p).contains("exit signal"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.threads[0].pdeathsig = 65;
    assert!(reject_model(&inv, &p).contains("parent-death signal"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.file_owners[0].file = p.files.len() as u32;
    assert!(reject_model(&inv, &p).contains("fd owner"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.file_owners[0].owner_type = 3;
    assert!(reject_model(&inv, &p).contains("fd owner"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.file_owners[0].signal = -1;
    assert!(reject_model(&inv, &p).contains("fd owner"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.inode_attrs.push(InodeAttrs {
        of: InodeOf::Memfd(12345),
        mode: 0o600,
        uid: 0,
        gid: 0,
    });
    assert!(reject_model(&inv, &p).contains("inode attributes"));

    let (inv, mut p) = valid_fidelity();
    p.fidelity.inode_attrs.push(InodeAttrs { of: InodeOf::File(0), mode: 0o600, uid: 0, gid: 0 }); // not a deleted file
    assert!(reject_model(&inv, &p).contains("inode attributes"));
}

#[test]
fn malformed_inotify_watches_are_rejected() {
    let w = |wd: i32| InotifyWatch { wd, path: "/tmp".into(), mask: 0x100 };
    let (inv, mut p) = valid();
    p.files[0].kind = FileKind::Inotify { watches: vec![w(1), w(3)] };
    let bytes = encode_meta(&inv, &TreeImage::single(p.clone())).expect("encode");
    decode_meta(&bytes).expect("ordered watches decode");
    for bad in [vec![w(3), w(1)], vec![w(2), w(2)], vec![w(0)], vec![w(-5), w(1)]] {
        let (inv, mut p) = valid();
        p.files[0].kind = FileKind::Inotify { watches: bad };
        assert!(reject_model(&inv, &p).contains("inotify"));
    }
}

#[test]
fn format4_references_are_checked() {
    // An epoll entry for an fd the process lacks is valid only with a target.
    let (inv, mut p) = valid();
    p.files[3].kind = FileKind::Epoll { entries: vec![EpollEntry { fd: 77, events: 1, data: 0 }] };
    assert!(reject_model(&inv, &p).contains("epoll entry"));
    p.fidelity.epoll_targets.push(EpollTarget { epoll_file: 3, fd: 77, target: 101 });
    let bytes = encode_meta(&inv, &TreeImage::single(p.clone())).expect("encode");
    decode_meta(&bytes).expect("an entry with a target decodes");
    let mut q = p.clone();
    q.fidelity.epoll_targets[0].epoll_file = 0; // not an epoll instance
    assert!(reject_model(&inv, &q).contains("epoll"));
    let mut q = p.clone();
    q.fidelity.epoll_targets.push(EpollTarget { epoll_file: 3, fd: 78, target: 101 }); // more targets than entries
    assert!(reject_model(&inv, &q).contains("epoll target"));

    // A pending unix connection must name an unconnected unix socket.
    let (inv, mut p) = valid();
    p.fidelity.unix_connects.push(UnixConnect { file: 0, listener: 9, position: 0 });
    assert!(reject_model(&inv, &p).contains("pending unix connection"));

    // Ancillary data of a queued unix message names a queued message of a
    // connected socket, fds of the tree and a process of the tree.
    let (inv, mut p) = valid();
    let pid = p.pid;
    let fd0 = p.fds[0].fd;
    p.files[0].kind = FileKind::UnixSocket(UnixSocket {
        ino: 7,
        sock_type: libc_sock_stream(),
        name: vec![],
        listen_backlog: None,
        peer: Some(7),
        queued: vec![b"m".to_vec()],
        passcred: true,
        shutdown: 0,
        in_flight: vec![UnixInFlight {
            message: 0,
            fds: vec![PassedFd { pid, fd: fd0 }],
            creds: Some(UnixCreds { pid, uid: 0, gid: 0 }),
        }],
    });
    let ok = encode_meta(&inv, &TreeImage::single(p.clone())).expect("encode");
    decode_meta(&ok).expect("valid ancillary data decodes");
    let with = |f: &dyn Fn(&mut UnixInFlight)| {
        let mut q = p.clone();
        if let FileKind::UnixSocket(u) = &mut q.files[0].kind {
            f(&mut u.in_flight[0]);
        }
        q
    };
    assert!(reject_model(&inv, &with(&|m| m.message = 1)).contains("ancillary data for a message"));
    assert!(reject_model(&inv, &with(&|m| m.fds[0].fd = 999)).contains("descriptor in flight"));
    assert!(reject_model(&inv, &with(&|m| m.fds[0].pid = pid + 1)).contains("descriptor in flight"));
    assert!(reject_model(
        &inv,
        &with(&|m| m.creds = Some(UnixCreds { pid: pid + 1, uid: 0, gid: 0 }))
    )
    .contains("credentials"));
    assert!(reject_model(&inv, &with(&|m| m.fds = vec![PassedFd { pid, fd: fd0 }; 254]))
        .contains("malformed ancillary"));

    // The unix peers section (format 4.3) names connected unix sockets of
    // the tree, each once, processes of the tree and real ids.
    let peers = |list: Vec<UnixPeerCred>| {
        let mut t = TreeImage::single(p.clone());
        t.unix_peers = Some(UnixPeersImage { sockets: list });
        t
    };
    let good = UnixPeerCred { ino: 7, pid, uid: 1000, gid: 1000, groups: vec![1000, 27] };
    let ok = encode_meta(&inv, &peers(vec![good.clone()])).expect("encode");
    assert_eq!(
        decode_meta(&ok).expect("valid unix peers decode").1.unix_peers,
        Some(UnixPeersImage { sockets: vec![good.clone()] })
    );
    let reject_tree = |t: &TreeImage| match decode_meta(&encode_meta(&inv, t).expect("encode")) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted {:?}", t.unix_peers),
    };
    assert!(reject_tree(&peers(vec![UnixPeerCred { ino: 8, ..good.clone() }]))
        .contains("not a connected or listening unix socket"));
    assert!(reject_tree(&peers(vec![good.clone(), good.clone()])).contains("listed twice"));
    assert!(reject_tree(&peers(vec![UnixPeerCred { pid: pid + 1, ..good.clone() }]))
        .contains("not a process of the tree"));
    assert!(reject_tree(&peers(vec![UnixPeerCred { uid: u32::MAX, ..good.clone() }]))
        .contains("bad uid"));
    assert!(reject_tree(&peers(vec![UnixPeerCred { gid: u32::MAX, ..good.clone() }]))
        .contains("bad uid"));
    assert!(reject_tree(&peers(vec![UnixPeerCred { groups: vec![u32::MAX], ..good.clone() }]))
        .contains("bad uid"));
    assert!(reject_tree(&peers(vec![UnixPeerCred { groups: vec![5; 4097], ..good.clone() }]))
        .contains("4097 of them"));

    // A deleted mapped file must be in the image, with data inside its size.
    let (inv, mut p) = valid();
    p.vmas[0].backing = VmaBacking::DeletedFile { id: 5 };
    assert!(reject_model(&inv, &p).contains("deleted file"));
    p.fidelity.deleted_files.push(MemfdObject {
        id: 5,
        name: "/lib/x.so".into(),
        size: 4,
        seals: 0o644,
        extents: vec![(2, vec![0; 3])],
    });
    assert!(reject_model(&inv, &p).contains("beyond its size"));

    // A /proc file must be under /proc.
    let (inv, mut p) = valid();
    p.files[0].kind = FileKind::ProcFile { path: "/etc/shadow".into() };
    assert!(reject_model(&inv, &p).contains("/proc"));

    // The root cannot share a parent's fd table.
    let (inv, mut p) = valid();
    p.fidelity.shares_files_with_parent = true;
    assert!(reject_model(&inv, &p).contains("fd table"));
}

/// An established connection of the valid fixture (fd 103 turned from a
/// listener into a connection), for the TCP state checks.
fn with_connection(c: TcpConnection) -> (Inventory, ProcessImage) {
    let (inv, mut p) = valid();
    for f in p.files.iter_mut() {
        if let FileKind::InetSocket(s) = &mut f.kind {
            s.listen_backlog = None;
            s.peer = Some((vec![127, 0, 0, 2], 40000));
            s.connection = Some(c.clone());
        }
    }
    (inv, p)
}

fn good_connection() -> TcpConnection {
    TcpConnection {
        state: 1,
        send_seq: 1000,
        send_queue: vec![1; 300].into(),
        unsent: 100,
        recv_seq: 5000,
        recv_queue: vec![2; 50].into(),
        mss_clamp: 1460,
        snd_wscale: Some(7),
        rcv_wscale: 7,
        sack: true,
        timestamps: true,
        timestamp: 123,
        window: TcpWindow {
            snd_wl1: 5000,
            snd_wnd: 65535,
            max_window: 65535,
            rcv_wnd: 65535,
            rcv_wup: 5000,
        },
        sndbuf: 87040,
        rcvbuf: 131072,
        buf_lock: 0,
    }
}

#[test]
fn tcp_connection_state_is_checked() {
    let (inv, p) = with_connection(good_connection());
    let bytes = encode_meta(&inv, &TreeImage::single(p)).expect("encode");
    ferry_image::decode_meta(&bytes).expect("a sane connection is accepted");

    let bad: Vec<(&str, TcpConnection)> = vec![
        ("unsent", TcpConnection { unsent: 301, ..good_connection() }),
        ("window scale", TcpConnection { snd_wscale: Some(15), ..good_connection() }),
        ("window scale", TcpConnection { rcv_wscale: 200, ..good_connection() }),
        ("MSS", TcpConnection { mss_clamp: 0, ..good_connection() }),
        ("MSS", TcpConnection { mss_clamp: 70000, ..good_connection() }),
        ("buffer sizes", TcpConnection { sndbuf: -1, ..good_connection() }),
        ("SO_BUF_LOCK", TcpConnection { buf_lock: 8, ..good_connection() }),
    ];
    for (want, c) in bad {
        let (inv, p) = with_connection(c);
        let msg = reject_model(&inv, &p);
        assert!(msg.contains(want) && msg.contains("TCP connection"), "{want}: {msg}");
    }
    // A connection without a peer, or on a datagram socket.
    let (inv, mut p) = with_connection(good_connection());
    for f in p.files.iter_mut() {
        if let FileKind::InetSocket(s) = &mut f.kind {
            s.peer = None;
        }
    }
    assert!(reject_model(&inv, &p).contains("no peer"));
    let (inv, mut p) = with_connection(good_connection());
    for f in p.files.iter_mut() {
        if let FileKind::InetSocket(s) = &mut f.kind {
            s.sock_type = 2;
        }
    }
    assert!(reject_model(&inv, &p).contains("stream sockets"));
}

fn libc_sock_stream() -> i32 {
    1 // SOCK_STREAM
}

/// 10,000 connections with 4 KiB in each queue, as `bench/tcp.py` makes
/// them: the image directory written and read back gives the same tree,
/// and says how long each took (`--nocapture`).
#[test]
fn ten_thousand_connections_go_through_an_image_directory_unchanged() {
    let (mut inv, mut p) = with_connection(good_connection());
    // Memory is not what this is about: no page data.
    inv.pages_bytes = 0;
    p.page_runs.clear();
    let at = p.files.iter().position(|f| matches!(f.kind, FileKind::InetSocket(_))).unwrap();
    let template = p.files[at].clone();
    p.rlimits = vec![Rlimit { resource: 7, soft: 20_000, hard: 20_000 }];
    let base = p.fds.iter().map(|s| s.fd).max().unwrap_or(0) + 1;
    let first_id = p.files.iter().map(|f| f.id).max().unwrap_or(0) + 1;
    for i in 0..10_000u32 {
        let mut f = template.clone();
        f.id = first_id + u64::from(i);
        if let FileKind::InetSocket(s) = &mut f.kind {
            s.peer = Some((vec![127, 0, 0, 2], 10_000 + i as u16));
            let c = s.connection.as_mut().unwrap();
            c.recv_queue = vec![i as u8; 4096].into();
            c.send_queue = vec![!(i as u8); 4096].into();
            c.unsent = 0;
        }
        p.fds.push(FdSlot { fd: base + i as i32, file: p.files.len() as u32, cloexec: false });
        p.files.push(f);
    }
    let tree = TreeImage::single(p);
    // On tmpfs, as the benchmark keeps its images.
    let shm = std::path::Path::new("/dev/shm");
    let root = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let dir = root.join(format!("ferry-10k-image-{}", std::process::id()));
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = Rm(dir.clone());
    let mut sink = ferry_image::DirSink::create(&dir).expect("image directory");
    let t = std::time::Instant::now();
    ferry_image::ImageSink::finish_image(&mut sink, &inv, &tree, None).expect("write");
    let written = t.elapsed();
    let t = std::time::Instant::now();
    let loaded =
        ferry_image::ImageSource::load(&mut ferry_image::DirSource::new(&dir), 2).expect("read");
    let read = t.elapsed();
    eprintln!("10,000 connections: meta.img written in {written:?}, read and checked in {read:?}");
    assert!(loaded.tree == tree, "the tree read back differs");
}
