//! Issue 19 item 3, "a replayed acquire or renew reports a fresh expiry": a retry with the same
//! request id returns the stored outcome, and what it reports about time must be what is left
//! of the original grant at the retry (contract 3.4), never a full ttl counted from the retry.
//!
//! In a real 3-node cluster: acquire with a 10 s ttl through node 1, replay the same request id
//! 5 s later through node 2 (forwarded to the group's leader) and check the reported expiry,
//! through the HTTP gateway (`expiry_time`, `remaining_ttl_ms`) and through the native protocol
//! (the replay state, and the client library's safe window); then release and replay again: the
//! replay says the lease ended, with zero remaining ttl and no window.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::cast_possible_wrap,
    clippy::cast_possible_truncation,
    missing_docs
)]

use crate::common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{ClusterOptions, ProcessCluster, TENANT, http_json};
use serde_json::{Value, json};
use tenure_client::{AcquireOptions, Client, ClientConfig, Credentials, Endpoint};
use tenure_core::{LeaseReply, ReplayStatus};

const TENANT_HEADER: &str = "X-Tenure-Principal-Tenant";
const PRINCIPAL_HEADER: &str = "X-Tenure-Principal-Id";
const TTL_MS: u64 = 10_000;
/// How long after the grant the retry comes.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Slack for `expiry_time`'s wall-clock mapping (request latencies, millisecond rounding).
const SLACK_MS: i64 = 1_000;

/// Milliseconds since the epoch of `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn epoch_ms(text: &str) -> i64 {
    let number = |range: std::ops::Range<usize>| -> i64 {
        text.get(range)
            .and_then(|part| part.parse().ok())
            .unwrap_or_else(|| panic!("not an RFC 3339 UTC time with milliseconds: {text:?}"))
    };
    let (year, month, day) = (number(0..4), number(5..7), number(8..10));
    let (hour, minute, second, millis) = (
        number(11..13),
        number(14..16),
        number(17..19),
        number(20..23),
    );
    // Days from civil (H. Hinnant).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1_000 + millis
}

fn wall_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn post(cluster: &ProcessCluster, node: u64, route: &str, body: &Value) -> Value {
    let headers = [(TENANT_HEADER, TENANT), (PRINCIPAL_HEADER, "replay-tests")];
    let url = format!("{}/v1/leases/{route}", cluster.http_url(node));
    let (status, answer) = http_json("POST", &url, &headers, Some(body)).await;
    assert_eq!(status, 200, "{route} through node {node}: {answer}");
    answer
}

