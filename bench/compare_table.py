#!/usr/bin/env python3
"""Side-by-side table of a compare-etcd.sh run: reads the loadgen JSON reports in a results
directory and prints throughput, p50 and p99 per scenario and load level for each target, with
the ratio of the first target to the last. Usage: compare_table.py DIR TARGET... (no arguments
beyond these; standard library only)."""

import json
import os
import sys


def load(directory, name):
    path = os.path.join(directory, name + ".json")
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def ms(us):
    return f"{us / 1000:.2f}"


def ratio(a, b):
    if a is None or b is None or not b:
        return "-"
    return f"{a / b:.1f}x"


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: compare_table.py DIR TARGET...")
    directory, targets = sys.argv[1], sys.argv[2:]
    first, last = targets[0], targets[-1]
    header = ["scenario", "load"]
    for target in targets:
        header += [f"{target} ops/s", "p50 ms", "p99 ms"]
    if len(targets) > 1:
        header += [f"{first}/{last} ops/s", f"{last}/{first} p99"]
    rows = []
    for scenario in ["acquire", "mixed", "contended"]:
        for load_name, suffix in [("saturation", "sat"), ("half", "half")]:
            reports = {t: load(directory, f"{t}-{scenario}-{suffix}") for t in targets}
            if not any(reports.values()):
                continue
            row = [scenario, load_name]
            for target in targets:
                report = reports[target]
                if report is None:
                    row += ["-", "-", "-"]
                    continue
                errors = sum(v for k, v in report["errors"].items() if k != "ALREADY_HELD")
                ops = f"{report['throughput_ops_per_s']:.0f}"
                if errors:
                    ops += f" ({errors} err)"
                row += [ops, ms(report["latency_us"]["p50"]), ms(report["latency_us"]["p99"])]
            if len(targets) > 1:
                a, b = reports[first], reports[last]
                row.append(ratio(a and a["throughput_ops_per_s"], b and b["throughput_ops_per_s"]))
                row.append(ratio(b and b["latency_us"]["p99"], a and a["latency_us"]["p99"]))
            rows.append(row)
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))))

    def server_memory_text(report):
        memory = report.get("server_memory") or {}
        if not memory:
            return ""
        rss = max(m["rss_bytes"] for m in memory.values()) / 2**20
        peak = max(m["peak_rss_bytes"] for m in memory.values()) / 2**20
        return f"; largest server process RSS {rss:.0f} MiB at the end (peak {peak:.0f} MiB)"

    holds = {t: load(directory, f"{t}-hold") for t in targets}
    if any(holds.values()):
        print()
        print("hold: acquire K leases, then keep them alive (steady window)")
        for target in targets:
            h = holds[target]
            if h is None:
                print(f"  {target}: no report")
                continue
            d = h["details"]
            steady = d["steady"]
            phase = d["acquire_phase"]
            renew = h["ops"].get("renew", {}).get("latency_us")
            renew_text = f", renew p50 {ms(renew['p50'])} ms p99 {ms(renew['p99'])} ms" if renew else ""
            print(
                f"  {target}: {phase['acquired']} of {d['leases']} acquired at {phase['acquired_per_s']:.0f}/s "
                f"(p50 {ms(phase['latency_us']['p50'])} ms, p99 {ms(phase['latency_us']['p99'])} ms); "
                f"held {d['held_at_end']}, lost {d['lost']} over {steady['seconds']:.0f} s; "
                f"{steady['renewals_per_s']:.0f} renewals/s in {steady['renew_requests_per_s']:.0f} requests/s"
                f"{renew_text}; loadgen CPU {steady['loadgen_cpu_percent_of_one_core'] or 0:.0f}% of a core, "
                f"RSS {(d['loadgen_rss_bytes_holding'] or 0) / 2**20:.0f} MiB; "
                f"server CPU {h.get('server_cpu_s', 0):.1f} s over the whole run"
                f"{server_memory_text(h)}"
            )

    expiries = {t: load(directory, f"{t}-expiry") for t in targets}
    if any(expiries.values()):
        print()
        print("expiry: K leases expire at once while background traffic runs")
        for target in targets:
            e = expiries[target]
            if e is None:
                print(f"  {target}: no report")
                continue
            d = e["details"]
            delay = d.get("reclaim_delay_after_earliest_expiry_us") or d.get("reclaim_delay_after_expiry_us")
            before, during = d["background_before_expiry"], d["background_during_reclaim"]
            after = d["all_reclaimed_after_latest_expiry_ms"]
            after_text = f"{after:.0f} ms" if after is not None else "never"
            print(
                f"  {target}: {d['reclaimed']} of {d['expiring']} reclaimed, the last {after_text} after the latest expiry "
                f"(per lease, from its earliest possible expiry: p50 {ms(delay['p50'])} ms, p99 {ms(delay['p99'])} ms); "
                f"background min {before['min_ops_per_s'] or 0:.0f} -> {during['min_ops_per_s'] or 0:.0f} ops/s, "
                f"p99 {ms(before['max_interval_p99_us'])} -> {ms(during['max_interval_p99_us'])} ms"
            )


if __name__ == "__main__":
    main()
