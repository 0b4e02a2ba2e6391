//! signalfd: the set of signals it reads.

use super::FdInfo;
use crate::error::Result;
use ferry_image::FileKind;

pub fn capture(info: &FdInfo) -> Result<FileKind> {
    let mask = info
        .field("sigmask")
        .and_then(crate::procfs::parse_hex)
        .ok_or_else(|| info.unsupported("fdinfo has no sigmask"))?;
    Ok(FileKind::SignalFd { mask })
}
