//! When a group leader may propose its next Expire command: the command rate
//! (`timing.expire_commands_per_s_max`) and the pacing of reclaim (`expire_paced_leases_per_s`
//! while the group's oldest due lease is less than `expire_overdue_target_ms` past its expiry
//! and no AcquireWait is queued in it). Pure: times arrive as arguments.
//!
//! Pacing delays when a due lease's record is removed and what follows from that: its watch
//! EXPIRED event, the hand-off to a queued waiter (which is why a group with queued waits is not
//! paced), the session-end bookkeeping and the quota counts (an acquire at its tenant's quota
//! reclaims due leases itself first). Expiry itself is judged by log time on every read and
//! write whether or not the record was reclaimed yet.
//!
//! Must not depend on: anything but the configuration.

use crate::config::TimingConfig;

/// When a group may propose its next Expire command (pure: times arrive as arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExpiryPace {
    /// Leases one Expire command reclaims at most.
    pub leases_max: u32,
    /// Least time between two Expire proposals of a group, milliseconds (from
    /// `expire_commands_per_s_max`).
    pub min_gap_ms: u64,
    /// Leases reclaimed per second at most while on time; 0 = no pacing.
    pub paced_leases_per_s: u32,
    /// Overdue (log-time ms of the oldest due lease past its expiry) from which pacing stops.
    pub overdue_target_ms: u64,
}

impl ExpiryPace {
    /// The pace the configuration asks for.
    pub(crate) fn from_timing(timing: &TimingConfig) -> Self {
        ExpiryPace {
            leases_max: timing.expire_batch_max,
            min_gap_ms: 1_000 / u64::from(timing.expire_commands_per_s_max.max(1)),
            paced_leases_per_s: timing.expire_paced_leases_per_s,
            overdue_target_ms: timing.expire_overdue_target_ms,
        }
    }

    /// Whether a group may propose an Expire now: `clock_now_ms` on the node's monotonic clock,
    /// its last proposal at `last_proposed_clock_ms` (0 = none yet), the pacing holding it back
    /// until `paced_until_clock_ms`, `due` what is due in it.
    pub(crate) fn may_propose(
        &self,
        clock_now_ms: u64,
        last_proposed_clock_ms: u64,
        paced_until_clock_ms: u64,
        due: Due,
    ) -> bool {
        if last_proposed_clock_ms != 0
            && clock_now_ms.saturating_sub(last_proposed_clock_ms) < self.min_gap_ms
        {
            return false;
        }
        due.waits_queued
            || due.overdue_ms >= self.overdue_target_ms
            || clock_now_ms >= paced_until_clock_ms
    }

    /// Until when (node clock ms) pacing holds a group back after an Expire command that
    /// completed at `completed_clock_ms` and reclaimed `reclaimed` leases.
    pub(crate) fn paced_until(&self, completed_clock_ms: u64, reclaimed: usize) -> u64 {
        if self.paced_leases_per_s == 0 {
            return 0;
        }
        let reclaimed = u64::try_from(reclaimed).unwrap_or(u64::MAX);
        completed_clock_ms
            .saturating_add(reclaimed.saturating_mul(1_000) / u64::from(self.paced_leases_per_s))
    }
}

