use thiserror::Error;

/// What went wrong in replication, said so that the user knows where the
/// service runs and whether it is protected.
#[derive(Debug, Error)]
pub enum ReplicateError {
    // The wrapped errors' own messages are the whole story.
    #[error("{0}")]
    Migrate(ferry_migrate::MigrateError),
    #[error("output commit: {0}")]
    Outbox(ferry_outbox::OutboxError),
    #[error("fencing: {0}")]
    Fence(ferry_fence::FenceError),
    /// The standby stopped answering; what the primary did about it.
    #[error("the standby is lost: {0}")]
    StandbyLost(String),
    /// Another agent holds the service: this side must not run it.
    #[error("fenced: {0}")]
    Fenced(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// State a sync cannot carry; the lines name each object.
    #[error("not replicated: {}", .0.join("; "))]
    Unreplicable(Vec<String>),
    #[error("{0}")]
    Invalid(String),
}

impl From<ferry_migrate::MigrateError> for ReplicateError {
    fn from(e: ferry_migrate::MigrateError) -> Self {
        ReplicateError::Migrate(e)
    }
}

impl From<ferry_engine::EngineError> for ReplicateError {
    fn from(e: ferry_engine::EngineError) -> Self {
        ReplicateError::Migrate(e.into())
    }
}

impl From<ferry_image::ImageError> for ReplicateError {
    fn from(e: ferry_image::ImageError) -> Self {
        ReplicateError::Migrate(e.into())
    }
}

impl From<ferry_transport::TransportError> for ReplicateError {
    fn from(e: ferry_transport::TransportError) -> Self {
        ReplicateError::Migrate(e.into())
    }
}

impl From<ferry_outbox::OutboxError> for ReplicateError {
    fn from(e: ferry_outbox::OutboxError) -> Self {
        ReplicateError::Outbox(e)
    }
}

impl From<ferry_fence::FenceError> for ReplicateError {
    fn from(e: ferry_fence::FenceError) -> Self {
        ReplicateError::Fence(e)
    }
}

pub type Result<T> = std::result::Result<T, ReplicateError>;
