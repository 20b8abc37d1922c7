//! The metrics gauges: once a second, readiness, leadership, leases, records held, lag, the
//! process's resident memory, storage (snapshot builds included) and transport counters are
//! copied into the metrics registry.
//!
//! Must not depend on: the request path.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics as m;
use crate::shared::NodeShared;

/// The notAfter (Unix seconds) of the node certificate in `path`, if it can be read.
fn certificate_expiry_unix_s(path: &std::path::Path) -> Option<i64> {
    let pem = std::fs::read(path).ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let certificate = pem.parse_x509().ok()?;
    Some(certificate.validity().not_after.timestamp())
}

/// The process's resident set size in bytes, from `/proc/self/statm` (its second field, in pages);
/// `None` where that file does not exist or does not parse.
fn process_resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page_bytes = rustix::param::page_size() as u64;
    Some(resident_pages * page_bytes)
}

/// Refreshes the gauges once a second until the node stops.
pub(crate) async fn run_gauges(shared: Arc<NodeShared>) {
    m::register_all();
    let certificate_expiry = certificate_expiry_unix_s(&shared.config.tls.node_cert);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        ticker.tick().await;
        let mut led = 0u64;
        let mut active = 0u64;
        let mut lag = 0u64;
        let mut hosted = 0u64;
        let mut overdue_ms = 0u64;
        let mut under_replicated = 0u64;
        let mut lease_records = 0u64;
        let mut dedup_records = 0u64;
        let voters_wanted = shared.voters_wanted();
        for handle in shared.hosted() {
            hosted += 1;
            lag += handle.apply_lag_entries();
            let stats = handle.state_stats();
            lease_records += stats.lease_records;
            dedup_records += stats.dedup_records;
            if handle.is_ready_leader() {
                led += 1;
                let members = handle.members();
                if members.voter_sets.len() > 1 || members.voters.len() < voters_wanted {
                    under_replicated += 1;
                }
                active += stats.active_leases;
                overdue_ms = overdue_ms.max(handle.expiry_overdue_ms().unwrap_or(0));
            }
        }
        let readiness = shared.readiness();
        ::metrics::gauge!(m::NODE_READY).set(if readiness.ready { 1.0 } else { 0.0 });
        ::metrics::gauge!(m::GROUPS_WITHOUT_LEADER)
            .set(f64::from(readiness.groups - readiness.groups_with_leader));
        ::metrics::gauge!(m::EXPIRY_OVERDUE_SECONDS).set(overdue_ms as f64 / 1_000.0);
        if let Some(expiry) = certificate_expiry {
            ::metrics::gauge!(m::CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS).set(expiry as f64);
        }
        if let Ok(stats) = rustix::fs::statvfs(shared.storage.data_dir()) {
            let block = stats.f_frsize as f64;
            ::metrics::gauge!(m::DATA_DIR_AVAILABLE_BYTES).set(stats.f_bavail as f64 * block);
            ::metrics::gauge!(m::DATA_DIR_TOTAL_BYTES).set(stats.f_blocks as f64 * block);
        }
        ::metrics::gauge!(m::GROUPS_LED).set(led as f64);
        ::metrics::gauge!(m::GROUPS_UNDER_REPLICATED).set(under_replicated as f64);
        ::metrics::gauge!(m::REPLICA_MOVES_INFLIGHT).set(shared.moves.inflight() as f64);
        ::metrics::gauge!(m::GROUPS_HOSTED).set(hosted as f64);
        ::metrics::gauge!(m::ACTIVE_LEASES).set(active as f64);
        ::metrics::gauge!(m::APPLY_LAG_ENTRIES).set(lag as f64);
        ::metrics::gauge!(m::REQUESTS_INFLIGHT).set(f64::from(shared.admission.inflight()));
        let pressured = shared
            .renewal_pressure
            .tenants_under_pressure(shared.clock.now_ms());
        ::metrics::gauge!(m::RENEWAL_PRESSURE_TENANTS).set(pressured as f64);
        let proposal_mean_us = shared
            .renewal_pressure
            .node_load(shared.clock.now_ms())
            .proposal_mean_us;
        ::metrics::gauge!(m::LEASE_PROPOSAL_MEAN_SECONDS).set(proposal_mean_us as f64 / 1e6);
        ::metrics::gauge!(m::STATE_LEASE_RECORDS).set(lease_records as f64);
        ::metrics::gauge!(m::STATE_DEDUP_RECORDS).set(dedup_records as f64);
        if let Some(rss_bytes) = process_resident_bytes() {
            ::metrics::gauge!(m::PROCESS_RESIDENT_MEMORY_BYTES).set(rss_bytes as f64);
        }
        let storage = shared.storage.stats();
        ::metrics::counter!(m::SNAPSHOT_BUILDS_TOTAL).absolute(storage.snapshot_builds);
        ::metrics::gauge!(m::SNAPSHOT_BUILD_SECONDS_TOTAL)
            .set(storage.snapshot_build_micros as f64 / 1e6);
        ::metrics::gauge!(m::SNAPSHOT_BUILD_SECONDS_MAX)
            .set(storage.snapshot_build_micros_max as f64 / 1e6);
        ::metrics::gauge!(m::SNAPSHOT_BYTES_MAX).set(storage.snapshot_bytes_max as f64);
        ::metrics::counter!(m::SNAPSHOT_WRITTEN_BYTES_TOTAL).absolute(storage.snapshot_bytes);
        ::metrics::gauge!(m::SNAPSHOT_APPLY_PAUSE_SECONDS_MAX)
            .set(storage.snapshot_pause_micros_max as f64 / 1e6);
        ::metrics::counter!(m::SNAPSHOT_APPLY_PAUSES_OVER_10MS_TOTAL)
            .absolute(storage.snapshot_pauses_over_10ms);
        ::metrics::gauge!(m::SNAPSHOT_SHARED_APPLY_SECONDS_MAX)
            .set(storage.snapshot_shared_apply_micros_max as f64 / 1e6);
        ::metrics::gauge!(m::SNAPSHOT_APPLY_PAUSE_CPU_SECONDS_MAX)
            .set(storage.snapshot_pause_cpu_micros_max as f64 / 1e6);
        ::metrics::gauge!(m::SNAPSHOT_SHARED_APPLY_CPU_SECONDS_MAX)
            .set(storage.snapshot_shared_apply_cpu_micros_max as f64 / 1e6);
        ::metrics::counter!(m::SNAPSHOT_SHARED_APPLIES_OVER_10MS_TOTAL)
            .absolute(storage.snapshot_shared_applies_over_10ms);
        ::metrics::gauge!(m::SNAPSHOT_APPLY_PAUSE_LESS_CORE_WAIT_SECONDS_MAX)
            .set(storage.snapshot_pause_less_core_wait_micros_max as f64 / 1e6);
        ::metrics::counter!(m::SNAPSHOT_APPLY_PAUSES_LESS_CORE_WAIT_OVER_10MS_TOTAL)
            .absolute(storage.snapshot_pauses_less_core_wait_over_10ms);
        ::metrics::gauge!(m::SNAPSHOT_SHARED_APPLY_LESS_CORE_WAIT_SECONDS_MAX)
            .set(storage.snapshot_shared_apply_less_core_wait_micros_max as f64 / 1e6);
        ::metrics::counter!(m::SNAPSHOT_SHARED_APPLIES_LESS_CORE_WAIT_OVER_10MS_TOTAL)
            .absolute(storage.snapshot_shared_applies_less_core_wait_over_10ms);
        ::metrics::counter!(m::FSYNCS_TOTAL).absolute(storage.fsyncs);
        ::metrics::gauge!(m::FSYNC_SECONDS_TOTAL).set(storage.fsync_micros as f64 / 1e6);
        if storage.fsyncs > 0 {
            ::metrics::gauge!(m::ENTRIES_PER_FSYNC)
                .set(storage.entries_appended as f64 / storage.fsyncs as f64);
        }
        let transport = shared.transport.stats();
        ::metrics::counter!(m::TRANSPORT_FRAMES_TOTAL).absolute(transport.frames_sent);
        ::metrics::counter!(m::TRANSPORT_MESSAGES_TOTAL).absolute(transport.messages_sent);
        ::metrics::counter!(m::TRANSPORT_APPEND_REQUESTS_TOTAL)
            .absolute(transport.append_requests_sent);
        ::metrics::counter!(m::TRANSPORT_APPEND_ENTRIES_TOTAL)
            .absolute(transport.append_entries_sent);
        ::metrics::counter!(m::TRANSPORT_APPEND_REQUESTS_WITHOUT_ENTRIES_TOTAL)
            .absolute(transport.append_requests_without_entries_sent);
        ::metrics::counter!(m::TRANSPORT_APPEND_COMMITS_CARRIED_TOTAL)
            .absolute(transport.append_requests_carried);
        if transport.frames_sent > 0 {
            ::metrics::gauge!(m::TRANSPORT_MESSAGES_PER_FRAME)
                .set(transport.messages_sent as f64 / transport.frames_sent as f64);
        }
    }
}