/// What is due in a group when its leader considers an Expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Due {
    /// Log-time ms the oldest due lease (or session, or wait) is past its expiry.
    pub overdue_ms: u64,
    /// Whether an AcquireWait is queued in the group: a reclaim may hand a resource to it, so
    /// the group is not paced.
    pub waits_queued: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace() -> ExpiryPace {
        ExpiryPace::from_timing(&TimingConfig::default())
    }

    fn overdue(overdue_ms: u64) -> Due {
        Due {
            overdue_ms,
            waits_queued: false,
        }
    }

    #[test]
    fn the_defaults_pace_a_group_to_2500_leases_a_second_until_5_s_overdue() {
        let pace = pace();
        assert_eq!(pace.leases_max, 1_024);
        assert_eq!(pace.min_gap_ms, 50);
        // A full command of 1,024 leases holds the group back 409 ms.
        assert_eq!(pace.paced_until(10_000, 1_024), 10_409);
        assert!(!pace.may_propose(10_408, 9_990, 10_409, overdue(0)));
        assert!(pace.may_propose(10_409, 9_990, 10_409, overdue(0)));
        assert!(!pace.may_propose(10_100, 9_990, 10_409, overdue(4_999)));
        // Overdue past the target: only the command rate holds it back.
        assert!(pace.may_propose(10_100, 9_990, 10_409, overdue(5_000)));
        assert!(!pace.may_propose(10_030, 9_990, 10_409, overdue(5_000)));
    }

    #[test]
    fn a_group_with_queued_waits_is_not_paced() {
        let pace = pace();
        let waits = Due {
            overdue_ms: 0,
            waits_queued: true,
        };
        assert!(pace.may_propose(10_100, 9_990, 10_409, waits));
        assert!(!pace.may_propose(10_030, 9_990, 10_409, waits));
    }

    #[test]
    fn a_trickle_of_due_leases_is_reclaimed_every_interval_as_before() {
        let pace = pace();
        // One lease reclaimed: paced for 0 ms, so the next command waits only the 50 ms gap.
        let until = pace.paced_until(10_000, 1);
        assert_eq!(until, 10_000);
        assert!(!pace.may_propose(10_049, 10_000, until, overdue(0)));
        assert!(pace.may_propose(10_050, 10_000, until, overdue(0)));
        // The first command of a group is never held back.
        assert!(pace.may_propose(1, 0, 0, overdue(0)));
    }

    #[test]
    fn pacing_off_leaves_only_the_command_rate() {
        let mut pace = pace();
        pace.paced_leases_per_s = 0;
        assert_eq!(pace.paced_until(10_000, 1_024), 0);
        assert!(pace.may_propose(10_050, 10_000, 0, overdue(0)));
    }

    /// One group's share of a storm (`share` leases expiring uniformly over the first second)
    /// driven by 50 ms ticks, each command completing at once: (when the last was reclaimed,
    /// the most any lease was overdue when reclaimed).
    fn drain(pace: ExpiryPace, share: usize) -> (u64, u64) {
        let expiry_of = |i: usize| (i as u64) * 1_000 / (share as u64);
        let (mut reclaimed, mut last, mut until, mut t, mut overdue_max) = (0, 0, 0, 1u64, 0);
        while reclaimed < share {
            assert!(t < 20_000, "the storm never drained");
            t += 50;
            let due = (0..share).take_while(|&i| expiry_of(i) <= t).count();
            if due <= reclaimed {
                continue;
            }
            if !pace.may_propose(t, last, until, overdue(t - expiry_of(reclaimed))) {
                continue;
            }
            let n = (due - reclaimed).min(pace.leases_max as usize);
            overdue_max = overdue_max.max(t - expiry_of(reclaimed));
            reclaimed += n;
            last = t;
            until = pace.paced_until(t, n);
        }
        (t, overdue_max)
    }

    #[test]
    fn a_million_leases_ending_together_in_64_groups_are_reclaimed_within_10_s() {
        // The storm, one group's share (1,000,000 / 64 plus the hashing's unevenness).
        let pace = pace();
        let (done_ms, overdue_max_ms) = drain(pace, 17_000);
        // Spread over about 6 s (paced at 2,500 a second until the oldest left is 5 s late).
        assert!(
            done_ms > 5_000,
            "the storm was not spread: done at {done_ms} ms"
        );
        assert!(done_ms <= 6_500, "done at {done_ms} ms");
        // The overdue target bounds every lease's wait: the rest goes at the full rate.
        assert!(
            overdue_max_ms <= pace.overdue_target_ms + 100,
            "a lease waited {overdue_max_ms} ms"
        );
        // Without the overdue escape the pace alone would take longer.
        let mut no_escape = pace;
        no_escape.overdue_target_ms = u64::MAX;
        let (done_ms, overdue_max_ms) = drain(no_escape, 17_000);
        assert!(
            done_ms > 7_000 && overdue_max_ms > 6_000,
            "{done_ms} {overdue_max_ms}"
        );
        // Unpaced, it is a burst of about a second.
        let mut unpaced = pace;
        unpaced.paced_leases_per_s = 0;
        assert!(drain(unpaced, 17_000).0 <= 1_100);
    }
}
