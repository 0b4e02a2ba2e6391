use ferry_engine::EngineError;
use thiserror::Error;

/// Why a replacement did not happen, said so that the user knows which
/// tree runs: every kind but [`ReplaceError::AfterKill`] leaves the old
/// tree running untouched.
#[derive(Debug, Error)]
pub enum ReplaceError {
    /// There is no tree to replace.
    #[error("pid {0}: no such process")]
    NoSuchProcess(i32),
    /// The old tree exited while its memory was pre-copied: there is
    /// nothing left to replace (ferry's copies are gone with it).
    #[error("pid {0}: the tree exited during pre-copy; nothing was replaced")]
    Exited(i32),
    /// An option refused before anything was frozen.
    #[error("{0}")]
    Option(String),
    /// The tree cannot be replaced as it is (named), found in the freeze.
    #[error("{0}")]
    Refused(String),
    /// The capture, an edit's image or the trial restore failed.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// The old tree was killed and the new one did not come up: the one
    /// failure after the point of no return, which the trial restore of
    /// the same image guards against.
    #[error("the old tree was killed and the new one failed: {0}")]
    AfterKill(EngineError),
    /// `--exec`: the new binary holds the listeners but taking them from
    /// the old tree failed part way (said how far it went).
    #[error("taking the listeners from the old tree: {0}")]
    Takeover(String),
}

impl ReplaceError {
    /// Whether the old tree runs on after this error (false also when
    /// there was none).
    pub fn old_tree_runs(&self) -> bool {
        !matches!(
            self,
            ReplaceError::AfterKill(_)
                | ReplaceError::NoSuchProcess(_)
                | ReplaceError::Takeover(_)
                | ReplaceError::Exited(_)
        )
    }
}

impl From<ferry_image::ImageError> for ReplaceError {
    fn from(e: ferry_image::ImageError) -> Self {
        ReplaceError::Engine(e.into())
    }
}
