//! The leader-election recipe: [`Election`] (campaign, read and observe the leader of one
//! resource), [`Leadership`] (a won election: fencing token, auto-renewed lease, `proclaim`,
//! `resign`), [`Leader`] and [`LeaderWatch`].
//!
//! An election is one resource; its leader is the holder of the resource's lease. Leases carry
//! no value of their own, so the leader's value travels in the holder id:
//! `{candidate_id}#{value}` ([`Election::holder_id`] and [`Election::parse_holder_id`] are the
//! one place that encodes and decodes it). Candidates wait in the resource's FIFO queue
//! (`Client::acquire_wait`): no polling, and when a leader resigns or its lease expires the
//! first waiter is granted in the same apply. A proclaim is a Transfer of the lease to the same
//! candidate with the new value: leadership has no gap, and the fencing token rises.
//!
//! Must not depend on: the server (only the native protocol), nor the renewer's internals (it
//! uses `Lease` handles and the client's public calls).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::Stream;
use tenure_core::{
    LeaseId, LeaseStatus, LeaseView, ReleaseReceipt, ResourceKey, WatchEventKind, WatchSelector,
};

use crate::client::Client;
use crate::error::ClientError;
use crate::handle::LeaseState;
use crate::lease::{Lease, refused_without_effect};
use crate::wait::WaitOptions;
use crate::watch::{Watch, WatchFrom, WatchItem, WatchOptions};

/// The character between the candidate id and the value in an election's holder id.
const SEPARATOR: char = '#';

/// Items a [`LeaderWatch`] buffers before its poll pauses (one resource: few events).
const OBSERVE_BUFFER_ITEMS: usize = 64;

/// One election: a resource of a tenant whose lease holder is the leader.
///
/// ```no_run
/// # async fn example(client: tenure_client::Client) -> Result<(), tenure_client::ClientError> {
/// use std::time::Duration;
/// use tenure_client::Election;
///
/// let election = Election::new(&client, "acme", "election/reports");
/// // Waits in the resource's FIFO queue for up to a minute.
/// let leadership = election
///     .campaign("host-a", "10.0.0.7:8080", Duration::from_secs(10), Duration::from_secs(60))
///     .await?;
/// // ... lead, passing leadership.fencing_token() to every system written to ...
/// leadership.resign().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    key: ResourceKey,
}

/// Options of [`Election::campaign_with`].
#[derive(Debug, Clone)]
pub struct CampaignOptions {
    /// Who campaigns: non-empty, without `#`.
    pub candidate_id: String,
    /// The value the leader announces (an address, say); may be empty. `candidate_id#value` is
    /// at most 128 bytes, without control characters or surrounding whitespace.
    pub value: String,
    /// The lease's ttl: how long a leader that dies without resigning keeps the others waiting.
    pub ttl: Duration,
    /// How long to wait in the queue at most (at least 1 ms, at most the tenant's largest ttl).
    pub wait: Duration,
    /// The wait's request id; `None` generates one. With an id of its own, a caller can
    /// withdraw the candidacy from elsewhere ([`Election::withdraw`]) or retry the same wait.
    pub request_id: Option<String>,
}

impl CampaignOptions {
    /// Options with a generated request id.
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = tenure_client::CampaignOptions::new(
    ///     "host-a", "10.0.0.7:8080", Duration::from_secs(10), Duration::from_secs(60),
    /// );
    /// assert!(options.request_id.is_none());
    /// ```
    pub fn new(
        candidate_id: impl Into<String>,
        value: impl Into<String>,
        ttl: Duration,
        wait: Duration,
    ) -> Self {
        CampaignOptions {
            candidate_id: candidate_id.into(),
            value: value.into(),
            ttl,
            wait,
            request_id: None,
        }
    }
}

/// The leader of an election, as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leading candidate (the whole holder id when it is not of the form `candidate#value`,
    /// i.e. the resource was taken outside the recipe).
    pub candidate_id: String,
    /// Its value (empty for a holder id without `#`).
    pub value: String,
    /// The fencing token of its lease.
    pub fencing_token: u64,
    /// Its lease.
    pub lease_id: LeaseId,
}

