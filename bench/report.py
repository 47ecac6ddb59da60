#!/usr/bin/env python3
"""Turns bench/run.sh's raw.jsonl into results.md (table, ratios, targets) and chart.png.

Usage: report.py RESULTS_DIR   (matplotlib only for the chart; without it the chart is skipped)
"""

import json
import statistics
import sys
from pathlib import Path

MIB = 1024 * 1024


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


def summarise(raw):
    config = raw["config"][0]
    sizes = {"big": config["big_size"], "small": config["small_size"]}
    pipes, pipes_both = {}, {}
    for p in raw.get("pipe", []):
        pipes.setdefault(p["set"], []).append(min(p["produce"]["records_per_s"], p["consume_source_rps"]))
        if "both" in p:
            both = p["both"]
            pipes_both.setdefault(p["set"], []).append(min(both["produce"]["records_per_s"], both["consume_source_rps"]))
    copies = {}
    for c in raw.get("copy", []):
        copies.setdefault((c["arm"], c["set"]), []).append(c)
    out = {"config": config, "sets": {}, "steady": {}}
    for s in ("big", "small"):
        pipe_list = pipes.get(s, [])
        both_list = pipes_both.get(s, [])
        entry = {"size": sizes[s], "pipe_rps": median(pipe_list), "pipe_runs": pipe_list,
                 "pipe_both_rps": median(both_list)}
        for arm in ("ours", "mm2"):
            runs = copies.get((arm, s), [])
            rps = [r["result"]["records_per_s"] for r in runs]
            # Each copy against the pipe limit measured just before it (same repetition).
            fractions = [
                r["result"]["records_per_s"] / pipe_list[r["rep"] - 1]
                for r in runs
                if r["rep"] - 1 < len(pipe_list)
            ]
            fractions_both = [
                r["result"]["records_per_s"] / both_list[r["rep"] - 1]
                for r in runs
                if r["rep"] - 1 < len(both_list)
            ]
            entry[arm] = {
                "pipe_both_fraction": median(fractions_both),
                "runs": rps,
                "rps": median(rps),
                "mibps": median(rps) * sizes[s] / MIB if rps else None,
                "pipe_fraction": median(fractions),
                "cpu_per_m": median([r["result"]["cpu_s_per_million"] for r in runs]),
                "rss_mib": max((r["result"]["peak_rss_kib"] / 1024 for r in runs), default=None),
                "startup_s": median([r["result"]["startup_s"] for r in runs]),
            }
        o, m = entry["ours"]["rps"], entry["mm2"]["rps"]
        entry["ratio"] = o / m if o and m else None
        # Paired ratios per repetition (same machine conditions).
        entry["paired_ratios"] = [a / b for a, b in zip(entry["ours"]["runs"], entry["mm2"]["runs"]) if b]
        out["sets"][s] = entry
    # Steady phases run once per repetition (arms alternating which goes first). The row shown
    # per arm is its run with the median latency p99, so every figure in it comes from one real
    # run; the p99s of all runs are kept for the per-repetition comparison.
    steady_runs = {}
    for st in raw.get("steady", []):
        steady_runs.setdefault(st["arm"], []).append(st)
    out["steady_p99s"] = {}
    for arm, runs in steady_runs.items():
        ordered = sorted(runs, key=lambda r: r["result"]["latency_ms"]["p99"] or float("inf"))
        out["steady"][arm] = ordered[(len(ordered) - 1) // 2]["result"]
        out["steady_p99s"][arm] = [(r.get("rep", 1), r["result"]["latency_ms"]["p99"]) for r in runs]
    return out


def targets(summary):
    sets, steady = summary["sets"], summary["steady"]
    rows = []

    def verdict(ok):
        return "n/a" if ok is None else ("**holds**" if ok else "**not met**")

    for s, e in sets.items():
        r = e["ratio"]
        rows.append((f"throughput >= 1.5x MM2 ({s})", fmt(r, 2, "x"), verdict(None if r is None else r >= 1.5)))
        f = e["ours"]["pipe_fraction"]
        rows.append((f"throughput >= 80% of the pipe limit ({s})", fmt(None if f is None else 100 * f, 0, "%"),
                     verdict(None if f is None else f >= 0.8)))
        fb = e["ours"]["pipe_both_fraction"]
        if fb is not None:
            rows.append((f"(for reading: of the limit with both ends busy at once) ({s})", fmt(100 * fb, 0, "%"),
                         "**holds**" if fb >= 0.8 else "**not met**"))
    rss_o = max((e["ours"]["rss_mib"] or 0) for e in sets.values()) or None
    rss_m = max((e["mm2"]["rss_mib"] or 0) for e in sets.values()) or None
    if rss_o and rss_m:
        rows.append(("peak RSS <= 1/8 of MM2's", f"1/{rss_m / rss_o:.1f}", verdict(rss_o * 8 <= rss_m)))
    o, m = steady.get("ours"), steady.get("mm2")
    if o and m:
        po, pm = o["latency_ms"]["p99"], m["latency_ms"]["p99"]
        rows.append(("p99 latency no worse than MM2's", f"{fmt(po, 1)} vs {fmt(pm, 1)} ms",
                     verdict(None if po is None or pm is None else po <= pm)))
    if o:
        fp = o["freshness_ms"]["p99"]
        rows.append(("checkpoint freshness p99 <= 2 s (defaults)", fmt(None if fp is None else fp / 1000, 2, " s"),
                     verdict(None if fp is None else fp <= 2000 and o["commits_without_checkpoint"] == 0)))
        rr = o["reread_after_failover"]["total"]
        rows.append(("zero records re-read after failover (steady state)", str(rr),
                     verdict(rr == 0 and o["final_checkpoint_exact"])))
    return rows


def markdown(summary):
    c = summary["config"]
    sets, steady = summary["sets"], summary["steady"]
    lines = [
        f"# MirrorFlow vs MirrorMaker 2: {c['date']} (tree {c['commit']}, replicator built "
        f"{c.get('binary_built', '?')}{', quick' if c['quick'] else ''})",
        "",
        f"Same two single-broker KRaft clusters on loopback, {c['nproc']} cores shared with other work; "
        f"{c['partitions']} partitions; copies repeated {c['reps']}x with the arms alternating, medians shown. "
        "Throughput is counted on the target (end offsets polled every 100 ms) from its first copied record "
        "to the last, so start-up is excluded (shown separately). MB = 2^20 bytes of record values. "
        "Pipe limit = min(ProducerPerformance into the target, rate watched on the target the same way; "
        "ConsumerPerformance fetch rate from the source), each run alone just before the copies of its "
        "repetition" + (", then both at once (as replication loads the brokers; shown as 'at once')"
                        if any(e["pipe_both_rps"] for e in sets.values()) else "") + "; each "
        "arm's fraction is against its own repetition's limit. CPU = utime+stime of the replicator process over the copy window; "
        "peak RSS = VmHWM (MM2: its JVM).",
        "",
        "## Throughput, CPU, memory",
        "",
        "| data set | | records/s | MB/s | of pipe limit | CPU s / M records | peak RSS MiB | start-up s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s, e in sets.items():
        label = f"{c[s + '_n']:,} x {e['size']} B"
        lines.append(f"| {label} | pipe limit | {fmt(e['pipe_rps'])} | "
                     f"{fmt(e['pipe_rps'] * e['size'] / MIB if e['pipe_rps'] else None, 1)} | 100% | | | |")
        if e["pipe_both_rps"]:
            lines.append(f"| | pipe limit, both ends at once | {fmt(e['pipe_both_rps'])} | "
                         f"{fmt(e['pipe_both_rps'] * e['size'] / MIB, 1)} | "
                         f"{fmt(100 * e['pipe_both_rps'] / e['pipe_rps'] if e['pipe_rps'] else None, 0, '%')} | | | |")
        for arm, name in (("ours", "MirrorFlow"), ("mm2", "MirrorMaker 2")):
            a = e[arm]
            frac = None if a["pipe_fraction"] is None else 100 * a["pipe_fraction"]
            fb = a["pipe_both_fraction"]
            frac_text = fmt(frac, 0, "%") + (f" ({100 * fb:.0f}% at once)" if fb is not None else "")
            lines.append(f"| | {name} | {fmt(a['rps'])} | {fmt(a['mibps'], 1)} | {frac_text} | "
                         f"{fmt(a['cpu_per_m'], 1)} | {fmt(a['rss_mib'], 0)} | {fmt(a['startup_s'], 1)} |")
        paired = ", ".join(f"{r:.2f}x" for r in e["paired_ratios"])
        lines.append(f"| | **ratio ours/MM2** | **{fmt(e['ratio'], 2, 'x')}** | | | "
                     f"{fmt(e['mm2']['cpu_per_m'] / e['ours']['cpu_per_m'] if e['ours']['cpu_per_m'] and e['mm2']['cpu_per_m'] else None, 1, 'x less')} | "
                     f"{fmt(e['mm2']['rss_mib'] / e['ours']['rss_mib'] if e['ours']['rss_mib'] and e['mm2']['rss_mib'] else None, 1, 'x less')} | |")
        if paired:
            lines.append(f"| | per repetition | {paired} | | | | | |")
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
        "process's CPU seconds per second during the traffic. Translation gap: upstream - downstream of every "
        "checkpoint seen during the traffic (records a failover on it would repeat).",
        "",
        "| | latency p50 ms | latency p99 ms | freshness p50 s | freshness p99 s | commits never checkpointed | "
        "re-read after failover | translation gap p50 / max | final checkpoint | CPU s/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for arm, name in (("ours", "MirrorFlow"), ("mm2", "MirrorMaker 2 (defaults)")):
        st = steady.get(arm)
        if not st:
            continue
        lat, fr, gap = st["latency_ms"], st["freshness_ms"], st["translation_gap_records"]
        f50 = None if fr["p50"] is None else fr["p50"] / 1000
        f99 = None if fr["p99"] is None else fr["p99"] / 1000
        lines.append(
            f"| {name} | {fmt(lat['p50'], 1)} | {fmt(lat['p99'], 1)} | {fmt(f50, 2)} | {fmt(f99, 2)} | "
            f"{st['commits_without_checkpoint']} of {st['commits']} | {st['reread_after_failover']['total']} | "
            f"{fmt(gap['p50'])} / {fmt(gap['max'])} | "
            f"{'exact' if st['final_checkpoint_exact'] else ('carries the final commit, not exact' if st['final_checkpoint_covered'] else 'behind the final commit')} "
            f"after {st['settle_s']:.1f} s | {fmt(st.get('cpu_s_per_s_during_traffic'), 3)} |")
    p99s = summary.get("steady_p99s", {})
    if len(p99s.get("ours", [])) > 1:
        mm2 = dict(p99s.get("mm2", []))
        pairs = ", ".join(f"{fmt(o99, 1)} vs {fmt(mm2.get(r), 1)} ms" for r, o99 in p99s["ours"])
        lines.append("")
        lines.append(f"Rows: each arm's run with the median p99 of its {len(p99s['ours'])} runs. "
                     f"Latency p99 per repetition, ours vs MM2: {pairs}.")
    o, m = steady.get("ours"), steady.get("mm2")
    if o and m and o["latency_ms"]["p99"] and m["latency_ms"]["p99"]:
        lines.append("")
        lines.append(f"Ratios: latency p99 MM2/ours {m['latency_ms']['p99'] / o['latency_ms']['p99']:.1f}x"
                     + (f", freshness p99 MM2/ours {m['freshness_ms']['p99'] / o['freshness_ms']['p99']:.0f}x"
                        if o["freshness_ms"]["p99"] and m["freshness_ms"]["p99"] else ""))
    lines += ["", "## Targets (issue 7)", "", "| target | measured | verdict |", "|---|---|---|"]
    for t, v, ok in targets(summary):
        lines.append(f"| {t} | {v} | {ok} |")
    lines += ["", "![chart](chart.png)", ""]
    return "\n".join(lines)


def chart(summary, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: chart skipped", file=sys.stderr)
        return
    sets, steady = summary["sets"], summary["steady"]
    colors = {"ours": "#2b7bba", "mm2": "#d95f02", "pipe": "#999999"}
    fig, axes = plt.subplots(2, 3, figsize=(14, 8))
    names = list(sets)
    x = range(len(names))

    def bars(ax, values, labels, title, ylabel, log=False):
        width = 0.8 / len(values)
        for i, (key, vals) in enumerate(values):
            ax.bar([j + i * width for j in x], [v or 0 for v in vals], width, label=labels[key], color=colors[key])
        ax.set_xticks([j + width * (len(values) - 1) / 2 for j in x])
        ax.set_xticklabels([f"{summary['config'][n + '_n']:,} x {sets[n]['size']} B" for n in names])
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=8)

    labels = {"ours": "MirrorFlow", "mm2": "MirrorMaker 2", "pipe": "pipe limit"}
    bars(axes[0][0], [("pipe", [sets[n]["pipe_rps"] for n in names]),
                      ("ours", [sets[n]["ours"]["rps"] for n in names]),
                      ("mm2", [sets[n]["mm2"]["rps"] for n in names])], labels, "Throughput", "records/s")
    bars(axes[0][1], [("ours", [100 * (sets[n]["ours"]["pipe_fraction"] or 0) for n in names]),
                      ("mm2", [100 * (sets[n]["mm2"]["pipe_fraction"] or 0) for n in names])], labels,
         "Throughput as % of the pipe limit", "%")
    axes[0][1].axhline(80, color="black", linestyle="--", linewidth=1)
    bars(axes[0][2], [("ours", [sets[n]["ours"]["cpu_per_m"] for n in names]),
                      ("mm2", [sets[n]["mm2"]["cpu_per_m"] for n in names])], labels,
         "CPU per million records", "CPU s")
    bars(axes[1][0], [("ours", [sets[n]["ours"]["rss_mib"] for n in names]),
                      ("mm2", [sets[n]["mm2"]["rss_mib"] for n in names])], labels, "Peak RSS", "MiB")
    arms = [a for a in ("ours", "mm2") if a in steady]
    for ax, key, title, unit, scale in ((axes[1][1], "latency_ms", "End-to-end latency", "ms", 1),
                                        (axes[1][2], "freshness_ms", "Checkpoint freshness", "s", 1000)):
        width = 0.35
        for i, a in enumerate(arms):
            raw = [steady[a][key]["p50"], steady[a][key]["p99"]]
            vals = [(v or 0) / scale for v in raw]
            xs = [j + i * width for j in range(2)]
            ax.bar(xs, vals, width, label=labels[a], color=colors[a])
            for xv, v in zip(xs, raw):
                if v is None:
                    ax.annotate("none seen", (xv, 0), xycoords=("data", "axes fraction"), ha="center",
                                va="bottom", fontsize=7, rotation=90, color=colors[a])
        ax.set_xticks([j + width / 2 for j in range(2)])
        ax.set_xticklabels(["p50", "p99"])
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel(unit + " (log)")
        ax.legend(fontsize=8)
    fig.suptitle(f"MirrorFlow vs MirrorMaker 2 ({summary['config']['date']}, {summary['config']['nproc']} shared cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    out = Path(sys.argv[1])
    summary = summarise(load(out / "raw.jsonl"))
    (out / "results.md").write_text(markdown(summary))
    chart(summary, out / "chart.png")
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
