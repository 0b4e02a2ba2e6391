//! What a migration hands to the restore beyond the image: none of it
//! exists for a restore from an image directory, so it is kept out of
//! [`RestoreOptions`](super::RestoreOptions).

/// A migration's inputs to the restore; `Handover::default()` for a
/// restore of an image alone.
#[derive(Clone, Default)]
pub struct Handover {
    /// A network lock prepared on this host for the image's connections
    /// (by name), taken over instead of the one the image names: a
    /// migrated tree's lock was set up by the destination.
    pub adopt_lock: Option<String>,
    /// Memory of ferry's own placed where the root has its pages (see
    /// ferry_sys::placed): the root inherits it over fork for the
    /// mappings its image lists as `inherited`, and ferry drops its copy
    /// right after. Only for a restore in a process forked from the
    /// regions' owner (the new PID namespace's helper).
    pub placed_for_root: ferry_sys::placed::InheritedRegions,
    /// Post-copy: per image PID, the pages (sorted runs)
    /// that are not in the page data but fetched on first touch; their
    /// mappings are registered with a userfaultfd
    /// ([`Held::lazy_uffds`](super::Held::lazy_uffds)). Single-process
    /// trees only.
    pub lazy: Vec<(i32, Vec<ferry_image::PageSpan>)>,
    /// Carried files (`ferry replace`): ferry's descriptors of the old
    /// tree's files, by description id, which the restore places instead
    /// of making them ([`FileKind::Carried`](ferry_image::FileKind::Carried)).
    /// The caller keeps them open until the restore is done; a helper
    /// forked for a new PID namespace inherits them.
    pub carried: std::collections::HashMap<u64, std::os::fd::RawFd>,
}
