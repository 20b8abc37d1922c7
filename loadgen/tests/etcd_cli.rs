//! The `loadgen` binary end to end against a real etcd (Debian's `etcd-server`, installed by
//! `scripts/install-deps.sh`): a single-member etcd on loopback in a temporary directory, then
//! `loadgen --target etcd` runs of the mixed and contended scenarios (closed and open loop) and a
//! small hold. Checks the command shape scripts rely on, the JSON report's keys, the SVG plot,
//! and that the etcd mapping answers every operation with a success or an expected refusal.
//! Needs the `etcd` feature (the README's test command builds every feature).
#![cfg(feature = "etcd")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Etcd {
    child: Child,
    endpoint: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_etcd(dir: &Path) -> Etcd {
    let client_port = free_port();
    let peer_port = free_port();
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
    let child = Command::new("etcd")
        .args(["--name", "loadgen-test", "--data-dir"])
        .arg(dir.join("data"))
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("loadgen-test={peer_url}")])
        .args(["--logger", "zap", "--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("etcd is installed by scripts/install-deps.sh (Debian package etcd-server)");
    let etcd = Etcd {
        child,
        endpoint: format!("127.0.0.1:{client_port}"),
    };
    // Bounded wait until etcd answers its health endpoint.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let healthy = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &etcd.endpoint, "endpoint", "health"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if healthy {
            return etcd;
        }
        assert!(
            Instant::now() < deadline,
            "etcd did not become healthy: {}",
            std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn loadgen(etcd: &Etcd, dir: &Path, name: &str, extra: &[&str]) -> serde_json::Value {
    let report = dir.join(format!("{name}.json"));
    let plot = dir.join(format!("{name}.svg"));
    let output = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--target", "etcd", "--endpoints", &etcd.endpoint])
        .args(["--workers", "8", "--warmup", "1s", "--duration", "3s"])
        .arg("--report-json")
        .arg(&report)
        .arg("--plot")
        .arg(&plot)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name}: {stdout}\n{stderr}");
    println!("{name}: {stdout}");
    // One progress line per second on stderr (the last second may end with the run).
    assert!(
        stderr.lines().filter(|line| line.contains("ops/s")).count() >= 2,
        "{stderr}"
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("latency by percentile"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for key in tenure_loadgen::report::REPORT_KEYS {
        assert!(json.get(key).is_some(), "{name}: {key} missing in {json}");
    }
    assert_eq!(json["target"], "etcd");
    json
}

#[test]
fn loadgen_drives_a_real_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = start_etcd(dir.path());

    let mixed = loadgen(&etcd, dir.path(), "mixed", &["--scenario", "mixed"]);
    assert_eq!(mixed["scenario"], "mixed");
    for op in ["acquire", "renew", "release"] {
        assert!(
            mixed["ops"][op]["ok"].as_u64().unwrap() > 0,
            "no successful {op}: {mixed}"
        );
        for key in ["p50", "p90", "p99", "p999", "max"] {
            assert!(mixed["ops"][op]["latency_us"][key].as_u64().unwrap() > 0);
        }
    }
    let errors = mixed["errors"].as_object().unwrap();
    assert!(
        errors.keys().all(|code| code == "ALREADY_HELD"),
        "unexpected errors: {errors:?}"
    );

    // Contended, open loop at 200 ops/s: Zipf on 20 keys, so acquires meet held keys.
    let contended = loadgen(
        &etcd,
        dir.path(),
        "contended",
        &[
            "--scenario",
            "contended",
            "--keyspace",
            "20",
            "--rate",
            "200",
        ],
    );
    assert_eq!(contended["mode"], "open");
    assert!(
        contended["errors"]["ALREADY_HELD"].as_u64().unwrap() > 0,
        "{contended}"
    );
    let errors = contended["errors"].as_object().unwrap();
    assert!(
        errors.keys().all(|code| code == "ALREADY_HELD"),
        "{errors:?}"
    );

    // Hold: 200 leases of 3 s (etcd rounds to whole seconds) renewed by loadgen every second.
    let hold = loadgen(
        &etcd,
        dir.path(),
        "hold",
        &["--scenario", "hold", "--leases", "200", "--ttl", "3s"],
    );
    assert_eq!(hold["details"]["held_at_end"], 200, "{hold}");
    assert_eq!(hold["details"]["lost"], 0, "{hold}");
    assert!(hold["ops_total"].as_u64().unwrap() >= 200, "{hold}");
}
