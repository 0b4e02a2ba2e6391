//! Compatibility between builds (format major.minor) and incremental
//! images (format 4.1): old images are read, newer ones refused with a
//! message that says what to do, and hostile `Incremental` sections are
//! refused without a panic.

mod compat_fixture;

use compat_fixture::{image, CHILD, CHILD_MAP, PAGE, ROOT, ROOT_HEAP, ROOT_STACK_TOP};
use ferry_image::container::{
    self, checksum, decode_meta_full, decode_meta_versioned, encode_meta, encode_meta_with,
    file_header_for, read_file_header, FormatVersion, SectionKind, HEADER_LEN, SECTION_HEADER_LEN,
};
use ferry_image::model::*;
use ferry_image::stream::{dir_to_stream, read_stream, read_stream_full, write_stream_with};
use ferry_image::{
    decode_meta, require_complete, ImageDir, ImageError, FORMAT_MAJOR, FORMAT_MINOR,
};
use std::io::Cursor;
use std::path::{Path, PathBuf};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-4.0")
}

fn v(major: u32, minor: u16) -> FormatVersion {
    FormatVersion { major, minor }
}

/// The fixture model with the current major in its inventory.
fn model() -> (Inventory, TreeImage, Vec<u8>) {
    image(FORMAT_MAJOR)
}

/// Root: heap pages 2..5 and the stack below its top page; child: pages
/// 0 and 2..4 of its mapping. None overlaps a page run.
fn incremental() -> Incremental {
    Incremental {
        parent_id: 0xfeed_0001,
        parent_pages: vec![
            ParentPages {
                pid: ROOT,
                ranges: vec![
                    ferry_image::PageSpan::new(ROOT_HEAP + 2 * PAGE, 3),
                    ferry_image::PageSpan::new(ROOT_STACK_TOP - 8 * PAGE, 7),
                ],
            },
            ParentPages {
                pid: CHILD,
                ranges: vec![
                    ferry_image::PageSpan::new(CHILD_MAP, 1),
                    ferry_image::PageSpan::new(CHILD_MAP + 2 * PAGE, 2),
                ],
            },
        ],
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "ferry-compat-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_dir(dir: &Path, inv: &Inventory, t: &TreeImage, inc: Option<&Incremental>, pages: &[u8]) {
    let image = ImageDir::new(dir);
    let mut w = image.create_pages().unwrap();
    w.append_runs(&[], pages).unwrap();
    w.finish().unwrap();
    image.write_meta_with(inv, t, inc).unwrap();
}

fn stream_of(inv: &Inventory, t: &TreeImage, inc: Option<&Incremental>, pages: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let n = write_stream_with(&mut out, inv, t, inc, pages).unwrap();
    assert_eq!(n, out.len() as u64);
    out
}

/// Replaces the version in a header (meta.img, pages.img or a stream).
fn with_version(bytes: &[u8], version: FormatVersion) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[..HEADER_LEN].copy_from_slice(&file_header_for(version, 0));
    b
}

/// Frames raw sections behind a header of `version`.
fn frame(version: FormatVersion, sections: &[(u32, &[u8])]) -> Vec<u8> {
    let mut out = file_header_for(version, 0).to_vec();
    for (kind, payload) in sections {
        let mut h = [0u8; SECTION_HEADER_LEN];
        h[..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        h[16..24].copy_from_slice(&checksum(payload).to_le_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(payload);
    }
    out
}

fn message(e: &ImageError) -> String {
    e.to_string()
}

// ------------------------------------------------------------ versions

#[test]
fn this_build_is_4_9() {
    assert_eq!((FORMAT_MAJOR, FORMAT_MINOR), (4, 9));
    assert_eq!(FormatVersion::CURRENT.to_string(), "4.9");
    let (inv, t, _) = model();
    let meta = encode_meta(&inv, &t).unwrap();
    // Major 4, then the flags word with minor 9 in its upper half.
    assert_eq!(&meta[8..16], &[4, 0, 0, 0, 0, 0, 9, 0]);
    assert_eq!(read_file_header(&meta, "meta.img").unwrap().version, v(4, 9));
}

#[test]
fn format_4_0_fixture_directory_is_read() {
    let dir = ImageDir::new(fixture_dir());
    let raw = std::fs::read(fixture_dir().join("meta.img")).unwrap();
    assert_eq!(
        &raw[8..16],
        &[4, 0, 0, 0, 0, 0, 0, 0],
        "the fixture is a header as format 4.0 wrote it"
    );
    let (inv, t, pages) = model();
    assert_eq!(dir.read_meta_full().unwrap(), (inv.clone(), t.clone(), None));
    assert_eq!(dir.read_meta().unwrap(), (inv.clone(), t.clone()));
    assert_eq!(dir.read_meta_complete().unwrap(), (inv.clone(), t.clone()));
    assert_eq!(dir.read_version().unwrap(), v(4, 0));
    // pages.img has a 4.0 header too; its data is the model's.
    dir.check_pages_file(&inv).unwrap();
    let data = std::fs::read(dir.pages_path()).unwrap();
    assert_eq!(&data[4096..], &pages[..]);
    for p in &t.processes {
        ImageDir::verify_runs(&p.page_runs, &data[4096..]).unwrap();
    }
    // And it streams: the stream carries this build's version (a build
    // writes its own), and reads back as the same image.
    let mut s = Vec::new();
    dir_to_stream(&fixture_dir(), &mut s).unwrap();
    assert_eq!(read_file_header(&s, "stream").unwrap().version, FormatVersion::CURRENT);
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap(), (inv, t, None, pages));
}

#[test]
fn format_4_0_fixture_stream_is_read() {
    let s = std::fs::read(fixture_dir().join("stream.bin")).unwrap();
    assert_eq!(&s[8..16], &[4, 0, 0, 0, 0, 0, 0, 0]);
    let (inv, t, pages) = model();
    let mut c = Cursor::new(&s);
    assert_eq!(
        read_stream_full(&mut c, None).unwrap(),
        (inv.clone(), t.clone(), None, pages.clone())
    );
    assert_eq!(c.position() as usize, s.len());
    // Received into a directory, it is an ordinary (complete) image.
    let d = TempDir::new("fixture-stream");
    read_stream(&mut Cursor::new(&s), Some(&d.0)).unwrap();
    assert_eq!(ImageDir::new(&d.0).read_meta_full().unwrap(), (inv, t, None));
}

#[test]
fn hand_made_4_0_header_reads_as_minor_0() {
    let (inv, t, pages) = model();
    let meta = with_version(&encode_meta(&inv, &t).unwrap(), v(4, 0));
    assert_eq!(&meta[12..16], &[0, 0, 0, 0]);
    assert_eq!(decode_meta_versioned(&meta).unwrap(), (v(4, 0), inv.clone(), t.clone(), None));
    let s = with_version(&stream_of(&inv, &t, None, &pages), v(4, 0));
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap(), (inv, t, None, pages));
}