impl Leader {
    /// The leader a lease view names: `None` unless the lease is active with time left.
    fn from_view(view: &LeaseView) -> Option<Leader> {
        if view.status != LeaseStatus::Active || view.remaining_ttl_ms == 0 {
            return None;
        }
        Some(Leader::from_holder(
            &view.holder_id,
            view.fencing_token,
            view.lease_id,
        ))
    }

    fn from_holder(holder_id: &str, fencing_token: u64, lease_id: LeaseId) -> Leader {
        let (candidate_id, value) = Election::parse_holder_id(holder_id);
        Leader {
            candidate_id: candidate_id.to_owned(),
            value: value.to_owned(),
            fencing_token,
            lease_id,
        }
    }
}

impl Election {
    /// The election `name` (a resource id) of `tenant_id`, through `client` (cloned: clones
    /// share connections).
    ///
    /// ```no_run
    /// # fn example(client: &tenure_client::Client) {
    /// let election = tenure_client::Election::new(client, "acme", "election/reports");
    /// assert_eq!(election.key().resource_id, "election/reports");
    /// # }
    /// ```
    pub fn new(client: &Client, tenant_id: impl Into<String>, name: impl Into<String>) -> Self {
        Election {
            client: client.clone(),
            key: ResourceKey::new(tenant_id, name),
        }
    }

    /// The election's resource.
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// The holder id a candidate campaigns with: `{candidate_id}#{value}`. `INVALID_REQUEST`
    /// (before anything is sent) when the candidate id is empty, contains `#`, or has
    /// surrounding whitespace or control characters, or when the holder id is not a valid
    /// holder id (at most 128 bytes, trimmed, no control characters).
    ///
    /// ```
    /// use tenure_client::Election;
    /// assert_eq!(Election::holder_id("host-a", "10.0.0.7").unwrap(), "host-a#10.0.0.7");
    /// assert!(Election::holder_id("a#b", "v").is_err());
    /// assert_eq!(Election::parse_holder_id("host-a#x#y"), ("host-a", "x#y"));
    /// ```
    pub fn holder_id(candidate_id: &str, value: &str) -> Result<String, ClientError> {
        let invalid = |what: String| ClientError::InvalidRequest(what);
        tenure_core::validate_holder_id(candidate_id)
            .map_err(|error| invalid(format!("candidate_id: {error}")))?;
        if candidate_id.contains(SEPARATOR) {
            return Err(invalid(format!(
                "candidate_id {candidate_id:?} must not contain '{SEPARATOR}'"
            )));
        }
        let holder_id = format!("{candidate_id}{SEPARATOR}{value}");
        tenure_core::validate_holder_id(&holder_id).map_err(|error| {
            invalid(format!(
                "the election's holder id (candidate_id{SEPARATOR}value): {error}"
            ))
        })?;
        Ok(holder_id)
    }

    /// The candidate id and the value of an election's holder id: split at the first `#` (a
    /// candidate id has none; a value may). A holder id without `#` is all candidate, with an
    /// empty value.
    ///
    /// ```
    /// assert_eq!(tenure_client::Election::parse_holder_id("a#"), ("a", ""));
    /// assert_eq!(tenure_client::Election::parse_holder_id("plain"), ("plain", ""));
    /// ```
    pub fn parse_holder_id(holder_id: &str) -> (&str, &str) {
        holder_id.split_once(SEPARATOR).unwrap_or((holder_id, ""))
    }

