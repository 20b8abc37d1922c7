#!/usr/bin/env python3
"""Where the CPU time goes: reads `perf report --no-children --sort comm,dso,sym --stdio -g none`
output on stdin and sums the sample percentages into components (RocksDB, openraft, QUIC and
TLS, tokio, allocator, kernel network, kernel storage, ...). Standard library only."""

import re
import sys

# (component, test on "dso symbol"), first match wins.
RULES = [
    ("rocksdb (memtable, WAL, compaction)", lambda d, s: "rocksdb" in s or "librocksdb" in d),
    ("crypto (ring: AES-GCM, header protection)", lambda d, s: "ring_core" in s or "aes_" in s or "gcm" in s.lower() or "chacha" in s.lower()),
    ("quinn / rustls (QUIC, TLS framing)", lambda d, s: "quinn" in s or "rustls" in s),
    ("openraft (replication, log, commit)", lambda d, s: "openraft" in s),
    ("tokio (scheduler, timers, channels)", lambda d, s: "tokio" in s),
    ("tenure (state machine, proposer, protocol)", lambda d, s: "tenure" in s),
    ("encoding (postcard, serde, bytes)", lambda d, s: "postcard" in s or "serde" in s or "bytes::" in s),
    ("allocator and memcpy (libc)", lambda d, s: "libc" in d and re.search(r"malloc|free|memmove|memcpy|memset|unlink_chunk|consolidate|cfree", s)),
    ("libc other", lambda d, s: "libc" in d),
    ("kernel: network (UDP, loopback)", lambda d, s: "kernel" in d and re.search(r"udp|ip_|net_|skb|sock|dev_|loopback|__sys_send|__sys_recv|recvmsg|sendmsg|inet|napi|gro|gso", s)),
    ("kernel: storage (fsync, block, ext4)", lambda d, s: "kernel" in d and re.search(r"ext4|jbd2|bio|blk|fsync|folio|page_cache|filemap|iowrite|writeback|virtio", s)),
    ("kernel: scheduling, futex, timers", lambda d, s: "kernel" in d and re.search(r"sched|futex|task|wake|switch|timer|hrtimer|epoll|ipi|irq", s)),
    ("kernel: other", lambda d, s: "kernel" in d),
]

LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S+)\s+(\S+)\s+\[[.k]\]\s+(.*)$")


def main():
    totals = {}
    for line in sys.stdin:
        match = LINE.match(line)
        if not match:
            continue
        percent, _comm, dso, symbol = float(match.group(1)), match.group(2), match.group(3), match.group(4)
        for name, test in RULES:
            if test(dso, symbol):
                break
        else:
            name = "other: " + dso
        totals[name] = totals.get(name, 0.0) + percent
    for name, percent in sorted(totals.items(), key=lambda item: -item[1]):
        if percent >= 0.5:
            print(f"{percent:6.1f}%  {name}")


if __name__ == "__main__":
    main()
