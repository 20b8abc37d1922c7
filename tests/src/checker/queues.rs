//! Properties 7 to 9: wait queues, watch streams and the commands `tenurectl lock` runs,
//! judged from the history.
//!
//! 7. **Wait queues** ([`Property::WaitQueue`]), from the Acquires that waited
//!    ([`crate::history::WaitRecord`]) and told their place (the log time they were queued at,
//!    `q`, and the end of their wait, `u`):
//!    - *no grant to a dead waiter*: a waiter granted by a hand-off at log time `g` was alive
//!      then (`g < u`);
//!    - *FIFO among live waiters*: a hand-off at `g` to a waiter queued at `q_B` passes over no
//!      waiter A queued earlier (`q_A < q_B`) that was alive then (`g < u_A`) and still queued (it
//!      was granted later, or its wait ended without a grant, which happens at `u_A` at the
//!      earliest: the workload never cancels a wait it records an answer for).
//!
//!    A hand-off only after the previous holder's release or expiry is the single-holder,
//!    fencing and linearizability properties applied to these Acquires like any other.
//! 8. **Watch streams** ([`Property::Watch`]), from what each watcher was delivered, per group:
//!    - *log order*: events come in index order, each after the `Through` before it;
//!    - *no gaps*: every grant takes the group's next fencing token, so between a start (or a
//!      resync) and the stream's end, the grant events (ACQUIRED, HANDED_OFF) of a tenant watch
//!      carry consecutive tokens; a resumed stream continues from the state the earlier one had
//!      at its cursor, so a gap across a resume is caught too. This assumes the watched tenant
//!      makes every grant of the group (the fault suite and the simulation use one tenant);
//!      the grants of one entry are judged together (an entry lists its hand-offs last, so
//!      its tokens need not come in order), and the stream's last entry, with no Through
//!      after it, is not judged;
//!    - *ends before grants*: a resource's next grant comes after the end (RELEASED, EXPIRED)
//!      of the lease granted before it, and an end names the lease last granted;
//!    - *agreement*: the grant a stream reports under a (group, token) names the resource and
//!      holder every other stream and every acknowledged grant of the history name.
//! 9. **Lock commands** ([`Property::LockCommand`]), from the signs of life the commands of
//!    `tenurectl lock` wrote while they ran ([`crate::history::LockBeat`]): two commands of one
//!    lock never ran at once (a command's run is its first to its last beat), and they ran in
//!    the order of their fencing tokens.
//!
//! Must not depend on: processes, the network, the client library.

use std::collections::{BTreeMap, HashMap};

use super::{Property, Violation};
use crate::history::{History, Nanos, OpRecord, Outcome, WatchItemRecord, WatchRecord};

/// A waiter the history knows the place of.
struct Waiter<'a> {
    op: &'a OpRecord,
    queued_at_ms: u64,
    wait_until_ms: u64,
    /// Log time of its grant (`None`: its wait ended without one).
    granted_at_ms: Option<u64>,
}

/// Checks property 7 on every resource.
pub(super) fn check_wait_queues(history: &History, violations: &mut Vec<Violation>) -> u64 {
    let mut by_resource: BTreeMap<&str, Vec<Waiter<'_>>> = BTreeMap::new();
    for op in &history.ops {
        let Some(wait) = &op.wait else { continue };
        let (Some(queued_at_ms), Some(wait_until_ms)) = (wait.queued_at_ms, wait.wait_until_ms)
        else {
            continue;
        };
        if op.replay_of.is_some() {
            continue;
        }
        let granted_at_ms = match &op.outcome {
            Outcome::Granted { log_time_ms, .. } => Some(*log_time_ms),
            Outcome::Refused { .. } => None,
            // Without an answer nothing is known of when it left the queue.
            _ => continue,
        };
        by_resource
            .entry(op.resource.as_str())
            .or_default()
            .push(Waiter {
                op,
                queued_at_ms,
                wait_until_ms,
                granted_at_ms,
            });
    }
    let mut judged = 0;
    for (resource, waiters) in &by_resource {
        for b in waiters {
            let Some(granted_at_ms) = b.granted_at_ms else {
                continue;
            };
            judged += 1;
            if granted_at_ms >= b.wait_until_ms {
                violations.push(Violation::new(
                    Property::WaitQueue,
                    resource,
                    format!(
                        "a hand-off at log {granted_at_ms} granted a waiter whose wait had ended \
                         at log {} (queued at log {})",
                        b.wait_until_ms, b.queued_at_ms
                    ),
                    vec![b.op],
                ));
            }
            for a in waiters {
                // Still queued at the hand-off: granted later, or its wait ended (at its end
                // at the earliest) after it.
                let left_at_ms = a.granted_at_ms.unwrap_or(a.wait_until_ms);
                if a.queued_at_ms < b.queued_at_ms
                    && granted_at_ms < a.wait_until_ms
                    && granted_at_ms < left_at_ms
                {
                    violations.push(Violation::new(
                        Property::WaitQueue,
                        resource,
                        format!(
                            "a hand-off at log {granted_at_ms} granted the waiter queued at log \
                             {} over one queued at log {} and alive until log {}",
                            b.queued_at_ms, a.queued_at_ms, a.wait_until_ms
                        ),
                        vec![a.op, b.op],
                    ));
                }
            }
        }
    }
    judged
}

