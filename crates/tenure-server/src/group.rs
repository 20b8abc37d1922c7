//! One group hosted by this node: its replica, its leader clock (log time), the batching
//! proposer, expiry proposals and linearizable reads.
//!
//! Log time (contract section 4): when this replica becomes leader of term `T` it waits until its
//! state machine has applied everything the previous leaders committed (a ReadIndex barrier,
//! which also commits the new term's blank entry), takes the last log time found there as its
//! base, and from then on stamps `base + (clock.now_ms() - took_over_ms)`, where `took_over_ms`
//! is its monotonic reading when it saw itself leader. Log time therefore continues from the
//! log; a failover can only lengthen leases. Proposals wait until that base is known.
//!
//! Reads use openraft's `ReadPolicy::ReadIndex`: the leader confirms with a quorum round that it
//! still leads, then waits until its state machine has applied up to the commit index it saw when
//! the read began, and evaluates expiry at its current log time. ReadIndex does not rest on clocks
//! at all, unlike `LeaseRead`, whose safety would need the leader-lease window to stay shorter
//! than the election timeout after rate drift (`max_drift`, 1%) on both sides; we pay one quorum
//! round per read to keep reads independent of the drift
//! bound. Log time itself can only run slow after a failover, so a Get never shows a lease
//! expired before its holder's safe deadline.
//!
//! Batching: lease operations for the group queue in a bounded channel; one proposer task takes
//! everything queued (up to `ops_per_entry_max` operations and `ENTRY_BYTES_MAX` bytes) into one
//! log entry, with at most `proposals_inflight_per_group_max` entries in flight. A client's
//! Batch request is never split across entries, so its items apply in order.
//!
//! Must not depend on: the wire (QUIC, HTTP) or other groups.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ReadPolicy;
use openraft::ServerState;
use openraft::error::ClientWriteError;
use openraft::impls::ProgressResponder;
use openraft::type_config::async_runtime::WatchReceiver;
use tenure_core::{
    ApplyOutput, Command, CommandResult, Entry, ErrorCode, GroupLimits, LeaseOp, LeaseOutcome,
    LeaseView, ListPage, ListRequest, ResourceKey,
};
use tenure_proto::client::WireError;
use tenure_storage::{GroupStateMachine, TenureRaft};
use tenure_transport::GroupRaft;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::clock::MonotonicClock;
use crate::expiry_pace::{Due, ExpiryPace};
use crate::metrics as m;

use crate::limits::ENTRY_BYTES_MAX;

/// Fixed per-operation overhead in the entry-size estimate (ids, ttl, enum tags).
const OP_OVERHEAD_BYTES: usize = 48;

/// An upper estimate of an operation's encoded size.
pub fn op_bytes_estimate(op: &LeaseOp) -> usize {
    OP_OVERHEAD_BYTES + op.text_bytes()
}

/// Per-group tuning taken from the node's configuration.
#[derive(Debug, Clone)]
pub struct GroupSettings {
    /// Operations in one entry at most.
    pub ops_per_entry_max: usize,
    /// Entries in flight at most.
    pub proposals_inflight_max: usize,
    /// Queued proposals at most (beyond: `OVERLOADED`).
    pub queue_max: usize,
    /// Limits the leader installs in the group's log when they differ.
    pub desired_limits: GroupLimits,
}

/// Operations waiting to be proposed together, and where their outcomes go.
struct Proposal {
    ops: Vec<LeaseOp>,
    bytes: usize,
    reply: oneshot::Sender<Result<Vec<LeaseOutcome>, WireError>>,
}

/// This replica's view of its own leadership.
#[derive(Debug, Clone, Copy, Default)]
struct LeaderClock {
    /// The term this replica leads (0 = not leading).
    term: u64,
    /// Monotonic reading when it saw itself leader.
    took_over_ms: u64,
    /// Last log time in the log once everything before the term was applied.
    base_log_ms: u64,
    /// True once `base_log_ms` is known; proposals wait for it.
    ready: bool,
}