    /// Campaigns as `candidate_id` with `value`: waits up to `wait` in the resource's FIFO queue
    /// (parked on the server: no polling, no herd), then returns the [`Leadership`], whose lease
    /// the client renews by itself. See [`Election::campaign_with`].
    ///
    /// ```no_run
    /// # async fn example(election: tenure_client::Election) -> Result<(), tenure_client::ClientError> {
    /// use std::time::Duration;
    /// match election
    ///     .campaign("host-a", "10.0.0.7:8080", Duration::from_secs(10), Duration::from_secs(5))
    ///     .await
    /// {
    ///     Ok(leadership) => println!("elected with token {}", leadership.fencing_token()),
    ///     Err(error) if tenure_client::is_wait_ended(&error) => println!("not elected in time"),
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn campaign(
        &self,
        candidate_id: &str,
        value: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Leadership, ClientError> {
        self.campaign_with(CampaignOptions::new(candidate_id, value, ttl, wait))
            .await
    }

    /// Campaigns with explicit options. Errors: `INVALID_REQUEST` for a bad candidate id or
    /// value (see [`Election::holder_id`]); when the wait runs out, the wait-ended error
    /// ([`crate::is_wait_ended`]: code `ALREADY_HELD`, the candidacy withdrawn); `ALREADY_HELD`
    /// without a wait end when this very holder id (candidate and value) leads already;
    /// `QUOTA_EXCEEDED` when the queue is full. Dropping the future withdraws the candidacy in
    /// the background (a grant that beat the withdrawal is released).
    ///
    /// ```no_run
    /// # async fn example(election: tenure_client::Election) -> Result<(), tenure_client::ClientError> {
    /// use std::time::Duration;
    /// let mut options = tenure_client::CampaignOptions::new(
    ///     "host-a", "10.0.0.7:8080", Duration::from_secs(10), Duration::from_secs(600),
    /// );
    /// options.request_id = Some("host-a-campaign-1".into());
    /// let leadership = election.campaign_with(options).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn campaign_with(&self, options: CampaignOptions) -> Result<Leadership, ClientError> {
        let holder_id = Election::holder_id(&options.candidate_id, &options.value)?;
        let mut wait = WaitOptions::new(
            self.key.tenant_id.clone(),
            self.key.resource_id.clone(),
            holder_id,
            options.ttl,
            options.wait,
        );
        wait.request_id = options.request_id;
        let lease = self.client.acquire_wait_lease(wait).await?;
        Ok(Leadership {
            client: self.client.clone(),
            lease,
            candidate_id: options.candidate_id,
            value: options.value,
        })
    }

    /// Withdraws a candidacy started with `options` (which must name its `request_id`) from
    /// anywhere: its wait leaves the queue. A grant that arrived before the withdrawal is
    /// released, so only withdraw a candidacy whose campaign did not return a [`Leadership`]
    /// (a leader resigns instead). `INVALID_REQUEST` without a request id.
    ///
    /// ```no_run
    /// # async fn example(election: tenure_client::Election, options: tenure_client::CampaignOptions) -> Result<(), tenure_client::ClientError> {
    /// election.withdraw(&options).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn withdraw(&self, options: &CampaignOptions) -> Result<(), ClientError> {
        let Some(request_id) = options.request_id.as_deref() else {
            return Err(ClientError::InvalidRequest(
                "withdrawing a candidacy needs its request_id".into(),
            ));
        };
        let holder_id = Election::holder_id(&options.candidate_id, &options.value)?;
        let receipt = self
            .client
            .cancel_wait(&self.key, &holder_id, request_id)
            .await?;
        if let Some(grant) = receipt.granted {
            match self
                .client
                .release(self.key.clone(), grant.lease_id, holder_id, None)
                .await
            {
                // Released already (by the campaign's own withdrawal, say): nothing held.
                Err(error) if !error.is_lease_gone() => return Err(error),
                _ => {}
            }
        }
        Ok(())
    }

    /// The current leader, from a linearizable read of the resource; `None` when nobody leads
    /// (no lease, or it expired or was released).
    ///
    /// ```no_run
    /// # async fn example(election: tenure_client::Election) -> Result<(), tenure_client::ClientError> {
    /// if let Some(leader) = election.leader().await? {
    ///     println!("{} leads at {} (token {})", leader.candidate_id, leader.value, leader.fencing_token);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn leader(&self) -> Result<Option<Leader>, ClientError> {
        Ok(self
            .client
            .get(&self.key)
            .await?
            .view
            .as_ref()
            .and_then(Leader::from_view))
    }

    /// Observes the leader: a [`LeaderWatch`] that yields the leader when it starts, then every
    /// change (`Some` when a candidate is elected or proclaims, `None` when the leader resigns
    /// or its lease expires without a waiter to take over), on one long-polling watch of the
    /// resource. Dropping it stops the polls.
    ///
    /// ```no_run
    /// # async fn example(election: tenure_client::Election) -> Result<(), tenure_client::ClientError> {
    /// let mut leaders = election.observe().await?;
    /// loop {
    ///     match leaders.changed().await? {
    ///         Some(leader) => println!("leader: {} at {}", leader.candidate_id, leader.value),
    ///         None => println!("no leader"),
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn observe(&self) -> Result<LeaderWatch, ClientError> {
        let watch = self
            .client
            .watch(
                WatchSelector::Resource(self.key.clone()),
                WatchFrom::Now,
                WatchOptions {
                    buffer_items: OBSERVE_BUFFER_ITEMS,
                    ..WatchOptions::default()
                },
            )
            .await?;
        Ok(LeaderWatch {
            watch,
            states: LeaderStates::default(),
        })
    }
}