#[test]
fn newer_minor_is_refused_with_upgrade_message() {
    let (inv, t, pages) = model();
    let want =
        "image format 4.10 is newer than this ferry build reads (4.9): upgrade ferry on this host";
    let meta = with_version(&encode_meta(&inv, &t).unwrap(), v(4, 10));
    let e = decode_meta(&meta).unwrap_err();
    assert!(matches!(e, ImageError::NewerMinor { major: 4, found: 10, supported: 9 }), "{e:?}");
    assert_eq!(message(&e), want);
    let s = with_version(&stream_of(&inv, &t, None, &pages), v(4, 10));
    let mut c = Cursor::new(&s);
    let e = read_stream(&mut c, None).unwrap_err();
    assert_eq!(message(&e), want);
    assert_eq!(c.position() as usize, HEADER_LEN, "nothing read past the header");
    // In a directory: meta.img and pages.img are each checked.
    let d = TempDir::new("minor-6");
    write_dir(&d.0, &inv, &t, None, &pages);
    let image = ImageDir::new(&d.0);
    let pages_path = image.pages_path();
    let p = std::fs::read(&pages_path).unwrap();
    std::fs::write(&pages_path, with_version(&p, v(4, 10))).unwrap();
    assert_eq!(message(&image.check_pages_file(&inv).unwrap_err()), want);
    std::fs::write(d.0.join("meta.img"), &meta).unwrap();
    assert_eq!(message(&image.read_meta().unwrap_err()), want);
    // The largest minor the header can hold.
    let e = decode_meta(&with_version(&meta, v(4, u16::MAX))).unwrap_err();
    assert!(message(&e).contains("image format 4.65535 is newer"), "{e}");
}

#[test]
fn other_major_is_refused() {
    let (inv, t, pages) = model();
    let meta = encode_meta(&inv, &t).unwrap();
    for (major, minor) in [(5u32, 0u16), (3, 0), (5, 7), (0, 0), (u32::MAX, 0)] {
        let want = format!("image format {major} is not readable by this build (reads 4.x)");
        let e = decode_meta(&with_version(&meta, v(major, minor))).unwrap_err();
        assert!(
            matches!(e, ImageError::Version { found, supported: 4 } if found == major),
            "{e:?}"
        );
        assert_eq!(message(&e), want);
        let s = with_version(&stream_of(&inv, &t, None, &pages), v(major, minor));
        assert_eq!(message(&read_stream(&mut Cursor::new(&s), None).unwrap_err()), want);
    }
    // An inventory of another major inside a 4.x file is refused too.
    let mut inv5 = inv.clone();
    inv5.format_version = 5;
    let e = decode_meta(&encode_meta(&inv5, &t).unwrap()).unwrap_err();
    assert_eq!(message(&e), "image format 5 is not readable by this build (reads 4.x)");
}

#[test]
fn unknown_header_flags_are_refused() {
    let (inv, t, _) = model();
    let mut meta = encode_meta(&inv, &t).unwrap();
    meta[12..16].copy_from_slice(&((1u32 << 16) | 0x0004).to_le_bytes());
    let e = decode_meta(&meta).unwrap_err();
    assert!(
        matches!(e, ImageError::Invalid(ref m) if m.contains("header flags 0x0004") && m.contains("4.1")),
        "{e:?}"
    );
}

#[test]
fn incremental_section_is_refused_in_a_4_0_image() {
    let (inv, t, pages) = model();
    let inc = incremental();
    let meta = with_version(&encode_meta_with(&inv, &t, Some(&inc)).unwrap(), v(4, 0));
    let e = decode_meta(&meta).unwrap_err();
    assert!(
        matches!(e, ImageError::Invalid(ref m) if m.contains("incremental section") && m.contains("format 4.0")),
        "{e:?}"
    );
    let s = with_version(&stream_of(&inv, &t, Some(&inc), &pages), v(4, 0));
    let e = read_stream(&mut Cursor::new(&s), None).unwrap_err();
    assert!(
        matches!(e, ImageError::Invalid(ref m) if m.contains("incremental section") && m.contains("format 4.0")),
        "{e:?}"
    );
}

#[test]
fn unknown_section_kinds_are_refused() {
    let (inv, t, pages) = model();
    let meta = encode_meta(&inv, &t).unwrap();
    // After the required sections, and in their place.
    for at in [meta.len(), HEADER_LEN] {
        for kind in [0u32, 13, 99, u32::MAX] {
            let mut m = meta.clone();
            let payload = [1u8, 2, 3];
            let mut h = [0u8; SECTION_HEADER_LEN];
            h[..4].copy_from_slice(&kind.to_le_bytes());
            h[8..16].copy_from_slice(&3u64.to_le_bytes());
            h[16..24].copy_from_slice(&checksum(&payload).to_le_bytes());
            m.splice(at..at, h.iter().chain(payload.iter()).copied());
            let e = decode_meta(&m).unwrap_err();
            assert!(
                matches!(e, ImageError::Invalid(ref s) if s.contains(&format!("unknown section kind {kind}"))),
                "{kind} at {at}: {e:?}"
            );
        }
    }
    // A stream: an unknown kind where the pages (or an optional section) may come.
    let s = stream_of(&inv, &t, None, &pages);
    let mut bad = s.clone();
    bad[meta.len()] = 13;
    let e = read_stream(&mut Cursor::new(&bad), None).unwrap_err();
    assert!(
        matches!(e, ImageError::Invalid(ref m) if m.contains("unknown section kind 13")),
        "{e:?}"
    );
}

// --------------------------------------------------------- round trips

#[test]
fn round_trip_current_without_optional_sections() {
    let (inv, t, pages) = model();
    let meta = encode_meta_with(&inv, &t, None).unwrap();
    assert_eq!(meta, encode_meta(&inv, &t).unwrap());
    assert_eq!(
        decode_meta_versioned(&meta).unwrap(),
        (FormatVersion::CURRENT, inv.clone(), t.clone(), None)
    );
    let d = TempDir::new("rt-plain");
    write_dir(&d.0, &inv, &t, None, &pages);
    let image = ImageDir::new(&d.0);
    assert_eq!(image.read_meta_full().unwrap(), (inv.clone(), t.clone(), None));
    assert_eq!(image.read_meta_complete().unwrap(), (inv.clone(), t.clone()));
    assert_eq!(image.read_version().unwrap(), FormatVersion::CURRENT);
    let s = stream_of(&inv, &t, None, &pages);
    assert_eq!(&s[..meta.len()], &meta[..]);
    assert_eq!(
        read_stream_full(&mut Cursor::new(&s), None).unwrap(),
        (inv.clone(), t.clone(), None, pages.clone())
    );
    let mut s2 = Vec::new();
    dir_to_stream(&d.0, &mut s2).unwrap();
    assert_eq!(s2, s);
}

fn with_cgroups(mut t: TreeImage) -> TreeImage {
    let memberships = vec![
        CgroupMembership { hierarchy: 5, controllers: "cpu,cpuacct".into(), path: "/svc".into() },
        CgroupMembership {
            hierarchy: 0,
            controllers: String::new(),
            path: "/system.slice/svc.service".into(),
        },
    ];
    t.cgroups = Some(CgroupImage {
        processes: t
            .processes
            .iter()
            .map(|p| ProcessCgroups { pid: p.pid, memberships: memberships.clone() })
            .collect(),
    });
    t
}

