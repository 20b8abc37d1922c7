//! `expiry` with sessions: K leases acquired in S sessions end together when the sessions do,
//! while background traffic runs. It reports how long the nodes took to end every one of them
//! (from their own counter of bound leases reclaimed, `tenure_session_leases_ended_total`),
//! the background's p99 while they did (and for 3 s after, while operations sent meanwhile are
//! answered) against its p99 in the 3 s before, and checks on a sample that the resources are
//! free to a new holder afterwards. The background is the mixed workload of the target's
//! tenant; the session leases belong to the tenant `<tenant>-sessions`.
//!
//! Two ways to end the sessions: `expire` (the default) stops the keep-alives, sends one last
//! keep-alive to every (session, group) record at the same moment so they all expire together,
//! and waits for the ttl; `close` closes every record at once.
//!
//! Must not depend on: any server crate; the nodes are seen through the client library and
//! their metrics endpoints only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenure_client::{AcquireOptions, Client, Session, SessionId};

use super::{Background, LoadConfig, Recorder, RunOutcome, ScenarioError, phase_figures};
use crate::node_metrics::NodeMetrics;
use crate::stats::{IntervalSample, LOG_BUCKET_RATIO};

/// The nodes' counter of bound leases ended with their session.
const SESSION_LEASES_ENDED: &str = "tenure_session_leases_ended_total";
/// How often the counter is read while the leases end.
const POLL_EVERY: Duration = Duration::from_millis(25);
/// Between the acquire phase and the "before" window.
const SETTLE: Duration = Duration::from_secs(5);
/// Background traffic with every lease held, before the sessions end: the "before" window.
const BEFORE_WINDOW: Duration = Duration::from_secs(3);
/// How long the "during" window runs on after the last lease ended.
const AFTERMATH: Duration = Duration::from_secs(3);
/// Resources acquired by a new holder after the end, to check they are free (evenly spaced over
/// the leases).
const FREE_CHECK_SAMPLE: usize = 1_000;
/// Points of the ended-leases curve kept for the report.
const CURVE_POINTS_MAX: usize = 4_000;

/// How the sessions end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionEnd {
    /// Keep-alives stop; every record expires a ttl after one last keep-alive sent to all.
    Expire,
    /// Every record is closed at once.
    Close,
}

/// One (session, group) record to end.
struct Record {
    session_id: SessionId,
    owner_id: String,
    group_id: u32,
}

/// When the records ended, as far as the client can tell: not before `earliest`, not after
/// `latest`.
struct EndWindow {
    earliest: Instant,
    latest: Instant,
    refused: u64,
    errors: Vec<String>,
}