/// A won election: the leader's auto-renewed lease and its value. Lead only while
/// [`Leadership::is_valid`], and pass [`Leadership::fencing_token`] to every system written to.
///
/// Dropping it without [`Leadership::resign`] is dropping its [`Lease`]: renewal stops and the
/// lease is released in the background (best effort), so the next candidate is elected at once;
/// if that release does not get through, at the end of the ttl.
///
/// ```no_run
/// # async fn example(election: tenure_client::Election) -> Result<(), tenure_client::ClientError> {
/// use std::time::Duration;
/// let mut leadership = election
///     .campaign("host-a", "v1", Duration::from_secs(10), Duration::from_secs(60))
///     .await?;
/// tokio::select! {
///     state = leadership.lost() => println!("leadership lost: {state:?}"),
///     () = tokio::time::sleep(Duration::from_secs(30)) => {
///         leadership.proclaim("v2").await?;
///         leadership.resign().await?;
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Leadership {
    client: Client,
    lease: Lease,
    candidate_id: String,
    value: String,
}

impl Leadership {
    /// The leading candidate.
    pub fn candidate_id(&self) -> &str {
        &self.candidate_id
    }

    /// The value announced (the last one proclaimed).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The fencing token of the current lease. A [`Leadership::proclaim`] replaces the lease,
    /// so it returns a larger token afterwards, and the one before is stale (downstream systems
    /// refuse it once they have seen the new one).
    pub fn fencing_token(&self) -> u64 {
        self.lease.fencing_token()
    }

    /// The current lease (replaced by each proclaim).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Until when the leader may act (the lease's safe deadline, contract section 5).
    pub fn safe_deadline(&self) -> Instant {
        self.lease.safe_deadline()
    }

    /// True while the lease is held and its safe deadline has not passed: the leader may act.
    pub fn is_valid(&self) -> bool {
        self.lease.is_valid()
    }

    /// Resolves when the leadership is lost (a renewal refused, or none confirmed before the
    /// safe deadline) or ended, with the lease's final state.
    pub async fn lost(&self) -> LeaseState {
        self.lease.lost().await
    }