/// An image with an optional section its header's minor does not have
/// is refused, naming the section and the version, as a file and as a
/// stream; without the section, the same tree reads at that version.
fn assert_section_refused_in(older: FormatVersion, section: &str, t: &TreeImage) {
    let (inv, plain, pages) = model();
    let want = |e: &ImageError| matches!(e, ImageError::Invalid(ref m) if m.contains(&format!("{section} section")) && m.contains(&format!("format {older}")));
    let e = decode_meta(&with_version(&encode_meta(&inv, t).unwrap(), older)).unwrap_err();
    assert!(want(&e), "{e:?}");
    let s = with_version(&stream_of(&inv, t, None, &pages), older);
    let e = read_stream(&mut Cursor::new(&s), None).unwrap_err();
    assert!(want(&e), "{e:?}");
    let meta = with_version(&encode_meta(&inv, &plain).unwrap(), older);
    assert_eq!(decode_meta_versioned(&meta).unwrap(), (older, inv, plain, None));
}

#[test]
fn cgroups_section_is_refused_in_a_4_1_image() {
    assert_section_refused_in(v(4, 1), "cgroups", &with_cgroups(model().1));
}

/// The model with its root's first file a unix socket connected to
/// itself, and that socket's SO_PEERCRED recorded.
fn with_unix_peers(mut t: TreeImage) -> TreeImage {
    let root = &mut t.processes[0];
    let pid = root.pid;
    root.files[0].kind = FileKind::UnixSocket(UnixSocket {
        ino: 77,
        sock_type: 1,
        name: vec![],
        listen_backlog: None,
        peer: Some(77),
        queued: vec![],
        passcred: false,
        shutdown: 0,
        in_flight: vec![],
    });
    t.unix_peers = Some(UnixPeersImage {
        sockets: vec![UnixPeerCred { ino: 77, pid, uid: 1000, gid: 100, groups: vec![100, 27] }],
    });
    t
}

#[test]
fn round_trip_current_with_unix_peers_cgroups_and_incremental() {
    let (inv, t, pages) = model();
    let t = with_unix_peers(with_cgroups(t));
    let inc = incremental();
    for inc in [None, Some(&inc)] {
        let meta = encode_meta_with(&inv, &t, inc).unwrap();
        assert_eq!(
            decode_meta_versioned(&meta).unwrap(),
            (FormatVersion::CURRENT, inv.clone(), t.clone(), inc.cloned())
        );
        let d = TempDir::new("rt-unix-peers");
        write_dir(&d.0, &inv, &t, inc, &pages);
        assert_eq!(
            ImageDir::new(&d.0).read_meta_full().unwrap(),
            (inv.clone(), t.clone(), inc.cloned())
        );
        let s = stream_of(&inv, &t, inc, &pages);
        assert_eq!(
            read_stream_full(&mut Cursor::new(&s), None).unwrap(),
            (inv.clone(), t.clone(), inc.cloned(), pages.clone())
        );
        let mut s2 = Vec::new();
        dir_to_stream(&d.0, &mut s2).unwrap();
        assert_eq!(s2, s);
    }
}

#[test]
fn unix_peers_section_is_refused_in_a_4_2_image() {
    assert_section_refused_in(v(4, 2), "unix peers", &with_unix_peers(model().1));
}

/// The model with its root's first file a stream socket whose peer was
/// closed (its SO_PEERCRED recorded too) and its second a datagram
/// socket whose peer, bound to an abstract name, was closed.
fn with_unix_dead_peers(t: TreeImage) -> TreeImage {
    let mut t = with_unix_peers(t);
    let root = &mut t.processes[0];
    let dead = |ino, sock_type| {
        FileKind::UnixSocket(UnixSocket {
            ino,
            sock_type,
            name: vec![],
            listen_backlog: None,
            peer: None,
            queued: vec![b"tail".to_vec()],
            passcred: false,
            shutdown: if sock_type == 1 { 3 } else { 0 },
            in_flight: vec![],
        })
    };
    root.files[0].kind = dead(77, 1);
    let mut second = root.files[0].clone();
    second.id = 0x7e57_0078;
    second.kind = dead(78, 2);
    root.files.push(second);
    let fd = root.fds.iter().map(|s| s.fd).max().unwrap_or(2) + 1;
    root.fds.push(FdSlot { fd, file: root.files.len() as u32 - 1, cloexec: false });
    t.unix_dead_peers = Some(UnixDeadPeersImage {
        sockets: vec![
            UnixDeadPeer { ino: 77, peer_name: vec![], client: false, reset: true },
            UnixDeadPeer { ino: 78, peer_name: b"\0gone".to_vec(), client: false, reset: false },
        ],
    });
    t
}

#[test]
fn round_trip_current_with_unix_dead_peers() {
    let (inv, t, pages) = model();
    let t = with_unix_dead_peers(with_cgroups(t));
    let inc = incremental();
    for inc in [None, Some(&inc)] {
        let meta = encode_meta_with(&inv, &t, inc).unwrap();
        assert_eq!(
            decode_meta_versioned(&meta).unwrap(),
            (FormatVersion::CURRENT, inv.clone(), t.clone(), inc.cloned())
        );
        let d = TempDir::new("rt-unix-dead-peers");
        write_dir(&d.0, &inv, &t, inc, &pages);
        assert_eq!(
            ImageDir::new(&d.0).read_meta_full().unwrap(),
            (inv.clone(), t.clone(), inc.cloned())
        );
        let s = stream_of(&inv, &t, inc, &pages);
        assert_eq!(
            read_stream_full(&mut Cursor::new(&s), None).unwrap(),
            (inv.clone(), t.clone(), inc.cloned(), pages.clone())
        );
    }
}

#[test]
fn unix_dead_peers_section_is_refused_in_a_4_3_image() {
    assert_section_refused_in(v(4, 3), "unix dead peers", &with_unix_dead_peers(model().1));
}

/// A 4.3 image (SO_PEERCRED recorded, no dead peers section) is read by
/// this build as it was written: no socket has a closed peer.
#[test]
fn a_4_3_image_is_read_without_dead_peers() {
    let (inv, t, pages) = model();
    let t = with_unix_peers(with_cgroups(t));
    let meta = with_version(&encode_meta(&inv, &t).unwrap(), v(4, 3));
    let (version, _, read, _) = decode_meta_versioned(&meta).unwrap();
    assert_eq!((version, read.unix_dead_peers.as_ref()), (v(4, 3), None));
    assert_eq!(read, t);
    let s = with_version(&stream_of(&inv, &t, None, &pages), v(4, 3));
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap(), (inv, t, None, pages));
}

/// A dead peers entry that does not name an unconnected socket of the
/// tree, or says "client" of a datagram socket, is refused.
#[test]
fn bad_unix_dead_peers_are_refused() {
    let (inv, t, _) = model();
    let good = with_unix_dead_peers(t);
    let bad = |f: &dyn Fn(&mut TreeImage)| {
        let mut t = good.clone();
        f(&mut t);
        let e = decode_meta(&encode_meta(&inv, &t).unwrap()).unwrap_err();
        assert!(matches!(&e, ImageError::Invalid(m) if m.contains("unix dead peers")), "{e:?}");
    };
    fn entry(t: &mut TreeImage) -> &mut UnixDeadPeer {
        &mut t.unix_dead_peers.as_mut().unwrap().sockets[1]
    }
    bad(&|t| entry(t).ino = 12345);
    bad(&|t| entry(t).client = true);
    bad(&|t| entry(t).peer_name = vec![b'a'; 108]);
    bad(&|t| {
        let e = entry(t).clone();
        t.unix_dead_peers.as_mut().unwrap().sockets.push(e);
    });
    bad(&|t| {
        if let FileKind::UnixSocket(u) = &mut t.processes[0].files[1].kind {
            u.peer = Some(77);
        }
    });
}

