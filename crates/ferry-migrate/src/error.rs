use thiserror::Error;

/// What went wrong in a migration, said so that the user knows where the
/// service is now.
#[derive(Debug, Error)]
pub enum MigrateError {
    // The wrapped errors' own messages are the whole story: they are not
    // also reported as a `source`, which would print them twice.
    #[error("{0}")]
    Engine(ferry_engine::EngineError),
    #[error("{0}")]
    Image(ferry_image::ImageError),
    #[error("connection to the other host: {0}")]
    Transport(ferry_transport::TransportError),
    /// Its message names the lock.
    #[error("{0}")]
    Netlock(ferry_netlock::NetlockError),
    #[error("{what}: {errno}")]
    Sys { what: String, errno: ferry_sys::SysError },
    #[error("the destination refused the migration: {0}")]
    Refused(String),
    /// Found in the hello, before anything was frozen: one line each.
    #[error("the destination cannot restore this tree (nothing was frozen):{}", lines(.0))]
    Unfit(Vec<crate::problem::Problem>),
    #[error("the destination failed: {0}")]
    DestinationFailed(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("the source gave up: {0}")]
    Aborted(String),
    #[error("{0}")]
    Invalid(String),
}

impl From<ferry_engine::EngineError> for MigrateError {
    fn from(e: ferry_engine::EngineError) -> Self {
        MigrateError::Engine(e)
    }
}

impl From<ferry_image::ImageError> for MigrateError {
    fn from(e: ferry_image::ImageError) -> Self {
        MigrateError::Image(e)
    }
}

impl From<ferry_transport::TransportError> for MigrateError {
    fn from(e: ferry_transport::TransportError) -> Self {
        MigrateError::Transport(e)
    }
}

impl From<ferry_netlock::NetlockError> for MigrateError {
    fn from(e: ferry_netlock::NetlockError) -> Self {
        MigrateError::Netlock(e)
    }
}

impl MigrateError {
    pub fn sys(what: impl Into<String>, errno: ferry_sys::SysError) -> MigrateError {
        MigrateError::Sys { what: what.into(), errno }
    }
}

fn lines(problems: &[crate::problem::Problem]) -> String {
    problems.iter().map(|p| format!("\n  - {p}")).collect()
}

pub type Result<T> = std::result::Result<T, MigrateError>;
