//! Files the tree writes: their content is not part of a sync, so after a
//! takeover the standby would run on with memory that knows writes its
//! files lack. Each sync's image is checked: a regular file open for
//! writing, or mapped shared and writable, ends protection (before the
//! first sync: refuses it) with the file named. /dev/null, terminals and
//! the files of `--ignore-writes` (logs the service may lose a tail of)
//! are let through, and so is everything under a `--data-dir`, whose
//! content each sync carries (`data_dir.rs`).

use ferry_image::{FileKind, TreeImage, VmaBacking};
use std::path::PathBuf;

const PROT_WRITE: u8 = 2;

/// Every file of `tree` written outside what `ignored` allows, as
/// "pid P: PATH (how)" lines.
pub(crate) fn written_files(
    tree: &TreeImage,
    ignored: &[PathBuf],
    data_dirs: &[PathBuf],
) -> Vec<String> {
    let allowed = |path: &str| {
        path == "/dev/null"
            || ignored.iter().any(|i| i.as_os_str() == path)
            || data_dirs.iter().any(|d| crate::data_dir::is_under(d, path))
    };
    let mut out = Vec::new();
    for p in &tree.processes {
        for f in &p.files {
            let path = match &f.kind {
                FileKind::Regular { path, .. } | FileKind::Deleted { path, .. } => path,
                _ => continue,
            };
            if f.flags & libc::O_ACCMODE != libc::O_RDONLY && !allowed(path) {
                out.push(format!("pid {}: {path} (open for writing)", p.pid));
            }
        }
        for v in &p.vmas {
            if let VmaBacking::File { path, .. } = &v.backing {
                if v.shared && v.prot & PROT_WRITE != 0 && !allowed(path) {
                    out.push(format!("pid {}: {path} (mapped shared and writable)", p.pid));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_image::{OpenFile, ProcessImage, Vma};

    fn file(flags: i32, path: &str) -> OpenFile {
        OpenFile {
            id: 1,
            flags,
            pos: 0,
            kind: FileKind::Regular { path: path.into(), size: 0 },
            locks: vec![],
        }
    }

    #[test]
    fn writes_outside_the_allowed_files_are_named() {
        let mut p = ProcessImage { pid: 7, ..Default::default() };
        p.files = vec![
            file(libc::O_RDONLY, "/etc/hosts"),
            file(libc::O_WRONLY | libc::O_APPEND, "/var/log/app.log"),
            file(libc::O_RDWR, "/srv/data.db"),
            file(libc::O_WRONLY, "/dev/null"),
        ];
        p.vmas = vec![Vma {
            start: 0x1000,
            end: 0x2000,
            prot: 3,
            shared: true,
            flags: 0,
            pgoff: 0,
            backing: VmaBacking::File { path: "/srv/map".into(), dev: 1, ino: 2 },
        }];
        let tree = TreeImage { processes: vec![p], ..Default::default() };
        assert_eq!(
            written_files(&tree, &[PathBuf::from("/var/log/app.log")], &[]),
            vec![
                "pid 7: /srv/data.db (open for writing)".to_string(),
                "pid 7: /srv/map (mapped shared and writable)".to_string(),
            ]
        );
        assert_eq!(written_files(&tree, &[], &[]).len(), 3);
        // Under a data directory, writes are replicated state.
        assert_eq!(written_files(&tree, &[], &[PathBuf::from("/srv")]).len(), 1);
    }
}