/// The model with its root's first file a unix socket connected to
/// itself with one message queued that passes two descriptors no process
/// holds: one file, then an eventfd.
fn with_in_flight_files(t: TreeImage) -> TreeImage {
    let mut t = with_unix_peers(t);
    if let FileKind::UnixSocket(u) = &mut t.processes[0].files[0].kind {
        u.queued = vec![b"m".to_vec()];
        u.in_flight = vec![UnixInFlight {
            message: 0,
            fds: vec![PassedFd::HELD_BY_NONE, PassedFd::HELD_BY_NONE],
            creds: None,
        }];
    }
    let file = |id, kind| OpenFile { id, flags: 2, pos: 30, kind, locks: vec![] };
    let entry = |index, file| InFlightFile { socket: 77, message: 0, index, file };
    t.unix_in_flight_files = Some(UnixInFlightFilesImage {
        files: vec![
            entry(0, file(900, FileKind::Regular { path: "/srv/a.dat".into(), size: 100 })),
            entry(1, file(901, FileKind::EventFd { count: 7, semaphore: false })),
        ],
    });
    t
}

#[test]
fn round_trip_current_with_in_flight_files() {
    let (inv, t, pages) = model();
    let t = with_in_flight_files(t);
    let meta = encode_meta(&inv, &t).unwrap();
    assert_eq!(
        decode_meta_versioned(&meta).unwrap(),
        (FormatVersion::CURRENT, inv.clone(), t.clone(), None)
    );
    let s = stream_of(&inv, &t, None, &pages);
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap(), (inv, t, None, pages));
}

#[test]
fn unix_in_flight_files_section_is_refused_in_a_4_3_image() {
    let t = with_in_flight_files(model().1);
    let (inv, _, pages) = model();
    let want = |e: &ImageError| matches!(e, ImageError::Invalid(ref m) if m.contains("unix in-flight files section") && m.contains("format 4.3"));
    let e = decode_meta(&with_version(&encode_meta(&inv, &t).unwrap(), v(4, 3))).unwrap_err();
    assert!(want(&e), "{e:?}");
    let s = with_version(&stream_of(&inv, &t, None, &pages), v(4, 3));
    let e = read_stream(&mut Cursor::new(&s), None).unwrap_err();
    assert!(want(&e), "{e:?}");
}

/// A descriptor held by no process without its file, an entry for a
/// descriptor that is not one, a file of a kind restore does not make on
/// its own, or one id for two files: refused, as a file and as a stream.
#[test]
fn bad_unix_in_flight_files_are_refused() {
    let (inv, t, pages) = model();
    let good = with_in_flight_files(t);
    let bad = |f: &dyn Fn(&mut TreeImage)| {
        let mut t = good.clone();
        f(&mut t);
        let e = decode_meta(&encode_meta(&inv, &t).unwrap()).unwrap_err();
        assert!(matches!(&e, ImageError::Invalid(_)), "{e:?}");
        let s = stream_of(&inv, &t, None, &pages);
        let e = read_stream(&mut Cursor::new(&s), None).unwrap_err();
        assert!(matches!(&e, ImageError::Invalid(_)), "{e:?}");
    };
    fn files(t: &mut TreeImage) -> &mut Vec<InFlightFile> {
        &mut t.unix_in_flight_files.as_mut().unwrap().files
    }
    bad(&|t| t.unix_in_flight_files = None);
    bad(&|t| {
        files(t).pop();
    });
    bad(&|t| files(t)[1].index = 2);
    bad(&|t| files(t)[1].file.kind = FileKind::SignalFd { mask: 0 });
    bad(&|t| files(t)[1].file.id = 900);
    bad(&|t| {
        let id = t.processes[0].files[0].id;
        files(t)[0].file.id = id;
    });
}

#[test]
fn round_trip_4_2_with_incremental() {
    let (inv, t, pages) = model();
    let inc = incremental();
    assert_eq!(inc.parent_page_count(), 13);
    let meta = encode_meta_with(&inv, &t, Some(&inc)).unwrap();
    assert_eq!(decode_meta_full(&meta).unwrap(), (inv.clone(), t.clone(), Some(inc.clone())));
    // Callers that do not care still read it (without the section)...
    assert_eq!(decode_meta(&meta).unwrap(), (inv.clone(), t.clone()));
    // ...and a restore can tell it needs the parent.
    let e = require_complete(Some(&inc)).unwrap_err();
    assert_eq!(
        message(&e),
        format!("image is incremental (parent id {}); restore needs its parent", 0xfeed_0001u64)
    );
    assert!(require_complete(None).is_ok());

    // Directory.
    let d = TempDir::new("rt-inc");
    write_dir(&d.0, &inv, &t, Some(&inc), &pages);
    let image = ImageDir::new(&d.0);
    assert_eq!(image.read_meta_full().unwrap(), (inv.clone(), t.clone(), Some(inc.clone())));
    assert_eq!(image.read_meta().unwrap(), (inv.clone(), t.clone()));
    let e = image.read_meta_complete().unwrap_err();
    assert!(matches!(e, ImageError::NeedsParent { parent_id: 0xfeed_0001 }), "{e:?}");

    // Stream: the section sits between the process tree and the pages.
    let s = stream_of(&inv, &t, Some(&inc), &pages);
    assert_eq!(&s[..meta.len()], &meta[..]);
    assert_eq!(
        u32::from_le_bytes(s[meta.len()..meta.len() + 4].try_into().unwrap()),
        SectionKind::Pages as u32
    );
    let mut c = Cursor::new(&s);
    assert_eq!(
        read_stream_full(&mut c, None).unwrap(),
        (inv.clone(), t.clone(), Some(inc.clone()), pages.clone())
    );
    assert_eq!(c.position() as usize, s.len());
    assert_eq!(
        read_stream(&mut Cursor::new(&s), None).unwrap(),
        (inv.clone(), t.clone(), pages.clone())
    );
    // A directory streams with its section, and a stream received into a
    // directory keeps it, through the old read_stream too: the received
    // image must not look complete.
    let mut s2 = Vec::new();
    dir_to_stream(&d.0, &mut s2).unwrap();
    assert_eq!(s2, s);
    let r = TempDir::new("rt-inc-recv");
    read_stream(&mut Cursor::new(&s), Some(&r.0)).unwrap();
    assert_eq!(
        ImageDir::new(&r.0).read_meta_full().unwrap(),
        (inv.clone(), t.clone(), Some(inc.clone()))
    );
    assert!(matches!(
        ImageDir::new(&r.0).read_meta_complete(),
        Err(ImageError::NeedsParent { .. })
    ));
    // Two images back to back on one connection.
    let mut two = s.clone();
    two.extend_from_slice(&stream_of(&inv, &t, None, &pages));
    let mut c = Cursor::new(&two);
    assert!(read_stream_full(&mut c, None).unwrap().2.is_some());
    assert!(read_stream_full(&mut c, None).unwrap().2.is_none());
    assert_eq!(c.position() as usize, two.len());
}

