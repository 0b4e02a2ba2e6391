//! Live migration: a running process tree moves to another host while its
//! clients keep going.
//!
//! The source ([`source`]) streams the tree's memory to the destination
//! agent while it runs ([`precopy`], dirty pages tracked with userfaultfd
//! write-protect), freezes it, streams the rest and the metadata, and
//! kills its copy only once the destination ([`destination`]) reports the
//! tree running there. The channel ([`ferry_transport`]) is authenticated
//! with a shared key and encrypted; [`protocol`] lists the messages.

pub mod address;
pub mod destination;
pub mod error;
pub mod link;
pub mod page_store;
pub mod pager;
pub mod postcopy;
pub mod precopy;
pub mod problem;
pub mod protocol;
pub mod ranges;
pub mod source;
pub mod stream_sink;

pub use error::{MigrateError, Result};
pub use source::{dry_run, migrate, DryRun, MigrateOptions, MigrationReport};

/// Progress lines for the user (a spinner, a log line...).
pub type Progress = Box<dyn Fn(&str) + Send + Sync>;

/// The image format (major, minor) this build writes and reads.
pub const FORMAT: (u32, u32) = (ferry_image::FORMAT_MAJOR, ferry_image::FORMAT_MINOR as u32);
