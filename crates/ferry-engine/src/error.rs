use ferry_image::ImageError;
use ferry_sys::SysError;

/// Everything that can go wrong in capture or restore, with the object it
/// happened to.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("pid {pid}: {what}: {err}")]
    Kernel { pid: i32, what: String, err: SysError },
    #[error("pid {pid} thread {tid}: {call} inside the process failed: {}", std::io::Error::from_raw_os_error(*errno))]
    Remote { pid: i32, tid: i32, call: String, errno: i32 },
    #[error("pid {pid}: cannot capture {object}: {reason}")]
    Unsupported { pid: i32, object: String, reason: String },
    /// A state that passes by itself (a connection closing or waiting
    /// to be accepted): the checkpoint was undone and may be tried again.
    #[error("pid {pid}: cannot capture {object} now: {reason} (a passing state: the service runs on untouched; try again)")]
    Transient { pid: i32, object: String, reason: String },
    #[error("{path}: {err}")]
    Io { path: String, err: std::io::Error },
    #[error("{path}: unexpected content: {what}")]
    Parse { path: String, what: String },
    #[error(transparent)]
    Image(#[from] ImageError),
    /// `holder` says who holds it (`restore::pid_holder`): a running
    /// process, or one that ended and awaits its parent's reap.
    #[error("pid {pid} is taken by {holder}; free it or restore with --new-pid-ns")]
    PidTaken { pid: i32, holder: String },
    #[error("pid {pid}: {msg}")]
    Restore { pid: i32, msg: String },
    #[error("pid {pid}: process is gone ({what})")]
    Gone { pid: i32, what: String },
    /// What failed inside the helper of a restore into a new PID
    /// namespace, as the helper described it.
    #[error("in the new PID namespace: {0}")]
    InNewPidNs(String),
    /// `checkpoint --verify`: the image did not restore (or not exactly)
    /// in the trial; the tree was let run on and the image left in place.
    #[error("the trial restore of the image failed, so the tree runs on and the image stays in {image}: {error}")]
    TrialFailed { image: String, error: String },
    /// The network lock that holds TCP connections still. Its message
    /// names the lock already; repeating it (with the error as its own
    /// source) printed the whole message twice.
    #[error(transparent)]
    NetworkLock(#[from] ferry_netlock::NetlockError),
}

impl EngineError {
    pub fn kernel(pid: i32, what: impl Into<String>, source: SysError) -> Self {
        EngineError::Kernel { pid, what: what.into(), err: source }
    }
    pub fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        EngineError::Io { path: path.into(), err: source }
    }
    pub fn unsupported(pid: i32, object: impl Into<String>, reason: impl Into<String>) -> Self {
        EngineError::Unsupported { pid, object: object.into(), reason: reason.into() }
    }
    pub fn restore(pid: i32, msg: impl Into<String>) -> Self {
        EngineError::Restore { pid, msg: msg.into() }
    }
    pub fn transient(pid: i32, object: impl Into<String>, reason: impl Into<String>) -> Self {
        EngineError::Transient { pid, object: object.into(), reason: reason.into() }
    }
    /// Whether the same checkpoint may succeed if tried again shortly.
    pub fn is_transient(&self) -> bool {
        matches!(self, EngineError::Transient { .. })
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;