#[test]
fn empty_incremental_and_edge_ranges_are_accepted() {
    let (inv, t, pages) = model();
    for inc in [
        Incremental { parent_id: 0, parent_pages: vec![] },
        Incremental {
            parent_id: u64::MAX,
            parent_pages: vec![ParentPages { pid: CHILD, ranges: vec![] }],
        },
        // Right up to the page runs on either side, and to the mapping's end.
        Incremental {
            parent_id: 1,
            parent_pages: vec![
                ParentPages {
                    pid: ROOT,
                    ranges: vec![
                        ferry_image::PageSpan::new(ROOT_HEAP + 2 * PAGE, 6),
                        ferry_image::PageSpan::new(ROOT_STACK_TOP - 32 * PAGE, 31),
                    ],
                },
                ParentPages {
                    pid: CHILD,
                    ranges: vec![
                        ferry_image::PageSpan::new(CHILD_MAP, 1),
                        ferry_image::PageSpan::new(CHILD_MAP + 2 * PAGE, 1),
                        ferry_image::PageSpan::new(CHILD_MAP + 3 * PAGE, 1),
                    ],
                },
            ],
        },
    ] {
        let meta = encode_meta_with(&inv, &t, Some(&inc)).unwrap();
        assert_eq!(decode_meta_full(&meta).unwrap().2, Some(inc.clone()));
        let s = stream_of(&inv, &t, Some(&inc), &pages);
        assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap().2, Some(inc));
    }
}

#[test]
fn many_ranges_are_checked_in_linear_time() {
    let (inv, mut t, pages) = model();
    let big = 0x1_0000_0000u64;
    let n = 200_000u64;
    t.processes[0].vmas.insert(
        2,
        Vma {
            start: big,
            end: big + 2 * n * PAGE,
            prot: PROT_READ | PROT_WRITE,
            shared: false,
            flags: 0,
            pgoff: 0,
            backing: VmaBacking::Anonymous,
        },
    );
    let ranges: Vec<ferry_image::PageSpan> =
        (0..n).map(|i| ferry_image::PageSpan::new(big + 2 * i * PAGE, 1)).collect();
    let inc = Incremental { parent_id: 7, parent_pages: vec![ParentPages { pid: ROOT, ranges }] };
    let t0 = std::time::Instant::now();
    let s = stream_of(&inv, &t, Some(&inc), &pages);
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap().2, Some(inc));
    assert!(t0.elapsed().as_secs() < 10, "{:?}", t0.elapsed());
}

// -------------------------------------------------- hostile incremental

const USER_END: u64 = ferry_image::validate::USER_ADDR_END;

fn with_pages(pid: i32, ranges: Vec<(u64, u64)>) -> Incremental {
    let ranges = ranges.into_iter().map(|(s, n)| ferry_image::PageSpan::new(s, n)).collect();
    Incremental { parent_id: 9, parent_pages: vec![ParentPages { pid, ranges }] }
}

/// Incremental sections that are well-formed postcard but wrong for the
/// tree, and the words the error must contain.
fn hostile() -> Vec<(Incremental, &'static str)> {
    let heap = ROOT_HEAP;
    let mut two = incremental();
    two.parent_pages.push(ParentPages {
        pid: ROOT,
        ranges: vec![ferry_image::PageSpan::new(heap + 7 * PAGE, 1)],
    });
    vec![
        (with_pages(ROOT, vec![(heap + 4 * PAGE, 1), (heap + 2 * PAGE, 1)]), "out of order"),
        (
            with_pages(ROOT, vec![(heap + 2 * PAGE, 2), (heap + 3 * PAGE, 1)]),
            "overlap the range before",
        ),
        (
            with_pages(ROOT, vec![(heap + 2 * PAGE, 1), (heap + 2 * PAGE, 1)]),
            "overlap the range before",
        ),
        (with_pages(ROOT, vec![(0x70_0000, 1)]), "outside every mapping"),
        (with_pages(ROOT, vec![(heap + 6 * PAGE, 3)]), "outside every mapping"),
        (with_pages(ROOT, vec![(heap - PAGE, 2)]), "outside every mapping"),
        (with_pages(ROOT, vec![(0x40_0000, 0x60_0000 / PAGE)]), "outside every mapping"),
        (with_pages(ROOT, vec![(CHILD_MAP, 1)]), "outside every mapping"),
        (with_pages(CHILD, vec![(heap + 2 * PAGE, 1)]), "outside every mapping"),
        (with_pages(ROOT, vec![(USER_END, 1)]), "outside every mapping"),
        (with_pages(ROOT, vec![(heap + PAGE, 2)]), "overlap the page run at 0x600000"),
        (with_pages(ROOT, vec![(heap, 1)]), "overlap the page run at 0x600000"),
        (
            with_pages(ROOT, vec![(ROOT_STACK_TOP - 2 * PAGE, 2)]),
            "overlap the page run at 0x7ffd0001f000",
        ),
        (with_pages(CHILD, vec![(CHILD_MAP, 4)]), "overlap the page run at 0x901000"),
        (with_pages(4242, vec![(heap + 2 * PAGE, 1)]), "not a process of the tree"),
        (with_pages(0, vec![]), "not a process of the tree"),
        (with_pages(-1, vec![]), "not a process of the tree"),
        (two, "listed twice"),
        (with_pages(ROOT, vec![(heap + 2 * PAGE, 0)]), "empty or misaligned"),
        (with_pages(ROOT, vec![(heap + 2 * PAGE + 1, 1)]), "empty or misaligned"),
        (with_pages(ROOT, vec![(heap + 2 * PAGE, u64::MAX)]), "overflows"),
        (with_pages(ROOT, vec![(heap + 2 * PAGE, 1 << 52)]), "overflows"),
        (
            with_pages(ROOT, vec![(heap + 2 * PAGE, (u64::MAX - heap) / PAGE - 2)]),
            "outside every mapping",
        ),
        (with_pages(ROOT, vec![(0xffff_ffff_ffff_f000, 1)]), "overflows"),
    ]
}

#[test]
fn hostile_incremental_sections_are_refused() {
    let (inv, t, pages) = model();
    for (inc, want) in hostile() {
        let meta = encode_meta_with(&inv, &t, Some(&inc)).unwrap();
        let e = decode_meta(&meta).unwrap_err();
        assert!(
            matches!(e, ImageError::Invalid(ref m) if m.contains(want) && m.contains("incremental section")),
            "{want}: {e:?}"
        );
        // A stream refuses it before any page data is read.
        let s = stream_of(&inv, &t, Some(&inc), &pages);
        let mut c = Cursor::new(&s[..]);
        let e = read_stream_full(&mut c, None).unwrap_err();
        assert!(matches!(e, ImageError::Invalid(ref m) if m.contains(want)), "{want}: {e:?}");
        assert_eq!(c.position() as usize, meta.len(), "{want}: page data was read");
        // And nothing is written into a target directory.
        let d = TempDir::new("hostile");
        let target = d.0.join("img");
        assert!(read_stream(&mut Cursor::new(&s), Some(&target)).is_err());
        assert!(!target.exists(), "{want}");
    }
}