fn expiry_ms(answer: &Value) -> i64 {
    epoch_ms(answer["expiry_time"].as_str().expect("an expiry_time"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_replayed_acquire_or_renew_reports_a_fresh_expiry() {
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let acquire = json!({"tenant_id": TENANT, "resource_id": "replay/http", "holder_id": "alice",
        "ttl_seconds": TTL_MS / 1_000, "request_id": "http-acquire-1"});
    let first = post(&cluster, 1, "acquire", &acquire).await;
    assert_eq!(first["replayed"], false, "{first}");
    let first_expiry = expiry_ms(&first);

    tokio::time::sleep(RETRY_AFTER).await;
    let replay = post(&cluster, 2, "acquire", &acquire).await;
    println!("first answer: {first}\nreplay 5 s later through node 2: {replay}");
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["lease_id"], first["lease_id"]);
    assert_eq!(replay["fencing_token"], first["fencing_token"]);
    let replay_expiry = expiry_ms(&replay);
    assert!(
        replay_expiry <= first_expiry + SLACK_MS,
        "a replay 5 s later reported expiry_time {} ({} ms after the first grant's {})",
        replay["expiry_time"],
        replay_expiry - first_expiry,
        first["expiry_time"]
    );
    assert!(
        replay_expiry >= first_expiry - SLACK_MS,
        "an exact retry of an unchanged lease shows the original expiry: {} vs {}",
        replay["expiry_time"],
        first["expiry_time"]
    );
    let remaining = replay["remaining_ttl_ms"]
        .as_u64()
        .expect("remaining_ttl_ms");
    assert!(
        remaining > 0 && remaining <= TTL_MS - 4_000,
        "remaining ttl {remaining} ms 5 s into a 10 s lease"
    );
    assert_eq!(replay["replay_status"], "ACTIVE");

    // A renewal, then the lease is released: replays of the acquire and the renewal now say the
    // lease ended, with nothing remaining and an expiry in the past.
    let renew = json!({"tenant_id": TENANT, "resource_id": "replay/http",
        "lease_id": first["lease_id"], "holder_id": "alice", "ttl_seconds": TTL_MS / 1_000,
        "request_id": "http-renew-1"});
    let renewed = post(&cluster, 1, "renew", &renew).await;
    let renewed_expiry = expiry_ms(&renewed);
    let release = json!({"tenant_id": TENANT, "resource_id": "replay/http",
        "lease_id": first["lease_id"], "holder_id": "alice", "request_id": "http-release-1"});
    let released = post(&cluster, 1, "release", &release).await;
    let released_at = wall_now_ms();
    for (route, body, granted_expiry) in [
        ("acquire", &acquire, first_expiry),
        ("renew", &renew, renewed_expiry),
    ] {
        let replay = post(&cluster, 3, route, body).await;
        println!("{route} replayed after the release: {replay}");
        assert_eq!(replay["replayed"], true, "{replay}");
        let expiry = expiry_ms(&replay);
        assert!(
            expiry <= released_at + SLACK_MS && expiry <= granted_expiry + SLACK_MS,
            "a {route} replayed after the release reported expiry_time {} ({} ms after the \
             release)",
            replay["expiry_time"],
            expiry - released_at
        );
        assert_eq!(replay["remaining_ttl_ms"], 0, "{replay}");
        assert_eq!(replay["replay_status"], "RELEASED", "{replay}");
    }
    let release_replay = post(&cluster, 2, "release", &release).await;
    assert_eq!(release_replay["replayed"], true);
    assert!(
        (expiry_ms(&release_replay) - expiry_ms(&released)).abs() <= SLACK_MS,
        "a replayed release shows when the release happened: {release_replay} vs {released}"
    );
}

fn library_config(cluster: &ProcessCluster) -> ClientConfig {
    let endpoints = cluster
        .ids()
        .into_iter()
        .map(|id| Endpoint {
            node_id: Some(id),
            addr: cluster.node(id).quic_addr,
        })
        .collect();
    ClientConfig::new(
        endpoints,
        cluster.ca_pem().to_string(),
        Credentials::InsecureDev {
            principal_id: "replay-tests".to_string(),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_replayed_acquire_or_renew_reports_a_fresh_expiry() {
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let node1 = cluster.client(1).await;
    let node2 = cluster.client(2).await;
    let first = node1
        .acquire(TENANT, "replay/native", "alice", TTL_MS, "native-acquire-1")
        .await
        .unwrap();
    let LeaseReply::Acquired(grant) = first.reply.clone() else {
        panic!("acquire answered {first:?}");
    };
    // The client library: its safe window of a replay of the caller's own request id.
    let library = Client::connect(library_config(&cluster)).await.unwrap();
    let options = AcquireOptions::new(
        TENANT,
        "replay/library",
        "bob",
        Duration::from_millis(TTL_MS),
    )
    .request_id("library-acquire-1".to_string());
    let library_first = library.acquire_grant(options.clone()).await.unwrap();

    tokio::time::sleep(RETRY_AFTER).await;
    let replay = node2
        .acquire(TENANT, "replay/native", "alice", TTL_MS, "native-acquire-1")
        .await
        .unwrap();
    println!("first: {first:?}\nreplay 5 s later through node 2: {replay:?}");
    assert!(replay.replayed);
    assert_eq!(replay.reply, first.reply, "the original outcome, unchanged");
    let state = replay.replay.expect("a replay carries its state");
    assert_eq!(state.status, ReplayStatus::Active, "{state:?}");
    assert_eq!(state.decided_at_ms, grant.log_time_ms);
    assert!(
        state.answered_at_ms >= grant.log_time_ms + 4_000,
        "answered at log {} for a grant at log {}",
        state.answered_at_ms,
        grant.log_time_ms
    );
    assert!(
        state.expires_at_ms <= grant.expires_at_ms,
        "a replay reported expiry {} after the original {}",
        state.expires_at_ms,
        grant.expires_at_ms
    );
    assert_eq!(
        state.remaining_ttl_ms,
        state.expires_at_ms - state.answered_at_ms
    );
    assert!(
        state.remaining_ttl_ms > 0 && state.remaining_ttl_ms <= TTL_MS - 4_000,
        "remaining ttl {} ms 5 s into a 10 s lease",
        state.remaining_ttl_ms
    );

    let sent_at = Instant::now();
    let library_replay = library.acquire_grant(options.clone()).await.unwrap();
    println!(
        "library: first window {:?}, replay window {:?} from its send",
        library_first
            .safe_deadline
            .saturating_duration_since(library_first.sent_at),
        library_replay
            .safe_deadline
            .saturating_duration_since(sent_at)
    );
    assert!(library_replay.replayed);
    assert!(
        library_replay.safe_deadline <= library_first.safe_deadline + Duration::from_millis(300),
        "a replay's safe window ends {:?} after the original grant's",
        library_replay
            .safe_deadline
            .saturating_duration_since(library_first.safe_deadline)
    );
    assert!(
        library_replay.safe_deadline >= sent_at + Duration::from_secs(3),
        "a replay of a live lease keeps the window of what is left of it"
    );
    assert!(library_replay.remaining_ttl_ms <= TTL_MS - 4_000);

    // After a release, a replay says the lease ended: zero remaining, no window.
    node1
        .release(
            TENANT,
            "replay/native",
            grant.lease_id,
            "alice",
            "native-release-1",
        )
        .await
        .unwrap();
    let ended = node2
        .acquire(TENANT, "replay/native", "alice", TTL_MS, "native-acquire-1")
        .await
        .unwrap();
    let state = ended.replay.expect("a replay carries its state");
    println!("replay after the release: {state:?}");
    assert_eq!(state.status, ReplayStatus::Released);
    assert_eq!(state.remaining_ttl_ms, 0);
    assert!(state.expires_at_ms <= state.answered_at_ms);
    library
        .release(
            library_first.key.clone(),
            library_first.lease_id,
            "bob",
            None,
        )
        .await
        .unwrap();
    let library_ended = library.acquire_grant(options).await.unwrap();
    assert!(library_ended.replayed);
    assert_eq!(library_ended.remaining_ttl_ms, 0);
    assert_eq!(
        library_ended.safe_deadline, library_ended.sent_at,
        "no window once the lease ended"
    );
    assert_eq!(
        library_ended.replay.map(|replay| replay.status),
        Some(ReplayStatus::Released)
    );
    library.close().await;
}
