//! The two numbers a process has once PID namespaces are involved: the
//! PID the tree sees (the one its image records, `getpid()` inside it)
//! and the PID ferry sees in its own namespace. They are equal unless the
//! tree has a PID namespace of its own; the types keep them apart where
//! both are at hand.

use std::fmt;

/// A PID as the tree sees it: the number its image records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TreePid(pub i32);

/// A PID as ferry sees it, in the PID namespace ferry runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPid(pub i32);

impl fmt::Display for TreePid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for HostPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