    /// Announces `value` as the leader's new value: the lease is transferred to the holder id
    /// `{candidate}#{value}` in one log entry, so there is no moment without a leader and no
    /// waiter can take over. The new lease has a new id and a **larger fencing token**, which
    /// [`Leadership::fencing_token`] returns from now on (the old token is stale); its ttl is
    /// the current one, counted from the proclaim. A receiver taken from [`Lease::watch`]
    /// before the proclaim ends with `Released`: take a new one.
    ///
    /// On `INVALID_REQUEST` (a bad value) or a refusal that changed nothing, the leadership is
    /// unchanged. When the lease was gone (`LEASE_EXPIRED`, `LEASE_MISMATCH`, `NOT_FOUND`) the
    /// leadership is lost ([`Leadership::lost`] resolves). When no answer came, the cluster is
    /// read: if the transfer was applied, the new lease is taken over and the call succeeds;
    /// otherwise the error is returned with the old lease still held and renewed (or lost, if
    /// the transfer is applied later).
    ///
    /// ```no_run
    /// # async fn example(mut leadership: tenure_client::Leadership) -> Result<(), tenure_client::ClientError> {
    /// let before = leadership.fencing_token();
    /// leadership.proclaim("10.0.0.8:8080").await?;
    /// assert!(leadership.fencing_token() > before);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn proclaim(&mut self, value: &str) -> Result<(), ClientError> {
        let new_holder_id = Election::holder_id(&self.candidate_id, value)?;
        let key = self.lease.key().clone();
        let ttl = self.lease.ttl();
        let transferred = self
            .client
            .transfer(
                key.clone(),
                self.lease.lease_id(),
                self.lease.holder_id().to_owned(),
                new_holder_id.clone(),
                ttl,
                None,
            )
            .await;
        let new_lease = match transferred {
            Ok(transferred) => self.client.adopt_grant(transferred.grant).await,
            Err(error) if refused_without_effect(&error) || error.is_lease_gone() => {
                return Err(error);
            }
            // No definite answer: the transfer may have been applied.
            Err(error) => match self.client.adopt(key, new_holder_id, ttl).await {
                Ok(lease) => lease,
                Err(_) => return Err(error),
            },
        };
        // The old lease ended with the transfer: stop tracking it without a release.
        let _ = std::mem::replace(&mut self.lease, new_lease).detach();
        self.value = value.to_owned();
        Ok(())
    }

    /// Resigns: releases the lease; the first waiting candidate is elected in the same apply.
    ///
    /// ```no_run
    /// # async fn example(leadership: tenure_client::Leadership) -> Result<(), tenure_client::ClientError> {
    /// let receipt = leadership.resign().await?;
    /// println!("resigned at log time {} ms", receipt.released_at_ms);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn resign(self) -> Result<ReleaseReceipt, ClientError> {
        self.lease.release().await
    }
}

/// The leader of an election as it changes ([`Election::observe`]): first the leader when the
/// watch started, then one item per change, each the state after a whole log entry (a proclaim
/// or a hand-off to the next candidate is one change, never a `None` in between). A watcher
/// that fell behind the server's retained window is given the state then (a resync): changes in
/// between may be skipped, never reported out of order. Also a [`Stream`] of the same items.
///
/// ```no_run
/// # async fn example(election: tenure_client::Election) -> Result<(), tenure_client::ClientError> {
/// let mut leaders = election.observe().await?;
/// let first = leaders.changed().await?;
/// println!("leader now: {first:?}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LeaderWatch {
    watch: Watch,
    states: LeaderStates,
}

impl LeaderWatch {
    /// The next state of the leader (`None`: nobody leads). [`ClientError::Closed`] once the
    /// watch has ended (after an error it yielded, or when the client was closed).
    ///
    /// ```no_run
    /// # async fn example(mut leaders: tenure_client::LeaderWatch) -> Result<(), tenure_client::ClientError> {
    /// while let Some(leader) = leaders.changed().await? {
    ///     println!("{} leads", leader.candidate_id);
    /// }
    /// println!("nobody leads");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn changed(&mut self) -> Result<Option<Leader>, ClientError> {
        use futures_util::StreamExt as _;
        match self.next().await {
            Some(item) => item,
            None => Err(ClientError::Closed),
        }
    }

    /// The last state yielded: `None` before the first, or when nobody led then.
    pub fn current(&self) -> Option<&Leader> {
        self.states.yielded.as_ref().and_then(Option::as_ref)
    }
}

