use thiserror::Error;

/// What went wrong in a migration, said so that the user knows where the
/// service is now.
#[derive(Debug, Error)]
pub enum MigrateError {
    #[error("{0}")]
    Engine(#[from] ferry_engine::EngineError),
    #[error("{0}")]
    Image(#[from] ferry_image::ImageError),
    #[error("connection to the other host: {0}")]
    Transport(#[from] ferry_transport::TransportError),
    #[error("network lock: {0}")]
    Netlock(#[from] ferry_netlock::NetlockError),
    #[error("{what}: {errno}")]
    Sys { what: String, errno: ferry_sys::SysError },
    #[error("the destination refused the migration: {0}")]
    Refused(String),
    #[error("the destination failed: {0}")]
    DestinationFailed(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("the source gave up: {0}")]
    Aborted(String),
    #[error("{0}")]
    Invalid(String),
}

impl MigrateError {
    pub fn sys(what: impl Into<String>, errno: ferry_sys::SysError) -> MigrateError {
        MigrateError::Sys { what: what.into(), errno }
    }
}

pub type Result<T> = std::result::Result<T, MigrateError>;
