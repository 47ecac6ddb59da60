#!/usr/bin/env python3
"""One sample of a running replicator for bench/run.sh --verify-cost, as one line of JSON: its
CPU seconds (utime+stime), RSS and peak RSS (KiB), the bytes its TCP sockets to each cluster
received and sent (the kernel's tcp_info through `ss`; sockets closed before the sample are
not counted), and the verification and checkpoint metrics it exposes."""
import argparse
import json
import os
import re
import subprocess
import urllib.request

METRICS = ("mirrorflow_verifications_total", "mirrorflow_verification_read_bytes_total",
           "mirrorflow_checkpoints_emitted_total")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat; after the name, indices 11 and 12.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def socket_bytes(pid, ports):
    """Per cluster name: bytes received and sent by the process's established sockets to it."""
    text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True,
                          text=True, check=True).stdout
    totals = {name: {"received": 0, "sent": 0, "sockets": 0} for name in ports.values()}
    cluster = None
    for line in text.splitlines():
        if not line[:1].isspace():
            cluster = None
            cols = line.split()
            if f"pid={pid}," in line and len(cols) >= 4:
                port = cols[3].rsplit(":", 1)[-1]
                cluster = ports.get(port)
                if cluster:
                    totals[cluster]["sockets"] += 1
            continue
        if cluster:
            for key, field in (("received", "bytes_received"), ("sent", "bytes_acked")):
                m = re.search(rf"\b{field}:(\d+)", line)
                if m:
                    totals[cluster][key] += int(m.group(1))
    return totals


def metrics(url):
    out = {}
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(METRICS):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--source-port", required=True)
    p.add_argument("--target-port", required=True)
    p.add_argument("--metrics", required=True)
    a = p.parse_args()
    ports = {a.source_port: "source", a.target_port: "target"}
    print(json.dumps({
        "cpu_s": cpu_seconds(a.pid),
        "memory_kib": memory_kib(a.pid),
        "sockets": socket_bytes(a.pid, ports),
        "metrics": metrics(a.metrics),
    }))


if __name__ == "__main__":
    main()