/// Leader of a group as this node sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaderView {
    /// The leader's node id.
    pub leader: Option<u64>,
    /// The term.
    pub term: u64,
}

/// One hosted group.
pub struct GroupHandle {
    group_id: u32,
    node_id: u64,
    raft: GroupRaft,
    state_machine: GroupStateMachine,
    clock: Arc<dyn MonotonicClock>,
    leader_clock: Mutex<LeaderClock>,
    queue: mpsc::Sender<Proposal>,
    settings: GroupSettings,
    expire_inflight: AtomicBool,
    /// Node-clock ms of this group's last Expire proposal (0 = none yet).
    last_expire_clock_ms: AtomicU64,
    /// Node-clock ms up to which this group's paced reclaim budget is spent (see
    /// `ExpiryPace::charge`).
    expire_paced_spent_until_clock_ms: AtomicU64,
    view: Mutex<LeaderView>,
    /// Set once the replica is stopped (dropped from this node): ends its proposer.
    stopped: watch::Sender<bool>,
    /// The last term in which this replica became a ready leader (wakes requests that wait for
    /// a leader-elect to become ready).
    ready_term: watch::Sender<u64>,
}

impl std::fmt::Debug for GroupHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupHandle")
            .field("group_id", &self.group_id)
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

fn not_leader(group_id: u32, leader: Option<u64>) -> WireError {
    let mut error = WireError::new(
        ErrorCode::NotLeader,
        format!("this node does not lead group {group_id}"),
    );
    // The caller fills in the leader's address from the node table.
    error.leader_hint = leader.map(|node_id| tenure_proto::client::NodeAddress {
        node_id,
        client_addr: String::new(),
        http_url: String::new(),
    });
    error
}

fn unavailable(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Unavailable, message)
}

impl GroupHandle {
    /// Wraps a replica and starts its proposer and leadership watcher.
    pub fn start(
        group_id: u32,
        node_id: u64,
        raft: GroupRaft,
        state_machine: GroupStateMachine,
        clock: Arc<dyn MonotonicClock>,
        settings: GroupSettings,
    ) -> Arc<Self> {
        let (queue, receiver) = mpsc::channel(settings.queue_max.max(1));
        let (stopped, stop_signal) = watch::channel(false);
        let handle = Arc::new(GroupHandle {
            group_id,
            node_id,
            raft,
            state_machine,
            clock,
            leader_clock: Mutex::new(LeaderClock::default()),
            queue,
            settings,
            expire_inflight: AtomicBool::new(false),
            last_expire_clock_ms: AtomicU64::new(0),
            expire_paced_spent_until_clock_ms: AtomicU64::new(0),
            view: Mutex::new(LeaderView::default()),
            stopped,
            ready_term: watch::channel(0).0,
        });
        tokio::spawn(run_proposer(handle.clone(), receiver, stop_signal));
        tokio::spawn(watch_leadership(handle.clone()));
        handle
    }

    /// The group id.
    pub fn group_id(&self) -> u32 {
        self.group_id
    }

    /// The replica.
    pub fn raft(&self) -> &GroupRaft {
        &self.raft
    }

    /// The local state machine.
    pub fn state_machine(&self) -> &GroupStateMachine {
        &self.state_machine
    }

    /// The leader as this replica last saw it.
    pub fn leader_view(&self) -> LeaderView {
        self.view.lock().map(|view| *view).unwrap_or_default()
    }

    /// True when this replica leads and knows its log time.
    pub fn is_ready_leader(&self) -> bool {
        self.leader_clock
            .lock()
            .map(|clock| clock.ready && clock.term > 0)
            .unwrap_or(false)
    }

