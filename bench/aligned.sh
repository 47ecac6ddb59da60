#!/usr/bin/env bash
# Aligned against translated offsets (`spec.offsets`), on the same pre-loaded data sets: a plain
# topic and a transactional one (ProducerPerformance with a transaction every 20 ms, so a commit
# marker per partition every few hundred records). Same clusters, same binary; the arms
# alternate who goes first.
#
#   bench/aligned.sh [--records N] [--reps N] [--no-build] [--out DIR]
#
#   --records N   records of 1 KiB per data set (default 200000)
#   --reps N      repetitions (default 2)
#
# Writes DIR/results.md and DIR/raw.jsonl (default bench/results/<UTC date>-aligned). Its own
# clusters on 127.0.0.1:19592 / :29592 (BENCH_ALIGNED_SOURCE_PORT / _TARGET_PORT), state in
# /tmp/mirrorflow-bench-aligned.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
export MF_STATE="${BENCH_ALIGNED_STATE:-/tmp/mirrorflow-bench-aligned}"
export KAFKA_SOURCE_PORT="${BENCH_ALIGNED_SOURCE_PORT:-19592}"
export KAFKA_TARGET_PORT="${BENCH_ALIGNED_TARGET_PORT:-29592}"
# The brokers' OAUTHBEARER listener needs a token endpoint: its own, not a world's.
export OIDC_PORT="${BENCH_ALIGNED_OIDC_PORT:-19597}"
export RUST_BACKTRACE=0
# shellcheck source=../e2e/lib/common.sh
source "$ROOT/e2e/lib/common.sh"
# shellcheck source=../e2e/lib/build.sh
source "$ROOT/e2e/lib/build.sh"
# shellcheck source=../e2e/lib/kafka.sh
source "$ROOT/e2e/lib/kafka.sh"

N=200000 REPS=2 BUILD=true OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --records) N="$2"; shift ;;
    --reps) REPS="$2"; shift ;;
    --no-build) BUILD=false ;;
    --out) OUT="$2"; shift ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
  shift
done
PARTITIONS=8
SIZE=1024
OUT="${OUT:-$HERE/results/$(date -u +%Y-%m-%d)-aligned}"
LOGS="$OUT/logs"
RAW="$OUT/raw.jsonl"
CARGO_TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
MF_BIN="$CARGO_TARGET/release/mirrorflow"
DRIVER="$CARGO_TARGET/release/mirrorflow-bench"
SRC="$(kafka_bootstrap source)"
TGT="$(kafka_bootstrap target)"
METRICS_PORT="${BENCH_ALIGNED_METRICS_PORT:-19564}"
PRODUCER_PROPS=(acks=all linger.ms=5 batch.size=1048576 compression.type=none)

