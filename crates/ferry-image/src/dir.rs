//! An image directory: `meta.img` (header + inventory + process sections)
//! and `pages.img` (header, then raw page data at page-aligned offsets so
//! restore can map it and copy runs with one syscall each).

use crate::container::{self, HEADER_LEN};
use crate::error::ImageError;
use crate::model::{Incremental, Inventory, PageRun, TreeImage};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub const META_FILE: &str = "meta.img";
pub const PAGES_FILE: &str = "pages.img";
/// In an incremental image: a symbolic link to its parent's directory.
pub const PARENT_LINK: &str = "parent";
/// Page data starts one page into pages.img so it stays page-aligned.
pub const PAGES_DATA_OFFSET: u64 = 4096;

pub struct ImageDir {
    pub path: PathBuf,
}

/// Appends page runs to pages.img and computes their checksums.
pub struct PagesWriter {
    file: File,
    path: PathBuf,
    offset: u64,
    /// pages.img is on tmpfs or ramfs: reading it back would read the
    /// very memory just written (see [`PagesWriter::verify_written`]).
    in_memory: bool,
    /// The room made for the pages while the tree still runs
    /// ([`PagesWriter::make_room_ahead`]), waited for before a write.
    room: RoomAhead,
}

/// A thread allocating pages.img's data area ahead of the copy. On tmpfs,
/// writing into new pages costs about twice the copy into pages that
/// exist (docs/benchmarks.md, "The pages file's room made before the
/// freeze"): the allocation is done while the tree runs, not in the pause.
/// It goes in steps of [`ROOM_STEP`] and stops at the first write: what
/// the time before the freeze did not cover is allocated by the writes,
/// as without it, and the pause never waits for more than a step.
#[derive(Default)]
struct RoomAhead(std::sync::Mutex<Option<(std::thread::JoinHandle<()>, Arc<AtomicBool>)>>);

/// One `fallocate` of the room made ahead: about 0.7 ms of tmpfs pages
/// here.
const ROOM_STEP: u64 = 2 << 20;

impl RoomAhead {
    /// Stops the allocation, if one runs, after its current step.
    fn stop(&self) {
        let running = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some((thread, stop)) = running {
            stop.store(true, Ordering::Relaxed);
            // The thread only logs its failure: nothing to report here.
            let _ = thread.join();
        }
    }

    /// Allocates `bytes` of `file` from the data area's start on a
    /// thread, step by step until told to stop.
    fn start(&self, file: File, path: PathBuf, bytes: u64) {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let spawned = std::thread::Builder::new().name("pages room".into()).spawn(move || {
            use std::os::fd::AsFd;
            let mut done = 0;
            while done < bytes && !stopped.load(Ordering::Relaxed) {
                let step = ROOM_STEP.min(bytes - done);
                let at = PAGES_DATA_OFFSET + done;
                if let Err(e) = ferry_sys::fd::allocate(file.as_fd(), at, step) {
                    tracing::debug!(
                        "{}: no room made ahead past {done} bytes: {e}",
                        path.display()
                    );
                    return;
                }
                done += step;
            }
        });
        if let Ok(thread) = spawned {
            *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((thread, stop));
        }
    }
}

impl Drop for RoomAhead {
    /// Not left allocating into a file whose image failed.
    fn drop(&mut self) {
        self.stop();
    }
}

/// From this many pages the restore's verification is split over its
/// threads: 4 MiB hash in about 0.6 ms on one core here, a thread starts
/// in 0.05 (redis with 100,000 keys, 3,769 pages, verified on one thread
/// in 3.3-5.0 ms before).
pub const VERIFY_SPLIT_FROM_PAGES: u64 = 1024;

/// Below this, making room ahead saves less than a thread costs.
pub const ROOM_AHEAD_MIN: u64 = 1 << 20;

impl PagesWriter {
    /// Starts allocating `bytes` of the data area on a thread of its
    /// own, on tmpfs or ramfs only (where the allocation is what a write
    /// into new pages spends most on) and from `ROOM_AHEAD_MIN` up, until
    /// the first write stops it. Best effort: a failed allocation (no
    /// space for an estimate larger than what comes) is logged and the
    /// writes allocate as before. Room past the final length is given
    /// back by [`set_data_len`](Self::set_data_len).
    pub fn make_room_ahead(&mut self, bytes: u64) {
        if !self.in_memory || bytes < ROOM_AHEAD_MIN || self.offset != 0 {
            return;
        }
        self.room.stop();
        if let Ok(file) = self.file.try_clone() {
            self.room.start(file, self.path.clone(), bytes);
        }
    }