/// Postcard bytes of an Incremental with one ParentPages whose range list
/// claims `count` entries and holds `held`.
fn raw_incremental(count: u64, held: &[(u64, u64)]) -> Vec<u8> {
    fn varint(mut x: u64, out: &mut Vec<u8>) {
        loop {
            let b = (x & 0x7f) as u8;
            x >>= 7;
            if x == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    let mut out = Vec::new();
    varint(9, &mut out); // parent_id
    varint(1, &mut out); // one ParentPages
    varint(((ROOT << 1) ^ (ROOT >> 31)) as u32 as u64, &mut out); // pid, zigzag
    varint(count, &mut out);
    for &(a, n) in held {
        varint(a, &mut out);
        varint(n, &mut out);
    }
    out
}

#[test]
fn malformed_incremental_payloads_are_refused() {
    let (inv, t, pages) = model();
    let inv_b = postcard::to_stdvec(&inv).unwrap();
    let tree_b = postcard::to_stdvec(&t).unwrap();
    let good = postcard::to_stdvec(&incremental()).unwrap();
    assert_eq!(
        raw_incremental(1, &[(ROOT_HEAP + 2 * PAGE, 1)]),
        postcard::to_stdvec(&with_pages(ROOT, vec![(ROOT_HEAP + 2 * PAGE, 1)])).unwrap()
    );
    let mut trailing = good.clone();
    trailing.push(0);
    let payloads: Vec<(Vec<u8>, &str)> = vec![
        // Huge claimed counts, with (almost) nothing behind them: no
        // allocation of that size, a decode error.
        (raw_incremental(u64::MAX, &[]), "huge count"),
        (raw_incremental(1 << 40, &[(ROOT_HEAP + 2 * PAGE, 1)]), "2^40 ranges"),
        (raw_incremental(3, &[(ROOT_HEAP + 2 * PAGE, 1)]), "3 claimed, 1 held"),
        (good[..good.len() - 1].to_vec(), "truncated payload"),
        (good[..1].to_vec(), "one byte"),
        (vec![], "empty payload"),
        (vec![0xff; 11], "overlong varint"),
        (trailing, "trailing byte"),
    ];
    let inc = SectionKind::Incremental as u32;
    for (payload, what) in payloads {
        let meta = frame(v(4, 1), &[(1, &inv_b), (2, &tree_b), (inc, &payload)]);
        match decode_meta(&meta) {
            Err(ImageError::Decode { kind: "incremental", .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
        let mut s = meta.clone();
        s.extend_from_slice(
            &stream_of(&inv, &t, None, &pages)[encode_meta(&inv, &t).unwrap().len()..],
        );
        match read_stream_full(&mut Cursor::new(&s), None) {
            Err(ImageError::Decode { kind: "incremental", .. }) => {}
            other => panic!("stream, {what}: {other:?}"),
        }
    }
}

#[test]
fn misplaced_and_repeated_incremental_sections_are_refused() {
    let (inv, t, pages) = model();
    let inv_b = postcard::to_stdvec(&inv).unwrap();
    let tree_b = postcard::to_stdvec(&t).unwrap();
    let inc_b = postcard::to_stdvec(&incremental()).unwrap();
    let inc = SectionKind::Incremental as u32;
    for (sections, want) in [
        (vec![(1, &inv_b), (2, &tree_b), (inc, &inc_b), (inc, &inc_b)], "duplicate incremental"),
        (
            vec![(1, &inv_b), (inc, &inc_b), (2, &tree_b)],
            "where the process tree section was expected",
        ),
        (
            vec![(inc, &inc_b), (1, &inv_b), (2, &tree_b)],
            "where the inventory section was expected",
        ),
        (vec![(1, &inv_b), (2, &tree_b), (inc, &inc_b), (2, &tree_b)], "duplicate process tree"),
    ] {
        let sections: Vec<(u32, &[u8])> =
            sections.iter().map(|(k, p)| (*k, p.as_slice())).collect();
        let meta = frame(v(4, 1), &sections);
        let e = decode_meta(&meta).unwrap_err();
        assert!(matches!(e, ImageError::Invalid(ref m) if m.contains(want)), "{want}: {e:?}");
        // The same order in a stream, then the pages.
        let mut s = meta;
        s.extend_from_slice(
            &stream_of(&inv, &t, None, &pages)[encode_meta(&inv, &t).unwrap().len()..],
        );
        let e = read_stream(&mut Cursor::new(&s), None).unwrap_err();
        assert!(
            matches!(e, ImageError::Invalid(ref m) if m.contains(want)),
            "stream, {want}: {e:?}"
        );
    }
    // In a stream, the incremental section after the pages is another
    // image's first section: refused as a bad header... and meta.img never
    // holds pages.
    let meta = frame(v(4, 1), &[(1, &inv_b), (2, &tree_b), (3, &[]), (inc, &inc_b)]);
    assert!(
        matches!(decode_meta(&meta), Err(ImageError::Invalid(ref m)) if m.contains("pages section does not belong in meta.img"))
    );
}

#[test]
fn every_truncation_of_an_incremental_image_is_refused() {
    let (inv, t, pages) = model();
    let inc = incremental();
    let meta = encode_meta_with(&inv, &t, Some(&inc)).unwrap();
    let s = stream_of(&inv, &t, Some(&inc), &pages);
    let without = encode_meta(&inv, &t).unwrap().len();
    for cut in 0..meta.len() {
        // Cut right after the process tree section: a complete image
        // without the incremental section, which is valid.
        if cut == without {
            assert!(decode_meta_full(&meta[..cut]).unwrap().2.is_none());
            continue;
        }
        assert!(decode_meta_full(&meta[..cut]).is_err(), "meta cut at {cut}");
    }
    for cut in 0..s.len() {
        match read_stream_full(&mut Cursor::new(&s[..cut]), None) {
            Err(ImageError::Truncated(_)) => {}
            other => panic!("stream cut at {cut}: {other:?}"),
        }
    }
    // Flipped bytes anywhere in the metadata: an error, never a panic.
    for at in HEADER_LEN..meta.len() {
        let mut m = meta.clone();
        m[at] ^= 0x5a;
        assert!(decode_meta_full(&m).is_err(), "flip at {at}");
    }
}

#[test]
fn validate_incremental_alone_never_panics_on_an_unchecked_tree() {
    // Garbage page runs and mappings (validate would refuse them): the
    // incremental check must still only return errors.
    let (_, mut t, _) = model();
    t.processes[0].page_runs.push(PageRun {
        start: u64::MAX - 10,
        pages: u64::MAX,
        offset: 0,
        checksum: 0,
    });
    t.processes[0].vmas.push(Vma {
        start: u64::MAX - 4095,
        end: 3,
        prot: 0,
        shared: false,
        flags: 0,
        pgoff: 0,
        backing: VmaBacking::Anonymous,
    });
    for (inc, _) in hostile() {
        let _ = ferry_image::validate::validate_incremental(&t, &inc);
    }
    let _ = ferry_image::validate::validate_incremental(
        &t,
        &with_pages(ROOT, vec![(u64::MAX - 4095, 1)]),
    );
    let _ = container::require_complete(None);
}

/// meta.img is encoded into one buffer of the exact size, each section
/// serialized in place: the bytes are those of each payload serialized
/// on its own and framed in order, and nothing was allocated beyond them.
#[test]
fn meta_is_each_section_serialized_on_its_own_and_framed_in_order() {
    let (inv, t, _) = model();
    let inc = incremental();
    let bytes = encode_meta_with(&inv, &t, Some(&inc)).unwrap();
    assert_eq!(bytes.len(), bytes.capacity());
    let inv_b = postcard::to_stdvec(&inv).unwrap();
    let tree_b = postcard::to_stdvec(&t).unwrap();
    let inc_b = postcard::to_stdvec(&inc).unwrap();
    let mut sections: Vec<(u32, &[u8])> = vec![
        (SectionKind::Inventory as u32, &inv_b),
        (SectionKind::Tree as u32, &tree_b),
        (SectionKind::Incremental as u32, &inc_b),
    ];
    let cg_b = t.cgroups.as_ref().map(|c| postcard::to_stdvec(c).unwrap());
    if let Some(b) = &cg_b {
        sections.push((SectionKind::Cgroups as u32, b));
    }
    assert_eq!(bytes, frame(FormatVersion::CURRENT, &sections));
    let (inv2, t2, inc2) = decode_meta_full(&bytes).unwrap();
    assert_eq!((inv2, t2, inc2), (inv, t, Some(inc)));
}

/// The model with a pty pair: its root's first file the master, a second
/// file the slave, queues both ways and a session.
fn with_ptys(t: TreeImage) -> TreeImage {
    let mut t = t;
    let root = &mut t.processes[0];
    for (id, path) in [(0x7e57_0078, "/dev/ptmx"), (0x7e57_0079, "/dev/pts/3")] {
        let mut f = root.files[0].clone();
        f.id = id;
        f.kind = FileKind::Terminal { path: path.into() };
        root.files.push(f);
        let fd = root.fds.iter().map(|s| s.fd).max().unwrap_or(2) + 1;
        root.fds.push(FdSlot { fd, file: root.files.len() as u32 - 1, cloexec: false });
    }
    let (master_id, pid, pgid) = (0x7e57_0078, root.pid, root.pgid);
    t.ptys = Some(PtysImage {
        pairs: vec![PtyPair {
            index: 3,
            termios: PtyTermios { lflag: 0o105073, cc: vec![3; 19], ..Default::default() },
            winsize: [24, 80, 0, 0],
            slave_mode: 0o620,
            input_lines: vec![b"ls\n".to_vec()],
            input_rest: b"ec".to_vec(),
            output: b"$ ".to_vec(),
            session: pid,
            foreground: pgid,
            ..Default::default()
        }],
        ends: vec![
            PtyEnd { file: master_id, index: 3, master: true },
            PtyEnd { file: 0x7e57_0079, index: 3, master: false },
        ],
    });
    t
}

#[test]
fn round_trip_4_6_with_ptys() {
    let (inv, t, pages) = model();
    let t = with_ptys(with_cgroups(t));
    let meta = encode_meta(&inv, &t).unwrap();
    assert_eq!(
        decode_meta_versioned(&meta).unwrap(),
        (FormatVersion::CURRENT, inv.clone(), t.clone(), None)
    );
    let s = stream_of(&inv, &t, None, &pages);
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap(), (inv, t, None, pages));
}

/// A 4.5 build would replace the pair by --tty-to: a 4.5 header with the
/// section is refused.
#[test]
fn ptys_section_is_refused_in_a_4_5_image() {
    assert_section_refused_in(v(4, 5), "ptys", &with_ptys(model().1));
}

/// An end that is not a terminal of the tree, a pair without a master or
/// a slave, a second master, or a wrong number of control characters.
#[test]
fn bad_ptys_are_refused() {
    let (inv, t, _) = model();
    let good = with_ptys(t);
    let bad = |f: &dyn Fn(&mut PtysImage)| {
        let mut t = good.clone();
        f(t.ptys.as_mut().unwrap());
        let e = decode_meta(&encode_meta(&inv, &t).unwrap()).unwrap_err();
        assert!(matches!(&e, ImageError::Invalid(m) if m.contains("ptys section")), "{e:?}");
    };
    bad(&|p| p.ends[0].file = 12345);
    bad(&|p| p.ends[1].master = true);
    bad(&|p| {
        p.ends.pop();
    });
    bad(&|p| {
        p.pairs[0].termios.cc.pop();
    });
    bad(&|p| p.ends[1].index = 4);
    bad(&|p| p.pairs[0].output = vec![0; (1 << 20) + 1]);
}

/// The model with each process's coredump_filter (format 4.7) and each
/// thread's I/O priority, the autogroup nice and the audit ids (4.8).
fn with_process_attrs(t: TreeImage) -> TreeImage {
    let mut t = t;
    let processes = t
        .processes
        .iter()
        .enumerate()
        .map(|(i, p)| ProcessAttrs {
            coredump_filter: 0x33 | (i as u32 & 0xc),
            netns: (i == 1).then_some(4026532000),
            ioprio: p.threads.iter().map(|_| (2 << 13) | i as u16).collect(),
            autogroup_nice: (i == 0).then_some(5),
            audit: Some((u32::MAX, u32::MAX)),
        })
        .collect();
    t.process_attrs = Some(ProcessAttrsImage { processes });
    t
}

#[test]
fn round_trip_4_8_with_process_attrs() {
    let (inv, t, pages) = model();
    let t = with_process_attrs(with_ptys(with_cgroups(t)));
    let meta = encode_meta(&inv, &t).unwrap();
    assert_eq!(
        decode_meta_versioned(&meta).unwrap(),
        (FormatVersion::CURRENT, inv.clone(), t.clone(), None)
    );
    let s = stream_of(&inv, &t, None, &pages);
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap(), (inv, t, None, pages));
}

/// Appends one raw section to an encoded metadata file.
fn append_section(meta: &mut Vec<u8>, kind: SectionKind, payload: &[u8]) {
    let framed = frame(v(4, 0), &[(kind as u32, payload)]);
    meta.extend_from_slice(&framed[HEADER_LEN..]);
}

/// A 4.7 image's section (coredump_filter and netns only) is read in
/// its own layout, with nothing else to set; the 4.8 layout behind a 4.7
/// header is refused, not misread.
#[test]
fn a_4_7_process_attrs_section_is_read_in_its_layout() {
    let (inv, plain, _) = model();
    let old = ProcessAttrsImage47 {
        processes: (0..plain.processes.len())
            .map(|i| ProcessAttrs47 { coredump_filter: 0x3f, netns: (i == 0).then_some(7) })
            .collect(),
    };
    let mut meta = with_version(&encode_meta(&inv, &plain).unwrap(), v(4, 7));
    append_section(&mut meta, SectionKind::ProcessAttrs, &postcard::to_allocvec(&old).unwrap());
    let (version, _, t, _) = decode_meta_versioned(&meta).unwrap();
    assert_eq!(version, v(4, 7));
    let attrs = t.process_attrs.unwrap();
    assert_eq!(attrs, ProcessAttrsImage::from(old));
    assert!(attrs.processes.iter().all(|a| a.ioprio.is_empty() && a.audit.is_none()));
    assert_eq!(attrs.processes[0].netns, Some(7));
    let new = encode_meta(&inv, &with_process_attrs(plain)).unwrap();
    let e = decode_meta(&with_version(&new, v(4, 7))).unwrap_err();
    assert!(matches!(&e, ImageError::Decode { kind: "process attributes", .. }), "{e:?}");
}

/// A 4.6 build would give the restored processes its own coredump_filter,
/// silently: a 4.6 header with the section is refused.
#[test]
fn process_attrs_section_is_refused_in_a_4_6_image() {
    assert_section_refused_in(v(4, 6), "process attributes", &with_process_attrs(model().1));
}

/// One entry per process, only filter bits the kernel has, I/O
/// priorities of the process's own threads in a class the kernel knows,
/// an autogroup nice in -20..19.
#[test]
fn bad_process_attrs_are_refused() {
    let (inv, t, _) = model();
    let good = with_process_attrs(t);
    let bad = |f: &dyn Fn(&mut ProcessAttrsImage)| {
        let mut t = good.clone();
        f(t.process_attrs.as_mut().unwrap());
        let e = decode_meta(&encode_meta(&inv, &t).unwrap()).unwrap_err();
        assert!(
            matches!(&e, ImageError::Invalid(m) if m.contains("process attributes section")),
            "{e:?}"
        );
    };
    bad(&|a| {
        a.processes.pop();
    });
    bad(&|a| a.processes.push(ProcessAttrs::default()));
    bad(&|a| a.processes[0].coredump_filter = 1 << 9);
    bad(&|a| a.processes[0].ioprio[0] = 4 << 13);
    bad(&|a| a.processes[0].ioprio.push(0));
    bad(&|a| a.processes[0].autogroup_nice = Some(20));
    bad(&|a| a.processes[0].autogroup_nice = Some(-21));
}

/// The model with options on its unix socket (format 4.8): a forced
/// send buffer with its lock, a receive timeout, a linger, a mark.
fn with_unix_socket_options(t: TreeImage) -> TreeImage {
    let mut t = with_unix_peers(t);
    let int = |name, v: i32| SockOpt { level: 1, name, value: v.to_ne_bytes().to_vec() };
    let mut timeout = 3i64.to_ne_bytes().to_vec();
    timeout.extend(250_000i64.to_ne_bytes());
    t.unix_socket_options = Some(UnixSocketOptionsImage {
        sockets: vec![UnixSocketOptions {
            ino: 77,
            options: vec![
                int(7, 16_777_216),
                int(72, 1),
                SockOpt { level: 1, name: 20, value: timeout },
                SockOpt { level: 1, name: 13, value: [1i32, 9].map(i32::to_ne_bytes).concat() },
                int(36, 0x1234),
                int(42, 2),
            ],
        }],
    });
    t
}

#[test]
fn round_trip_4_8_with_unix_socket_options() {
    let (inv, t, pages) = model();
    let t = with_unix_socket_options(with_process_attrs(with_cgroups(t)));
    let meta = encode_meta(&inv, &t).unwrap();
    assert_eq!(decode_meta_versioned(&meta).unwrap(), (v(4, 9), inv.clone(), t.clone(), None));
    let d = TempDir::new("rt-unix-opts");
    write_dir(&d.0, &inv, &t, None, &pages);
    assert_eq!(ImageDir::new(&d.0).read_meta_full().unwrap(), (inv.clone(), t.clone(), None));
    let s = stream_of(&inv, &t, None, &pages);
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap(), (inv, t, None, pages));
}

/// A 4.7 build would make the unix sockets with default options,
/// silently: a 4.7 header with the section is refused.
#[test]
fn unix_socket_options_section_is_refused_in_a_4_7_image() {
    assert_section_refused_in(v(4, 7), "unix socket options", &with_unix_socket_options(model().1));
}

/// A socket that is not a unix socket of the tree or is listed twice, an
/// option restore does not set, at another level, of the wrong length or
/// listed twice, a buffer size that is not positive.
#[test]
fn bad_unix_socket_options_are_refused() {
    let (inv, t, pages) = model();
    let good = with_unix_socket_options(t);
    let bad = |f: &dyn Fn(&mut UnixSocketOptionsImage)| {
        let mut t = good.clone();
        f(t.unix_socket_options.as_mut().unwrap());
        let want = |e: &ImageError| matches!(e, ImageError::Invalid(m) if m.contains("unix socket options section"));
        let e = decode_meta(&encode_meta(&inv, &t).unwrap()).unwrap_err();
        assert!(want(&e), "{e:?}");
        let e = read_stream(&mut Cursor::new(&stream_of(&inv, &t, None, &pages)), None);
        assert!(want(&e.unwrap_err()));
    };
    bad(&|o| o.sockets[0].ino = 78);
    bad(&|o| {
        let again = o.sockets[0].clone();
        o.sockets.push(again)
    });
    bad(&|o| o.sockets[0].options[4].name = 50);
    bad(&|o| o.sockets[0].options[4].level = 6);
    bad(&|o| o.sockets[0].options[2].value.pop().map_or((), drop));
    bad(&|o| {
        let again = o.sockets[0].options[0].clone();
        o.sockets[0].options.push(again)
    });
    bad(&|o| o.sockets[0].options[0].value = 0i32.to_ne_bytes().to_vec());
    bad(&|o| o.sockets[0].options[0].value = (-4i32).to_ne_bytes().to_vec());
}

/// The model in a UTS namespace of its own (format 4.9).
fn with_uts(mut t: TreeImage) -> TreeImage {
    t.uts = Some(UtsImage { hostname: "svc-a".into(), domainname: "svc.test".into() });
    t
}

#[test]
fn round_trip_4_9_with_uts() {
    let (inv, t, pages) = model();
    let t = with_uts(with_unix_socket_options(with_process_attrs(with_cgroups(t))));
    let meta = encode_meta(&inv, &t).unwrap();
    assert_eq!(decode_meta_versioned(&meta).unwrap(), (v(4, 9), inv.clone(), t.clone(), None));
    let d = TempDir::new("rt-uts");
    write_dir(&d.0, &inv, &t, None, &pages);
    assert_eq!(ImageDir::new(&d.0).read_meta_full().unwrap(), (inv.clone(), t.clone(), None));
    let s = stream_of(&inv, &t, None, &pages);
    assert_eq!(read_stream_full(&mut Cursor::new(&s), None).unwrap(), (inv, t, None, pages));
}

/// A 4.8 build would restore the tree into its own UTS namespace, with
/// its host's names, silently: a 4.8 header with the section is refused.
#[test]
fn uts_section_is_refused_in_a_4_8_image() {
    assert_section_refused_in(v(4, 8), "uts", &with_uts(model().1));
}

/// A name longer than the kernel keeps (64 bytes) or holding a NUL.
#[test]
fn bad_uts_names_are_refused() {
    let (inv, t, pages) = model();
    let good = with_uts(t);
    let bad = |f: &dyn Fn(&mut UtsImage)| {
        let mut t = good.clone();
        f(t.uts.as_mut().unwrap());
        let want =
            |e: &ImageError| matches!(e, ImageError::Invalid(m) if m.contains("uts section"));
        let e = decode_meta(&encode_meta(&inv, &t).unwrap()).unwrap_err();
        assert!(want(&e), "{e:?}");
        let e = read_stream(&mut Cursor::new(&stream_of(&inv, &t, None, &pages)), None);
        assert!(want(&e.unwrap_err()));
    };
    bad(&|u| u.hostname = "h".repeat(65));
    bad(&|u| u.domainname = "d".repeat(65));
    bad(&|u| u.hostname = "a\0b".into());
    bad(&|u| u.domainname = "\0".into());
    // 64 bytes and an empty name are what a namespace may hold.
    let mut t = good.clone();
    t.uts = Some(UtsImage { hostname: "h".repeat(64), domainname: String::new() });
    decode_meta(&encode_meta(&inv, &t).unwrap()).unwrap();
}
