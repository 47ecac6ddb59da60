#!/usr/bin/env python3
"""Turns bench/run.sh's raw.jsonl into results.md (tables, ratios, targets) and chart.png.

Usage: report.py RESULTS_DIR [--check]   (matplotlib only for the chart; without it the chart is
skipped). --check (bench/run.sh --smoke): exit 1 unless every phase the run's scenarios hold
gave its figures.
"""

import json
import statistics
import sys
from pathlib import Path

MIB = 1024 * 1024
GB = 1e9
NAMES = {
    "ours": "MirrorFlow",
    "oursr": "MirrorFlow, records (copy: Records)",
    "oursn": "MirrorFlow, uncompressed writes (before)",
    "oursf": "MirrorFlow, fetch 16 MiB, queue 16 MiB (trial)",
    "oursq": "MirrorFlow, producer queue 32 MiB (trial)",
    "ours2": "MirrorFlow, 2 replicas (trial; CPU and RSS of both)",
    "oursb": "MirrorFlow, whole batches (copy: Batches)",
    "oursp": "batch passthrough (bench arm on the batch pieces, not the product)",
    "mm2": "MirrorMaker 2 (defaults)",
    "mm2t": "MirrorMaker 2 (tuned)",
}
ARM_ORDER = ["ours", "oursr", "oursn", "oursf", "oursq", "ours2", "oursb", "oursp", "mm2", "mm2t"]
COLORS = {"ours": "#2b7bba", "oursr": "#74a9cf", "oursn": "#9ecae1", "oursf": "#08519c", "oursq": "#6baed6", "ours2": "#4292c6", "oursb": "#08306b", "oursp": "#c6dbef", "mm2": "#d95f02", "mm2t": "#7570b3", "pipe": "#999999"}


def load(path):
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_phase = {}
    for r in rows:
        by_phase.setdefault(r["phase"], []).append(r)
    return by_phase


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=0, unit=""):
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}{unit}"


def load_text(rows):
    loads = sorted({r.get("load_average", "?") for r in rows})
    return "; ".join(loads) if loads else "n/a"


def codec_text(c):
    """The codecs the target stored, by bytes: 'lz4' or 'none 60%, lz4 40%'."""
    if not c or not c.get("bytes"):
        return "n/a"
    total = sum(c["bytes"].values())
    parts = sorted(c["bytes"].items(), key=lambda kv: -kv[1])
    if len(parts) == 1:
        return parts[0][0]
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in parts)