    /// When this replica was just elected and is still learning the log's time (it answers
    /// `NOT_LEADER` naming itself meanwhile): waits until it is ready, at most `wait`. True when
    /// it is a ready leader at the end; returns at once when it is not leading.
    pub async fn await_ready_leader(&self, wait: Duration) -> bool {
        let term = match self.leader_clock.lock() {
            Ok(clock) if clock.ready && clock.term > 0 => return true,
            Ok(clock) if clock.term > 0 => clock.term,
            _ => return false,
        };
        let mut ready = self.ready_term.subscribe();
        let _ = tokio::time::timeout(wait, ready.wait_for(|&ready| ready >= term)).await;
        self.is_ready_leader()
    }

    /// The current log time, when this replica is a ready leader.
    pub fn log_now_ms(&self) -> Option<u64> {
        let clock = self.leader_clock.lock().ok().map(|clock| *clock)?;
        if !clock.ready || clock.term == 0 {
            return None;
        }
        let elapsed = self.clock.now_ms().saturating_sub(clock.took_over_ms);
        Some(clock.base_log_ms.saturating_add(elapsed))
    }

    fn not_leader(&self) -> WireError {
        not_leader(self.group_id, self.leader_view().leader)
    }

    /// Proposes `ops` (in order, in one entry) and waits for their outcomes.
    pub async fn propose(
        &self,
        ops: Vec<LeaseOp>,
        timeout: Duration,
    ) -> Result<Vec<LeaseOutcome>, WireError> {
        if !self.is_ready_leader() {
            return Err(self.not_leader());
        }
        let bytes: usize = ops.iter().map(op_bytes_estimate).sum();
        if bytes > ENTRY_BYTES_MAX {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "batch of about {bytes} bytes exceeds the entry maximum of {ENTRY_BYTES_MAX} bytes"
                ),
            ));
        }
        let (reply, outcome) = oneshot::channel();
        let proposal = Proposal { ops, bytes, reply };
        match self.queue.try_send(proposal) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let mut error = WireError::new(
                    ErrorCode::Overloaded,
                    format!("group {} has too many queued proposals", self.group_id),
                );
                error.retry_after_ms = Some(50);
                return Err(error);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(unavailable("the group is shutting down"));
            }
        }
        match tokio::time::timeout(timeout, outcome).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(unavailable("the proposal was dropped")),
            Err(_) => Err(unavailable(format!(
                "no commit within {} ms; retry with the same request id",
                timeout.as_millis()
            ))),
        }
    }

    /// Waits until a read is linearizable (ReadIndex: leadership confirmed by a quorum, state
    /// applied up to the commit index at the read's start) and returns the log time to evaluate
    /// it at: that of the last entry applied, which every later leader continues from.
    ///
    /// Not the leader's clock: it runs ahead of the log between entries, and a read evaluated
    /// there could report an expiry no entry has decided yet; after a failover the new leader,
    /// continuing from the log, would report that lease active again (log time going back, a
    /// status going from EXPIRED to ACTIVE). Expiry is decided by the Expire entries the leader
    /// proposes as leases fall due, so reads lag the clock only until the next entry. Callers
    /// may still compute a remaining ttl from [`GroupHandle::log_now_ms`].
    pub async fn linearizable_read_time(&self, timeout: Duration) -> Result<u64, WireError> {
        if !self.is_ready_leader() {
            return Err(self.not_leader());
        }
        match tokio::time::timeout(
            timeout,
            self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                if let Some(forward) = error.forward_to_leader() {
                    return Err(not_leader(self.group_id, forward.leader_id));
                }
                return Err(unavailable(format!("read barrier failed: {error}")));
            }
            Err(_) => return Err(unavailable("read barrier timed out")),
        }
        if !self.is_ready_leader() {
            return Err(self.not_leader());
        }
        Ok(self.applied_log_time_ms())
    }

    /// Get at log time `now_ms` from the local state.
    pub fn get_at(&self, key: &ResourceKey, now_ms: u64) -> Result<Option<LeaseView>, WireError> {
        self.state_machine
            .with_leases(|leases| leases.get(key, now_ms))
            .map_err(WireError::from_lease_error)
    }

    /// Like [`GroupHandle::get_at`], `None` at once when the state is busy (being applied to, or
    /// frozen for a snapshot) instead of waiting for it.
    pub fn try_get_at(
        &self,
        key: &ResourceKey,
        now_ms: u64,
    ) -> Option<Result<Option<LeaseView>, WireError>> {
        self.state_machine
            .try_with_leases(|leases| leases.get(key, now_ms))
            .map(|got| got.map_err(WireError::from_lease_error))
    }

    /// List at log time `now_ms` from the local state.
    pub fn list_at(&self, request: &ListRequest, now_ms: u64) -> Result<ListPage, WireError> {
        self.state_machine
            .with_leases(|leases| leases.list(request, now_ms))
            .map_err(WireError::from_lease_error)
    }

    /// The last log time this replica applied (for stale reads).
    pub fn applied_log_time_ms(&self) -> u64 {
        self.state_machine
            .with_leases(|leases| leases.last_log_time_ms())
    }

    /// The replica's state counters (every replica, leader or not).
    pub fn state_stats(&self) -> tenure_core::StateStats {
        self.state_machine.with_leases(|leases| leases.stats())
    }

    /// Proposes one Expire command when leases are due, none is in flight and `pace` allows
    /// one (the command rate, and the pacing while the reclaim is on time). Returns
    /// immediately; the command completes in the background.
    pub(crate) fn maybe_expire(self: &Arc<Self>, pace: ExpiryPace) {
        let Some(now) = self.log_now_ms() else {
            return;
        };
        let Some(due) = self.state_machine.with_leases(|leases| {
            leases
                .next_expiry_ms()
                .filter(|&expiry| expiry <= now)
                .map(|expiry| Due {
                    overdue_ms: now.saturating_sub(expiry),
                    waits_queued: leases.has_queued_waits(),
                })
        }) else {
            return;
        };
        // Claimed before the last proposal's time and the spent budget are read: only the
        // claimer (or its command, before releasing the claim) writes them.
        if self.expire_inflight.swap(true, Ordering::AcqRel) {
            return;
        }
        let clock_now = self.clock.now_ms();
        let Some(command) = pace.next_command(
            clock_now,
            self.last_expire_clock_ms.load(Ordering::Relaxed),
            self.expire_paced_spent_until_clock_ms
                .load(Ordering::Relaxed),
            due,
        ) else {
            self.expire_inflight.store(false, Ordering::Release);
            return;
        };
        self.last_expire_clock_ms
            .store(clock_now.max(1), Ordering::Relaxed);
        let handle = self.clone();
        tokio::spawn(async move {
            let entry = Entry {
                log_time_ms: now,
                command: Command::Expire {
                    leases_max: command.leases_max,
                },
            };
            match handle.raft.client_write(entry).await {
                Ok(response) => {
                    if let Some(output) = response.data {
                        record_reclaimed(&output);
                        if command.paced {
                            let spent = pace.charge(
                                handle
                                    .expire_paced_spent_until_clock_ms
                                    .load(Ordering::Relaxed),
                                clock_now,
                                output.reclaimed.len(),
                            );
                            handle
                                .expire_paced_spent_until_clock_ms
                                .store(spent, Ordering::Relaxed);
                        }
                    }
                }
                Err(error) => debug!(group = handle.group_id, "expire proposal failed: {error}"),
            }
            handle.expire_inflight.store(false, Ordering::Release);
        });
    }

    /// Proposes one command of its own (not a lease operation) as this ready leader, stamped
    /// with the leader's log time, and waits for its output.
    pub async fn propose_command(&self, command: Command) -> Result<ApplyOutput, WireError> {
        let Some(now) = self.log_now_ms() else {
            return Err(self.not_leader());
        };
        let entry = Entry {
            log_time_ms: now,
            command,
        };
        match self.raft.client_write(entry).await {
            Ok(response) => response.data.ok_or_else(|| {
                WireError::new(
                    ErrorCode::Internal,
                    format!(
                        "group {} applied a command without an output",
                        self.group_id
                    ),
                )
            }),
            Err(openraft::error::RaftError::APIError(error)) => {
                Err(write_error(self.group_id, error))
            }
            Err(openraft::error::RaftError::Fatal(fatal)) => {
                Err(unavailable(format!("proposal failed: {fatal}")))
            }
        }
    }

    /// The cluster metadata in this replica's applied state (empty outside the metadata group).
    pub fn cluster_meta(&self) -> tenure_core::ClusterMeta {
        self.state_machine
            .with_leases(|leases| leases.cluster().clone())
    }

    /// Asks the replica to hand leadership to `to`.
    pub async fn transfer_leadership(&self, to: u64) {
        if let Err(error) = self.raft.trigger().transfer_leader(to).await {
            warn!(
                group = self.group_id,
                to, "leadership transfer failed: {error}"
            );
        }
    }

    /// Stops the replica (its Raft and its proposer); queued proposals are answered with an
    /// error. The node has already stopped routing to it.
    pub async fn stop(&self) {
        self.stopped.send_replace(true);
        if let Err(error) = self.raft.shutdown().await {
            warn!(group = self.group_id, "stopping the replica: {error}");
        }
    }

    /// The group's replica set as this replica sees it (its effective membership), with the
    /// followers' progress when it leads.
    pub fn members(&self) -> tenure_proto::client::GroupMembers {
        let view = self.leader_view();
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let stored = &metrics.membership_config;
        let membership = stored.membership();
        let voter_sets: Vec<Vec<u64>> = membership
            .get_joint_config()
            .iter()
            .map(|set| set.iter().copied().collect())
            .collect();
        let mut voters: Vec<u64> = membership.voter_ids().collect();
        voters.sort_unstable();
        voters.dedup();
        let mut learners: Vec<u64> = membership.learner_ids().collect();
        learners.sort_unstable();
        let membership_log_index = stored.log_id().as_ref().map_or(0, |id| id.index);
        let committed_index = metrics.local_committed.as_ref().map_or(0, |id| id.index);
        let followers = self.followers_of(&metrics);
        tenure_proto::client::GroupMembers {
            group_id: self.group_id,
            seen_by: self.node_id,
            leader: view.leader,
            term: metrics.current_term,
            voters,
            voter_sets,
            learners,
            membership_log_index,
            membership_committed: membership_log_index <= committed_index,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            followers,
        }
    }

    /// Each other replica's matched log index, as this replica's metrics say (empty unless it
    /// leads).
    fn followers_of(
        &self,
        metrics: &openraft::RaftMetrics<TenureRaft>,
    ) -> Vec<tenure_proto::client::FollowerProgress> {
        metrics
            .replication
            .as_ref()
            .map(|replication| {
                replication
                    .iter()
                    .filter(|(node, _)| **node != self.node_id)
                    .map(|(node, log_id)| tenure_proto::client::FollowerProgress {
                        node_id: *node,
                        matched_index: log_id.as_ref().map_or(0, |id| id.index),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The replication progress of followers (leader only): node -> matched log index.
    pub fn follower_progress(&self) -> Option<(u64, Vec<(u64, u64)>)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let last = metrics.last_log_index?;
        let replication = metrics.replication.as_ref()?;
        let matched = replication
            .iter()
            .map(|(node, log_id)| (*node, log_id.as_ref().map_or(0, |id| id.index)))
            .collect();
        Some((last, matched))
    }

    /// This replica's role, term, log indexes and (when it leads) its followers' progress.
    pub fn status(&self) -> tenure_proto::client::GroupStatus {
        let clock = self.leader_clock.lock().ok().map(|clock| *clock);
        let view = self.leader_view();
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        // The leader clock steps down when the metrics watcher runs; a replica that was paused
        // while leading may already know a newer term. It claims leadership only for the term
        // it took over in, never for the newer term (the fault suite's election-safety check
        // saw "two leaders in term 2" from exactly that mix).
        let is_leader = clock.is_some_and(|clock| {
            clock.ready && clock.term > 0 && clock.term == metrics.current_term
        });
        let followers = self.followers_of(&metrics);
        tenure_proto::client::GroupStatus {
            group_id: self.group_id,
            leader: view.leader,
            term: metrics.current_term,
            is_leader,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            committed_index: metrics.local_committed.as_ref().map_or(0, |id| id.index),
            applied_index: metrics.last_applied.as_ref().map_or(0, |id| id.index),
            followers,
        }
    }

    /// Entries committed but not yet applied here.
    pub fn apply_lag_entries(&self) -> u64 {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let committed = metrics.local_committed.as_ref().map_or(0, |id| id.index);
        let applied = metrics.last_applied.as_ref().map_or(0, |id| id.index);
        committed.saturating_sub(applied)
    }

    fn set_leader_view(&self, view: LeaderView) {
        if let Ok(mut current) = self.view.lock() {
            if current.leader != view.leader {
                ::metrics::counter!(m::LEADER_CHANGES_TOTAL).increment(1);
            }
            *current = view;
        }
    }

    /// When this replica is the ready leader: how far (log-time ms) the oldest expired lease not
    /// yet reclaimed is past its expiry; 0 when none is.
    pub fn expiry_overdue_ms(&self) -> Option<u64> {
        let now = self.log_now_ms()?;
        let next = self
            .state_machine
            .with_leases(|leases| leases.next_expiry_ms());
        Some(next.map_or(0, |expiry| now.saturating_sub(expiry)))
    }

    /// Called by the watcher when this replica sees itself leader of `term`.
    async fn become_ready(self: Arc<Self>, term: u64) {
        // The barrier commits the blank entry of this term and waits until everything before
        // it is applied, so the state machine's last log time is the log's.
        let mut attempt = 0u32;
        loop {
            if !self.still_leading(term) {
                return;
            }
            match tokio::time::timeout(
                Duration::from_secs(5),
                self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
            )
            .await
            {
                Ok(Ok(_)) => break,
                Ok(Err(error)) => {
                    debug!(
                        group = self.group_id,
                        term, "leader barrier failed: {error}"
                    );
                }
                Err(_) => debug!(group = self.group_id, term, "leader barrier timed out"),
            }
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(10)) * 20)).await;
        }
        let base_log_ms = self.applied_log_time_ms();
        let took_over_ms = match self.leader_clock.lock() {
            Ok(clock) if clock.term == term => clock.took_over_ms,
            _ => return,
        };
        // Install the configured limits before any client operation of this term.
        let limits_differ = self
            .state_machine
            .with_leases(|leases| *leases.limits() != self.settings.desired_limits);
        if limits_differ {
            let now = base_log_ms + self.clock.now_ms().saturating_sub(took_over_ms);
            let entry = Entry {
                log_time_ms: now,
                command: Command::SetGroupLimits(self.settings.desired_limits.clone()),
            };
            match self.raft.client_write(entry).await {
                Ok(_) => info!(
                    group = self.group_id,
                    term, "installed the configured group limits"
                ),
                Err(error) => {
                    warn!(
                        group = self.group_id,
                        term, "installing group limits failed: {error}"
                    );
                    return;
                }
            }
        }
        if let Ok(mut clock) = self.leader_clock.lock() {
            if clock.term == term {
                clock.base_log_ms = base_log_ms;
                clock.ready = true;
                debug!(group = self.group_id, term, base_log_ms, "leader ready");
                self.ready_term.send_replace(term);
            }
        }
    }

    fn still_leading(&self, term: u64) -> bool {
        self.leader_clock
            .lock()
            .map(|clock| clock.term == term)
            .unwrap_or(false)
    }
}

