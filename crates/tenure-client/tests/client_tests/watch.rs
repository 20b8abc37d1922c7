//! Watches end to end against real `tenure` processes: a resource's watch sees ACQUIRED,
//! RELEASED, HANDED_OFF and EXPIRED in log order (a lease's end before the next grant), a
//! tenant's watch sees them too (from any replica), a watch resumed from an index yields exactly
//! the events after it (through the library, `tenurectl watch` and HTTP server-sent events
//! resumed with `Last-Event-ID`), and a watcher whose index fell out of the retained window is told to
//! resync (with the resource's lease then) rather than skipped silently.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::collections::BTreeMap;
use std::time::Duration;

use tenure_client::{
    AcquireOptions, ExpiryReason, LeaseStatus, ResourceKey, WaitOptions, Watch, WatchEvent,
    WatchEventKind, WatchFrom, WatchItem, WatchOptions, WatchSelector,
};
use tenure_core::{AcquireRequest, LeaseOp, LeaseReply, ReleaseRequest};
use tenure_testkit::{TENANT, sse_read, wait_for};

use crate::client_library::{
    cluster_with_a_follower_of_group_0, connect, metric_sum, tenurectl_cluster_file,
};

const TTL: Duration = Duration::from_millis(4_500);

async fn next(watch: &mut Watch) -> WatchItem {
    tokio::time::timeout(Duration::from_secs(30), watch.next_item())
        .await
        .expect("a watch item within 30 s")
        .expect("the watch goes on")
        .expect("no error")
}

