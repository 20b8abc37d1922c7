//! When a group leader may propose its next Expire command, and how many leases it may reclaim:
//! the command rate (`timing.expire_commands_per_s_max`) and the pacing of reclaim
//! (`expire_paced_leases_per_s` while the group's oldest due lease is less than
//! `expire_overdue_target_ms` past its expiry and no AcquireWait is queued in it). Pure: times
//! arrive as arguments.
//!
//! A paced command is sized by the group's budget: `expire_paced_leases_per_s` x the time since
//! the budget was last spent (125 leases a default 50 ms tick), so a paced group reclaims a
//! little every tick, and a late tick or a slow commit (one Expire is in flight per group) is
//! made up by the next command instead of lowering the rate. Only leases reclaimed spend it
//! ([`ExpiryPace::charge`]): an Expire examines at most twice its `leases_max` index entries,
//! and one that spent them re-filing renewed leases leaves its budget to the next. The budget
//! builds up for at most [`PACED_CATCH_UP_GAPS`] command gaps (at least the time one lease takes
//! at the rate), so a group that was idle starts with a small command, not a full batch.
//! Full commands of `expire_batch_max` (1,024) every 409 ms would reach the same average, but
//! in bursts: each replica applies a storm's groups' bursts together, and a foreground call
//! waits behind them. Commands that are not paced (overdue, or waits queued) take a full batch
//! and are not charged to the pace.
//!
//! Pacing delays when a due lease's record is removed and what follows from that: its watch
//! EXPIRED event, the hand-off to a queued waiter (which is why a group with queued waits is not
//! paced), the session-end bookkeeping and the quota counts (an acquire at its tenant's quota
//! reclaims due leases itself first). Expiry itself is judged by log time on every read and
//! write whether or not the record was reclaimed yet.
//!
//! Must not depend on: anything but the configuration.

use crate::config::TimingConfig;

/// Command gaps of time a paced command's size may make up at most.
pub(crate) const PACED_CATCH_UP_GAPS: u64 = 4;

/// When a group may propose its next Expire command, and its size (pure: times arrive as
/// arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExpiryPace {
    /// Leases one Expire command reclaims at most.
    pub leases_max: u32,
    /// Least time between two Expire proposals of a group, milliseconds (from
    /// `expire_commands_per_s_max`).
    pub min_gap_ms: u64,
    /// Time between two proposals of a group that keeps proposing: the larger of `min_gap_ms`
    /// and the driver's interval, milliseconds.
    pub command_gap_ms: u64,
    /// Leases reclaimed per second at most while on time; 0 = no pacing.
    pub paced_leases_per_s: u32,
    /// Overdue (log-time ms of the oldest due lease past its expiry) from which pacing stops.
    pub overdue_target_ms: u64,
}

impl ExpiryPace {
    /// The pace the configuration asks for.
    pub(crate) fn from_timing(timing: &TimingConfig) -> Self {
        let min_gap_ms = 1_000 / u64::from(timing.expire_commands_per_s_max.max(1));
        ExpiryPace {
            leases_max: timing.expire_batch_max,
            min_gap_ms,
            command_gap_ms: min_gap_ms.max(timing.expire_interval_ms),
            paced_leases_per_s: timing.expire_paced_leases_per_s,
            overdue_target_ms: timing.expire_overdue_target_ms,
        }
    }

    /// Whether pacing holds a group with `due` back.
    fn paces(&self, due: Due) -> bool {
        self.paced_leases_per_s != 0 && !due.waits_queued && due.overdue_ms < self.overdue_target_ms
    }

    /// Time a paced group's unused budget may build up, milliseconds: [`PACED_CATCH_UP_GAPS`]
    /// command gaps, and at least the time one lease takes (so a very low rate still reclaims).
    fn budget_window_ms(&self) -> u64 {
        let rate = u64::from(self.paced_leases_per_s.max(1));
        self.command_gap_ms
            .saturating_mul(PACED_CATCH_UP_GAPS)
            .max(1_000u64.div_ceil(rate))
    }

    /// Where a group's unspent budget starts at `clock_ms`: where it was spent up to, or the
    /// start of the window it may build up over, whichever is later.
    fn budget_from_ms(&self, paced_spent_until_clock_ms: u64, clock_ms: u64) -> u64 {
        paced_spent_until_clock_ms.max(clock_ms.saturating_sub(self.budget_window_ms()))
    }