/// The leader states a [`LeaderWatch`] derives from its watch's items: the state after each
/// log entry, queued when it differs from the last one queued.
#[derive(Debug, Default)]
struct LeaderStates {
    /// The last state yielded to the caller (`None` before the first).
    yielded: Option<Option<Leader>>,
    /// The last state queued (what the next change is compared with).
    queued: Option<Option<Leader>>,
    /// The log index of the entry whose events are being gathered.
    entry: Option<u64>,
    /// The state after the events gathered so far.
    working: Option<Leader>,
    /// States to yield, oldest first (at most one per entry of a page).
    ready: VecDeque<Option<Leader>>,
}

impl LeaderStates {
    /// The next state to yield, if one is ready.
    fn pop(&mut self) -> Option<Option<Leader>> {
        let state = self.ready.pop_front()?;
        self.yielded = Some(state.clone());
        Some(state)
    }

    /// Queues the working state if it differs from the last one queued.
    fn queue_if_changed(&mut self) {
        if self.queued.as_ref() != Some(&self.working) {
            self.queued = Some(self.working.clone());
            self.ready.push_back(self.working.clone());
        }
    }

    /// Ends the entry being gathered, if any.
    fn end_entry(&mut self) {
        if self.entry.take().is_some() {
            self.queue_if_changed();
        }
    }

    /// Takes in one watch item.
    fn absorb(&mut self, item: WatchItem) {
        match item {
            WatchItem::Started { current, .. } | WatchItem::Resync { current, .. } => {
                self.end_entry();
                self.working = current.as_ref().and_then(Leader::from_view);
                self.queue_if_changed();
            }
            WatchItem::Event(event) => {
                if self.entry.is_some_and(|index| index != event.index) {
                    self.end_entry();
                }
                self.entry = Some(event.index);
                match event.kind {
                    WatchEventKind::Acquired {
                        holder_id,
                        lease_id,
                        fencing_token,
                        ..
                    }
                    | WatchEventKind::HandedOff {
                        holder_id,
                        lease_id,
                        fencing_token,
                        ..
                    } => {
                        self.working =
                            Some(Leader::from_holder(&holder_id, fencing_token, lease_id));
                    }
                    WatchEventKind::Released { lease_id, .. }
                    | WatchEventKind::Expired { lease_id, .. } => {
                        if self
                            .working
                            .as_ref()
                            .is_some_and(|leader| leader.lease_id == lease_id)
                        {
                            self.working = None;
                        }
                    }
                }
            }
            WatchItem::Through { .. } => self.end_entry(),
        }
    }
}

