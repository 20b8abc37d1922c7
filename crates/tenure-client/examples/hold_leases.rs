//! Holds many leases at once and reports what keeping them alive costs: renewal requests (Batch
//! requests the renewer sent) and renewals per renewal period, and leases lost.
//!
//! Against a running `tenure dev` (`./scripts/run.sh` in another terminal):
//!
//! ```text
//! cargo run --release -p tenure-client --example hold_leases -- \
//!     --cluster tenure-dev/cluster.json --leases 10000 --ttl-ms 9000 --hold-s 30
//! ```
//!
//! The nodes' view of the same thing: `curl -s http://127.0.0.1:8401/metrics | grep
//! renewals_per_request` (sum / count = renewals per request). The run stops by itself after
//! `--hold-s` and releases every lease.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use futures_util::StreamExt as _;
use tenure_client::{Client, Credentials};

#[derive(Parser)]
struct Args {
    /// cluster.json of the cluster.
    #[arg(long)]
    cluster: PathBuf,
    /// Tenant of the leases.
    #[arg(long, default_value = "acme")]
    tenant: String,
    /// How many leases to hold.
    #[arg(long, default_value_t = 10_000)]
    leases: usize,
    /// Their ttl.
    #[arg(long, default_value_t = 9_000)]
    ttl_ms: u64,
    /// How long to hold them.
    #[arg(long, default_value_t = 30)]
    hold_s: u64,
    /// Acquires in flight at once.
    #[arg(long, default_value_t = 1_024)]
    concurrency: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = Client::from_cluster_file(
        &args.cluster,
        Credentials::InsecureDev {
            principal_id: "hold-leases".to_string(),
        },
    )
    .await
    .context("connecting")?;
    let ttl = Duration::from_millis(args.ttl_ms);
    let run = format!(
        "{:x}",
        Instant::now().elapsed().as_nanos() ^ u128::from(std::process::id())
    );
    let started = Instant::now();
    let results: Vec<_> = futures_util::stream::iter(0..args.leases)
        .map(|i| {
            let client = client.clone();
            let tenant = args.tenant.clone();
            let resource = format!("hold/{run}/{i}");
            async move { client.acquire(tenant, resource, "holder", ttl).await }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let mut leases = Vec::with_capacity(results.len());
    for result in results {
        leases.push(result.context("acquire")?);
    }
    println!(
        "acquired {} leases in {} ms ({:.0}/s)",
        leases.len(),
        started.elapsed().as_millis(),
        leases.len() as f64 / started.elapsed().as_secs_f64()
    );
    let period = ttl / 3;
    let hold_until = Instant::now() + Duration::from_secs(args.hold_s);
    let mut before = client.stats();
    let mut periods = 0u32;
    let (mut batches_total, mut renewals_total) = (0u64, 0u64);
    while Instant::now() + period <= hold_until {
        tokio::time::sleep(period).await;
        let now = client.stats();
        let batches = now.renew_batches - before.renew_batches;
        let renewals = now.renewals - before.renewals;
        let lost = leases.iter().filter(|lease| !lease.is_valid()).count();
        periods += 1;
        batches_total += batches;
        renewals_total += renewals;
        println!(
            "period {periods} ({} ms): {batches} renewal requests carrying {renewals} renewals ({:.1} per request); {lost} leases not valid",
            period.as_millis(),
            renewals as f64 / batches.max(1) as f64
        );
        before = now;
    }
    let lost = leases.iter().filter(|lease| !lease.is_valid()).count();
    println!(
        "held {} leases for {periods} renewal periods: {:.1} renewal requests per period, {:.1} renewals per request, {lost} lost",
        leases.len(),
        batches_total as f64 / f64::from(periods.max(1)),
        renewals_total as f64 / batches_total.max(1) as f64
    );
    drop(leases);
    client.close().await;
    Ok(())
}
