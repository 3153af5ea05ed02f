//! The per-tenant concurrency cap: at most N tasks of one tenant running at once in a lane
//! (`LANES_TENANT_CONCURRENCY`), whatever the fair order or the token shares would allow. A
//! running task is a member of its group's set in the cache, with an end time its run keeps
//! renewing; a crashed run's place frees itself when that time passes. Pure: the limits and the key.

use super::{Lane, TaskId};

/// The cap per lane; `None` where a lane has none (the default, everywhere).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps([Option<u32>; 3]);

/// The largest cap accepted (a higher one is no cap at all on any pool we run).
pub const MAX_CAP: u32 = 10_000;

impl Caps {
    /// Parses `interactive=4,synthesis=2`. An entry without `=`, a lane that is not a task lane
    /// or is listed twice, or a cap that is not a whole number from 1 to [`MAX_CAP`] is an error
    /// naming the entry.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut caps = [None; 3];
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (lane, cap) = entry.split_once('=').ok_or_else(|| format!("`{entry}` is not `lane=cap`"))?;
            let lane: Lane = lane.trim().parse().map_err(|_| format!("`{entry}`: unknown lane"))?;
            if lane == Lane::Commits {
                return Err(format!("`{entry}`: the commits lane runs batches, not tenants' tasks"));
            }
            let cap: u32 =
                cap.trim().parse().ok().filter(|c| (1..=MAX_CAP).contains(c)).ok_or_else(|| {
                    format!("`{entry}`: the cap must be a whole number from 1 to {MAX_CAP}")
                })?;
            if caps[lane.index()].replace(cap).is_some() {
                return Err(format!("`{}` is listed twice", lane.as_str()));
            }
        }
        Ok(Self(caps))
    }

    /// The cap of `lane`, if it has one.
    pub fn of(&self, lane: Lane) -> Option<u32> {
        self.0[lane.index()]
    }
}

/// The set of `group`'s running tasks in `lane`; the group is the hash tag (one cluster slot).
pub fn running_key(lane: Lane, group: &str) -> String {
    format!("tenant-running:{{{group}}}:{}", lane.as_str())
}

/// A run's member in its group's set: the task and the claim's fence, so each run of a task holds
/// a place of its own. A run that lost its lease gives back its own place, never the one of the run
/// that took the task over (keyed by the task alone, its leave freed the live run's place, and the
/// group could run one more than its cap).
pub fn place_member(task: &TaskId, fence: u64) -> String {
    format!("{task}#{fence}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_per_task_lane_and_name_the_bad_entry() {
        let caps = Caps::parse("interactive=4, synthesis = 2").unwrap_or_default();
        assert_eq!((caps.of(Lane::Interactive), caps.of(Lane::Synthesis)), (Some(4), Some(2)));
        assert_eq!(Caps::parse("").map(|c| c.of(Lane::Interactive)), Ok(None));
        for (bad, names) in [
            ("interactive", "`interactive`"),
            ("fast=1", "`fast=1`"),
            ("commits=1", "`commits=1`"),
            ("interactive=0", "`interactive=0`"),
            ("interactive=x", "`interactive=x`"),
            ("interactive=1,interactive=2", "`interactive`"),
        ] {
            let e = Caps::parse(bad).err().unwrap_or_default();
            assert!(e.contains(names), "{bad}: {e}");
        }
        assert_eq!(running_key(Lane::Interactive, "t-1"), "tenant-running:{t-1}:interactive");
    }
}
