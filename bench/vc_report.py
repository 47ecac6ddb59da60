#!/usr/bin/env python3
"""results.md of bench/run.sh --verify-cost: from raw.jsonl, the idle window's cost per arm
(verifications a minute by outcome, CPU, bytes read from each cluster, RSS) with verification on
minus off per repetition, and the copies' throughput and CPU per GB, paired by repetition."""
import json
import statistics
import sys
from pathlib import Path


def load(path):
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by = {}
    for r in rows:
        by.setdefault(r["phase"], []).append(r)
    return by


def metric_sum(sample, name, label=None):
    total = 0.0
    for key, value in sample["metrics"].items():
        if key.split("{")[0] == name and (label is None or label in key):
            total += value
    return total


def window_figures(w):
    b, a, s = w["before"], w["after"], w["window_s"]
    per_min = 60.0 / s
    verif = {o: (metric_sum(a, "mirrorflow_verifications_total", f'outcome="{o}"')
                 - metric_sum(b, "mirrorflow_verifications_total", f'outcome="{o}"')) * per_min
             for o in ("match", "mismatch", "unverifiable")}
    out = {
        "verifications_per_min": sum(verif.values()),
        "by_outcome": verif,
        "cpu_s_per_min": (a["cpu_s"] - b["cpu_s"]) * per_min,
        "checkpoints_per_min": (metric_sum(a, "mirrorflow_checkpoints_emitted_total")
                                - metric_sum(b, "mirrorflow_checkpoints_emitted_total")) * per_min,
        "rss_mib": a["memory_kib"].get("VmRSS", 0) / 1024,
        "hwm_mib": a["memory_kib"].get("VmHWM", 0) / 1024,
    }
    for c in ("source", "target"):
        for d in ("received", "sent"):
            out[f"{c}_{d}_mb_per_min"] = (a["sockets"][c][d] - b["sockets"][c][d]) * per_min / 1e6
        out[f"{c}_verify_read_mb_per_min"] = (
            metric_sum(a, "mirrorflow_verification_read_bytes_total", f'cluster="{c}"')
            - metric_sum(b, "mirrorflow_verification_read_bytes_total", f'cluster="{c}"')) * per_min / 1e6
    return out


def copy_figures(c):
    r = c["result"]
    gb = r["window_records"] * 1024 / 1e9
    return {
        "records_per_s": r["records_per_s"],
        "cpu_s_per_gb": r["cpu_s_window"] / gb if gb else float("nan"),
        "peak_rss_mib": r["peak_rss_kib"] / 1024,
        "window_s": r["window_s"],
        "startup_s": r["startup_s"],
    }


def f(x, d=1):
    return f"{x:,.{d}f}"


