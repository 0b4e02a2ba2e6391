//! A reason the destination cannot restore a tree, found before the
//! freeze (destination/checks.rs), carried by Msg::Unfit and
//! MigrateError::Unfit.

use serde::{Deserialize, Serialize};

/// Something that would make the restore fail at the destination, found
/// before the freeze: the object (a socket, a PID, the service address),
/// what is wrong with it there, and what to do about it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Problem {
    pub object: String,
    pub problem: String,
    pub remedy: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}; remedy: {}", self.object, self.problem, self.remedy)
    }
}
