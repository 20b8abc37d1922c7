//! The limits that tie one crate's bounds to another's, defined once and checked when a node
//! starts.
//!
//! Each limit lives where it is enforced (the state machine's entry bound in `tenure-core`, frame
//! bounds in `tenure-proto` and `tenure-transport`); this module holds the server's own bound on
//! entry bytes and [`check_relations`], which refuses a node whose settings would let one layer
//! produce what the next refuses (an entry the state machine would reject whole, an AppendEntries
//! message the transport would not send). The relations used to be comments; now a changed
//! default that breaks one stops the node at start, with the numbers.
//!
//! Must not depend on: the network, storage or the runtime (pure arithmetic over settings).

use tenure_core::GroupLimits;

/// Estimated bytes of one log entry at most (the proposer's size estimate of the operations it
/// packs, see `group::op_bytes_estimate`). [`check_relations`] checks that the transport's largest
/// AppendEntries message of such entries fits its frame bound.
pub const ENTRY_BYTES_MAX: usize = 120 * 1024;

/// Bytes allowed per entry, beyond its operations, in an AppendEntries frame: the entry's log id,
/// log time, encoding tags and length prefixes (a few dozen bytes in the pinned format; 1 KiB is
/// far above it).
pub const ENTRY_FRAMING_BYTES_MAX: usize = 1024;

/// Bytes allowed per AppendEntries message beyond its entries: vote, previous log id, commit
/// index, message and frame headers.
pub const APPEND_FRAMING_BYTES_MAX: usize = 4 * 1024;

/// The settings [`check_relations`] looks at, from the server, core and transport configurations.
#[derive(Debug, Clone, Copy)]
pub struct LimitSettings<'a> {
    /// The proposer's operations per entry at most (`limits.ops_per_entry_max`).
    pub ops_per_entry_max: u32,
    /// The groups' limits, as the node installs them.
    pub group: &'a GroupLimits,
    /// Entries per AppendEntries message at most (`GroupTiming::append_entries_max`).
    pub append_entries_max: u64,
    /// The transport's largest frame body (`TransportConfig::frame_bytes_max`).
    pub frame_bytes_max: usize,
}

/// A relation between two crates' limits that the settings break.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limits do not fit together: {0}")]
pub struct LimitRelationError(pub String);

/// Checks every cross-crate relation the server relies on:
///
/// - the proposer's `ops_per_entry_max` is at most the groups' `batch_items_max` (the state
///   machine refuses a longer entry whole, failing every operation packed into it);
/// - the wire's `BATCH_OPS_MAX` is at most `batch_items_max` (a client's `Batch` is proposed as
///   one entry);
/// - `append_entries_max` entries of [`ENTRY_BYTES_MAX`] bytes, with their framing, fit the
///   transport's frame bound (a longer message would be refused by the sender, and replication
///   of that group would stall).
pub fn check_relations(settings: &LimitSettings<'_>) -> Result<(), LimitRelationError> {
    let batch_items_max = settings.group.batch_items_max;
    if settings.ops_per_entry_max > batch_items_max {
        return Err(LimitRelationError(format!(
            "limits.ops_per_entry_max ({}) exceeds the groups' batch_items_max ({batch_items_max})",
            settings.ops_per_entry_max
        )));
    }
    let wire_batch_ops_max = tenure_proto::client::BATCH_OPS_MAX;
    if wire_batch_ops_max > batch_items_max as usize {
        return Err(LimitRelationError(format!(
            "the client protocol's BATCH_OPS_MAX ({wire_batch_ops_max}) exceeds the groups' \
             batch_items_max ({batch_items_max})"
        )));
    }
    let entries = usize::try_from(settings.append_entries_max).unwrap_or(usize::MAX);
    let message_bytes_max = entries
        .saturating_mul(ENTRY_BYTES_MAX + ENTRY_FRAMING_BYTES_MAX)
        .saturating_add(APPEND_FRAMING_BYTES_MAX);
    if message_bytes_max > settings.frame_bytes_max {
        return Err(LimitRelationError(format!(
            "append_entries_max ({entries}) entries of up to {ENTRY_BYTES_MAX} bytes make \
             AppendEntries messages of up to {message_bytes_max} bytes, above the transport's \
             frame_bytes_max ({})",
            settings.frame_bytes_max
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_transport::{FRAME_BYTES_MAX_DEFAULT, GroupTiming};

    fn defaults(group: &GroupLimits) -> LimitSettings<'_> {
        LimitSettings {
            ops_per_entry_max: crate::config::LimitsConfig::default().ops_per_entry_max,
            group,
            append_entries_max: GroupTiming::default().append_entries_max,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        }
    }

    #[test]
    fn the_defaults_fit_together() {
        let group = GroupLimits::default();
        assert_eq!(check_relations(&defaults(&group)), Ok(()));
        let ceiling = LimitSettings {
            ops_per_entry_max: crate::config::OPS_PER_ENTRY_CEILING,
            ..defaults(&group)
        };
        assert_eq!(check_relations(&ceiling), Ok(()));
    }

    #[test]
    fn each_broken_relation_is_named() {
        let group = GroupLimits::default();
        let too_many_ops = LimitSettings {
            ops_per_entry_max: group.batch_items_max + 1,
            ..defaults(&group)
        };
        let error = check_relations(&too_many_ops).unwrap_err();
        assert!(error.0.contains("ops_per_entry_max"), "{error}");

        let small_group = GroupLimits {
            batch_items_max: 16,
            ..GroupLimits::default()
        };
        let settings = LimitSettings {
            ops_per_entry_max: 16,
            ..defaults(&small_group)
        };
        let error = check_relations(&settings).unwrap_err();
        assert!(error.0.contains("BATCH_OPS_MAX"), "{error}");

        let long_messages = LimitSettings {
            append_entries_max: 1_024,
            ..defaults(&group)
        };
        let error = check_relations(&long_messages).unwrap_err();
        assert!(error.0.contains("frame_bytes_max"), "{error}");
    }
}
