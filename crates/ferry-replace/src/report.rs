//! What a replacement reports: the pause (from the first thread frozen
//! to the new tree running) with its parts, and every phase for
//! `--verbose`.

/// A replacement that happened.
#[derive(Debug, Clone)]
pub struct Replaced {
    pub pid: i32,
    pub processes: usize,
    pub threads: usize,
    /// From the freeze of the old tree to the new tree running, in ms.
    pub pause_ms: f64,
    /// The pause's parts, in order: (phase, ms).
    pub parts: Vec<(String, f64)>,
    /// Every phase of every step (capture, edit, trial, kill, restore),
    /// each (step: phase, ms), in order.
    pub phases: Vec<(String, f64)>,
    /// What changed besides the kernel objects, one item per edit.
    pub edits: Vec<String>,
    /// How the kernel objects came over ([`files_moved`]).
    pub files: String,
    /// The pre-copy, when there was one.
    pub precopy: Option<PrecopyLine>,
    /// The old tree's memory held past the kill, when some was.
    pub old_memory: Option<OldMemory>,
    /// Where the trial restore was made.
    pub trial: TrialLine,
}

/// Where the trial that guarded the kill was made: before the freeze on
/// a first capture (that capture's own pause), or in the pause.
#[derive(Debug, Clone, Default)]
pub struct TrialLine {
    /// The first freeze's length, when there was one.
    pub first_pause: Option<f64>,
    /// Why the final image was tried again in the pause, if it was.
    pub changed: Option<String>,
}

impl TrialLine {
    /// `tried before the freeze (first pause 2.9 ms)`, or `tried again in
    /// the pause after a first pause of 2.9 ms: the tree changed (pid 7:
    /// its fd table)`; nothing for a single freeze.
    pub fn text(&self) -> Option<String> {
        let first = self.first_pause?;
        Some(match &self.changed {
            None => format!("tried before the freeze (first pause {first:.1} ms)"),
            Some(what) => format!(
                "tried again in the pause after a first pause of {first:.1} ms: the tree changed ({what})"
            ),
        })
    }
}

/// The old tree's address spaces held past the kill and freed after the
/// release: a cost outside the pause, reported beside it.
#[derive(Debug, Clone, Copy)]
pub struct OldMemory {
    pub bytes: u64,
    pub freed_ms: f64,
}

impl OldMemory {
    /// Ends the holders (the teardown, after the new tree runs).
    pub fn free(held: ferry_engine::held_memory::HeldMemory) -> Option<OldMemory> {
        if held.is_empty() {
            return None;
        }
        let bytes = held.bytes();
        Some(OldMemory { bytes, freed_ms: held.free().as_secs_f64() * 1e3 })
    }

    /// `old memory (1024.0 MiB) freed after the release in 41.2 ms`.
    pub fn text(&self) -> String {
        format!(
            "old memory ({:.1} MiB) freed after the release in {:.1} ms",
            self.bytes as f64 / 1048576.0,
            self.freed_ms
        )
    }
}

/// `N files carried, M TCP connections repaired, no network lock` (or
/// `network lock held`): what the capture did with the old tree's files.
pub fn files_moved(carried: usize, repaired: usize, locked: bool) -> String {
    let lock = if locked { "network lock held" } else { "no network lock" };
    format!("{carried} files carried, {repaired} TCP connections repaired, {lock}")
}

/// The pre-copy's rounds and what was left for the pause.
#[derive(Debug, Clone)]
pub struct PrecopyLine {
    pub summary: crate::precopy::Summary,
    /// Bytes of pages the capture copied in the pause (all processes).
    pub pause_pages: u64,
}

impl PrecopyLine {
    /// `pre-copied 64.0 MiB in 3 rounds (the written set stopped
    /// shrinking), 63.5 MiB inherited, 0.4 MiB copied in the pause`.
    pub fn text(&self) -> String {
        let mib = |b: u64| b as f64 / 1048576.0;
        let s = &self.summary;
        let copied: u64 = s.rounds.iter().map(|r| r.bytes).sum();
        let why = s.stop.map_or(String::new(), |w| format!(" ({})", w.describe()));
        let collided = match s.collided_bytes {
            0 => String::new(),
            b => format!(", {:.1} MiB where ferry has memory copied in the pause", mib(b)),
        };
        let huge = match s.huge_bytes {
            0 => String::new(),
            b => format!(" ({:.1} MiB in huge pages)", mib(b)),
        };
        format!(
            "pre-copied {:.1} MiB in {} rounds{why}, {:.1} MiB inherited{huge}, {:.1} MiB copied in the pause{collided}",
            mib(copied),
            s.rounds.len(),
            mib(s.inherited_bytes),
            mib(self.pause_pages + s.last_round_bytes)
        )
    }
}