    /// Appends one run's bytes; `start` is its address in the process.
    pub fn append_run(&mut self, start: u64, data: &[u8]) -> Result<PageRun, ImageError> {
        self.room.stop();
        self.file.write_all(data).map_err(|e| ImageError::io(&self.path, e))?;
        let run = PageRun {
            start,
            pages: data.len() as u64 / 4096,
            offset: self.offset,
            checksum: container::checksum(data),
        };
        self.offset += data.len() as u64;
        Ok(run)
    }

    /// Appends several runs whose bytes are concatenated in `data`, with
    /// one write; each run gets its own checksum.
    pub fn append_runs(
        &mut self,
        ranges: &[(u64, usize)],
        data: &[u8],
    ) -> Result<Vec<PageRun>, ImageError> {
        let runs = self.write_runs_at(self.offset, ranges, data)?;
        self.offset += data.len() as u64;
        Ok(runs)
    }

    /// Writes runs at a given offset of the data area (for writers that
    /// fill pages.img from several threads). Call `set_data_len` with the
    /// final size once all are written.
    pub fn write_runs_at(
        &self,
        data_offset: u64,
        ranges: &[(u64, usize)],
        data: &[u8],
    ) -> Result<Vec<PageRun>, ImageError> {
        use std::os::unix::fs::FileExt;
        self.room.stop();
        self.file
            .write_all_at(data, PAGES_DATA_OFFSET + data_offset)
            .map_err(|e| ImageError::io(&self.path, e))?;
        crate::sink::runs_at(data_offset, ranges, data, true)
    }

    /// Reads back what `write_runs_at` wrote and checks it against the
    /// runs' checksums: the bytes in the file, not only the ones we sent,
    /// are what a restore will see. Not on tmpfs or ramfs, where the file
    /// is the memory `write_runs_at` copied into and hashed from the same
    /// buffer: the second pass over it (a fifth of a 100 MiB checkpoint)
    /// would find nothing the restore's own verification of every
    /// checksum, before any page is used, does not.
    pub fn verify_written(&self, runs: &[PageRun], scratch: &mut [u8]) -> Result<(), ImageError> {
        use std::os::unix::fs::FileExt;
        if self.in_memory {
            return Ok(());
        }
        let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
            return Ok(());
        };
        let len = (last.offset + last.pages * 4096 - first.offset) as usize;
        let buf = scratch
            .get_mut(..len)
            .ok_or_else(|| ImageError::Invalid("read-back buffer too small".into()))?;
        self.file
            .read_exact_at(buf, PAGES_DATA_OFFSET + first.offset)
            .map_err(|e| ImageError::io(&self.path, e))?;
        for r in runs {
            let s = (r.offset - first.offset) as usize;
            let chunk = &buf[s..s + (r.pages * 4096) as usize];
            if container::checksum(chunk) != r.checksum {
                return Err(ImageError::Checksum {
                    what: format!("pages at {:#x} as written to {}", r.start, self.path.display()),
                });
            }
        }
        Ok(())
    }

    pub fn set_data_len(&mut self, len: u64) -> Result<(), ImageError> {
        self.room.stop();
        self.file.set_len(PAGES_DATA_OFFSET + len).map_err(|e| ImageError::io(&self.path, e))?;
        self.offset = len;
        Ok(())
    }

    pub fn bytes_written(&self) -> u64 {
        self.offset
    }

    /// Makes what was written durable.
    pub fn sync(&self) -> Result<(), ImageError> {
        self.file.sync_all().map_err(|e| ImageError::io(&self.path, e))
    }

    pub fn finish(self) -> Result<u64, ImageError> {
        self.file.sync_all().map_err(|e| ImageError::io(&self.path, e))?;
        Ok(self.offset)
    }
}