    /// The next Expire command of a group, or `None` when it may not propose now.
    /// `clock_now_ms` is on the node's monotonic clock; the group's last proposal was at
    /// `last_proposed_clock_ms` (0 = none yet); its paced budget is spent up to
    /// `paced_spent_until_clock_ms` (see [`ExpiryPace::charge`]; 0 = nothing spent); `due` is
    /// what is due in it.
    pub(crate) fn next_command(
        &self,
        clock_now_ms: u64,
        last_proposed_clock_ms: u64,
        paced_spent_until_clock_ms: u64,
        due: Due,
    ) -> Option<ExpireCommand> {
        if last_proposed_clock_ms != 0
            && clock_now_ms.saturating_sub(last_proposed_clock_ms) < self.min_gap_ms
        {
            return None;
        }
        if !self.paces(due) {
            return Some(ExpireCommand {
                leases_max: self.leases_max,
                paced: false,
            });
        }
        let from_ms = self.budget_from_ms(paced_spent_until_clock_ms, clock_now_ms);
        let budget = u64::from(self.paced_leases_per_s)
            .saturating_mul(clock_now_ms.saturating_sub(from_ms))
            / 1_000;
        if budget == 0 {
            return None;
        }
        Some(ExpireCommand {
            leases_max: u32::try_from(budget)
                .unwrap_or(u32::MAX)
                .min(self.leases_max),
            paced: true,
        })
    }

    /// Where a group's paced budget is spent up to after a paced command proposed at
    /// `proposed_clock_ms` reclaimed `reclaimed` leases, given it was spent up to
    /// `paced_spent_until_clock_ms` before. Only what was reclaimed is charged: a command that
    /// spent its examined entries re-filing renewed leases leaves its budget to the next one.
    pub(crate) fn charge(
        &self,
        paced_spent_until_clock_ms: u64,
        proposed_clock_ms: u64,
        reclaimed: usize,
    ) -> u64 {
        if self.paced_leases_per_s == 0 {
            return paced_spent_until_clock_ms;
        }
        let from_ms = self.budget_from_ms(paced_spent_until_clock_ms, proposed_clock_ms);
        let reclaimed = u64::try_from(reclaimed).unwrap_or(u64::MAX);
        // Rounded up: the rate is never exceeded.
        from_ms.saturating_add(
            reclaimed
                .saturating_mul(1_000)
                .div_ceil(u64::from(self.paced_leases_per_s)),
        )
    }
}