fn record_reclaimed(output: &ApplyOutput) {
    if !output.reclaimed.is_empty() {
        ::metrics::counter!(m::EXPIRATIONS_TOTAL).increment(output.reclaimed.len() as u64);
        let session_bound = output
            .reclaimed
            .iter()
            .filter(|lease| lease.session_id.is_some())
            .count();
        if session_bound > 0 {
            ::metrics::counter!(m::SESSION_LEASES_ENDED_TOTAL).increment(session_bound as u64);
        }
    }
}

async fn watch_leadership(handle: Arc<GroupHandle>) {
    let mut server_metrics = handle.raft.server_metrics();
    loop {
        let (state, leader) = {
            let metrics = server_metrics.borrow_watched();
            (metrics.state, metrics.current_leader)
        };
        let term = handle.raft.metrics().borrow_watched().current_term;
        handle.set_leader_view(LeaderView { leader, term });
        let leading = state == ServerState::Leader && leader == Some(handle.node_id);
        let mut start_ready = false;
        if let Ok(mut clock) = handle.leader_clock.lock() {
            if leading && clock.term != term {
                *clock = LeaderClock {
                    term,
                    took_over_ms: handle.clock.now_ms(),
                    base_log_ms: 0,
                    ready: false,
                };
                start_ready = true;
            } else if !leading && clock.term != 0 {
                *clock = LeaderClock::default();
            }
        }
        if start_ready {
            info!(group = handle.group_id, term, "became leader");
            tokio::spawn(handle.clone().become_ready(term));
        }
        if server_metrics.changed().await.is_err() {
            return;
        }
    }
}