impl Stream for LeaderWatch {
    type Item = Result<Option<Leader>, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(state) = this.states.pop() {
                return Poll::Ready(Some(Ok(state)));
            }
            match Pin::new(&mut this.watch).poll_next(cx) {
                Poll::Ready(Some(Ok(item))) => this.states.absorb(item),
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_encode_and_parse() {
        assert_eq!(Election::holder_id("a", "v").unwrap(), "a#v");
        assert_eq!(Election::holder_id("a", "").unwrap(), "a#");
        assert_eq!(Election::holder_id("a", "x#y").unwrap(), "a#x#y");
        assert_eq!(Election::parse_holder_id("a#x#y"), ("a", "x#y"));
        assert_eq!(Election::parse_holder_id("a#"), ("a", ""));
        assert_eq!(Election::parse_holder_id("plain"), ("plain", ""));
        for (candidate, value) in [
            ("", "v"),
            ("a#b", "v"),
            (" a", "v"),
            ("a", "v "),
            ("a", "line\nbreak"),
            ("a", &"v".repeat(127)),
        ] {
            let error = Election::holder_id(candidate, value).unwrap_err();
            assert!(
                matches!(error, ClientError::InvalidRequest(_)),
                "{candidate:?} {value:?}: {error}"
            );
        }
        // 128 bytes in all is the limit.
        assert!(Election::holder_id("a", &"v".repeat(126)).is_ok());
    }

    fn lease(token: u64) -> LeaseId {
        LeaseId {
            group_id: tenure_core::GroupId(0),
            sequence: token,
        }
    }

    fn event(index: u64, kind: WatchEventKind) -> WatchItem {
        WatchItem::Event(tenure_core::WatchEvent {
            group_id: 0,
            index,
            log_time_ms: index,
            key: ResourceKey::new("t", "e"),
            kind,
        })
    }

    fn acquired(holder: &str, token: u64) -> WatchEventKind {
        WatchEventKind::Acquired {
            holder_id: holder.into(),
            lease_id: lease(token),
            fencing_token: token,
            expires_at_ms: 0,
            session_id: None,
        }
    }

    fn released(holder: &str, token: u64) -> WatchEventKind {
        WatchEventKind::Released {
            holder_id: holder.into(),
            lease_id: lease(token),
            fencing_token: token,
        }
    }

    fn leader(candidate: &str, value: &str, token: u64) -> Option<Leader> {
        Some(Leader {
            candidate_id: candidate.into(),
            value: value.into(),
            fencing_token: token,
            lease_id: lease(token),
        })
    }

    fn drain(states: &mut LeaderStates) -> Vec<Option<Leader>> {
        std::iter::from_fn(|| states.pop()).collect()
    }

    #[test]
    fn one_state_per_entry_and_only_changes() {
        let mut states = LeaderStates::default();
        states.absorb(WatchItem::Started {
            group_id: 0,
            through_index: 1,
            current: None,
        });
        assert_eq!(
            drain(&mut states),
            vec![None],
            "the first state is always yielded"
        );
        // One page: an election (entry 2), a proclaim (entry 3: released + acquired), a
        // resignation handed to the next waiter (entry 4), a release without a waiter (5).
        states.absorb(event(2, acquired("a#v1", 2)));
        states.absorb(event(3, released("a#v1", 2)));
        states.absorb(event(3, acquired("a#v2", 3)));
        states.absorb(event(4, released("a#v2", 3)));
        states.absorb(event(
            4,
            WatchEventKind::HandedOff {
                holder_id: "b#w".into(),
                lease_id: lease(4),
                fencing_token: 4,
                expires_at_ms: 0,
                previous_fencing_token: Some(3),
            },
        ));
        states.absorb(event(5, released("b#w", 4)));
        // Each entry's state is ready once a later entry begins; the last one's at the page's
        // end (its Through).
        assert_eq!(
            drain(&mut states),
            vec![
                leader("a", "v1", 2),
                leader("a", "v2", 3),
                leader("b", "w", 4)
            ]
        );
        states.absorb(WatchItem::Through {
            group_id: 0,
            index: 5,
        });
        assert_eq!(drain(&mut states), vec![None]);
        // The end of a lease that is not the leader's changes nothing; an empty page neither.
        states.absorb(event(
            6,
            WatchEventKind::Expired {
                lease_id: lease(1),
                fencing_token: 1,
                expired_at_ms: 6,
                reason: tenure_core::ExpiryReason::Ttl,
            },
        ));
        states.absorb(WatchItem::Through {
            group_id: 0,
            index: 7,
        });
        assert_eq!(drain(&mut states), vec![]);
        // A resync gives the state then, if it changed.
        let view = |status| LeaseView {
            key: ResourceKey::new("t", "e"),
            lease_id: lease(9),
            holder_id: "c#z".into(),
            status,
            fencing_token: 9,
            expires_at_ms: 100,
            remaining_ttl_ms: if status == LeaseStatus::Active { 50 } else { 0 },
            ttl_ms: 100,
            version: 1,
            session_id: None,
        };
        states.absorb(WatchItem::Resync {
            group_id: 0,
            through_index: 20,
            current: Some(view(LeaseStatus::Active)),
        });
        assert_eq!(drain(&mut states), vec![leader("c", "z", 9)]);
        states.absorb(WatchItem::Resync {
            group_id: 0,
            through_index: 21,
            current: Some(view(LeaseStatus::Active)),
        });
        assert_eq!(drain(&mut states), vec![]);
        states.absorb(WatchItem::Resync {
            group_id: 0,
            through_index: 22,
            current: Some(view(LeaseStatus::Expired)),
        });
        assert_eq!(drain(&mut states), vec![None]);
    }
}
