//! The image decoded and its page runs resolved against the page store:
//! each process's pages found in this migration's rounds, the root's
//! placed ones inherited rather than copied.

use super::rounds::ImageReceived;
use crate::error::{MigrateError, Result};
use crate::page_store::PageStore;
use crate::protocol::Hello;
use ferry_image::{PageRun, TreeImage, Vma};

/// Post-copy: (image PID, source PID, pages still at the source).
pub(super) type LazyPages = Vec<crate::pager::LazyProcess>;

/// The tree, ready to restore from the page store.
pub(super) struct Resolved {
    pub tree: TreeImage,
    pub lazy: LazyPages,
}

pub(super) fn resolve(
    image: ImageReceived,
    hello: &Hello,
    store: &mut PageStore,
) -> Result<Resolved> {
    let ImageReceived { meta, host_pids } = image;
    // Decoded, checked and validated like any image, the parent's page
    // ranges included.
    let (_inv, mut tree, incremental) = ferry_image::decode_meta_full(&meta)?;
    drop(meta);
    if host_pids.len() != tree.processes.len() {
        return Err(MigrateError::Protocol(format!(
            "{} source PIDs for {} processes",
            host_pids.len(),
            tree.processes.len()
        )));
    }
    let parent_pages = incremental.map(|i| i.parent_pages).unwrap_or_default();
    let mut placed_bytes = 0;
    let mut lazy: LazyPages = Vec::new();
    for (p, &host) in tree.processes.iter_mut().zip(&host_pids) {
        let mut runs: Vec<(u64, u64)> = p.page_runs.iter().map(|r| (r.start, r.pages)).collect();
        // The parent is this migration's earlier rounds, kept in the store
        // under the PIDs the source sees (or, post-copy, still at the source).
        if let Some(parent) = parent_pages.iter().find(|pp| pp.pid == p.pid) {
            if hello.lazy {
                lazy.push((
                    p.pid,
                    host,
                    parent.ranges.iter().map(|r| (r.start, r.pages)).collect(),
                ));
            } else {
                runs.extend(parent.ranges.iter().map(|r| (r.start, r.pages)));
            }
        }
        runs.sort_unstable();
        if host == hello.root_pid && !hello.lazy {
            // The root inherits its placed pages; the rest comes from the file.
            let root = store.settle_root(host, &p.vmas, &runs, (p.mm.start_brk, p.mm.brk))?;
            placed_bytes = root.placed_bytes;
            p.inherited = root.inherited;
            p.page_runs = split_at_mappings(root.runs, &p.vmas);
        } else {
            p.page_runs = split_at_mappings(store.runs_for(host, &runs)?, &p.vmas);
        }
    }
    tracing::debug!("{placed_bytes} bytes of the root's pages are inherited, not copied");
    // This host's lock and address, not the source's.
    tree.network_lock = None;
    Ok(Resolved { tree, lazy })
}

/// `runs` cut where a mapping ends. The store joins pages adjacent in
/// memory and in the store into one run, also across two mappings (a
/// read-write page next to a read-only one, both sent in the same round);
/// the restore makes a mapping writable for its pages only when a run
/// starts in it, and an image's runs must each lie in one mapping.
fn split_at_mappings(runs: Vec<PageRun>, vmas: &[Vma]) -> Vec<PageRun> {
    const PAGE: u64 = 4096;
    let mut out = Vec::with_capacity(runs.len());
    let mut vi = 0;
    for mut r in runs {
        loop {
            while vi < vmas.len() && vmas[vi].end <= r.start {
                vi += 1;
            }
            match vmas.get(vi) {
                Some(v) if v.start <= r.start && v.end < r.start + r.pages * PAGE => {
                    let n = (v.end - r.start) / PAGE;
                    out.push(PageRun { start: r.start, pages: n, offset: r.offset, checksum: 0 });
                    r = PageRun {
                        start: v.end,
                        pages: r.pages - n,
                        offset: r.offset + n * PAGE,
                        checksum: 0,
                    };
                }
                _ => {
                    out.push(r);
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_cut_at_mapping_ends() {
        let vma = |start: u64, end: u64| Vma {
            start,
            end,
            prot: 3,
            shared: false,
            flags: 0,
            pgoff: 0,
            backing: ferry_image::VmaBacking::Anonymous,
        };
        let vmas = [vma(0x1000, 0x3000), vma(0x3000, 0x4000), vma(0x4000, 0x8000)];
        let run =
            |start: u64, pages: u64, offset: u64| PageRun { start, pages, offset, checksum: 0 };
        let out = split_at_mappings(vec![run(0x2000, 4, 0), run(0x7000, 1, 0x8000)], &vmas);
        assert_eq!(
            out,
            vec![
                run(0x2000, 1, 0),
                run(0x3000, 1, 0x1000),
                run(0x4000, 2, 0x2000),
                run(0x7000, 1, 0x8000)
            ]
        );
    }
}
