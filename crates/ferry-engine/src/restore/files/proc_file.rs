//! Files under /proc/PID/ of a process of the tree (a parent watching
//! /proc/CHILD/stat): they exist only once that process does, so they are
//! not staged with the others but opened from inside their holder once
//! every process of the tree was forked, then put on their fd numbers at
//! their offset.

use crate::error::Result;
use crate::inject::Call;
use crate::restore::Session;
use ferry_image::FileKind;

const OPEN_MASK: i32 =
    !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY | libc::O_CLOEXEC);

/// Whether the image has a /proc file to open (an fd uses it).
pub fn any(image: &ferry_image::ProcessImage) -> bool {
    image.files.iter().enumerate().any(|(i, f)| {
        matches!(f.kind, FileKind::ProcFile { .. })
            && image.fds.iter().any(|x| x.file as usize == i)
    })
}

pub fn open_all(s: &mut Session) -> Result<()> {
    let image = s.image;
    for (i, f) in image.files.iter().enumerate() {
        let FileKind::ProcFile { path } = &f.kind else {
            continue;
        };
        let slots: Vec<_> = image.fds.iter().filter(|x| x.file as usize == i).collect();
        let Some(first) = slots.first() else { continue };
        let mut data = path.as_bytes().to_vec();
        data.push(0);
        s.remote.write(s.data, &data)?;
        let fd = first.fd as u64;
        let cloexec = |c: bool| if c { libc::O_CLOEXEC as u64 } else { 0 };
        let mut calls = vec![(
            format!("openat({path})"),
            Call::new(
                libc::SYS_openat,
                &[
                    libc::AT_FDCWD as u64,
                    s.data,
                    ((f.flags & OPEN_MASK) | libc::O_CLOEXEC) as u64,
                    0,
                ],
            ),
        )];
        // The result is not known before the batch runs: open first, then
        // move it with a second batch.
        let r = s.run(s.pid, &calls)?;
        let opened = r[0];
        calls.clear();
        // openat may have returned one of the file's own fd numbers.
        for slot in &slots {
            if slot.fd as u64 == opened {
                calls.push((
                    format!("fcntl({path}, F_SETFD)"),
                    Call::new(
                        libc::SYS_fcntl,
                        &[
                            opened,
                            libc::F_SETFD as u64,
                            if slot.cloexec { libc::FD_CLOEXEC as u64 } else { 0 },
                        ],
                    ),
                ));
            } else {
                calls.push((
                    format!("dup3({path} -> fd {})", slot.fd),
                    Call::new(libc::SYS_dup3, &[opened, slot.fd as u64, cloexec(slot.cloexec)]),
                ));
            }
        }
        if !slots.iter().any(|x| x.fd as u64 == opened) {
            calls.push((format!("close({path} temporary)"), Call::new(libc::SYS_close, &[opened])));
        }
        if f.pos != 0 {
            calls.push((
                format!("lseek({path})"),
                Call::new(libc::SYS_lseek, &[fd, f.pos as u64, libc::SEEK_SET as u64]),
            ));
        }
        s.run(s.pid, &calls)?;
    }
    Ok(())
}