pub(super) async fn run_session_expiry(
    target: Arc<super::Target>,
    config: &LoadConfig,
) -> Result<RunOutcome, ScenarioError> {
    let Some(client) = target.tenure_client().cloned() else {
        return Err(ScenarioError::Config(
            "expiry with sessions needs the tenure target (the native client library)".into(),
        ));
    };
    if config.node_metrics_urls.is_empty() {
        return Err(ScenarioError::Config(
            "expiry with sessions reads the nodes' counters: give --cluster (its nodes' HTTP \
             addresses)"
                .into(),
        ));
    }
    let metrics = NodeMetrics::new(&config.node_metrics_urls);
    let ended_at_start = metrics
        .counter_sum(SESSION_LEASES_ENDED)
        .await
        .map_err(|error| ScenarioError::Config(format!("reading the nodes' metrics: {error}")))?;
    let tag = config.run_tag;
    // The session leases belong to a tenant of their own: the background is another tenant's
    // traffic. (Sharing one tenant, the background's randomly chosen renewals, often late,
    // would let the nodes' renewal pressure refuse the tenant's acquires, sessions' included,
    // while the acquire phase loads them: a stall of the workload's making.)
    let tenant = format!("{}-sessions", target.tenure_tenant().unwrap_or_default());
    let start = Instant::now();
    let deadline = start + config.duration;

    // The sessions (nothing is sent before the first acquire).
    let owner = |index: u64| format!("s{tag:08x}-{index}");
    let sessions: Vec<Session> = (0..config.sessions)
        .map(|index| client.session(tenant.clone(), owner(index), config.ttl))
        .collect::<Result<_, _>>()
        .map_err(|error| ScenarioError::Config(format!("session: {error}")))?;
    // Background traffic: the mix, closed loop, a quarter of the workers, for the whole run.
    let Background {
        recorder,
        reporter,
        workers: background_workers,
        tasks: mut background_tasks,
    } = Background::start(&target, config, deadline);

    // Phase 1: the leases, in the sessions (round robin).
    let sessions = Arc::new(sessions);
    let phase_recorder = Arc::new(Recorder::new());
    let acquire_workers = config.workers.saturating_sub(background_workers).max(1);
    let phase_started = Instant::now();
    let held = super::acquire_in_sessions(
        &sessions,
        &phase_recorder,
        acquire_workers,
        config.leases,
        deadline,
        move |index| format!("x{tag:08x}-{index}"),
    )
    .await?;
    let phase_s = phase_started.elapsed().as_secs_f64();
    let acquire_phase = phase_figures(&phase_recorder, phase_s);
    let held_count = held.len() as u64;
    if config.progress {
        eprintln!(
            "expiry: {held_count} leases acquired in {} sessions in {phase_s:.1} s",
            sessions.len()
        );
    }

    // The "before" window: every lease held, the background alone, after a pause that lets
    // the acquire phase's load drain.
    tokio::time::sleep(SETTLE.min(deadline.saturating_duration_since(Instant::now()))).await;
    let before_from = Instant::now();
    tokio::time::sleep_until((before_from + BEFORE_WINDOW).min(deadline).into()).await;
    let before_to = Instant::now();

    // Phase 2: end the sessions together.
    let records: Vec<Record> = sessions
        .iter()
        .enumerate()
        .flat_map(|(index, session)| {
            let session_id = session.id();
            let owner_id = owner(index as u64);
            session
                .groups()
                .into_iter()
                .map(move |(group_id, _)| Record {
                    session_id,
                    owner_id: owner_id.clone(),
                    group_id,
                })
        })
        .collect();
    // At most FREE_CHECK_SAMPLE resources, evenly spaced.
    let sample: Vec<String> = held
        .iter()
        .step_by(held.len().div_ceil(FREE_CHECK_SAMPLE).max(1))
        .map(|(_, lease)| lease.key.resource_id.to_string())
        .collect();
    // Dropping every handle stops the keep-alives; one still in flight lands within this pause.
    drop(held);
    drop(sessions);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A close takes effect as its answer travels back: the counter is watched from before the
    // closes are sent. An expiry comes a ttl after the last keep-alives: it is watched from a
    // little before the earliest moment it may come (a node's clock may run slightly ahead).
    let watch = |from: Instant| {
        tokio::spawn(watch_ended(
            metrics.clone(),
            ended_at_start,
            held_count,
            from,
            deadline,
        ))
    };
    let close_watch = (config.session_end == SessionEnd::Close).then(|| watch(Instant::now()));
    let ended = tokio::time::timeout_at(
        deadline.into(),
        end_records(&client, &tenant, &records, config.session_end),
    )
    .await
    .unwrap_or_else(|_| {
        // Not all answered within the run's bound: reported as refused, the run goes on to
        // its report (the watch then ends at the bound too).
        let now = Instant::now();
        EndWindow {
            earliest: now,
            latest: now,
            refused: records.len() as u64,
            errors: vec!["the sessions could not be ended before the run's bound".into()],
        }
    });
    let (end_earliest, end_latest) = match config.session_end {
        SessionEnd::Expire => (ended.earliest + config.ttl, ended.latest + config.ttl),
        SessionEnd::Close => (ended.earliest, ended.latest),
    };
    if config.progress {
        eprintln!(
            "expiry: {} records {} ({} refused); they end within {:.1} s",
            records.len(),
            match config.session_end {
                SessionEnd::Expire => "kept alive one last time",
                SessionEnd::Close => "closed",
            },
            ended.refused,
            end_latest
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
        );
    }

    // Phase 3: the nodes' counter, until every lease ended (or the run's bound).
    let watcher = match close_watch {
        Some(watcher) => watcher,
        None => watch(
            end_earliest
                .checked_sub(Duration::from_millis(200))
                .unwrap_or(end_earliest),
        ),
    };
    let watched = watcher
        .await
        .map_err(|error| ScenarioError::Worker(error.to_string()))?;
    let (first_ended, all_ended) = (watched.first_ended, watched.all_ended);
    let watch_to = Instant::now();
    // The "during" window runs on for AFTERMATH: operations sent while the leases ended are
    // answered (and counted, by the second they are answered in) up to a few seconds later.
    let during_to = all_ended.unwrap_or(watch_to) + AFTERMATH;
    tokio::time::sleep_until(during_to.min(deadline).into()).await;

    // Phase 4: a sample of the resources taken by a new holder of the sessions' tenant (after
    // the measured window, within the run's bound).
    let free = Arc::new(AtomicU64::new(0));
    let not_free = Arc::new(AtomicU64::new(0));
    let mut checks = tokio::task::JoinSet::new();
    let holder = format!("lg{tag:08x}-after");
    for chunk in sample.chunks(sample.len().div_ceil(acquire_workers.min(64)).max(1)) {
        let chunk = chunk.to_vec();
        let (client, tenant, holder, free, not_free) = (
            client.clone(),
            tenant.clone(),
            holder.clone(),
            free.clone(),
            not_free.clone(),
        );
        let ttl = config.ttl;
        checks.spawn(async move {
            for resource in chunk {
                let options = AcquireOptions::new(tenant.as_str(), resource, holder.as_str(), ttl);
                let acquired =
                    tokio::time::timeout(crate::target::OP_TIMEOUT, client.acquire_grant(options))
                        .await;
                match acquired {
                    Ok(Ok(_)) => free.fetch_add(1, Ordering::Relaxed),
                    Ok(Err(_)) | Err(_) => not_free.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    let all_checked = async { while checks.join_next().await.is_some() {} };
    if tokio::time::timeout_at(deadline.into(), all_checked)
        .await
        .is_err()
    {
        checks.abort_all();
    }

    // Two more seconds of background traffic, then stop it.
    tokio::time::sleep_until(
        (Instant::now() + Duration::from_secs(2))
            .min(deadline)
            .into(),
    )
    .await;
    background_tasks.abort_all();
    while background_tasks.join_next().await.is_some() {}
    let finished = Instant::now();
    let (timeline, measured_s) = reporter.finish(finished).await?;

    let since_start = |at: Instant| at.saturating_duration_since(start).as_secs_f64();
    let before = window(&timeline, since_start(before_from), since_start(before_to));
    let during = window(
        &timeline,
        since_start(end_earliest.min(during_to)),
        since_start(during_to),
    );
    let ratio = match (before["p99_us"].as_u64(), during["p99_us"].as_u64()) {
        (Some(before), Some(during)) if before > 0 => json!(during as f64 / before as f64),
        _ => Value::Null,
    };
    let details = json!({
        "leases": config.leases,
        "sessions": config.sessions,
        "session_tenant": tenant,
        "session_end": config.session_end,
        "ttl_ms": u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
        "acquire_phase": acquire_phase,
        "held": held_count,
        "records": records.len(),
        "records_refused": ended.refused,
        "record_errors": ended.errors,
        "end_window_ms": end_latest.saturating_duration_since(end_earliest).as_secs_f64() * 1000.0,
        "ended": watched.ended,
        "first_ended_after_latest_end_ms": first_ended.map(|at| signed_s(at, end_latest) * 1000.0),
        "all_ended_after_latest_end_ms": all_ended.map(|at| signed_s(at, end_latest) * 1000.0),
        "all_ended_after_earliest_end_ms": all_ended.map(|at| signed_s(at, end_earliest) * 1000.0),
        "ending_took_ms": match (first_ended, all_ended) {
            (Some(first), Some(all)) => json!(all.duration_since(first).as_secs_f64() * 1000.0),
            _ => Value::Null,
        },
        "counter_poll_ms": POLL_EVERY.as_secs_f64() * 1000.0,
        "counter_times": "each poll reads every node at once and is stamped when the last answers: an upper bound on when the count was reached",
        "during_window": "from the earliest possible end to 3 s after the last lease ended",
        "counter_scrape_errors": watched.scrape_errors,
        "ended_curve_s_after_latest_end": watched
            .curve
            .iter()
            .map(|&(at, count)| (signed_s(at, end_latest), count))
            .collect::<Vec<_>>(),
        "free_after_sampled": free.load(Ordering::Relaxed),
        "not_free_after_sampled": not_free.load(Ordering::Relaxed),
        "background_workers": background_workers,
        "background_before": before,
        "background_during": during,
        "background_p99_during_over_before": ratio,
    });
    Ok(RunOutcome::of_operations(
        &recorder, measured_s, timeline, details,
    ))
}

/// What the counter showed.
pub(super) struct Watched {
    /// (when a poll's answers were all in, bound leases ended by then), at most
    /// `CURVE_POINTS_MAX` points.
    pub(super) curve: Vec<(Instant, u64)>,
    pub(super) ended: u64,
    pub(super) first_ended: Option<Instant>,
    pub(super) all_ended: Option<Instant>,
    pub(super) scrape_errors: u64,
}

/// Polls the nodes' counter every `POLL_EVERY` from `from` until it shows `held` more bound
/// leases ended than `at_start` (a counter only grows; other runs' sessions may add to it), or
/// until `deadline`.
pub(super) async fn watch_ended(
    metrics: NodeMetrics,
    at_start: f64,
    held: u64,
    from: Instant,
    deadline: Instant,
) -> Watched {
    let mut watched = Watched {
        curve: Vec::new(),
        ended: 0,
        first_ended: None,
        all_ended: None,
        scrape_errors: 0,
    };
    let mut ticks = tokio::time::interval_at(from.into(), POLL_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if tokio::time::timeout_at(deadline.into(), ticks.tick())
            .await
            .is_err()
        {
            return watched;
        }
        let polled =
            tokio::time::timeout_at(deadline.into(), metrics.counter_sum(SESSION_LEASES_ENDED))
                .await;
        let now = Instant::now();
        match polled {
            Err(_) => return watched,
            Ok(Err(_)) => watched.scrape_errors += 1,
            Ok(Ok(total)) => {
                // An integer count well below 2^53, exact in an f64.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let ended = (total - at_start).max(0.0) as u64;
                watched.ended = ended;
                if watched.curve.len() < CURVE_POINTS_MAX {
                    watched.curve.push((now, ended));
                }
                if ended > 0 {
                    watched.first_ended.get_or_insert(now);
                }
                if ended >= held {
                    watched.all_ended = Some(now);
                    return watched;
                }
            }
        }
    }
}

/// Seconds from `reference` to `at`, negative when `at` is earlier.
pub(super) fn signed_s(at: Instant, reference: Instant) -> f64 {
    if at >= reference {
        at.duration_since(reference).as_secs_f64()
    } else {
        -reference.duration_since(at).as_secs_f64()
    }
}

/// Sends one last keep-alive to (or closes) every record at the same moment; the answers give
/// the window in which the records' expiry (or end) was fixed.
async fn end_records(
    client: &Client,
    tenant: &str,
    records: &[Record],
    how: SessionEnd,
) -> EndWindow {
    let mut calls = tokio::task::JoinSet::new();
    for record in records {
        let client = client.clone();
        let tenant = tenant.to_owned();
        let (session_id, owner_id, group_id) =
            (record.session_id, record.owner_id.clone(), record.group_id);
        calls.spawn(async move {
            let sent = Instant::now();
            let result = match how {
                SessionEnd::Expire => client
                    .session_keepalive(&tenant, group_id, session_id, &owner_id)
                    .await
                    .map(drop),
                SessionEnd::Close => client
                    .session_close(&tenant, group_id, session_id, &owner_id)
                    .await
                    .map(drop),
            };
            (sent, Instant::now(), result)
        });
    }
    let now = Instant::now();
    let mut window = EndWindow {
        earliest: now,
        latest: now,
        refused: 0,
        errors: Vec::new(),
    };
    while let Some(joined) = calls.join_next().await {
        let Ok((sent, answered, result)) = joined else {
            window.refused += 1;
            continue;
        };
        window.earliest = window.earliest.min(sent);
        window.latest = window.latest.max(answered);
        if let Err(error) = result {
            window.refused += 1;
            if window.errors.len() < 10 {
                window.errors.push(error.to_string());
            }
        }
    }
    window
}

/// The background's figures over the whole seconds of the timeline that overlap
/// `[from_s, to_s]` (seconds since the run's start): operations per second, and p50/p99 over
/// every operation of those seconds together (from the intervals' logarithmic buckets, to within
/// one bucket).
pub(super) fn window(timeline: &[IntervalSample], from_s: f64, to_s: f64) -> Value {
    let samples: Vec<&IntervalSample> = timeline
        .iter()
        .filter(|sample| sample.t_s > from_s && sample.t_s - 1.0 < to_s)
        .collect();
    let ops: u64 = samples.iter().map(|sample| sample.ops).sum();
    let mut buckets: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for sample in &samples {
        for &[bound, count] in &sample.latency_us_buckets {
            *buckets.entry(bound).or_default() += count;
        }
    }
    let total: u64 = buckets.values().sum();
    let quantile = |q: f64| -> Option<u64> {
        if total == 0 {
            return None;
        }
        // A rank between 1 and `total` (q is within 0..=1).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = ((total as f64) * q).ceil().clamp(1.0, total as f64) as u64;
        let mut seen = 0;
        buckets.iter().find_map(|(&bound, &count)| {
            seen += count;
            (seen >= rank).then_some(bound)
        })
    };
    let errors: u64 = samples
        .iter()
        .map(|sample| sample.errors.values().sum::<u64>())
        .sum();
    json!({
        "seconds": samples.len(),
        "ops": ops,
        "ops_per_s": if samples.is_empty() { Value::Null } else { json!(ops as f64 / samples.len() as f64) },
        "errors": errors,
        "p50_us": quantile(0.5),
        "p99_us": quantile(0.99),
        "max_interval_p99_us": samples.iter().map(|sample| sample.p99_us).max(),
        "bucket_ratio": LOG_BUCKET_RATIO,
    })
}
