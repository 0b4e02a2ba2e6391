//! Hot-standby replication: a primary (`ferry replicate`) syncs a
//! running tree to a standby agent (ferryd) again and again, on the
//! service's own output, and holds that output until the standby has the
//! state that produced it; when the primary falls silent, the standby
//! wins the service in a fencing store (etcd) and runs it from the last
//! complete sync. See docs/replication.md.
//!
//! - [`primary`]: the syncs, the output commit, the ways replication ends;
//! - [`standby`]: the copy kept whole sync after sync, and the takeover;
//! - `data_dir`: `--data-dir`, files as part of the replicated state;
//! - [`identity`]: the names of services and agents in the fencing store;
//! - [`status`]: the status line and file that `ferry status` reads.

mod data_dir;
pub mod error;
mod fault;
pub mod identity;
pub mod primary;
pub mod standby;
pub mod status;

pub use error::{ReplicateError, Result};
