#!/usr/bin/env python3
"""Helpers of bench/perf-smoke.sh (standard library only):

  perf_smoke.py scrape CLUSTER_JSON          every node's /metrics, nodes separated by '# node N'
  perf_smoke.py annotate REPORT BEFORE AFTER adds the nodes' CPU seconds to a loadgen JSON report
  perf_smoke.py table DIR GROUPS...          the table of a perf-smoke run
"""

import json
import os
import re
import sys
import urllib.request

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|\+Inf|-Inf)$")


def scrape(cluster_json):
    nodes = json.load(open(cluster_json))["nodes"]
    for index, node in enumerate(nodes):
        print(f"# node {index + 1}")
        try:
            text = urllib.request.urlopen(node["http"] + "/metrics", timeout=5).read().decode()
        except OSError as error:
            print(f"# scrape failed: {error}")
            continue
        print(text)


def parse(path):
    """Sums every sample over the nodes: {(name, labels): value}."""
    totals = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return totals
    for line in lines:
        match = SAMPLE.match(line)
        if not match:
            continue
        key = (match.group(1), match.group(2) or "")
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[key] = totals.get(key, 0.0) + value
    return totals


def delta(before, after, name, labels=""):
    return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)


def quantile_from_buckets(before, after, name, q):
    """The q-quantile (upper bucket bound) of a Prometheus histogram's increase."""
    buckets = []
    for (metric, labels), value in after.items():
        if metric != name + "_bucket":
            continue
        bound = re.search(r'le="([^"]+)"', labels)
        if not bound:
            continue
        le = float("inf") if bound.group(1) == "+Inf" else float(bound.group(1))
        buckets.append((le, value - before.get((metric, labels), 0.0)))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return None


def annotate(report_path, before, after):
    report = json.load(open(report_path))
    report["server_cpu_s"] = float(after) - float(before)
    json.dump(report, open(report_path, "w"), indent=1)


def load(directory, name):
    try:
        return json.load(open(os.path.join(directory, name + ".json")))
    except (OSError, ValueError):
        return None


def ms(us):
    return f"{us / 1000:.2f}"


def table(directory, groups_list):
    rows = []
    for groups in groups_list:
        prefix = f"g{groups}-"
        reports = {name: load(directory, prefix + name) for name in ["one", "sixteen", "sat", "half"]}
        try:
            idle = open(os.path.join(directory, prefix + "idle-percent-per-node.txt")).read().strip()
        except OSError:
            idle = "-"
        before = parse(os.path.join(directory, prefix + "sat-before.metrics"))
        after = parse(os.path.join(directory, prefix + "sat-after.metrics"))
        proposals = delta(before, after, "tenure_raft_proposals_total")
        ops = delta(before, after, "tenure_raft_proposed_ops_total")
        appends = delta(before, after, "tenure_transport_append_requests_total")
        appended = delta(before, after, "tenure_transport_append_entries_total")
        empty = delta(before, after, "tenure_transport_append_requests_without_entries_total")
        # Entry-less requests the next entry carried instead (absent before the commit linger).
        carried = delta(before, after, "tenure_transport_append_commits_carried_total")
        fsyncs = delta(before, after, "tenure_fsyncs_total")
        fsync_p50 = quantile_from_buckets(before, after, "tenure_fsync_duration_seconds", 0.5)
        fsync_p99 = quantile_from_buckets(before, after, "tenure_fsync_duration_seconds", 0.99)
        sat = reports["sat"]

        def lat(name):
            report = reports[name]
            if not report:
                return "-"
            return f"{ms(report['latency_us']['p50'])}/{ms(report['latency_us']['p99'])}"

        def per_op_us(report, key):
            if not report or report.get(key) is None:
                return "-"
            issued = report["details"].get("operations_issued_including_warmup") or report["ops_total"]
            return f"{report[key] / max(1, issued) * 1e6:.1f}"

        def client_us(report):
            if not report:
                return "-"
            cpu = report["details"].get("loadgen_cpu_s")
            issued = report["details"].get("operations_issued_including_warmup") or report["ops_total"]
            return "-" if cpu is None else f"{cpu / max(1, issued) * 1e6:.1f}"

        half = reports["half"]
        rows.append([
            str(groups),
            f"{sat['throughput_ops_per_s']:.0f}" if sat else "-",
            lat("sat"),
            lat("half") + (f" @{half['rate_ops_per_s']:.0f}/s" if half else ""),
            lat("one"),
            lat("sixteen"),
            per_op_us(sat, "server_cpu_s") + " / " + per_op_us(half, "server_cpu_s"),
            client_us(sat) + " / " + client_us(half),
            f"{ops / proposals:.1f}" if proposals else "-",
            (f"{appends / appended:.2f} ({empty / appends * 100:.0f}% empty, {carried / appended:.2f} carried)"
             if appended and appends else "-"),
            f"{fsyncs / max(1e-9, sat['duration_s'] + 3) / 3:.0f}/s/node" if sat and fsyncs else "-",
            (f"{fsync_p50 * 1000:g}/{fsync_p99 * 1000:g}" if fsync_p50 is not None and fsync_p99 is not None else "-"),
            idle,
        ])
    header = ["groups", "sat ops/s", "sat p50/p99 ms", "half p50/p99 ms", "1 caller p50/p99",
              "16 callers p50/p99", "server us/op sat/half", "loadgen us/op sat/half", "ops/entry",
              "AE msgs/entry", "fsyncs", "fsync p50/p99 ms (<=)", "idle % core/node"]
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "scrape":
        scrape(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "annotate":
        annotate(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) >= 4 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