/// An Expire command a group may propose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExpireCommand {
    /// Leases (and other due records) it may reclaim at most.
    pub leases_max: u32,
    /// Whether it is paced (its reclaim is charged to the group's budget).
    pub paced: bool,
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

    fn paced(leases_max: u32) -> Option<ExpireCommand> {
        Some(ExpireCommand {
            leases_max,
            paced: true,
        })
    }

    fn full() -> Option<ExpireCommand> {
        Some(ExpireCommand {
            leases_max: 1_024,
            paced: false,
        })
    }

    #[test]
    fn a_paced_command_is_the_budget_built_up_since_it_was_last_spent() {
        let pace = pace();
        assert_eq!(pace.leases_max, 1_024);
        assert_eq!(pace.min_gap_ms, 50);
        assert_eq!(pace.command_gap_ms, 50);
        // Within the command gap: nothing.
        assert_eq!(pace.next_command(10_049, 10_000, 10_000, overdue(0)), None);
        // One tick's budget: 2,500 a second x 50 ms.
        assert_eq!(
            pace.next_command(10_050, 10_000, 10_000, overdue(0)),
            paced(125)
        );
        // A late tick or a slow commit is made up...
        assert_eq!(
            pace.next_command(10_099, 10_000, 10_000, overdue(0)),
            paced(247)
        );
        // ...up to four gaps' worth; a group's first command is that size too.
        assert_eq!(
            pace.next_command(10_200, 10_000, 10_000, overdue(0)),
            paced(500)
        );
        assert_eq!(
            pace.next_command(60_000, 10_000, 10_000, overdue(0)),
            paced(500)
        );
        assert_eq!(pace.next_command(10_000, 0, 0, overdue(4_999)), paced(500));
        // A clock that went back proposes nothing until it passes the gap again.
        assert_eq!(pace.next_command(9_000, 10_000, 10_000, overdue(0)), None);
    }

    #[test]
    fn only_reclaimed_leases_spend_the_budget() {
        let pace = pace();
        // 125 reclaimed by a command proposed at 10,050, the budget spent up to 10,000: spent
        // up to 10,050.
        assert_eq!(pace.charge(10_000, 10_050, 125), 10_050);
        // A command that only re-filed renewed leases spends nothing: the next, a tick later,
        // has two ticks' budget.
        let spent = pace.charge(10_000, 10_050, 0);
        assert_eq!(spent, 10_000);
        assert_eq!(
            pace.next_command(10_100, 10_050, spent, overdue(0)),
            paced(250)
        );
        // A budget unused for long is capped at four gaps before the proposal.
        assert_eq!(pace.charge(0, 10_000, 0), 9_800);
        assert_eq!(pace.charge(0, 10_000, 500), 10_000);
        // Pacing off: nothing is charged.
        let mut unpaced = pace;
        unpaced.paced_leases_per_s = 0;
        assert_eq!(unpaced.charge(10_000, 10_050, 1_024), 10_000);
    }

    #[test]
    fn an_overdue_group_or_one_with_queued_waits_takes_full_commands_at_the_command_rate() {
        let pace = pace();
        // Even with its paced budget spent far ahead.
        assert_eq!(
            pace.next_command(10_050, 10_000, 20_000, overdue(5_000)),
            full()
        );
        assert_eq!(
            pace.next_command(10_049, 10_000, 10_000, overdue(5_000)),
            None
        );
        let waits = Due {
            overdue_ms: 0,
            waits_queued: true,
        };
        assert_eq!(pace.next_command(10_050, 10_000, 20_000, waits), full());
        assert_eq!(pace.next_command(10_049, 10_000, 10_000, waits), None);
        // A paced group whose budget is spent ahead waits for it.
        assert_eq!(pace.next_command(10_050, 10_000, 10_100, overdue(0)), None);
    }

    #[test]
    fn pacing_off_leaves_only_the_command_rate() {
        let mut pace = pace();
        pace.paced_leases_per_s = 0;
        assert_eq!(pace.next_command(10_050, 10_000, 0, overdue(0)), full());
        assert_eq!(pace.next_command(10_049, 10_000, 0, overdue(0)), None);
    }

    #[test]
    fn the_budget_follows_the_rate_the_interval_and_the_batch_limit() {
        let with = |rate: u32, interval_ms: u64, commands_per_s: u32| {
            ExpiryPace::from_timing(&TimingConfig {
                expire_paced_leases_per_s: rate,
                expire_interval_ms: interval_ms,
                expire_commands_per_s_max: commands_per_s,
                ..TimingConfig::default()
            })
        };
        // A 200 ms driver interval: 500 a tick, and up to four ticks' worth.
        let slow_ticks = with(2_500, 200, 20);
        assert_eq!(
            slow_ticks.next_command(10_200, 10_000, 10_000, overdue(0)),
            paced(500)
        );
        assert_eq!(
            slow_ticks.next_command(10_400, 10_000, 10_000, overdue(0)),
            paced(1_000)
        );
        // Never more than a full batch.
        let fast = with(1_000_000, 50, 20);
        assert_eq!(
            fast.next_command(10_050, 10_000, 10_000, overdue(0)),
            paced(1_024)
        );
        // One lease a second: nothing until a second has passed, then one.
        let trickle = with(1, 50, 20);
        assert_eq!(
            trickle.next_command(10_999, 10_000, 10_000, overdue(0)),
            None
        );
        assert_eq!(
            trickle.next_command(11_000, 10_000, 10_000, overdue(0)),
            paced(1)
        );
        assert_eq!(
            trickle.next_command(99_000, 10_000, 10_000, overdue(0)),
            paced(1)
        );
        // An odd rate is kept over time: the remainder carries in the spent time.
        let odd = with(30, 50, 20);
        let (mut spent, mut last, mut reclaimed) = (10_000u64, 10_000u64, 0usize);
        for tick in 1..=200u64 {
            let now = 10_000 + tick * 50;
            if let Some(command) = odd.next_command(now, last, spent, overdue(0)) {
                reclaimed += command.leases_max as usize;
                spent = odd.charge(spent, now, command.leases_max as usize);
                last = now;
            }
        }
        // 10 s at 30 a second, never more.
        assert!((290..=300).contains(&reclaimed), "{reclaimed}");
    }

    /// One group's share of a storm (`share` leases expiring uniformly over the first second),
    /// driven by ticks every 50 ms shifted by a repeating jitter of -2..=+2 ms, each command
    /// committing `commit_ms` after its proposal with one in flight at a time.
    struct Drained {
        /// When the last lease was reclaimed.
        done_ms: u64,
        /// The most any lease was overdue when its command was proposed.
        overdue_max_ms: u64,
        /// Leases reclaimed by 4 s (all paced while the oldest is under 5 s overdue).
        reclaimed_by_4_s: usize,
        /// The largest command proposed while paced.
        paced_command_max: u32,
    }

    fn drain(pace: ExpiryPace, share: usize, commit_ms: u64) -> Drained {
        const JITTER_MS: [i64; 5] = [0, -1, 2, -2, 1];
        let expiry_of = |i: usize| (i as u64) * 1_000 / (share as u64);
        let (mut reclaimed, mut last, mut spent, mut tick) = (0usize, 0u64, 0u64, 0u64);
        // (commits at, leases reclaimed, proposed at, paced)
        let mut inflight: Option<(u64, usize, u64, bool)> = None;
        let mut drained = Drained {
            done_ms: 0,
            overdue_max_ms: 0,
            reclaimed_by_4_s: 0,
            paced_command_max: 0,
        };
        while reclaimed < share {
            tick += 1;
            let t = (tick * 50).saturating_add_signed(
                JITTER_MS[usize::try_from(tick).unwrap_or(0) % JITTER_MS.len()],
            );
            assert!(t < 30_000, "the storm never drained");
            if let Some((commits_at, n, proposed_at, was_paced)) = inflight
                && commits_at <= t
            {
                reclaimed += n;
                if was_paced {
                    spent = pace.charge(spent, proposed_at, n);
                }
                inflight = None;
                drained.done_ms = commits_at;
            }
            if t <= 4_000 {
                drained.reclaimed_by_4_s = reclaimed;
            }
            let due = (0..share).take_while(|&i| expiry_of(i) <= t).count();
            if inflight.is_some() || due <= reclaimed {
                continue;
            }
            let state = overdue(t - expiry_of(reclaimed));
            let Some(command) = pace.next_command(t, last, spent, state) else {
                continue;
            };
            if command.paced {
                drained.paced_command_max = drained.paced_command_max.max(command.leases_max);
            }
            drained.overdue_max_ms = drained.overdue_max_ms.max(state.overdue_ms);
            last = t;
            let n = (due - reclaimed).min(command.leases_max as usize);
            inflight = Some((t + commit_ms, n, t, command.paced));
        }
        drained
    }

    #[test]
    fn a_storm_share_is_reclaimed_at_the_paced_rate_in_small_commands_despite_jitter_and_slow_commits()
     {
        // The storm, one group's share (1,000,000 / 64 plus the hashing's unevenness).
        let pace = pace();
        for commit_ms in [0, 30, 150] {
            let drained = drain(pace, 17_000, commit_ms);
            // 2,500 a second from the first tick: about 500 + 2,500 x 3.95 s by 4 s.
            assert!(
                drained.reclaimed_by_4_s >= 9_000 && drained.reclaimed_by_4_s <= 11_000,
                "commit {commit_ms} ms: {} reclaimed by 4 s",
                drained.reclaimed_by_4_s
            );
            assert!(
                drained.paced_command_max <= 500,
                "commit {commit_ms} ms: a paced command of {}",
                drained.paced_command_max
            );
            // Spread over seconds, and done soon after the overdue target lets the rest go.
            assert!(
                drained.done_ms > 5_000 && drained.done_ms <= 7_000,
                "commit {commit_ms} ms: done at {} ms",
                drained.done_ms
            );
            // Past the target by at most the command in flight and three ticks (one skipped by
            // the jitter).
            assert!(
                drained.overdue_max_ms <= pace.overdue_target_ms + commit_ms + 3 * 50 + 10,
                "commit {commit_ms} ms: a lease waited {} ms",
                drained.overdue_max_ms
            );
        }
        // Without the overdue escape the pace alone would take longer.
        let mut no_escape = pace;
        no_escape.overdue_target_ms = u64::MAX;
        let drained = drain(no_escape, 17_000, 0);
        assert!(
            drained.done_ms > 6_500 && drained.overdue_max_ms > pace.overdue_target_ms,
            "{} {}",
            drained.done_ms,
            drained.overdue_max_ms
        );
        // Unpaced, it is a burst of about a second in full commands (a tick that comes less than
        // the 50 ms gap after the last proposal is skipped, so somewhat over a second here).
        let mut unpaced = pace;
        unpaced.paced_leases_per_s = 0;
        let drained = drain(unpaced, 17_000, 0);
        assert!(drained.done_ms <= 1_500, "{}", drained.done_ms);
        assert!(drained.reclaimed_by_4_s == 17_000);
    }
}
