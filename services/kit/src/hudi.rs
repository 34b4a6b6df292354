//! Hudi's timeline file names, in both layouts, for the poller that reads a
//! table's commits and the dispatcher that reads a table service's outcome:
//!   0.x (timeline layout 1): `.hoodie/<instant>.<action>`, pending ones
//!       `<instant>.<action>.requested|inflight` (a commit's inflight is `<instant>.inflight`);
//!   1.x (timeline layout 2): `.hoodie/timeline/<requested>_<completed>.<action>`,
//!       pending ones `<requested>.<action>.requested|inflight`.

/// The directory of the timeline under `.hoodie` in layout 2.
pub const LAYOUT2_DIR: &str = "timeline";

/// The completed instant a timeline file names: `(requested instant, action)`;
/// none for a pending instant or any other file.
pub fn completed_instant(name: &str, layout2: bool) -> Option<(&str, &str)> {
    let (stem, action) = name.split_once('.')?;
    if action.contains('.') || matches!(action, "requested" | "inflight") {
        return None;
    }
    let requested = if layout2 {
        stem.split_once('_')?.0 // no completion time: not complete
    } else {
        stem
    };
    (!requested.is_empty() && requested.bytes().all(|b| b.is_ascii_digit()))
        .then_some((requested, action))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_completed_instants_are_named() {
        let l2 = |n| completed_instant(n, true);
        assert_eq!(
            l2("20261207031412979_20261207031427848.commit"),
            Some(("20261207031412979", "commit"))
        );
        assert_eq!(l2("20261207031412979.compaction.requested"), None);
        assert_eq!(l2("20261207031412979.compaction.inflight"), None);
        assert_eq!(l2("history"), None);
        let l1 = |n| completed_instant(n, false);
        assert_eq!(
            l1("20241201140000000.replacecommit"),
            Some(("20241201140000000", "replacecommit"))
        );
        assert_eq!(l1("20241201130000000.inflight"), None);
        assert_eq!(l1("20241201130000000.commit.requested"), None);
        assert_eq!(l1("hoodie.properties"), None);
        assert_eq!(l1(".20241201140000000.commit.crc"), None);
    }
}
