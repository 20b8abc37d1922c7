//! Which lease goes where in a scale run: of N leases, the session share (default 90%) is bound
//! to sessions and the rest held on their own (each with its own ttl, renewed by the client
//! library); the first E session leases go to the storm's sessions, which end together at the
//! end of the run. Each part is spread over tenants of at most `leases_per_tenant` leases (a
//! tenant's quota is cluster-wide), and each session belongs to one tenant. Lease `i` of N is
//! interleaved so that every part grows at the same pace while the leases are acquired.
//!
//! Pure arithmetic: must not depend on the client, the clock or the network.

/// Which part a lease belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// Bound to one of the long-lived sessions.
    Main,
    /// Bound to one of the storm's sessions.
    Storm,
    /// Held on its own.
    Individual,
}

/// Where one lease goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Slot {
    /// Its part.
    pub part: Part,
    /// Its index within the part (its resource name is the part's code and this index).
    pub index: u64,
    /// Its session within the part's sessions (individual leases: 0).
    pub session: u64,
    /// Its tenant within the part's tenants.
    pub tenant: u64,
}

/// One part's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PartPlan {
    /// Leases.
    pub leases: u64,
    /// Tenants (each with at most `leases_per_tenant` of the part's leases, give or take one
    /// session's share).
    pub tenants: u64,
    /// Sessions (a multiple of the tenants, so that each tenant has as many; 0 for individual
    /// leases).
    pub sessions: u64,
}

/// The whole layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    /// All leases.
    pub leases: u64,
    /// Percent of them bound to sessions.
    pub session_share_percent: u64,
    /// The long-lived sessions' part.
    pub main: PartPlan,
    /// The storm's part.
    pub storm: PartPlan,
    /// The individually held part.
    pub individual: PartPlan,
}

/// Most sessions a part gets by default.
const DEFAULT_SESSIONS_MAX: u64 = 1_000;
/// Leases per session a part's default session count aims at.
const DEFAULT_LEASES_PER_SESSION: u64 = 10_000;

/// The default session count of a part of `leases`: one per 10,000 leases, 1 to 1,000.
pub(super) fn default_sessions(leases: u64) -> u64 {
    (leases / DEFAULT_LEASES_PER_SESSION).clamp(1, DEFAULT_SESSIONS_MAX)
}

fn part(leases: u64, sessions: Option<u64>, leases_per_tenant: u64) -> PartPlan {
    if leases == 0 {
        return PartPlan {
            leases,
            tenants: 0,
            sessions: 0,
        };
    }
    let tenants = leases.div_ceil(leases_per_tenant.max(1));
    let sessions = sessions.map(|wanted| {
        // At least one per tenant, and as many for each tenant.
        wanted.max(tenants).div_ceil(tenants) * tenants
    });
    PartPlan {
        leases,
        tenants,
        sessions: sessions.unwrap_or(0),
    }
}

impl Plan {
    /// `leases` of which `session_share_percent` (0 to 100) in sessions: the first `storm` of
    /// them (capped at the session leases) in `storm_sessions` (default: [`default_sessions`]),
    /// the rest in `sessions` (default: [`default_sessions`] of all `leases`).
    pub(super) fn new(
        leases: u64,
        session_share_percent: u64,
        sessions: Option<u64>,
        storm: u64,
        storm_sessions: Option<u64>,
        leases_per_tenant: u64,
    ) -> Plan {
        let share = session_share_percent.min(100);
        let session_leases = leases / 100 * share + (leases % 100).min(share);
        let storm = storm.min(session_leases);
        let main_leases = session_leases - storm;
        let main_sessions = sessions
            .filter(|&count| count > 0)
            .unwrap_or_else(|| default_sessions(leases));
        let storm_sessions = storm_sessions
            .filter(|&count| count > 0)
            .unwrap_or_else(|| default_sessions(storm));
        Plan {
            leases,
            session_share_percent: share,
            main: part(main_leases, Some(main_sessions), leases_per_tenant),
            storm: part(storm, Some(storm_sessions), leases_per_tenant),
            individual: part(leases - session_leases, None, leases_per_tenant),
        }
    }

