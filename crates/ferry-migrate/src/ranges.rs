//! Sets of page-aligned address ranges: what the destination holds, what
//! was written since, for pre-copy's round decisions.

/// Sorted, disjoint, non-adjacent (start, end) byte ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    pub fn from_ranges(mut v: Vec<(u64, u64)>) -> RangeSet {
        v.retain(|&(s, e)| s < e);
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        RangeSet { ranges: out }
    }

    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    pub fn union(&self, other: &RangeSet) -> RangeSet {
        let mut v = self.ranges.clone();
        v.extend_from_slice(&other.ranges);
        RangeSet::from_ranges(v)
    }

    /// What of `self` is not in `other`.
    pub fn minus(&self, other: &RangeSet) -> RangeSet {
        let mut out = Vec::new();
        let mut k = 0;
        for &(mut s, e) in &self.ranges {
            while k < other.ranges.len() && other.ranges[k].1 <= s {
                k += 1;
            }
            let mut j = k;
            while s < e {
                match other.ranges.get(j) {
                    Some(&(a, b)) if a < e => {
                        if a > s {
                            out.push((s, a));
                        }
                        s = s.max(b);
                        j += 1;
                    }
                    _ => {
                        out.push((s, e));
                        break;
                    }
                }
            }
        }
        RangeSet { ranges: out }
    }

    /// As page runs, the form the capture takes.
    pub fn as_page_runs(&self) -> Vec<ferry_image::PageSpan> {
        self.ranges.iter().map(|&(s, e)| ferry_image::PageSpan::new(s, (e - s) / 4096)).collect()
    }

    pub fn from_page_runs(runs: &[ferry_image::PageSpan]) -> RangeSet {
        RangeSet::from_ranges(runs.iter().map(|r| (r.start, r.end())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::RangeSet;
    const P: u64 = 4096;

    #[test]
    fn union_merges_overlapping_and_adjacent() {
        let a = RangeSet::from_ranges(vec![(0, 2 * P), (10 * P, 12 * P)]);
        let b = RangeSet::from_ranges(vec![(2 * P, 3 * P), (11 * P, 20 * P)]);
        assert_eq!(a.union(&b).ranges(), &[(0, 3 * P), (10 * P, 20 * P)]);
        assert_eq!(a.union(&b).bytes(), 13 * P);
    }

    #[test]
    fn minus_cuts_holes_and_edges() {
        let held = RangeSet::from_ranges(vec![(0, 10 * P), (20 * P, 30 * P)]);
        let dirty = RangeSet::from_ranges(vec![(0, P), (4 * P, 5 * P), (9 * P, 21 * P)]);
        assert_eq!(held.minus(&dirty).ranges(), &[(P, 4 * P), (5 * P, 9 * P), (21 * P, 30 * P)]);
        assert!(dirty.minus(&dirty).is_empty());
        assert_eq!(held.minus(&RangeSet::new()), held);
    }

    #[test]
    fn page_runs_round_trip() {
        let s = RangeSet::from_ranges(vec![(P, 3 * P), (8 * P, 9 * P)]);
        let spans = vec![ferry_image::PageSpan::new(P, 2), ferry_image::PageSpan::new(8 * P, 1)];
        assert_eq!(s.as_page_runs(), spans);
        assert_eq!(RangeSet::from_page_runs(&s.as_page_runs()), s);
    }
}