/// What a stream has established about one group, as of its last item.
#[derive(Debug, Clone, Default)]
struct Chain {
    /// The last event's index, or the start's.
    index: u64,
    /// The last Through (events after it must be later).
    through: u64,
    /// The last grant's token since the start (unknown before the first), through the entries
    /// before the current one.
    last_grant: Option<u64>,
    /// The grant tokens of the current entry (`index`): an entry's grants take consecutive
    /// tokens, but its events need not list them in token order (its hand-offs come last).
    entry_grants: Vec<u64>,
    /// Per resource: the token of the lease granted in this stretch and not yet ended.
    open: HashMap<String, u64>,
}

/// A grant some stream reported: resource and holder, and who reported it first.
type Reported = (String, Option<String>, String);

/// Checks property 8 on every watcher's items.
pub(super) fn check_watch(history: &History, violations: &mut Vec<Violation>) -> u64 {
    let mut by_stream: BTreeMap<(&str, u32), Vec<&WatchRecord>> = BTreeMap::new();
    for record in &history.watch {
        by_stream
            .entry((record.watcher.as_str(), record.group))
            .or_default()
            .push(record);
    }
    let mut grants: HashMap<(u32, u64), Reported> = HashMap::new();
    let mut events = 0;
    for ((watcher, group), records) in &by_stream {
        let mut chain: Option<Chain> = None;
        // The chain as of each Through (and start), to continue from on a resume.
        let mut at_index: BTreeMap<u64, Chain> = BTreeMap::new();
        for record in records {
            let problem = match &record.item {
                WatchItemRecord::Started { index } | WatchItemRecord::Resync { index } => {
                    let fresh = Chain {
                        index: *index,
                        through: *index,
                        ..Chain::default()
                    };
                    at_index.insert(*index, fresh.clone());
                    chain = Some(fresh);
                    None
                }
                WatchItemRecord::Resumed { after } => match at_index.get(after) {
                    Some(state) => {
                        chain = Some(state.clone());
                        None
                    }
                    None => Some(format!(
                        "resumed after index {after}, which no Through delivered"
                    )),
                },
                WatchItemRecord::Through { index } => match chain.as_mut() {
                    Some(state) if *index < state.index => Some(format!(
                        "Through {index} after an event or start at index {}",
                        state.index
                    )),
                    Some(state) => {
                        let problem = close_entry(state);
                        state.index = *index;
                        state.through = *index;
                        at_index.insert(*index, state.clone());
                        problem
                    }
                    None => Some(format!("Through {index} before the stream started")),
                },
                WatchItemRecord::Event {
                    index,
                    resource,
                    kind,
                    holder,
                    token,
                    ..
                } => {
                    events += 1;
                    match chain.as_mut() {
                        None => Some(format!("{kind} at {index} before the stream started")),
                        Some(state) => {
                            let problem = judge_event(state, *index, resource, kind, *token);
                            state.index = state.index.max(*index);
                            if is_grant(kind) {
                                let reported =
                                    grants.entry((*group, *token)).or_insert_with(|| {
                                        (resource.clone(), holder.clone(), (*watcher).to_string())
                                    });
                                if problem.is_none()
                                    && (reported.0 != *resource || reported.1 != *holder)
                                {
                                    Some(format!(
                                        "{kind} of token {token} names {resource} held by {}; \
                                         {} reported {} held by {}",
                                        holder.as_deref().unwrap_or("?"),
                                        reported.2,
                                        reported.0,
                                        reported.1.as_deref().unwrap_or("?")
                                    ))
                                } else {
                                    problem
                                }
                            } else {
                                problem
                            }
                        }
                    }
                }
            };
            if let Some(problem) = problem {
                // The history's grants of the tokens the message names and of those between
                // them (a gap's missing grants), to show what is missing.
                let named = tokens_named(&problem);
                let (low, high) = (
                    named.iter().copied().min().unwrap_or(1),
                    named.iter().copied().max().unwrap_or(0),
                );
                let ops: Vec<OpRecord> = history
                    .ops
                    .iter()
                    .filter(|op| match &op.outcome {
                        Outcome::Granted { lease, token, .. } => {
                            lease.group == *group
                                && (low..=high).contains(token)
                                && op.kind != crate::history::OpKind::Renew
                        }
                        _ => false,
                    })
                    .cloned()
                    .collect();
                violations.push(Violation {
                    property: Property::Watch,
                    resource: None,
                    message: format!("watcher {watcher}, group {group}: {problem}"),
                    ops,
                    writes: Vec::new(),
                });
                // Judge the rest of this stream afresh from here.
                let index = item_index(&record.item);
                let fresh = Chain {
                    index,
                    through: chain
                        .as_ref()
                        .map_or(index, |state| state.through.min(index)),
                    ..Chain::default()
                };
                chain = Some(fresh);
            }
        }
    }
    // Every acknowledged grant agrees with what the streams reported for its token.
    for op in &history.ops {
        let Outcome::Granted { lease, token, .. } = &op.outcome else {
            continue;
        };
        if !matches!(
            op.kind,
            crate::history::OpKind::Acquire | crate::history::OpKind::Transfer
        ) {
            continue;
        }
        let Some((resource, holder, watcher)) = grants.get(&(lease.group, *token)) else {
            continue;
        };
        if *resource != op.resource || holder.as_deref() != Some(op.granted_holder()) {
            violations.push(Violation::new(
                Property::Watch,
                &op.resource,
                format!(
                    "watcher {watcher} reported token {token} of group {} as {resource} held by \
                     {}",
                    lease.group,
                    holder.as_deref().unwrap_or("?")
                ),
                vec![op],
            ));
        }
    }
    events
}

