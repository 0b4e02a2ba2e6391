//! The pure logic of pre-copy: when the rounds stop, and the byte-range
//! arithmetic of what ferry holds (sorted, disjoint, merged `[start, end)`
//! ranges).

/// (start, end) byte ranges, sorted, disjoint and merged.
pub type Ranges = Vec<(u64, u64)>;

/// When the copy rounds stop and the freeze comes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundRule {
    /// Rounds after the first whole copy, at most.
    pub max_rounds: u32,
    /// Freeze once the pages written since the last round are at most
    /// this many bytes: the capture copies them in the pause.
    pub stop_below: u64,
    /// Freeze when a round's dirty set is not below this fraction of the
    /// previous one: the tree writes as fast as ferry copies.
    pub min_shrink: f64,
}

impl Default for RoundRule {
    /// A local memory copy runs at several GB/s: 1 MiB left for the pause
    /// costs well under a millisecond.
    fn default() -> Self {
        RoundRule { max_rounds: 8, stop_below: 1 << 20, min_shrink: 0.8 }
    }
}

/// Why the rounds stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// What is left is small enough for the pause.
    Small,
    /// The dirty set stopped shrinking (a hot writer).
    NotShrinking,
    /// The most rounds were copied.
    RoundLimit,
}

impl Stop {
    pub fn describe(self) -> &'static str {
        match self {
            Stop::Small => "what was left was small",
            Stop::NotShrinking => "the written set stopped shrinking",
            Stop::RoundLimit => "round limit",
        }
    }
}

impl RoundRule {
    /// `rounds` rounds were copied after the first; `dirty` bytes were
    /// written since the last one, `previous` in the round before. None:
    /// copy another round.
    pub fn decide(&self, rounds: u32, dirty: u64, previous: Option<u64>) -> Option<Stop> {
        if dirty <= self.stop_below {
            return Some(Stop::Small);
        }
        if rounds >= self.max_rounds {
            return Some(Stop::RoundLimit);
        }
        match previous {
            Some(p) if dirty as f64 > p as f64 * self.min_shrink => Some(Stop::NotShrinking),
            _ => None,
        }
    }
}

/// Sorts and merges `r` (touching ranges become one).
pub fn merged(mut r: Ranges) -> Ranges {
    r.retain(|&(s, e)| s < e);
    r.sort_unstable();
    let mut out: Ranges = Vec::with_capacity(r.len());
    for (s, e) in r {
        match out.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

pub fn union(a: &[(u64, u64)], b: &[(u64, u64)]) -> Ranges {
    merged(a.iter().chain(b).copied().collect())
}

/// The parts of `a` outside every range of `b` (both sorted, merged).
pub fn minus(a: &[(u64, u64)], b: &[(u64, u64)]) -> Ranges {
    let mut out = Vec::with_capacity(a.len());
    let mut k = 0;
    for &(s, e) in a {
        let mut at = s;
        while k < b.len() && b[k].1 <= at {
            k += 1;
        }
        let mut j = k;
        while at < e {
            match b.get(j) {
                Some(&(bs, be)) if bs < e => {
                    if bs > at {
                        out.push((at, bs));
                    }
                    at = at.max(be);
                    j += 1;
                }
                _ => {
                    out.push((at, e));
                    at = e;
                }
            }
        }
    }
    out
}

/// The parts of `a` inside some range of `b` (both sorted, merged).
pub fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Ranges {
    minus(a, &minus(a, b))
}

pub fn bytes(r: &[(u64, u64)]) -> u64 {
    r.iter().map(|&(s, e)| e - s).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_stop_when_small_not_shrinking_or_too_many() {
        let r = RoundRule { max_rounds: 5, stop_below: 100, min_shrink: 0.8 };
        assert_eq!(r.decide(0, 50, None), Some(Stop::Small));
        assert_eq!(r.decide(0, 1000, None), None);
        assert_eq!(r.decide(1, 700, Some(1000)), None);
        assert_eq!(r.decide(2, 900, Some(1000)), Some(Stop::NotShrinking));
        assert_eq!(r.decide(5, 300, Some(1000)), Some(Stop::RoundLimit));
        assert_eq!(r.decide(5, 100, Some(1000)), Some(Stop::Small));
    }

    #[test]
    fn ranges_merge_subtract_and_intersect() {
        assert_eq!(merged(vec![(5, 8), (0, 2), (2, 3), (7, 9), (4, 4)]), vec![(0, 3), (5, 9)]);
        let a = vec![(0, 10), (20, 30)];
        let b = vec![(2, 4), (8, 22), (25, 26), (40, 50)];
        assert_eq!(minus(&a, &b), vec![(0, 2), (4, 8), (22, 25), (26, 30)]);
        assert_eq!(intersect(&a, &b), vec![(2, 4), (8, 10), (20, 22), (25, 26)]);
        assert_eq!(minus(&a, &[]), a);
        assert_eq!(minus(&[], &b), vec![]);
        assert_eq!(union(&[(0, 2)], &[(2, 5), (7, 8)]), vec![(0, 5), (7, 8)]);
        assert_eq!(bytes(&a), 20);
    }
}
