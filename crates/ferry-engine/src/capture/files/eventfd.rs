//! eventfd: the counter and the semaphore mode.

use super::FdInfo;
use crate::error::Result;
use ferry_image::FileKind;

pub fn capture(info: &FdInfo) -> Result<FileKind> {
    let count = info
        .field("eventfd-count")
        .and_then(crate::procfs::parse_hex)
        .ok_or_else(|| info.unsupported("fdinfo has no eventfd-count"))?;
    let semaphore = info.field("eventfd-semaphore").is_some_and(|v| v == "1");
    Ok(FileKind::EventFd { count, semaphore })
}