def summarise(raw):
    config = raw["config"][0]
    pipes = {}
    for p in raw.get("pipe", []):
        pipes.setdefault(p["set"], []).append(p)
    copies = {}
    for c in raw.get("copy", []):
        copies.setdefault(c["set"], {}).setdefault(c["arm"], []).append(c)
    out = {"config": config, "sets": {}, "steady": {}, "steady_runs": {}, "loads": raw.get("load", []),
           "failed": raw.get("failed", [])}
    for s, by_arm in copies.items():
        pipe_rows = pipes.get(s, [])
        limit_by_rep = {p["rep"]: p["result"]["limit_rps"] for p in pipe_rows}
        both_by_rep = {p["rep"]: p["result"]["both_limit_rps"] for p in pipe_rows}
        entry = {
            "size": next(iter(by_arm.values()))[0]["size"],
            "pipe": pipe_rows,
            "pipe_rps": median(list(limit_by_rep.values())),
            "pipe_both_rps": median(list(both_by_rep.values())),
            "arms": {},
        }
        for arm in ARM_ORDER:
            runs = by_arm.get(arm, [])
            if not runs:
                continue
            res = [r["result"] for r in runs]
            rps = [r["records_per_s"] for r in res]
            size = entry["size"]
            entry["arms"][arm] = {
                "runs": runs,
                "rps": median(rps),
                "rps_by_rep": {r["rep"]: r["result"]["records_per_s"] for r in runs},
                "mibps": median(rps) * size / MIB,
                "pipe_fraction": median([r["result"]["records_per_s"] / limit_by_rep[r["rep"]]
                                         for r in runs if limit_by_rep.get(r["rep"])]),
                "pipe_both_fraction": median([r["result"]["records_per_s"] / both_by_rep[r["rep"]]
                                              for r in runs if both_by_rep.get(r["rep"])]),
                "cpu_per_m": median([x["cpu_s_per_million"] for x in res]),
                "cpu_per_gb": median([x["cpu_s_per_million"] / 1e6 * GB / size for x in res]),
                "rss_mib": max(x["peak_rss_kib"] / 1024 for x in res),
                "startup_s": median([x["startup_s"] for x in res]),
                "codec": codec_text(runs[-1].get("target_codec")),
                "stored_bytes": runs[-1].get("target_codec", {}).get("bytes"),
                "load": load_text(runs),
            }
        out["sets"][s] = entry
    # Steady phases run once per repetition (arms rotating). The row shown per arm is its run
    # with the median latency p99, so every figure in it comes from one real run.
    for st in raw.get("steady", []):
        out["steady_runs"].setdefault(st["arm"], []).append(st)
    for arm, runs in out["steady_runs"].items():
        ordered = sorted(runs, key=lambda r: r["result"]["latency_ms"]["p99"] or float("inf"))
        pick = ordered[(len(ordered) - 1) // 2]
        out["steady"][arm] = dict(pick["result"], load_average=pick.get("load_average"))
    out["parts"] = summarise_partitions(raw)
    out["parts_loads"] = raw.get("parts_load", [])
    out["b3"] = summarise_b3(raw)
    out["b3_loads"] = raw.get("b3_load", [])
    return out


def summarise_b3(raw):
    """The three-broker scenario: per arm, medians over repetitions; every run's read-back and
    leader changes kept (the defects are per run, not medians)."""
    rows = {}
    for r in raw.get("brokers3", []):
        rows.setdefault(r["arm"], []).append(r)
    out = {}
    for arm in ARM_ORDER:
        runs = rows.get(arm)
        if not runs:
            continue
        res = [r["result"] for r in runs]
        measured = [x for x in res if x.get("window_records", 1) > 0]
        out[arm] = {
            "runs": runs,
            "rps": median([x["records_per_s"] for x in measured]),
            "rps_by_rep": {r["rep"]: r["result"]["records_per_s"] for r in runs},
            "cpu_per_m": median([x["cpu_s_per_million"] for x in measured]),
            "rss_mib": max(x["peak_rss_kib"] / 1024 for x in res),
            "startup_s": median([x["startup_s"] for x in res]),
            "max_stall_s": max(x.get("max_stall_s", 0) for x in res),
            "stall_from_s": max(res, key=lambda x: x.get("max_stall_s", 0)).get("max_stall_from_s"),
            "rps_before": median([rate_around_stop(r)[0] for r in runs]),
            "rps_after": median([rate_around_stop(r)[1] for r in runs]),
            "complete": all(x.get("complete", True) for x in res),
            "missing": sum(r["verify"]["missing"] for r in runs),
            "duplicates": sum(r["verify"]["duplicates"] for r in runs),
            "load": load_text(runs),
        }
    return out


def rate_around_stop(run):
    """Records/s of the copy before the first node was stopped and from then to the end, from
    the watch's once-a-second timeline (seconds from the arm's start, as the events)."""
    tl = [p for p in run["result"].get("timeline") or [] if p[1] > 0]
    if not tl or not run.get("leader_changes"):
        return None, None
    stop = min(ev["stop"] for ev in run["leader_changes"]) - run["arm_started"]
    before = [p for p in tl if p[0] <= stop]
    end = run["result"]["startup_s"] + run["result"]["window_s"]
    rb = ra = None
    if len(before) >= 2 and before[-1][0] > before[0][0]:
        rb = (before[-1][1] - before[0][1]) / (before[-1][0] - before[0][0])
    if before and end > before[-1][0]:
        ra = (run["result"]["records"] - before[-1][1]) / (end - before[-1][0])
    return rb, ra


def leader_change_text(run, ev):
    """'node 2 at 1.4 s (in the copy), back 9.8 s, in sync 12.0 s': times from the arm's start."""
    t0 = run["arm_started"]
    res = run["result"]
    copy_start = t0 + res["startup_s"]
    copy_end = copy_start + res["window_s"]
    inside = "in the copy" if copy_start <= ev["stop"] <= copy_end else (
        "before the copy" if ev["stop"] < copy_start else "after the copy")
    text = (f"node {ev['node']} stopped at {ev['stop'] - t0:.1f} s ({inside}; partition 0 to node "
            f"{ev['leader_after_stop']}; the node's process took {ev['stopped'] - ev['stop']:.1f} s to exit)")
    if ev.get("started") is None:
        return text + ", not started again (smoke, or BENCH_B3_RESTART=false)"
    return (text + f", serving again {ev['started'] - t0:.1f} s, all replicas in sync {ev['in_sync'] - t0:.1f} s, "
            f"preferred leaders back {ev['preferred_back'] - t0:.1f} s")


def summarise_partitions(raw):
    """The many-partitions scenario: per partition count and arm, medians over repetitions."""
    rows = {}
    for r in raw.get("partitions", []):
        rows.setdefault(r["partitions"], {}).setdefault(r["arm"], []).append(r)
    out = {}
    for count in sorted(rows):
        out[count] = {}
        for arm in ARM_ORDER:
            runs = rows[count].get(arm)
            if not runs:
                continue
            res = [r["result"] for r in runs]
            groups = [r["groups"] for r in runs if r.get("groups")]
            g = groups[len(groups) // 2] if groups else None
            out[count][arm] = {
                "runs": runs,
                "topics": runs[0]["topics"],
                # A copy complete at the first look has no rate (a smoke run's few records).
                "rps": median([x["records_per_s"] for x in res if x.get("window_records", 1) > 0]),
                "cpu_per_m": median([x["cpu_s_per_million"] for x in res if x.get("window_records", 1) > 0]),
                "rss_mib": max(x["peak_rss_kib"] / 1024 for x in res),
                "startup_s": median([x["startup_s"] for x in res]),
                "groups": g,
                "load": load_text(runs),
            }
    return out


def ratio(a, b):
    return a / b if a and b else None


def targets(summary):
    sets, steady = summary["sets"], summary["steady"]
    rows = []

    def verdict(ok):
        return "n/a" if ok is None else ("**holds**" if ok else "**not met**")

    for s, e in sets.items():
        arms = e["arms"]
        o = arms.get("ours")
        if not o:
            continue
        if s in ("big", "small"):
            for base, name in (("mm2", "MM2 defaults"), ("mm2t", "MM2 tuned")):
                if base in arms:
                    r = ratio(o["rps"], arms[base]["rps"])
                    rows.append((f"throughput >= 1.5x {name} ({s})", fmt(r, 2, "x"),
                                 verdict(None if r is None else r >= 1.5)))
            f = o["pipe_fraction"]
            rows.append((f"throughput >= 80% of the pipe limit ({s})", fmt(None if f is None else 100 * f, 0, "%"),
                         verdict(None if f is None else f >= 0.8)))
            fb = o["pipe_both_fraction"]
            rows.append((f"throughput >= 80% of the pipe limit, both ends at once ({s})",
                         fmt(None if fb is None else 100 * fb, 0, "%"), verdict(None if fb is None else fb >= 0.8)))
        elif s.startswith("w"):
            rtt, cap = wan_link(s)
            if cap:
                f = o["mibps"] / cap
                rows.append((f"{rtt} ms RTT, {cap:g} MiB/s cap: throughput >= 80% of the cap",
                             fmt(100 * f, 0, "%"), verdict(f >= 0.8)))
                continue
            for base, name, want in (("mm2", "MM2 defaults", 5.0), ("mm2t", "MM2 tuned", 1.5)):
                if base in arms and rtt == 50:
                    r = ratio(o["rps"], arms[base]["rps"])
                    rows.append((f"{rtt} ms RTT: throughput >= {want:g}x {name}", fmt(r, 2, "x"),
                                 verdict(None if r is None else r >= want)))
        else:
            # Every way the product copies: its default (whole batches since 2026-12-07),
            # records, and whole batches named.
            for mine, how in (("ours", ""), ("oursr", ", records"), ("oursb", ", whole batches")):
                p = arms.get(mine)
                if not p:
                    continue
                t = arms.get("mm2t")
                if t:
                    cr = ratio(t["cpu_per_gb"], p["cpu_per_gb"])
                    rows.append((f"compressed ({s}{how}): CPU per GB <= 1/4 of MM2 tuned", f"1/{fmt(cr, 1)}",
                                 verdict(None if cr is None else cr >= 4)))
                    r = ratio(p["rps"], t["rps"])
                    rows.append((f"compressed ({s}{how}): throughput >= 1.5x MM2 tuned", fmt(r, 2, "x"),
                                 verdict(None if r is None else r >= 1.5)))
                rows.append((f"compressed ({s}{how}): the target stores compressed batches", p["codec"],
                             verdict(p["codec"] != "n/a" and "none" not in p["codec"])))
    rss_o = max((e["arms"]["ours"]["rss_mib"] for e in sets.values() if "ours" in e["arms"]), default=None)
    rss_m = max((e["arms"][a]["rss_mib"] for e in sets.values() for a in ("mm2", "mm2t") if a in e["arms"]),
                default=None)
    if rss_o and rss_m:
        rows.append(("peak RSS <= 1/8 of MM2's (smallest MM2)", f"1/{rss_m / rss_o:.1f}", verdict(rss_o * 8 <= rss_m)))
    o = steady.get("ours")
    for base in ("mm2", "mm2t"):
        m = steady.get(base)
        if o and m:
            pairs = paired_p99s(summary, base)
            ok = all(po is not None and pm is not None and po <= pm for _, po, pm in pairs) if pairs else None
            rows.append((f"p99 latency no worse than {NAMES[base]}'s, every repetition",
                         ", ".join(f"{fmt(po, 1)} vs {fmt(pm, 1)} ms" for _, po, pm in pairs), verdict(ok)))
    rows += partition_targets(summary["parts"], verdict)
    for arm, a in summary["b3"].items():
        rows.append((f"3 brokers, a leader change on each side: no record missing ({NAMES[arm]})",
                     f"{a['missing']} missing, {a['duplicates']} duplicates", verdict(a["missing"] == 0 and a["complete"])))
    if o:
        fp = o["freshness_ms"]["p99"]
        rows.append(("checkpoint freshness p99 <= 2 s (defaults)", fmt(None if fp is None else fp / 1000, 2, " s"),
                     verdict(None if fp is None else fp <= 2000 and o["commits_without_checkpoint"] == 0)))
        rr = o["reread_after_failover"]["total"]
        rows.append(("zero records re-read after failover (steady state)", str(rr),
                     verdict(rr == 0 and o["final_checkpoint_exact"])))
    return rows


def partition_targets(parts, verdict):
    rows = []
    counts = [c for c in parts if "ours" in parts[c]]
    if len(counts) >= 2:
        # The whole run's peak (VmHWM after the groups phase, when there was one): the copy and
        # the groups' checkpoints both count.
        def peak(c):
            o = parts[c]["ours"]
            g = o["groups"]
            return max(o["rss_mib"], (g["peak_rss_kib"] or 0) / 1024 if g else 0)

        lo, hi = counts[0], counts[-1]
        g = peak(hi) / peak(lo)
        rows.append((f"peak RSS grows <= 1.5x from {lo} to {hi} partitions (copy and groups)",
                     f"{g:.2f}x ({fmt(peak(lo))} -> {fmt(peak(hi))} MiB)", verdict(g <= 1.5)))
    for c in counts:
        theirs = [parts[c][a]["rss_mib"] for a in ("mm2", "mm2t") if a in parts[c]]
        if theirs:
            r = min(theirs) / parts[c]["ours"]["rss_mib"]
            rows.append((f"{c} partitions: peak RSS of the copy <= 1/8 of MM2's (smallest MM2)", f"1/{r:.1f}",
                         verdict(r >= 8)))
    if counts:
        c = counts[-1]
        g = parts[c]["ours"]["groups"]
        if g:
            fp = g["freshness_ms"]["p99"]
            rows.append((f"checkpoint freshness p99 <= 2 s with {g['groups']} groups and {c} partitions",
                         fmt(None if fp is None else fp / 1000, 2, " s"),
                         verdict(None if fp is None else fp <= 2000 and g["commits_without_checkpoint"] == 0)))
    return rows


def paired_p99s(summary, base):
    runs = summary["steady_runs"]
    theirs = {r["rep"]: r["result"]["latency_ms"]["p99"] for r in runs.get(base, [])}
    return [(r["rep"], r["result"]["latency_ms"]["p99"], theirs.get(r["rep"])) for r in runs.get("ours", [])
            if r["rep"] in theirs]


def set_records(c, s):
    """Records in data set S."""
    if s.startswith("w"):
        return c["wan_n"]
    return {"big": c.get("big_n"), "small": c.get("small_n")}.get(s, c.get("json_n"))


def wan_link(s):
    """A WAN set's link: "w50" is 50 ms RTT, "w50c50" the same behind a 50 MiB/s cap."""
    rtt, _, cap = s[1:].partition("c")
    return int(rtt), float(cap) if cap else None


def set_label(c, s, e):
    if s.startswith("w"):
        rtt, cap = wan_link(s)
        capped = f", {cap:g} MiB/s cap" if cap else ""
        return f"{c['wan_n']:,} x {e['size']} B (random) over the WAN link, {rtt} ms RTT{capped}"
    n = set_records(c, s)
    kind = f"JSON-like, {s} batches" if s not in ("big", "small") else "random"
    return f"{n:,} x {e['size']} B ({kind})"


def pipe_text(e):
    parts = []
    for p in e["pipe"]:
        r = p["result"]
        steps = lambda key: " / ".join(f"{fmt(x['records_per_s'])}" for x in r[key])
        parts.append(f"rep {p['rep']} (load {p.get('load_average', '?')}): produce by 1.. clients {steps('produce')}; "
                     f"consume {steps('consume')}; both at once {steps('both')} records/s")
    return parts


def clusters_text(c):
    phases = c.get("phases", "base").split()
    if phases == ["brokers3"]:
        return "three-node"
    return "single-broker" + (" (three-node for the three-broker phase)" if "brokers3" in phases else "")


def markdown(summary):
    c = summary["config"]
    sets, steady = summary["sets"], summary["steady"]
    mode = ", smoke" if c.get("smoke") else (", quick" if c.get("quick") else "")
    end = summary.get("end")
    lines = [
        f"# MirrorFlow vs MirrorMaker 2: {c['date']} (tree {c['commit']}, replicator built "
        f"{c.get('binary_built', '?')}{mode}; scenarios: {c.get('phases', 'base')})",
        "",
    ]
    if c.get("ours_flow"):
        lines += [f"Our flow with `{c['ours_flow']}` added (a trial).", ""]
    lines += [
        f"Same two {clusters_text(c)} KRaft clusters on loopback"
        + (" (the WAN sets: a source broker of its own in a network namespace, across the WAN link; "
           "bench/README.md)" if "wan" in c.get("phases", "").split() else "")
        + f", {c['nproc']} cores shared with other work "
        f"(load average at the start: {c.get('load_average', '?')}"
        + (f", at the end: {end['load_average']}, {end['seconds']} s in all" if end else "") + "); "
        f"{c['partitions']} partitions; copies repeated {c['reps']}x with the arms rotating, medians shown; "
        "the load column is the load average (1, 5, 15 min) when each figure was taken. "
        "Throughput is counted on the target (end offsets polled every 100 ms) from its first copied record "
        "to the last, so start-up is excluded (shown separately). MB = 2^20 bytes of record values. "
        "Pipe limit = what librdkafka clients reach with 1, 2, ... producers into the target and consumers "
        "from the source, stopping when one more client adds less than 5 % (the smaller of the two ends; "
        "'at once': both ends busy together, as replication loads them), measured just before the copies of "
        "its repetition. CPU = utime+stime of the replicator process over the copy window (per GB: of record "
        "values, uncompressed); peak RSS = VmHWM (MM2: its JVM). Target codec: the codec of the batches the "
        "target broker stored (read from its log segments), and their size. Settings of each arm: "
        "bench/README.md.",
        "",
    ]
    if sets:
        lines += [
            "## Throughput, CPU, memory",
            "",
            "| data set | | records/s | MB/s | of pipe limit | CPU s / M records | CPU s / GB | peak RSS MiB "
            "| start-up s | target codec, stored MB | load |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
    for s, e in sets.items():
        label = set_label(c, s, e)
        if e["pipe_rps"]:
            lines.append(f"| {label} | pipe limit | {fmt(e['pipe_rps'])} | {fmt(e['pipe_rps'] * e['size'] / MIB, 1)} "
                         f"| 100% | | | | | | {load_text(e['pipe'])} |")
            lines.append(f"| | pipe limit, both ends at once | {fmt(e['pipe_both_rps'])} | "
                         f"{fmt(e['pipe_both_rps'] * e['size'] / MIB, 1)} | "
                         f"{fmt(100 * e['pipe_both_rps'] / e['pipe_rps'], 0, '%')} | | | | | | |")
            label = ""
        for arm, a in e["arms"].items():
            frac = "" if a["pipe_fraction"] is None else fmt(100 * a["pipe_fraction"], 0, "%") + (
                f" ({100 * a['pipe_both_fraction']:.0f}% at once)" if a["pipe_both_fraction"] is not None else "")
            stored = sum(a["stored_bytes"].values()) / MIB if a["stored_bytes"] else None
            # A copy the WAN scenario's window limit ended: its rate is over that window.
            limited = [r["result"]["records"] for r in a["runs"] if r["result"].get("limited")]
            name = NAMES[arm] + (f" (stopped at the window limit, {min(limited):,} of "
                                 f"{set_records(c, s):,} copied)" if limited else "")
            lines.append(f"| {label} | {name} | {fmt(a['rps'])} | {fmt(a['mibps'], 1)} | {frac} | "
                         f"{fmt(a['cpu_per_m'], 1)} | {fmt(a['cpu_per_gb'], 1)} | {fmt(a['rss_mib'], 0)} | "
                         f"{fmt(a['startup_s'], 1)} | {a['codec']}, {fmt(stored, 1)} | {a['load']} |")
            label = ""
        pairs = [("ours", b) for b in ("oursn", "oursf", "mm2", "mm2t")] + [("ours2", "mm2t"), ("oursr", "mm2"), ("oursr", "mm2t"), ("oursb", "mm2"), ("oursb", "mm2t"), ("oursp", "mm2t")]
        for mine, base in pairs:
            o, b = e["arms"].get(mine), e["arms"].get(base)
            if not o or not b:
                continue
            paired = ", ".join(f"{ratio(o['rps_by_rep'].get(r), v) or 0:.2f}x"
                               for r, v in sorted(b["rps_by_rep"].items()))
            who = "ours" if mine == "ours" else NAMES[mine].split(" (")[0]
            lines.append(f"| | **{who} / {NAMES[base]}** | **{fmt(ratio(o['rps'], b['rps']), 2, 'x')}** "
                         f"(per rep: {paired}) | | | | {fmt(ratio(b['cpu_per_gb'], o['cpu_per_gb']), 1, 'x less')} "
                         f"| {fmt(ratio(b['rss_mib'], o['rss_mib']), 1, 'x less')} | | | |")
    pipes = [t for e in sets.values() for t in pipe_text(e)]
    if pipes:
        lines += ["", "Pipe-limit steps: " + "; ".join(pipes) + "."]
    if summary["loads"]:
        lines += ["", "Compressed data sets on the source: " + "; ".join(
            f"{l['topic']}: {l['result']['records']:,} records, {l['result']['bytes'] / MIB:.0f} MiB of values, "
            f"stored as {codec_text(l.get('source_codec'))} ({sum(l['source_codec']['bytes'].values()) / MIB:.1f} "
            f"MiB stored)" for l in summary["loads"]) + "."]
    if steady:
        lines += [
            "",
            f"## Steady traffic: {c['rate']} records/s of {c['big_size']} B for {c['steady_s']} s",
            "",
            "Latency: producer send stamp (header) to the record read on the target. Freshness: a group "
            "commits on the source every second; time from the commit to a checkpoint at or past it for "
            "every partition it moved, visible on the target. Re-read: after the traffic, the group "
            "commits the end; once the latest checkpoint of every partition carries it exactly (or after "
            f"{c['settle_s']} s) a consumer failing over on the latest checkpoints reads the target from their "
            "downstream offsets, counting records the group had already consumed. CPU: the replicator "
            "process's CPU seconds per second during the traffic. Translation gap: upstream - downstream of "
            "every checkpoint seen during the traffic (records a failover on it would repeat).",
            "",
            "| | latency p50 ms | latency p99 ms | freshness p50 s | freshness p99 s | commits never checkpointed | "
            "re-read after failover | translation gap p50 / max | final checkpoint | CPU s/s | load |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
        ]
        for arm in ARM_ORDER:
            st = steady.get(arm)
            if not st:
                continue
            lat, fr, gap = st["latency_ms"], st["freshness_ms"], st["translation_gap_records"]
            f50 = None if fr["p50"] is None else fr["p50"] / 1000
            f99 = None if fr["p99"] is None else fr["p99"] / 1000
            final = ("exact" if st["final_checkpoint_exact"] else
                     ("carries the final commit, not exact" if st["final_checkpoint_covered"] else "behind the final commit"))
            lines.append(
                f"| {NAMES[arm]} | {fmt(lat['p50'], 1)} | {fmt(lat['p99'], 1)} | {fmt(f50, 2)} | {fmt(f99, 2)} | "
                f"{st['commits_without_checkpoint']} of {st['commits']} | {st['reread_after_failover']['total']} | "
                f"{fmt(gap['p50'])} / {fmt(gap['max'])} | {final} after {st['settle_s']:.1f} s | "
                f"{fmt(st.get('cpu_s_per_s_during_traffic'), 3)} | {st.get('load_average', '?')} |")
        if len(summary["steady_runs"].get("ours", [])) > 1:
            lines += ["", f"Rows: each arm's run with the median p99 of its {len(summary['steady_runs']['ours'])} runs."]
    lines += partitions_markdown(c, summary["parts"], summary["parts_loads"])
    lines += b3_markdown(c, summary["b3"], summary["b3_loads"])
    failed = summary.get("failed", [])
    if failed:
        lines += ["", "Failed copies (no figure; the arm died and the run went on): " + "; ".join(
            f"{NAMES[f['arm']]}, set {f['set']}, repetition {f['rep']}: {f['why']}" for f in failed) + "."]
    lines += ["", "## Targets (issues 7 and 20)", "", "| target | measured | verdict |", "|---|---|---|"]
    for t, v, ok in targets(summary):
        lines.append(f"| {t} | {v} | {ok} |")
    lines += ["", "![chart](chart.png)", ""]
    return "\n".join(lines)


def partitions_markdown(c, parts, loads):
    if not parts:
        return []
    lines = [
        "",
        f"## Many partitions: {c['parts_n']:,} JSON-like 1 KiB records (lz4 batches) over each partition count",
        "",
        "One topic of 8 partitions, or topics of 10. Copy: as above, over all the topics together. Groups: "
        f"{c['parts_groups']} groups without members, group g owning every partition of topic g mod topics, each "
        f"committing every {c['parts_commit_ms'] / 1000:g} s (spread over the interval) for {c['parts_fresh_s']} s "
        "with the arm still running after its copy; freshness of a commit = time until every partition it set has "
        "a checkpoint at or past it, visible on the target. Peak RSS with groups: VmHWM after the groups phase.",
        "",
        "| partitions (topics) | | records/s | CPU s / M records | peak RSS MiB | start-up s | "
        "group-partitions committed | freshness p50 / p99 s | commits never checkpointed | peak RSS with groups MiB "
        "| CPU s/s with groups | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for count, arms in parts.items():
        label = f"{count:,} ({next(iter(arms.values()))['topics']})"
        for arm, a in arms.items():
            g = a["groups"]
            if g:
                fr = g["freshness_ms"]
                f = (f"{fmt(None if fr['p50'] is None else fr['p50'] / 1000, 2)} / "
                     f"{fmt(None if fr['p99'] is None else fr['p99'] / 1000, 2)}")
                gcols = (f"{g['group_partitions']:,} | {f} | {g['commits_without_checkpoint']} of {g['commits']} | "
                         f"{fmt(None if g['peak_rss_kib'] is None else g['peak_rss_kib'] / 1024)} | "
                         f"{fmt(g['cpu_s_per_s'], 3)}")
            else:
                gcols = " | | | | "
            lines.append(f"| {label} | {NAMES[arm]} | {fmt(a['rps'])} | {fmt(a['cpu_per_m'], 1)} | "
                         f"{fmt(a['rss_mib'])} | {fmt(a['startup_s'], 1)} | {gcols} | {a['load']} |")
            label = ""
        o = arms.get("ours")
        for base in ("mm2", "mm2t"):
            b = arms.get(base)
            if o and b:
                lines.append(f"| | **ours / {NAMES[base]}** | **{fmt(ratio(o['rps'], b['rps']), 2, 'x')}** | "
                             f"{fmt(ratio(b['cpu_per_m'], o['cpu_per_m']), 1, 'x less')} | "
                             f"{fmt(ratio(b['rss_mib'], o['rss_mib']), 1, 'x less')} | | | | | | | |")
    if loads:
        lines += ["", "Loaded: " + "; ".join(
            f"{l['partitions']} partitions: {l['result']['records']:,} records in {l['result']['seconds']:.1f} s"
            for l in loads) + "."]
    return lines


def b3_markdown(c, b3, loads):
    if not b3:
        return []
    lines = [
        "",
        f"## Three brokers: {c['b3_n']:,} JSON-like 1 KiB records (lz4) over {c['partitions']} partitions, "
        "a leader change on each side",
        "",
        "Both clusters of 3 KRaft nodes (combined broker+controller, static 3-voter quorum), replication factor 3 "
        "and min.insync.replicas 2 for every topic (internal ones too; MirrorMaker's internal topics RF 3). While "
        f"each arm copies, once the target holds {c['b3_source_at']} % of the records the source node leading "
        f"partition 0 is stopped (SIGTERM, controlled shutdown) and started again, and at {c['b3_target_at']} % "
        "the target node leading the copy's partition 0; each side then waits until every replica is in sync and "
        "moves leadership back to the preferred replicas (kafka-leader-election): two leader changes per side "
        "(smoke and BENCH_B3_RESTART=false: the stopped nodes stay down, one leader change per side). "
        "Throughput, CPU and peak RSS as above (the copy window includes the leader changes); before / after the "
        "first stop: the rate from the first copied record to the first node's stop, and from there to the end "
        "(from the copied count sampled once a second). Longest stall: the "
        f"longest time the target's end offsets did not move during the copy, and when it began, in seconds from the "
        f"arm's start (a copy still for {c['b3_stall_s']} s "
        "ends as incomplete). Missing / duplicates: the copy read back record by record (every record carries its "
        "sequence number) once its end offsets stood still for 5 s, with the arm still running.",
        "",
        "| | records/s | before / after the first stop | CPU s / M records | peak RSS MiB | start-up s | "
        "longest stall s (from s) | complete | missing | duplicates | load |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for arm, a in b3.items():
        lines.append(f"| {NAMES[arm]} | {fmt(a['rps'])} | {fmt(a['rps_before'])} / {fmt(a['rps_after'])} | "
                     f"{fmt(a['cpu_per_m'], 1)} | {fmt(a['rss_mib'])} | "
                     f"{fmt(a['startup_s'], 1)} | {fmt(a['max_stall_s'], 1)} ({fmt(a['stall_from_s'], 1)}) | "
                     f"{'yes' if a['complete'] else '**no**'} | "
                     f"{a['missing'] if not a['missing'] else '**' + str(a['missing']) + '**'} | {a['duplicates']} | "
                     f"{a['load']} |")
    o = b3.get("ours")
    for base in ("oursq", "mm2", "mm2t"):
        b = b3.get(base)
        if o and b:
            paired = ", ".join(f"{ratio(o['rps_by_rep'].get(r), v) or 0:.2f}x" for r, v in sorted(b["rps_by_rep"].items()))
            lines.append(f"| **ours / {NAMES[base]}** | **{fmt(ratio(o['rps'], b['rps']), 2, 'x')}** (per rep: {paired}) "
                         f"| | {fmt(ratio(b['cpu_per_m'], o['cpu_per_m']), 1, 'x less')} | "
                         f"{fmt(ratio(b['rss_mib'], o['rss_mib']), 1, 'x less')} | | | | | | |")
    lines += ["", "Leader changes (times from the arm's start; copy window = start-up to start-up + window):", ""]
    for arm, a in b3.items():
        for r in a["runs"]:
            res = r["result"]
            lines.append(f"- {NAMES[arm]}, rep {r['rep']} (copy {res['startup_s']:.1f}-{res['startup_s'] + res['window_s']:.1f} s): "
                         + "; ".join(f"{ev['side']}: {leader_change_text(r, ev)}" for ev in r["leader_changes"]))
            v = r["verify"]
            if v["missing"] or v["duplicates"] or v["foreign"]:
                lines.append(f"  - read back: {v['records_read']:,} records, {v['missing']} missing "
                             f"(seq e.g. {v['missing_seq_examples']}; on the source: {v['missing_on_source']}), "
                             f"{v['duplicates']} duplicates (by target partition: {v['duplicates_by_partition']}; "
                             f"e.g. {v['duplicate_examples'][:3]}), {v['foreign']} not of the data set")
    if loads:
        lines += ["", "Loaded: " + "; ".join(
            f"{l['result']['records']:,} records ({l['result']['bytes'] / MIB:.0f} MiB of values) in "
            f"{l['result']['seconds']:.1f} s (acks=all)" for l in loads) + "."]
    return lines


def chart_partitions(summary, path):
    """Throughput, peak RSS and freshness against the partition count (chart-partitions.png)."""
    parts = summary["parts"]
    if not parts:
        return
    import matplotlib.pyplot as plt

    counts = list(parts)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for arm in ARM_ORDER:
        xs = [c for c in counts if arm in parts[c]]
        if not xs:
            continue
        axes[0].plot(xs, [parts[c][arm]["rps"] for c in xs], marker="o", label=NAMES[arm], color=COLORS[arm])
        axes[1].plot(xs, [parts[c][arm]["rss_mib"] for c in xs], marker="o", label=NAMES[arm], color=COLORS[arm])
        fresh = [(c, parts[c][arm]["groups"]) for c in xs if parts[c][arm]["groups"]]
        for q, style in (("p50", "--"), ("p99", "-")):
            pts = [(c, g["freshness_ms"][q] / 1000) for c, g in fresh if g["freshness_ms"][q] is not None]
            if pts:
                axes[2].plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o",
                             label=f"{NAMES[arm]} {q}", color=COLORS[arm])
    for ax, title, unit in ((axes[0], "Throughput", "records/s"), (axes[1], "Peak RSS", "MiB (log)"),
                            (axes[2], "Checkpoint freshness, groups committing", "s")):
        ax.set_xscale("log")
        ax.set_xticks(counts)
        ax.set_xticklabels([str(c) for c in counts])
        ax.set_xlabel("source partitions")
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    axes[2].axhline(2, color="black", linestyle="--", linewidth=1)
    fig.suptitle(f"Many partitions ({summary['config']['date']}, {summary['config']['nproc']} shared cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def chart(summary, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: chart skipped", file=sys.stderr)
        return
    sets, steady = summary["sets"], summary["steady"]
    names = list(sets)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    labels = dict(NAMES, pipe="pipe limit")

    def bars(ax, series, title, ylabel, log=False):
        keys = [k for k in ["pipe"] + ARM_ORDER if any(series(k, n) is not None for n in names)]
        width = 0.8 / max(len(keys), 1)
        for i, key in enumerate(keys):
            ax.bar([j + i * width for j in range(len(names))], [series(key, n) or 0 for n in names], width,
                   label=labels[key], color=COLORS[key])
        ax.set_xticks([j + width * (len(keys) - 1) / 2 for j in range(len(names))])
        ax.set_xticklabels([f"{n}\n{sets[n]['size']} B" for n in names], fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        if keys:
            ax.legend(fontsize=7)

    def arm_value(field):
        def get(key, n):
            if key == "pipe":
                return None
            a = sets[n]["arms"].get(key)
            return a[field] if a else None
        return get

    bars(axes[0][0], lambda k, n: sets[n]["pipe_rps"] if k == "pipe" else arm_value("rps")(k, n),
         "Throughput", "records/s")
    bars(axes[0][1], lambda k, n: None if k == "pipe" or arm_value("pipe_fraction")(k, n) is None
         else 100 * arm_value("pipe_fraction")(k, n), "Throughput as % of the pipe limit", "%")
    axes[0][1].axhline(80, color="black", linestyle="--", linewidth=1)
    bars(axes[0][2], arm_value("cpu_per_gb"), "CPU per GB of values", "CPU s")
    bars(axes[1][0], arm_value("rss_mib"), "Peak RSS", "MiB")
    arms = [a for a in ARM_ORDER if a in steady]
    for ax, key, title, unit, scale in ((axes[1][1], "latency_ms", "End-to-end latency", "ms", 1),
                                        (axes[1][2], "freshness_ms", "Checkpoint freshness", "s", 1000)):
        width = 0.8 / max(len(arms), 1)
        for i, a in enumerate(arms):
            raw = [steady[a][key]["p50"], steady[a][key]["p99"]]
            xs = [j + i * width for j in range(2)]
            ax.bar(xs, [(v or 0) / scale for v in raw], width, label=labels[a], color=COLORS[a])
            for xv, v in zip(xs, raw):
                if v is None:
                    ax.annotate("none seen", (xv, 0), xycoords=("data", "axes fraction"), ha="center",
                                va="bottom", fontsize=7, rotation=90, color=COLORS[a])
        ax.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(2)])
        ax.set_xticklabels(["p50", "p99"])
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel(unit + " (log)")
        if arms:
            ax.legend(fontsize=7)
    fig.suptitle(f"MirrorFlow vs MirrorMaker 2 ({summary['config']['date']}, {summary['config']['nproc']} shared cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    chart_partitions(summary, path.with_name("chart-partitions.png"))


def check(raw, summary):
    """Every phase of the run's scenarios gave a figure (bench/run.sh --smoke)."""
    phases = summary["config"].get("phases", "base").split()
    problems = []
    expected_sets = (["big", "small"] if "base" in phases else []) + (["lz4", "zstd"] if "compressed" in phases else [])
    if "wan" in phases:
        expected_sets += [f"w{r}" for r in summary["config"]["wan_links"].split()]
    for s in expected_sets:
        e = summary["sets"].get(s)
        if not e or "ours" not in e["arms"]:
            problems.append(f"copy of {s}: no figure")
            continue
        for arm, a in e["arms"].items():
            if not a["rps"] or a["rps"] <= 0 or a["cpu_per_m"] is None or not a["rss_mib"]:
                problems.append(f"copy of {s} by {arm}: no throughput, CPU or RSS")
            if any(r["result"].get("window_records", 1) <= 0 for r in a["runs"]):
                problems.append(f"copy of {s} by {arm}: complete at the first look, no rate measured")
            if a["codec"] == "n/a":
                problems.append(f"copy of {s} by {arm}: no target batches read")
        if s in ("big", "small") and not (e["pipe_rps"] and e["pipe_both_rps"]):
            problems.append(f"pipe limit of {s}: no figure")
    if "base" in phases or "latency" in phases:
        st = summary["steady"].get("ours")
        if not st or not st["latency_ms"]["count"] or st["freshness_ms"]["p99"] is None:
            problems.append("steady: no latency or freshness figure")
    if "compressed" in phases and len(raw.get("load", [])) < 2:
        problems.append("compressed data sets: not loaded")
    if "partitions" in phases:
        for count in map(int, summary["config"]["parts_counts"].split()):
            o = summary["parts"].get(count, {}).get("ours")
            if not o or not o["rss_mib"]:
                problems.append(f"copy over {count} partitions: no copy or RSS")
            elif not o["groups"] or o["groups"]["freshness_ms"]["p99"] is None:
                problems.append(f"groups over {count} partitions: no freshness figure")
    if "brokers3" in phases:
        b3 = summary["b3"]
        if "ours" not in b3:
            problems.append("brokers3: no copy by ours")
        for arm, a in b3.items():
            if not a["rps"] or a["cpu_per_m"] is None or not a["rss_mib"]:
                problems.append(f"brokers3 copy by {arm}: no throughput, CPU or RSS")
            if not a["complete"] or a["missing"]:
                problems.append(f"brokers3 copy by {arm}: {a['missing']} records missing (complete: {a['complete']})")
            for r in a["runs"]:
                if {ev["side"] for ev in r["leader_changes"]} != {"source", "target"}:
                    problems.append(f"brokers3 copy by {arm}: a side had no leader change")
    for f in summary["failed"]:
        problems.append(f"{f['arm']} died in {f['set']}: {f['why']}")
    if len(summary["sets"]) < 1 and not summary["parts"] and not summary["b3"]:
        problems.append("no copy at all")
    for p in problems:
        print(f"smoke: {p}", file=sys.stderr)
    return not problems


def main():
    out = Path(sys.argv[1])
    raw = load(out / "raw.jsonl")
    summary = summarise(raw)
    summary["end"] = (raw.get("end") or [None])[0]
    (out / "results.md").write_text(markdown(summary))
    chart(summary, out / "chart.png")
    print((out / "results.md").read_text())
    if "--check" in sys.argv[2:] and not check(raw, summary):
        sys.exit(1)


if __name__ == "__main__":
    main()
