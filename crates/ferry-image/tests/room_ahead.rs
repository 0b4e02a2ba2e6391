//! The pages file's room made while the tree runs
//! (`PagesWriter::make_room_ahead`): on tmpfs the data area is allocated
//! ahead, the pages written into it are the ones read back, and an
//! estimate larger than what came is given back when the data area ends.
//! On a disk filesystem nothing is allocated ahead.

use ferry_image::dir::{PAGES_DATA_OFFSET, PAGES_FILE};
use ferry_image::ImageDir;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

struct TempDir(PathBuf);

impl TempDir {
    fn under(root: &str, tag: &str) -> TempDir {
        let path = Path::new(root).join(format!("ferry-room-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn allocated(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(PAGES_FILE)).map(|m| m.blocks() * 512).unwrap_or(0)
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn room_made_ahead_on_tmpfs_is_trimmed_to_what_was_written() {
    let d = TempDir::under("/dev/shm", "trim");
    let mut w = ImageDir::new(&d.0).create_pages().expect("pages.img on /dev/shm");
    w.make_room_ahead(8 * MIB);
    // Made while nothing is written (the tree runs).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while allocated(&d.0) < 8 * MIB && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(allocated(&d.0) >= 8 * MIB, "room ahead not made: {} bytes", allocated(&d.0));
    let data = pattern(MIB, 7);
    w.write_runs_at(0, &[(0x10000, MIB as usize)], &data).expect("write into the room");
    w.set_data_len(MIB).expect("data area ends");
    let meta = std::fs::metadata(d.0.join(PAGES_FILE)).expect("pages.img");
    assert_eq!(meta.len(), PAGES_DATA_OFFSET + MIB);
    assert!(allocated(&d.0) <= PAGES_DATA_OFFSET + MIB, "room past the end kept");
    let back = std::fs::read(d.0.join(PAGES_FILE)).expect("read back");
    assert_eq!(&back[PAGES_DATA_OFFSET as usize..], &data[..]);
}

#[test]
fn pages_past_a_short_estimate_are_written_all_the_same() {
    let d = TempDir::under("/dev/shm", "short");
    let mut w = ImageDir::new(&d.0).create_pages().expect("pages.img on /dev/shm");
    w.make_room_ahead(2 * MIB);
    let data = pattern(3 * MIB, 3);
    let runs = w
        .write_runs_at(0, &[(0x20000, 2 * MIB as usize), (0x800000, MIB as usize)], &data)
        .expect("write past the room");
    w.set_data_len(3 * MIB).expect("data area ends");
    let back = std::fs::read(d.0.join(PAGES_FILE)).expect("read back");
    let area = &back[PAGES_DATA_OFFSET as usize..];
    assert_eq!(area, &data[..]);
    ImageDir::verify_runs(&runs, area).expect("every run's checksum holds");
}

/// A write stops the allocation at its current step: 1 GiB of room
/// asked, a write at once, and the file holds far less than 1 GiB.
#[test]
fn the_first_write_stops_the_room_being_made() {
    let d = TempDir::under("/dev/shm", "stop");
    let mut w = ImageDir::new(&d.0).create_pages().expect("pages.img on /dev/shm");
    w.make_room_ahead(1 << 30);
    let data = pattern(MIB, 5);
    w.write_runs_at(0, &[(0x10000, MIB as usize)], &data).expect("write");
    let made = allocated(&d.0);
    assert!(made < 512 * MIB, "the room went on past the first write: {made} bytes");
    w.set_data_len(MIB).expect("data area ends");
    let back = std::fs::read(d.0.join(PAGES_FILE)).expect("read back");
    assert_eq!(&back[PAGES_DATA_OFFSET as usize..], &data[..]);
}

#[test]
fn no_room_is_made_ahead_on_a_disk_filesystem_or_for_little() {
    let d = TempDir::under(env!("CARGO_TARGET_TMPDIR"), "disk");
    let mut w = ImageDir::new(&d.0).create_pages().expect("pages.img on disk");
    w.make_room_ahead(8 * MIB);
    w.write_runs_at(0, &[(0x10000, 4096)], &pattern(4096, 1)).expect("write");
    assert!(allocated(&d.0) < MIB, "room made ahead on disk: {} bytes", allocated(&d.0));

    let s = TempDir::under("/dev/shm", "little");
    let mut w = ImageDir::new(&s.0).create_pages().expect("pages.img on /dev/shm");
    w.make_room_ahead(ferry_image::dir::ROOM_AHEAD_MIN - 4096);
    w.write_runs_at(0, &[(0x10000, 4096)], &pattern(4096, 2)).expect("write");
    assert!(allocated(&s.0) < 64 * 1024, "room made for less than the minimum");
}