impl Replaced {
    /// `replaced pid P: pause X ms (freeze A, capture B, ...)`.
    pub fn line(&self) -> String {
        let parts: Vec<String> =
            self.parts.iter().map(|(name, ms)| format!("{name} {ms:.1}")).collect();
        let mut extra = self.edits.clone();
        extra.extend(self.trial.text());
        extra.extend(self.precopy.as_ref().map(PrecopyLine::text));
        extra.extend(self.old_memory.as_ref().map(OldMemory::text));
        let edits =
            if extra.is_empty() { String::new() } else { format!("; {}", extra.join(", ")) };
        format!(
            "replaced pid {}: pause {:.1} ms ({}); {}{edits}",
            self.pid,
            self.pause_ms,
            parts.join(", "),
            self.files
        )
    }
}

/// The capture's phases split at its freeze: (ms before it, the freeze's
/// own ms, ms after it). The capture's list starts with the phases that
/// run before the pause (presurvey, the checks, the lock's preparation).
pub fn split_capture(done: &[(String, f64)]) -> (f64, f64, f64) {
    let at = done.iter().position(|(name, _)| name == "freeze");
    match at {
        Some(i) => (
            done[..i].iter().map(|p| p.1).sum(),
            done[i].1,
            done[i + 1..].iter().map(|p| p.1).sum(),
        ),
        None => (0.0, 0.0, done.iter().map(|p| p.1).sum()),
    }
}

/// The pause's parts from the replacement's phases (counted from the
/// freeze; the first, "capture", holds the freeze): the freeze on its own
/// first, and nothing after "release", the moment the new tree runs.
pub fn pause_parts(done: &[(String, f64)], freeze_ms: f64) -> Vec<(String, f64)> {
    let end = done.iter().position(|p| p.0 == "release").map_or(done.len(), |i| i + 1);
    let mut parts = vec![("freeze".to_string(), freeze_ms)];
    parts.extend(done[..end].iter().cloned());
    if let Some(capture) = parts.get_mut(1) {
        capture.1 -= freeze_ms;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_is_split_out_of_the_capture_and_ends_at_the_release() {
        let done: Vec<(String, f64)> =
            [("capture", 5.0), ("trial", 9.0), ("release", 2.0), ("after", 4.0)]
                .iter()
                .map(|(n, ms)| (n.to_string(), *ms))
                .collect();
        let parts = pause_parts(&done, 0.5);
        let names: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(names, ["freeze", "capture", "trial", "release"]);
        assert_eq!(parts.iter().map(|p| p.1).sum::<f64>(), 16.0);
        assert_eq!(parts[1].1, 4.5);
    }

    #[test]
    fn the_capture_splits_at_its_freeze() {
        let done: Vec<(String, f64)> =
            [("presurvey", 1.0), ("freeze", 0.5), ("survey", 2.0), ("pages", 3.0)]
                .iter()
                .map(|(n, ms)| (n.to_string(), *ms))
                .collect();
        assert_eq!(split_capture(&done), (1.0, 0.5, 5.0));
        assert_eq!(split_capture(&done[2..]), (0.0, 0.0, 5.0));
    }

    #[test]
    fn the_line_names_the_pid_the_pause_and_each_part() {
        let r = Replaced {
            pid: 42,
            processes: 1,
            threads: 2,
            pause_ms: 12.345,
            parts: vec![("freeze".into(), 0.21), ("restore".into(), 7.0)],
            phases: vec![],
            edits: vec!["seccomp filter stacked".into()],
            files: files_moved(3, 0, false),
            precopy: None,
            old_memory: Some(OldMemory { bytes: 64 << 20, freed_ms: 3.25 }),
            trial: TrialLine { first_pause: Some(2.94), changed: None },
        };
        assert_eq!(
            r.line(),
            "replaced pid 42: pause 12.3 ms (freeze 0.2, restore 7.0); 3 files carried, 0 TCP connections repaired, no network lock; seccomp filter stacked, tried before the freeze (first pause 2.9 ms), old memory (64.0 MiB) freed after the release in 3.2 ms"
        );
        let changed =
            TrialLine { first_pause: Some(3.0), changed: Some("pid 7: its fd table".into()) };
        assert_eq!(
            changed.text().as_deref(),
            Some("tried again in the pause after a first pause of 3.0 ms: the tree changed (pid 7: its fd table)")
        );
        assert_eq!(TrialLine::default().text(), None);
        assert_eq!(
            files_moved(0, 2, true),
            "0 files carried, 2 TCP connections repaired, network lock held"
        );
    }
}
