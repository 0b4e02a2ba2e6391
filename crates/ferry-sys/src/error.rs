use std::fmt;

/// A failed system call: which call and the errno it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysError {
    pub call: &'static str,
    pub errno: i32,
}

pub type SysResult<T> = Result<T, SysError>;

impl SysError {
    pub fn new(call: &'static str, errno: i32) -> Self {
        SysError { call, errno }
    }

    pub fn io(&self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno)
    }
}

impl fmt::Display for SysError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.io())
    }
}

impl std::error::Error for SysError {}