impl ImageDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ImageDir { path: path.into() }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Creates the directory (if needed) and starts pages.img. The image
    /// holds the process's whole memory (its keys and passwords too): the
    /// directory is made 0700 and its files 0600.
    pub fn create_pages(&self) -> Result<PagesWriter, ImageError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.path)
            .map_err(|e| ImageError::io(&self.path, e))?;
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| ImageError::io(&self.path, e))?;
        // An older image here stops being an image before its pages change.
        let old_meta = self.file(META_FILE);
        match std::fs::remove_file(&old_meta) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(ImageError::io(&old_meta, e))
            }
            _ => {}
        }
        let path = self.file(PAGES_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| ImageError::io(&path, e))?;
        // An existing file keeps its mode through open(O_TRUNC).
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| ImageError::io(&path, e))?;
        let mut header = vec![0u8; PAGES_DATA_OFFSET as usize];
        header[..HEADER_LEN].copy_from_slice(&container::file_header(0));
        file.write_all(&header).map_err(|e| ImageError::io(&path, e))?;
        use std::os::fd::AsFd;
        let in_memory =
            ferry_sys::fd::in_memory_fs(file.as_fd()).map_err(|e| ImageError::io(&path, e.io()))?;
        Ok(PagesWriter { file, path, offset: 0, in_memory, room: RoomAhead::default() })
    }

    /// Writes meta.img atomically (temp file + rename) and syncs it.
    pub fn write_meta(&self, inv: &Inventory, process: &TreeImage) -> Result<(), ImageError> {
        self.write_meta_with(inv, process, None)
    }

    /// [`write_meta`](Self::write_meta) for an image that may be
    /// incremental: with `Some`, meta.img also holds the `Incremental`
    /// section.
    pub fn write_meta_with(
        &self,
        inv: &Inventory,
        process: &TreeImage,
        incremental: Option<&Incremental>,
    ) -> Result<(), ImageError> {
        self.write_meta_bytes(&container::encode_meta_with(inv, process, incremental)?)
    }

    /// Writes `bytes` as meta.img: a temporary file renamed into place,
    /// both on the disk before this returns.
    fn write_meta_bytes(&self, bytes: &[u8]) -> Result<(), ImageError> {
        self.write_meta_file(|f, tmp| {
            let mut f: &File = f;
            f.write_all(bytes).map_err(|e| ImageError::io(tmp, e))
        })
    }

    /// Writes meta.img with `write` (given the file, empty, and its
    /// path): a temporary file renamed into place, both on the disk
    /// before this returns.
    fn write_meta_file<R>(
        &self,
        write: impl FnOnce(&File, &Path) -> Result<R, ImageError>,
    ) -> Result<R, ImageError> {
        let tmp = self.file("meta.img.tmp");
        let fin = self.file(META_FILE);
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&tmp);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| ImageError::io(&tmp, e))?;
        let written = write(&f, &tmp)?;
        f.sync_all().map_err(|e| ImageError::io(&tmp, e))?;
        std::fs::rename(&tmp, &fin).map_err(|e| ImageError::io(&fin, e))?;
        // The rename itself must reach the disk too.
        File::open(&self.path)
            .and_then(|d| d.sync_all())
            .map_err(|e| ImageError::io(&self.path, e))?;
        Ok(written)
    }

    /// Refuses an image that a user other than root could have changed:
    /// the image decides the memory, files and credentials of the
    /// processes a restore creates. The directory, meta.img and pages.img
    /// must be owned by root, not writable by group or others, and not
    /// symbolic links.
    pub fn check_private(&self) -> Result<(), ImageError> {
        use std::os::unix::fs::MetadataExt;
        for (path, what) in [
            (self.file(META_FILE), META_FILE),
            (self.pages_path(), PAGES_FILE),
            (self.path.clone(), "image directory"),
        ] {
            let m = std::fs::symlink_metadata(&path).map_err(|e| ImageError::io(&path, e))?;
            let why = if m.file_type().is_symlink() {
                Some("is a symbolic link".to_string())
            } else if m.uid() != 0 {
                Some(format!("is owned by uid {}, not root", m.uid()))
            } else if m.mode() & 0o022 != 0 {
                Some(format!(
                    "is writable by {} (mode {:o})",
                    if m.mode() & 0o002 != 0 { "every user" } else { "its group" },
                    m.mode() & 0o7777
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(ImageError::Unsafe(format!(
                    "{what} {} {why}: a user other than root could have changed the image, and restore would run what it says as root",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    /// Reads, checks and decodes meta.img. An incremental image is read
    /// too, without saying so: a restore must use
    /// [`read_meta_complete`](Self::read_meta_complete) or
    /// [`read_meta_full`](Self::read_meta_full).
    pub fn read_meta(&self) -> Result<(Inventory, TreeImage), ImageError> {
        self.read_meta_full().map(|(inv, tree, _)| (inv, tree))
    }

    /// Reads, checks and decodes meta.img, with its `Incremental` section
    /// (`None`: the image holds every page itself).
    pub fn read_meta_full(
        &self,
    ) -> Result<(Inventory, TreeImage, Option<Incremental>), ImageError> {
        container::decode_meta_full(&self.read_meta_bytes()?)
    }

    /// [`read_meta`](Self::read_meta) for a restore from this directory
    /// alone: an incremental image is refused
    /// ([`ImageError::NeedsParent`]).
    pub fn read_meta_complete(&self) -> Result<(Inventory, TreeImage), ImageError> {
        let (inv, tree, inc) = self.read_meta_full()?;
        container::require_complete(inc.as_ref())?;
        Ok((inv, tree))
    }

    /// The format version meta.img's header claims, once the whole file
    /// has been checked.
    pub fn read_version(&self) -> Result<container::FormatVersion, ImageError> {
        container::decode_meta_versioned(&self.read_meta_bytes()?).map(|(v, ..)| v)
    }

    /// What identifies this image to an incremental child: the checksum
    /// of its whole meta.img (which holds every page run's checksum), so
    /// a parent rewritten since the child was taken is caught.
    pub fn image_id(&self) -> Result<u64, ImageError> {
        Ok(container::checksum(&self.read_meta_bytes()?))
    }

    pub(crate) fn read_meta_bytes(&self) -> Result<Vec<u8>, ImageError> {
        let path = self.file(META_FILE);
        let mut bytes = Vec::new();
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| ImageError::io(&path, e))?;
        Ok(bytes)
    }

    /// meta.img mapped read-only rather than read: the TCP queues
    /// decoded from it are ranges of the mapping, no copy of 40 MB
    /// (10,000 connections' queues) into fresh memory. The same trust as pages.img's mapping: the directory is
    /// checked private first.
    pub(crate) fn map_meta(&self) -> Result<ferry_sys::process::MappedFile, ImageError> {
        let path = self.file(META_FILE);
        let io = |e: std::io::Error| ImageError::io(&path, e);
        let f = File::open(&path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let len = usize::try_from(len)
            .map_err(|_| ImageError::Invalid("meta.img larger than the address space".into()))?;
        ferry_sys::process::MappedFile::map_named(&f, 0, len, "mmap(meta.img)")
            .map_err(|e| io(e.io()))
    }

    pub fn pages_path(&self) -> PathBuf {
        self.file(PAGES_FILE)
    }

    /// Checks pages.img's header and size against the inventory.
    pub fn check_pages_file(&self, inv: &Inventory) -> Result<File, ImageError> {
        let path = self.pages_path();
        let mut f = File::open(&path).map_err(|e| ImageError::io(&path, e))?;
        let mut header = [0u8; HEADER_LEN];
        f.read_exact(&mut header)
            .map_err(|_| ImageError::Truncated("pages.img has no header".into()))?;
        container::check_file_header(&header, PAGES_FILE)?;
        let len = f.metadata().map_err(|e| ImageError::io(&path, e))?.len();
        if len != PAGES_DATA_OFFSET + inv.pages_bytes {
            return Err(ImageError::Truncated(format!(
                "pages.img holds {} bytes of page data, inventory says {}",
                len.saturating_sub(PAGES_DATA_OFFSET),
                inv.pages_bytes
            )));
        }
        Ok(f)
    }

    /// Verifies every page run's checksum against `data` (pages.img's
    /// data area).
    pub fn verify_runs(runs: &[PageRun], data: &[u8]) -> Result<(), ImageError> {
        for r in runs {
            let bad = || ImageError::Truncated(format!("page run at {:#x}", r.start));
            let s = usize::try_from(r.offset).map_err(|_| bad())?;
            let len =
                r.pages.checked_mul(4096).and_then(|l| usize::try_from(l).ok()).ok_or_else(bad)?;
            let e = s.checked_add(len).ok_or_else(bad)?;
            let chunk = data.get(s..e).ok_or_else(bad)?;
            if container::checksum(chunk) != r.checksum {
                return Err(ImageError::Checksum {
                    what: format!("pages at {:#x} ({} pages)", r.start, r.pages),
                });
            }
        }
        Ok(())
    }

    /// [`verify_runs`](Self::verify_runs) split over `threads` threads
    /// from [`VERIFY_SPLIT_FROM_PAGES`] pages: hashing large images is
    /// bound by memory bandwidth per core.
    pub fn verify_runs_parallel(
        runs: &[PageRun],
        data: &[u8],
        threads: usize,
    ) -> Result<(), ImageError> {
        let total: u64 = runs.iter().fold(0u64, |a, r| a.saturating_add(r.pages));
        if threads <= 1 || total < VERIFY_SPLIT_FROM_PAGES {
            return Self::verify_runs(runs, data);
        }
        let per = total / threads as u64 + 1;
        let mut parts = Vec::new();
        let (mut start, mut acc) = (0usize, 0u64);
        for (i, r) in runs.iter().enumerate() {
            acc = acc.saturating_add(r.pages);
            if acc >= per {
                parts.push(&runs[start..=i]);
                start = i + 1;
                acc = 0;
            }
        }
        parts.push(&runs[start..]);
        std::thread::scope(|sc| {
            let hs: Vec<_> =
                parts.into_iter().map(|p| sc.spawn(move || Self::verify_runs(p, data))).collect();
            hs.into_iter().try_for_each(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ImageError::Invalid("verification thread panicked".into()))
                })
            })
        })
    }

    pub fn exists(path: &Path) -> bool {
        path.join(META_FILE).exists()
    }
}

/// An image directory being written: pages.img while the capture copies,
/// meta.img last, then both read back and checked.
pub struct DirSink {
    dir: ImageDir,
    pages: PagesWriter,
}

impl DirSink {
    /// Starts an image in `path` (see [`ImageDir::create_pages`]); what
    /// an older image left there stops being an image first.
    pub fn create(path: impl Into<PathBuf>) -> Result<DirSink, ImageError> {
        let dir = ImageDir::new(path);
        let pages = dir.create_pages()?;
        let link = dir.file(PARENT_LINK);
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(ImageError::io(&link, e))
            }
            _ => {}
        }
        Ok(DirSink { dir, pages })
    }

    /// Records `parent` (an image directory) as this image's parent and
    /// returns the parent's id for the image's `Incremental` section.
    pub fn link_parent(&self, parent: &Path) -> Result<u64, ImageError> {
        let parent = std::fs::canonicalize(parent).map_err(|e| ImageError::io(parent, e))?;
        let id = ImageDir::new(&parent).image_id()?;
        let link = self.dir.file(PARENT_LINK);
        std::os::unix::fs::symlink(&parent, &link).map_err(|e| ImageError::io(&link, e))?;
        Ok(id)
    }

    pub fn path(&self) -> &Path {
        &self.dir.path
    }
}

impl crate::sink::PageSink for DirSink {
    fn data_len(&self) -> u64 {
        self.pages.bytes_written()
    }
    fn write_runs_at(
        &self,
        _pid: i32,
        data_offset: u64,
        ranges: &[(u64, usize)],
        data: &[u8],
    ) -> Result<Vec<PageRun>, ImageError> {
        self.pages.write_runs_at(data_offset, ranges, data)
    }
    fn verify_written(&self, runs: &[PageRun], scratch: &mut [u8]) -> Result<(), ImageError> {
        self.pages.verify_written(runs, scratch)
    }
    fn set_data_len(&mut self, len: u64) -> Result<(), ImageError> {
        self.pages.set_data_len(len)
    }
    fn make_room_ahead(&mut self, bytes: u64) {
        self.pages.make_room_ahead(bytes)
    }
}

impl crate::sink::ImageSink for DirSink {
    fn finish_image(
        &mut self,
        inventory: &Inventory,
        tree: &TreeImage,
        incremental: Option<&Incremental>,
    ) -> Result<u64, ImageError> {
        self.pages.sync()?;
        // The checks a restore makes on what it decodes, made on the
        // values encoded (decoding gives them back unchanged), then the
        // file read back section by section: what a restore will read, not
        // what was meant, must be an image. Page data was read back batch
        // by batch already.
        crate::validate::validate(inventory, tree)?;
        crate::validate::validate_unix_in_flight_files(tree)?;
        if let Some(inc) = incremental {
            crate::validate::validate_incremental(tree, inc)?;
        }
        // Written straight to the file, no buffer of the whole (40 MB
        // with 10,000 connections' queues) built first.
        let written = self.dir.write_meta_file(|f, tmp| {
            crate::meta_file::write(f, tmp, inventory, tree, incremental)
        })?;
        // Not on tmpfs or ramfs, as for the pages (`verify_written`): the
        // file is the memory just written, and the restore checks every
        // checksum of it before anything is made. Elsewhere every section
        // must read back whole, with the header and checksum written.
        if !self.pages.in_memory {
            crate::meta_file::check_reads_back(&self.dir.read_meta_bytes()?, &written)?;
        }
        self.dir.check_pages_file(inventory)?;
        Ok(inventory.pages_bytes + written.len)
    }
}