/// Events from `watch` until one satisfies `last` (the markers checked on the way: indexes
/// never go back, and each page ends with a Through at or past its events).
async fn events_until(watch: &mut Watch, last: impl Fn(&WatchEvent) -> bool) -> Vec<WatchEvent> {
    let mut events: Vec<WatchEvent> = Vec::new();
    let mut through = 0;
    loop {
        match next(watch).await {
            WatchItem::Event(event) => {
                assert!(event.index > through, "{event:?} at or before {through}");
                if let Some(previous) = events.last() {
                    assert!(event.index >= previous.index);
                }
                let done = last(&event);
                events.push(event);
                if done {
                    return events;
                }
            }
            WatchItem::Through { index, .. } => {
                assert!(index >= through);
                if let Some(event) = events.last() {
                    assert!(index >= event.index);
                }
                through = index;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A watch of `key` (in group 0) resumed after `index`.
async fn resume(client: &tenure_client::Client, key: &ResourceKey, index: u64) -> Watch {
    client
        .watch(
            WatchSelector::Resource(key.clone()),
            WatchFrom::Cursor(BTreeMap::from([(0, index)])),
            WatchOptions::default(),
        )
        .await
        .unwrap()
}

fn names(events: &[WatchEvent]) -> Vec<(&'static str, u64)> {
    events
        .iter()
        .map(|e| (e.kind.as_str(), e.kind.fencing_token()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_follow_a_resource_through_grants_hand_offs_and_expiry_and_resume() {
    let (cluster, client, _follower) = cluster_with_a_follower_of_group_0().await;
    let resource = cluster.resource_in_group(TENANT, 0, "watched", 0);
    let key = ResourceKey::new(TENANT, resource.clone());
    let mut watch = client
        .watch(
            WatchSelector::Resource(key.clone()),
            WatchFrom::Now,
            WatchOptions::default(),
        )
        .await
        .unwrap();
    let WatchItem::Started {
        group_id: 0,
        current: None,
        ..
    } = next(&mut watch).await
    else {
        panic!("a resource watch starts with the resource's lease (none yet)")
    };
    // A tenant watch over every group, served by any replica.
    let mut tenant_watch = client
        .watch(
            WatchSelector::Tenant(TENANT.into()),
            WatchFrom::Now,
            WatchOptions {
                stale_read: true,
                ..WatchOptions::default()
            },
        )
        .await
        .unwrap();
    for _ in 0..client.routing().groups {
        assert!(matches!(
            next(&mut tenant_watch).await,
            WatchItem::Started { current: None, .. }
        ));
    }

    // a holds it, b waits; a's release hands it to b in the same entry; b's lease runs out.
    let first = client
        .acquire_grant(AcquireOptions::new(TENANT, resource.clone(), "a", TTL).without_auto_renew())
        .await
        .unwrap();
    let waiter_client = connect(&cluster).await;
    let options = WaitOptions::new(TENANT, resource.clone(), "b", TTL, Duration::from_secs(60));
    let waiter = tokio::spawn(async move { waiter_client.acquire_wait(options).await });
    let ids = cluster.ids();
    wait_for(Duration::from_secs(20), "the waiter parked", || async {
        (metric_sum(&cluster, &ids, "tenure_waits_parked").await >= 1.0).then_some(())
    })
    .await
    .unwrap();
    client
        .release(key.clone(), first.lease_id, "a", None)
        .await
        .unwrap();
    let second = waiter.await.unwrap().unwrap();
    let (t1, t2) = (first.fencing_token, second.fencing_token);
    let events = events_until(&mut watch, |e| e.kind.as_str() == "EXPIRED").await;
    assert_eq!(
        names(&events),
        [
            ("ACQUIRED", t1),
            ("RELEASED", t1),
            ("HANDED_OFF", t2),
            ("EXPIRED", t2)
        ]
    );
    assert_eq!(
        events[1].index, events[2].index,
        "the hand-off is in the release's entry"
    );
    let WatchEventKind::HandedOff {
        holder_id,
        previous_fencing_token,
        ..
    } = &events[2].kind
    else {
        unreachable!()
    };
    assert_eq!(
        (holder_id.as_str(), *previous_fencing_token),
        ("b", Some(t1))
    );
    assert!(matches!(
        events[3].kind,
        WatchEventKind::Expired {
            reason: ExpiryReason::Ttl,
            ..
        }
    ));
    let tenant_events = events_until(&mut tenant_watch, |e| {
        e.key == key && e.kind.as_str() == "EXPIRED"
    })
    .await;
    let tenant_events: Vec<_> = tenant_events.into_iter().filter(|e| e.key == key).collect();
    assert_eq!(
        tenant_events, events,
        "the tenant's watch saw the same events"
    );
    drop(tenant_watch);

    // Resumed from the index before the release: exactly the events after it.
    let resumed_from = events[1].index - 1;
    let mut resumed = resume(&client, &key, resumed_from).await;
    let again = events_until(&mut resumed, |e| e.kind.as_str() == "EXPIRED").await;
    assert_eq!(again, events[1..], "resumed after index {resumed_from}");
    // The page ends with its marker; the cursor advances on it.
    let WatchItem::Through { index, .. } = next(&mut resumed).await else {
        panic!("a page ends with its Through marker")
    };
    let cursor = *resumed.cursor().get(&0).unwrap();
    assert_eq!(cursor, index);
    assert!(cursor >= events[3].index);
    drop(resumed);

    // tenurectl watch, resumed from the same index: the same three events, one JSON line each,
    // then the summary with the cursor.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tenurectl"))
        .arg("--cluster")
        .arg(tenurectl_cluster_file(&cluster))
        .args([
            "-o",
            "json",
            "watch",
            "--tenant",
            TENANT,
            "--resource",
            &resource,
        ])
        .args(["--after", &format!("0:{resumed_from}"), "--count", "3"])
        .args(["--duration-ms", "20000"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let seen: Vec<(String, u64)> = lines[..3]
        .iter()
        .map(|l| {
            (
                l["event"].as_str().unwrap().to_owned(),
                l["fencing_token"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, u64)> = names(&events[1..])
        .into_iter()
        .map(|(name, token)| (name.to_owned(), token))
        .collect();
    assert_eq!(seen, expected, "{stdout}");
    assert_eq!(lines[3]["events"], 3, "{stdout}");

    // The same events over HTTP as server-sent events, resumed with Last-Event-ID: each event
    // named by its kind, then a `through` event whose id is the cursor.
    let url = format!(
        "{}/v1/tenants/{TENANT}/watch?resource={resource}",
        cluster.http_url(ids[0])
    );
    let last_event_id = format!("0:{resumed_from}");
    let sse = sse_read(
        &url,
        &[
            ("X-Tenure-Principal-Tenant", TENANT),
            ("X-Tenure-Principal-Id", "watch-tests"),
            ("Last-Event-ID", &last_event_id),
        ],
        Duration::from_secs(30),
        |events| events.iter().any(|e| e.0 == "EXPIRED"),
    )
    .await
    .unwrap();
    let kinds: Vec<(&str, u64)> = sse
        .iter()
        .filter(|e| e.0 != "through")
        .map(|e| {
            let data: serde_json::Value = serde_json::from_str(&e.2).unwrap();
            (e.0.as_str(), data["fencing_token"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(kinds, names(&events[1..]), "{sse:?}");

    // More than the retained window (4,096 events per group) of other resources' events in the
    // group: a watch resumed from before them is told to resync, with the lease then.
    let others = cluster.resources_in_group(TENANT, 0, "churn", 2_100);
    let mut leases = Vec::new();
    for chunk in others.chunks(300) {
        let ops = chunk
            .iter()
            .enumerate()
            .map(|(i, r)| {
                LeaseOp::Acquire(AcquireRequest {
                    key: ResourceKey::new(TENANT, r.clone()),
                    holder_id: "churner".into(),
                    ttl_ms: 60_000,
                    request_id: format!("churn-{r}-{i}"),
                })
            })
            .collect();
        for (result, r) in client.batch(ops).await.unwrap().into_iter().zip(chunk) {
            let LeaseReply::Acquired(grant) = result.unwrap().reply else {
                panic!("a churn acquire was refused")
            };
            leases.push((r.clone(), grant.lease_id));
        }
    }
    for chunk in leases.chunks(300) {
        let ops = chunk
            .iter()
            .map(|(r, lease_id)| {
                LeaseOp::Release(ReleaseRequest {
                    key: ResourceKey::new(TENANT, r.clone()),
                    lease_id: *lease_id,
                    holder_id: "churner".into(),
                    request_id: format!("release-{r}"),
                })
            })
            .collect();
        for result in client.batch(ops).await.unwrap() {
            result.unwrap();
        }
    }
    let mut behind = resume(&client, &key, resumed_from).await;
    let WatchItem::Resync {
        group_id: 0,
        through_index,
        current: Some(current),
    } = next(&mut behind).await
    else {
        panic!("a watcher behind the retained window is told to resync")
    };
    assert!(through_index > cursor);
    assert_eq!(
        (current.fencing_token, current.status),
        (t2, LeaseStatus::Expired)
    );
    assert_eq!(*behind.cursor().get(&0).unwrap(), through_index);
    println!(
        "watch: tokens {t1} -> {t2}; events at indexes {:?}; resumed after {resumed_from}; resync after 4,200 churn events through index {through_index}",
        events.iter().map(|e| e.index).collect::<Vec<_>>()
    );
}