    /// Where lease `i` (0 to `leases - 1`) goes.
    pub(super) fn slot(&self, i: u64) -> Slot {
        let share = self.session_share_percent;
        let (block, offset) = (i / 100, i % 100);
        if offset < share {
            let index = block * share + offset;
            let (part, index, plan) = if index < self.storm.leases {
                (Part::Storm, index, &self.storm)
            } else {
                (Part::Main, index - self.storm.leases, &self.main)
            };
            let session = index % plan.sessions.max(1);
            Slot {
                part,
                index,
                session,
                tenant: session % plan.tenants.max(1),
            }
        } else {
            let index = block * (100 - share) + (offset - share);
            Slot {
                part: Part::Individual,
                index,
                session: 0,
                tenant: index % self.individual.tenants.max(1),
            }
        }
    }
}

impl Part {
    /// The letter that starts its resources' and tenants' names.
    pub(super) fn code(self) -> u8 {
        match self {
            Part::Main => b's',
            Part::Storm => b'e',
            Part::Individual => b'i',
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn parts_add_up_and_every_lease_has_one_slot() {
        for (leases, share, storm) in [
            (50_000u64, 90u64, 5_000u64),
            (12_345, 90, 1_000),
            (1_000, 0, 100),
            (1_000, 100, 5_000),
            (7, 50, 2),
        ] {
            let plan = Plan::new(leases, share, None, storm, None, 500);
            assert_eq!(
                plan.main.leases + plan.storm.leases + plan.individual.leases,
                leases,
                "{plan:?}"
            );
            let mut counts: BTreeMap<(u8, u64), u64> = BTreeMap::new();
            let mut per_tenant: BTreeMap<(u8, u64), u64> = BTreeMap::new();
            let mut seen = std::collections::BTreeSet::new();
            for i in 0..leases {
                let slot = plan.slot(i);
                assert!(
                    seen.insert((slot.part.code(), slot.index)),
                    "{slot:?} twice"
                );
                *counts.entry((slot.part.code(), 0)).or_default() += 1;
                *per_tenant
                    .entry((slot.part.code(), slot.tenant))
                    .or_default() += 1;
                let part = match slot.part {
                    Part::Main => plan.main,
                    Part::Storm => plan.storm,
                    Part::Individual => plan.individual,
                };
                assert!(slot.index < part.leases, "{slot:?} {plan:?}");
                assert!(slot.tenant < part.tenants.max(1));
                if slot.part != Part::Individual {
                    assert!(slot.session < part.sessions, "{slot:?} {plan:?}");
                    assert_eq!(slot.tenant, slot.session % part.tenants);
                }
            }
            assert_eq!(
                counts.get(&(b's', 0)).copied().unwrap_or(0),
                plan.main.leases
            );
            assert_eq!(
                counts.get(&(b'e', 0)).copied().unwrap_or(0),
                plan.storm.leases
            );
            // No tenant gets much more than its bound (a session's worth of slack).
            for ((code, _), count) in per_tenant {
                let part = match code {
                    b's' => plan.main,
                    b'e' => plan.storm,
                    _ => plan.individual,
                };
                let session_share = part.leases / part.sessions.max(1) + 1;
                assert!(count <= 500 + session_share, "{code} {count} {plan:?}");
            }
        }
    }

    #[test]
    fn defaults_follow_the_lease_count() {
        let plan = Plan::new(10_000_000, 90, None, 1_000_000, None, 500_000);
        assert_eq!(plan.main.leases, 8_000_000);
        assert_eq!(plan.storm.leases, 1_000_000);
        assert_eq!(plan.individual.leases, 1_000_000);
        assert_eq!(plan.main.tenants, 16);
        assert_eq!(plan.main.sessions, 1_008); // 1,000 rounded up to a multiple of 16
        assert_eq!(plan.storm.sessions, 100);
        assert_eq!(plan.storm.tenants, 2);
        assert_eq!(plan.individual.tenants, 2);
        let small = Plan::new(50_000, 90, None, 5_000, None, 500_000);
        assert_eq!(small.main.sessions, 5);
        assert_eq!(small.storm.sessions, 1);
        assert_eq!(small.individual.leases, 5_000);
        // An explicit count is kept (rounded up to the tenants).
        assert_eq!(
            Plan::new(50_000, 90, Some(7), 0, None, 500_000)
                .main
                .sessions,
            7
        );
        // More storm leases than session leases: capped.
        assert_eq!(Plan::new(100, 10, None, 50, None, 500_000).storm.leases, 10);
    }
}