def main():
    out = Path(sys.argv[1])
    by = load(out / "raw.jsonl")
    config = (by.get("config") or [{}])[0]
    lines = [f"# Verification cost: bench/run.sh --verify-cost ({config.get('date', '?')}, "
             f"commit {config.get('commit', '?')})", ""]
    for l in by.get("vc_load", []):
        lines.append(f"Data set: {l['result']['records']:,} records of 1 KiB (lz4) over "
                     f"{l['partitions']:,} partitions, loaded in {l['result']['seconds']:.0f} s.")
    lines.append("")
    windows = {(w["arm"], w["rep"]): (w, window_figures(w)) for w in by.get("vc_window", [])}
    lines += ["## Idle window (copy done, groups checkpointed): per minute", "",
              "| arm | rep | verifications/min (match / mismatch / unverifiable) | CPU s/min | "
              "source read MB/min (sockets; verifier's fetches) | target read MB/min (sockets; "
              "verifier's fetches) | target sent MB/min | checkpoints/min | RSS MiB | peak RSS MiB | load |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (arm, rep), (w, x) in sorted(windows.items(), key=lambda k: (k[0][1], k[0][0])):
        o = x["by_outcome"]
        lines.append(
            f"| {arm} | {rep} | {f(x['verifications_per_min'])} ({f(o['match'])} / {f(o['mismatch'])} / "
            f"{f(o['unverifiable'])}) | {f(x['cpu_s_per_min'], 2)} | {f(x['source_received_mb_per_min'], 2)}; "
            f"{f(x['source_verify_read_mb_per_min'], 2)} | {f(x['target_received_mb_per_min'], 2)}; "
            f"{f(x['target_verify_read_mb_per_min'], 2)} | {f(x['target_sent_mb_per_min'], 2)} | "
            f"{f(x['checkpoints_per_min'])} | {f(x['rss_mib'])} | {f(x['hwm_mib'])} | {w.get('load_average', '')} |")
    reps = sorted({rep for (_, rep) in windows})
    on_arms = sorted({arm for (arm, _) in windows if arm != "oursu"})
    diffs = {}
    for arm in on_arms:
        for rep in reps:
            if (arm, rep) in windows and ("oursu", rep) in windows:
                on, off = windows[(arm, rep)][1], windows[("oursu", rep)][1]
                diffs.setdefault(arm, []).append({k: on[k] - off[k] for k in on if isinstance(on[k], float)})
    if diffs:
        lines += ["", "On minus off (oursu), per repetition, then the median:", "",
                  "| arm | rep | verifications/min | CPU s/min | source read MB/min | target read MB/min | "
                  "target sent MB/min | RSS MiB |", "|---|---|---|---|---|---|---|---|"]
        for arm, ds in diffs.items():
            for i, d in enumerate(ds + [None]):
                if d is None:
                    d = {k: statistics.median(x[k] for x in ds) for k in ds[0]}
                    label = "median"
                else:
                    label = str(reps[i])
                lines.append(f"| {arm} | {label} | {f(d['verifications_per_min'])} | {f(d['cpu_s_per_min'], 3)} | "
                             f"{f(d['source_received_mb_per_min'], 2)} | {f(d['target_received_mb_per_min'], 2)} | "
                             f"{f(d['target_sent_mb_per_min'], 2)} | {f(d['rss_mib'])} |")
    copies = {(c["arm"], c["rep"]): (c, copy_figures(c)) for c in by.get("vc_copy", [])}
    lines += ["", "## Copies (verification running during them on the arm that has it on)", "",
              "| arm | rep | records/s | CPU s per GB | peak RSS MiB | copy window s | start-up s | load |",
              "|---|---|---|---|---|---|---|---|"]
    for (arm, rep), (c, x) in sorted(copies.items(), key=lambda k: (k[0][1], k[0][0])):
        lines.append(f"| {arm} | {rep} | {f(x['records_per_s'], 0)} | {f(x['cpu_s_per_gb'], 2)} | "
                     f"{f(x['peak_rss_mib'])} | {f(x['window_s'], 1)} | {f(x['startup_s'], 1)} | "
                     f"{c.get('load_average', '')} |")
    for arm in on_arms:
        ratios = [(rep, copies[(arm, rep)][1], copies[("oursu", rep)][1]) for rep in reps
                  if (arm, rep) in copies and ("oursu", rep) in copies]
        if not ratios:
            continue
        tp = [on["records_per_s"] / off["records_per_s"] for _, on, off in ratios]
        cpu = [on["cpu_s_per_gb"] / off["cpu_s_per_gb"] for _, on, off in ratios]
        lines += ["", f"{arm} / oursu, paired by repetition: throughput "
                  + ", ".join(f"{x:.3f}" for x in tp) + f" (median {statistics.median(tp):.3f}); CPU per GB "
                  + ", ".join(f"{x:.3f}" for x in cpu) + f" (median {statistics.median(cpu):.3f})."]
        for name in (arm, "oursu"):
            xs = [copies[(name, rep)][1]["records_per_s"] for rep in reps if (name, rep) in copies]
            if len(xs) > 1:
                lines.append(f"{name} throughput over the repetitions: {min(xs):,.0f}-{max(xs):,.0f} records/s "
                             f"(spread {100 * (max(xs) / min(xs) - 1):.1f} %).")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