/// Ends the current entry's grants: with the grants before them they must carry consecutive
/// tokens. The problem, if any.
fn close_entry(state: &mut Chain) -> Option<String> {
    let mut tokens = std::mem::take(&mut state.entry_grants);
    tokens.sort_unstable();
    for token in tokens {
        if let Some(last) = state.last_grant
            && token != last + 1
        {
            state.last_grant = Some(token);
            return Some(format!(
                "the grants of the entry at index {} go on at token {token} after token {last}: \
                 the grants in between (from token {}) are missing",
                state.index,
                last + 1
            ));
        }
        state.last_grant = Some(token);
    }
    None
}

/// The fencing tokens a problem's message names (each written `token N`).
fn tokens_named(message: &str) -> Vec<u64> {
    message
        .split("token ")
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// The index an item names.
fn item_index(item: &WatchItemRecord) -> u64 {
    match item {
        WatchItemRecord::Started { index }
        | WatchItemRecord::Event { index, .. }
        | WatchItemRecord::Through { index }
        | WatchItemRecord::Resync { index } => *index,
        WatchItemRecord::Resumed { after } => *after,
    }
}

fn is_grant(kind: &str) -> bool {
    kind == "ACQUIRED" || kind == "HANDED_OFF"
}

/// One event against its stream's chain; the problem, if any. Updates the chain.
fn judge_event(
    state: &mut Chain,
    index: u64,
    resource: &str,
    kind: &str,
    token: u64,
) -> Option<String> {
    if index <= state.through {
        return Some(format!(
            "{kind} at index {index}, not after the Through at {}",
            state.through
        ));
    }
    if index < state.index {
        return Some(format!(
            "{kind} at index {index} after an event at index {}",
            state.index
        ));
    }
    if index != state.index
        && let Some(problem) = close_entry(state)
    {
        return Some(problem);
    }
    if is_grant(kind) {
        state.entry_grants.push(token);
        if let Some(open) = state.open.insert(resource.to_string(), token) {
            return Some(format!(
                "{kind} of {resource} (token {token}) at index {index} before the end of its \
                 lease of token {open}"
            ));
        }
        return None;
    }
    match state.open.remove(resource) {
        Some(open) if open != token => Some(format!(
            "{kind} of {resource} token {token} at index {index} while its lease of token {open} \
             was the one granted"
        )),
        _ => None,
    }
}

/// Checks property 9: per lock, the commands' runs (first to last beat, per fencing token) in
/// token order, each ending before the next begins. The number of runs judged.
pub(super) fn check_lock_commands(history: &History, violations: &mut Vec<Violation>) -> u64 {
    let mut runs: BTreeMap<&str, BTreeMap<u64, (Nanos, Nanos)>> = BTreeMap::new();
    for beat in &history.lock_beats {
        let run = runs
            .entry(beat.name.as_str())
            .or_default()
            .entry(beat.token)
            .or_insert((beat.at_ns, beat.at_ns));
        run.0 = run.0.min(beat.at_ns);
        run.1 = run.1.max(beat.at_ns);
    }
    let origin = history
        .lock_beats
        .iter()
        .map(|beat| beat.at_ns)
        .min()
        .unwrap_or(0);
    let ms = |at: Nanos| at.saturating_sub(origin) as f64 / 1e6;
    let mut judged = 0;
    for (name, by_token) in &runs {
        judged += by_token.len() as u64;
        let mut previous: Option<(u64, Nanos, Nanos)> = None;
        for (&token, &(first, last)) in by_token {
            if let Some((earlier, earlier_first, earlier_last)) = previous
                && first <= earlier_last
            {
                violations.push(Violation {
                    property: Property::LockCommand,
                    resource: Some((*name).to_string()),
                    message: format!(
                        "the command of token {token} ran from {:.1} ms to {:.1} ms, while (or \
                         before) the command of token {earlier}, from {:.1} ms to {:.1} ms",
                        ms(first),
                        ms(last),
                        ms(earlier_first),
                        ms(earlier_last)
                    ),
                    ops: Vec::new(),
                    writes: Vec::new(),
                });
            }
            previous = Some((token, first, last));
        }
    }
    judged
}