blog() { printf '[bench-aligned %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

ARM_PID=""
cleanup() {
  local rc=$?
  if [ -n "$ARM_PID" ]; then kill -KILL "$ARM_PID" 2>/dev/null || true; fi
  kafka_stop target || true
  kafka_stop source || true
  oidc_stop || true
  rm -rf "$MF_STATE"
  exit "$rc"
}

# load TOPIC [transactional]: N records of SIZE bytes on the source.
load() {
  local extra=()
  [ "${2:-}" = transactional ] && extra=(--transactional-id "bench-aligned-$1" --transaction-duration-ms 20)
  kafka_java org.apache.kafka.tools.ProducerPerformance --bootstrap-server "$SRC" --topic "$1" \
    --num-records "$N" --record-size "$SIZE" --throughput -1 --command-property "${PRODUCER_PROPS[@]}" \
    "${extra[@]}" >"$LOGS/load-$1.log" 2>&1 || die "loading $1 failed (log: $LOGS/load-$1.log)"
}

# Sum of the end offsets of TOPIC on the source (records plus markers).
source_end() {
  kafka_java org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$SRC" --topic "$1" --time -1 \
    2>/dev/null | awk -F: '{s += $3} END {print s}'
}

# copy MODE TOPIC SET REP: one copy of TOPIC by a fresh replicator with spec.offsets MODE.
copy() {
  local mode="$1" topic="$2" set="$3" rep="$4" alias dir expect out
  alias="al$rep${mode:0:1}${set:0:1}"
  dir="$MF_STATE/ours/$alias"
  mkdir -p "$dir/secrets"
  cat >"$dir/flow.yaml" <<EOF
source: {alias: $alias, bootstrapServers: '$SRC'}
target: {alias: t$alias, bootstrapServers: '$TGT'}
topics: ['$topic']
groups: ['bench-$alias']
offsets: $mode
EOF
  # Aligned copies take the source's offsets (markers too); translated ones only the records.
  expect="$N"
  [ "$mode" = Aligned ] && expect="$(source_end "$topic")"
  RUST_LOG=info "$MF_BIN" replicate --config "$dir/flow.yaml" --listen "127.0.0.1:$METRICS_PORT" \
    --replica bench --secrets-dir "$dir/secrets" >"$LOGS/ours-$alias.log" 2>&1 &
  ARM_PID=$!
  out="$("$DRIVER" watch-copy --bootstrap "$TGT" --topic "$alias.$topic" --expect "$expect" --pid "$ARM_PID")"
  kill -TERM "$ARM_PID" 2>/dev/null || true
  wait "$ARM_PID" 2>/dev/null || true
  ARM_PID=""
  echo "{\"mode\":\"$mode\",\"set\":\"$set\",\"rep\":$rep,\"records\":$N,\"load\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$out}" >>"$RAW"
  blog "$mode $set rep $rep: $out"
}

main() {
  mkdir -p "$LOGS"
  : >"$RAW"
  if $BUILD; then
    (cd "$ROOT" && cargo build --quiet --release -p mirrorflow -p mirrorflow-bench --bins) || die "cargo build failed"
  fi
  [ -x "$MF_BIN" ] && [ -x "$DRIVER" ] || die "release binaries missing: run without --no-build"
  fetch_kafka
  trap cleanup EXIT
  rm -rf "$MF_STATE"
  kafka_start source
  kafka_start target
  "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$PARTITIONS" plain txn
  blog "loading $N x $SIZE B plain and $N x $SIZE B in transactions of 20 ms"
  load plain
  load txn transactional
  local rep
  for rep in $(seq 1 "$REPS"); do
    for set in plain txn; do
      if [ $((rep % 2)) = 1 ]; then
        copy Translated "$set" "$set" "$rep"; copy Aligned "$set" "$set" "$rep"
      else
        copy Aligned "$set" "$set" "$rep"; copy Translated "$set" "$set" "$rep"
      fi
    done
  done
  python3 - "$RAW" "$OUT/results.md" "$N" <<'PY'
import json, statistics, sys
raw, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(raw)]
def med(mode, s, f):
    return statistics.median(f(r["result"]) for r in rows if r["mode"] == mode and r["set"] == s)
lines = ["# Aligned vs translated offsets", "",
         f"{n} records of 1 KiB per set, 8 partitions; records/s = records / copy window (aligned",
         "copies also write fillers and markers, which are not counted as records). Medians of",
         f"{len(rows) // 4} repetition(s); load average at each copy in raw.jsonl.", "",
         "| set | translated rec/s | aligned rec/s | aligned/translated | CPU s per M (T / A) | peak RSS MiB (T / A) |",
         "|---|---|---|---|---|---|"]
for s in ["plain", "txn"]:
    t = med("Translated", s, lambda r: n / r["window_s"])
    a = med("Aligned", s, lambda r: n / r["window_s"])
    ct = med("Translated", s, lambda r: r["cpu_s_window"] / n * 1e6)
    ca = med("Aligned", s, lambda r: r["cpu_s_window"] / n * 1e6)
    rt = med("Translated", s, lambda r: r["peak_rss_kib"] / 1024)
    ra = med("Aligned", s, lambda r: r["peak_rss_kib"] / 1024)
    lines.append(f"| {s} | {t:,.0f} | {a:,.0f} | {a / t:.2f} | {ct:.1f} / {ca:.1f} | {rt:.0f} / {ra:.0f} |")
lines += ["", "Target (issue): plain topics within 20% of Translated (ratio >= 0.80)."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
}

main