async fn run_proposer(
    handle: Arc<GroupHandle>,
    mut receiver: mpsc::Receiver<Proposal>,
    mut stop: watch::Receiver<bool>,
) {
    let inflight = Arc::new(Semaphore::new(
        handle.settings.proposals_inflight_max.max(1),
    ));
    let ops_max = handle.settings.ops_per_entry_max.max(1);
    let mut carried: Option<Proposal> = None;
    loop {
        let first = match carried.take() {
            Some(proposal) => proposal,
            None => tokio::select! {
                received = receiver.recv() => match received {
                    Some(proposal) => proposal,
                    None => return,
                },
                _ = stop.wait_for(|stopped| *stopped) => return,
            },
        };
        // Waiting for a slot lets more operations queue up behind `first`: the batch grows
        // with the load.
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            return;
        };
        let mut ops_count = first.ops.len();
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while ops_count < ops_max {
            match receiver.try_recv() {
                Ok(next) => {
                    if ops_count + next.ops.len() > ops_max || bytes + next.bytes > ENTRY_BYTES_MAX
                    {
                        carried = Some(next);
                        break;
                    }
                    ops_count += next.ops.len();
                    bytes += next.bytes;
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        // Invariant: the entry fits the bounds its readers rely on. The state machine refuses
        // an entry of more than `batch_items_max` operations whole, and the transport's frame
        // holds `append_entries_max` entries of `ENTRY_BYTES_MAX` (`limits::check_relations`).
        // `propose` and the request path refuse larger proposals, so only a bug gets here.
        assert!(
            ops_count <= handle.settings.desired_limits.batch_items_max as usize
                && bytes <= ENTRY_BYTES_MAX,
            "entry bounds broken: group {} packed {ops_count} operations of about {bytes} bytes",
            handle.group_id
        );
        let Some(now) = handle.log_now_ms() else {
            let error = handle.not_leader();
            for proposal in batch {
                let _ = proposal.reply.send(Err(error.clone()));
            }
            continue;
        };
        let mut counts = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        let mut ops = Vec::with_capacity(ops_count);
        for proposal in batch {
            counts.push(proposal.ops.len());
            replies.push(proposal.reply);
            ops.extend(proposal.ops);
        }
        let command = if ops.len() == 1 {
            match ops.pop() {
                Some(op) => Command::Lease(op),
                None => continue,
            }
        } else {
            Command::Batch(ops)
        };
        ::metrics::counter!(m::RAFT_PROPOSALS_TOTAL).increment(1);
        ::metrics::counter!(m::RAFT_PROPOSED_OPS_TOTAL).increment(ops_count as u64);
        ::metrics::histogram!(m::RAFT_OPS_PER_ENTRY).record(ops_count as f64);
        let group_id = handle.group_id;
        let proposed = std::time::Instant::now();
        let (responder, answer) = ProgressResponder::complete_only();
        // Submitted here, by the proposer itself: entries reach the log in the order their log
        // times were stamped, while the commits of up to `proposals_inflight_max` of them are
        // awaited concurrently (a spawned `client_write` per entry could reach Raft out of order).
        let entry = Entry {
            log_time_ms: now,
            command,
        };
        if let Err(fatal) = handle.raft.client_write_ff(entry, Some(responder)).await {
            drop(permit);
            distribute(
                Err(unavailable(format!("proposal failed: {fatal}"))),
                counts,
                replies,
            );
            continue;
        }
        tokio::spawn(async move {
            let result = answer.await;
            drop(permit);
            let outcomes = match result {
                Ok(Ok(response)) => {
                    ::metrics::counter!(m::RAFT_COMMITS_TOTAL).increment(1);
                    ::metrics::histogram!(m::COMMIT_DURATION_SECONDS)
                        .record(proposed.elapsed().as_secs_f64());
                    outcomes_of(group_id, response.data)
                }
                Ok(Err(error)) => Err(write_error(group_id, error)),
                Err(_) => Err(unavailable(
                    "the proposal was dropped before it was answered",
                )),
            };
            distribute(outcomes, counts, replies);
        });
    }
}

/// The wire error for a write Raft refused or could not finish. An entry discarded at a leader
/// change may still commit through another leader: the caller's retry with the same request id
/// finds its outcome.
/// A failed Raft write as the wire error a client retries on (`NOT_LEADER` with the leader
/// when it moved) or sees (`UNAVAILABLE`).
pub(crate) fn write_error(group_id: u32, error: ClientWriteError<TenureRaft>) -> WireError {
    match error {
        ClientWriteError::ForwardToLeader(forward)
        | ClientWriteError::LogEntryDiscarded(forward) => not_leader(group_id, forward.leader_id),
        other => unavailable(format!("proposal failed: {other}")),
    }
}

fn outcomes_of(group_id: u32, data: Option<ApplyOutput>) -> Result<Vec<LeaseOutcome>, WireError> {
    let Some(output) = data else {
        return Err(WireError::new(
            ErrorCode::Internal,
            format!("group {group_id} applied a lease entry without an output"),
        ));
    };
    record_reclaimed(&output);
    match output.result {
        CommandResult::Lease(outcome) => Ok(vec![outcome]),
        CommandResult::Batch(Ok(outcomes)) => Ok(outcomes),
        CommandResult::Batch(Err(error)) => Err(WireError::from_lease_error(error)),
        other => Err(WireError::new(
            ErrorCode::Internal,
            format!("group {group_id}: unexpected result {other:?} for a lease entry"),
        )),
    }
}

fn distribute(
    outcomes: Result<Vec<LeaseOutcome>, WireError>,
    counts: Vec<usize>,
    replies: Vec<oneshot::Sender<Result<Vec<LeaseOutcome>, WireError>>>,
) {
    match outcomes {
        Ok(outcomes) => {
            let total: usize = counts.iter().sum();
            if outcomes.len() != total {
                let error = WireError::new(
                    ErrorCode::Internal,
                    format!("{} outcomes for {total} operations", outcomes.len()),
                );
                for reply in replies {
                    let _ = reply.send(Err(error.clone()));
                }
                return;
            }
            let mut outcomes = outcomes.into_iter();
            for (count, reply) in counts.into_iter().zip(replies) {
                let part: Vec<LeaseOutcome> = outcomes.by_ref().take(count).collect();
                let _ = reply.send(Ok(part));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}
