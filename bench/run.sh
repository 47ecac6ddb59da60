#!/usr/bin/env bash
# Our replicator and MirrorMaker 2 (dedicated mode) side by side, on the same two local Kafka
# clusters of the bench's own (not the world's), against what the clusters allow
# (ProducerPerformance into the target, ConsumerPerformance from the source).
#
#   bench/run.sh [--quick] [--reps N] [--profile] [--no-build] [--out DIR]
#
#   full (default): 1 M records of 1 KiB and 1 M of 100 B over 8 partitions, arms interleaved,
#                   90 s of steady traffic per arm; --reps N repeats the copies and the steady
#                   phases (arms alternate which goes first)
#   --quick         100 k records of 1 KiB and 200 k of 100 B, one copy each, 20 s steady
#   --profile       after the measured runs, one more copy of the 1 KiB set by our replicator
#                   under `perf record`; top symbols to profile.txt (not part of the figures)
#   --no-build      use the release binaries as they are (default: cargo build --release first)
#   --out DIR       results folder (default bench/results/<UTC date>[-quick])
#
# Writes DIR/results.md (table, ratios, targets), DIR/chart.png, DIR/raw.jsonl (every
# measurement) and DIR/logs/. Both arms run with their defaults; see bench/README.md.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"

# The bench's own clusters and state, so it neither disturbs nor is disturbed by the world.
export MF_STATE="${BENCH_STATE:-/tmp/mirrorflow-bench}"
export KAFKA_SOURCE_PORT="${BENCH_SOURCE_PORT:-19392}"
export KAFKA_TARGET_PORT="${BENCH_TARGET_PORT:-29392}"
export RUST_BACKTRACE=0
# shellcheck source=../e2e/lib/common.sh
source "$ROOT/e2e/lib/common.sh"
# shellcheck source=../e2e/lib/build.sh
source "$ROOT/e2e/lib/build.sh"
# shellcheck source=../e2e/lib/kafka.sh
source "$ROOT/e2e/lib/kafka.sh"
# shellcheck source=../e2e/lib/mm2.sh
source "$ROOT/e2e/lib/mm2.sh"

QUICK=false REPS=1 PROFILE=false BUILD=true OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=true ;;
    --reps) REPS="$2"; shift ;;
    --profile) PROFILE=true ;;
    --no-build) BUILD=false ;;
    --out) OUT="$2"; shift ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
  shift
done

PARTITIONS=8
BIG_SIZE=1024
SMALL_SIZE=100
RATE=1000 # records/s of 1 KiB in the steady phase: ~1 MB/s, well under every arm's limit
if $QUICK; then
  BIG_N=100000 SMALL_N=200000 STEADY_S=20 SETTLE_S=15 REPS=1
else
  BIG_N=1000000 SMALL_N=1000000 STEADY_S=90 SETTLE_S=75
fi
SUFFIX=""
$QUICK && SUFFIX=-quick
OUT="${OUT:-$HERE/results/$(date -u +%Y-%m-%d)$SUFFIX}"
LOGS="$OUT/logs"
RAW="$OUT/raw.jsonl"
CARGO_TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
MF_BIN="$CARGO_TARGET/release/mirrorflow"
DRIVER="$CARGO_TARGET/release/mirrorflow-bench"
SRC="$(kafka_bootstrap source)"
TGT="$(kafka_bootstrap target)"
METRICS_PORT="${BENCH_METRICS_PORT:-19464}"
MPL_VERSION=3.10.7
VENV="$MF_CACHE/bench-venv-matplotlib-$MPL_VERSION"
# MirrorMaker 2's own defaults: e2e/lib/mm2.sh sets a test pace (1 s checkpoints, 5 s refreshes);
# the benchmark compares default settings.
MM2_DEFAULTS=(
  refresh.topics.interval.seconds=600
  refresh.groups.interval.seconds=600
  emit.checkpoints.interval.seconds=60
  emit.heartbeats.interval.seconds=1
  sync.group.offsets.interval.seconds=60
  offset.flush.interval.ms=60000
)

blog() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

ARM_PID=""
ARM_WRAP=(env)
ARM_KIND=""
ARM_ALIAS=""

cleanup() {
  local rc=$?
  arm_stop || true
  kafka_stop target || true
  kafka_stop source || true
  oidc_stop || true
  rm -rf "$MF_STATE"
  exit "$rc"
}

# --- the two arms ----------------------------------------------------------------------------

# arm_start ours|mm2 ALIAS TOPIC GROUP: starts a replicator of TOPIC (source alias ALIAS, target
# alias tALIAS, so no two runs share an offset-syncs topic) that also checkpoints GROUP; returns
# at once (the watchers wait for it).
arm_start() {
  ARM_KIND="$1" ARM_ALIAS="$2"
  local topic="$3" group="$4"
  case "$ARM_KIND" in
    ours)
      local dir="$MF_STATE/ours/$ARM_ALIAS"
      mkdir -p "$dir/secrets"
      cat >"$dir/flow.yaml" <<EOF
source: {alias: $ARM_ALIAS, bootstrapServers: '$SRC'}
target: {alias: t$ARM_ALIAS, bootstrapServers: '$TGT'}
topics: ['$topic']
groups: ['$group']
EOF
      RUST_LOG="${BENCH_RUST_LOG:-info,mirrorflow::replicator::checkpoint=debug}" \
        "${ARM_WRAP[@]}" "$MF_BIN" replicate --config "$dir/flow.yaml" --listen "127.0.0.1:$METRICS_PORT" \
        --replica bench --secrets-dir "$dir/secrets" >"$LOGS/ours-$ARM_ALIAS.log" 2>&1 &
      ARM_PID=$!
      ;;
    mm2)
      MM2_WAIT=none mm2_start "$ARM_ALIAS" "$ARM_ALIAS" "$SRC" "t$ARM_ALIAS" "$TGT" \
        "topics=$topic" "groups=$group" "${MM2_DEFAULTS[@]}"
      ARM_PID="$(cat "$(mm2_dir "$ARM_ALIAS")/mm2.pid")"
      ;;
  esac
}

arm_stop() {
  [ -n "$ARM_PID" ] || return 0
  case "$ARM_KIND" in
    ours)
      kill -TERM "$ARM_PID" 2>/dev/null || true
      local deadline=$((SECONDS + 30))
      while kill -0 "$ARM_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
      kill -KILL "$ARM_PID" 2>/dev/null || true
      wait "$ARM_PID" 2>/dev/null || true
      ;;
    mm2)
      mm2_stop "$ARM_ALIAS"
      cp "$(mm2_log "$ARM_ALIAS")" "$LOGS/mm2-$ARM_ALIAS.log" 2>/dev/null || true
      ;;
  esac
  ARM_PID=""
}

record() { printf '%s\n' "$1" >>"$RAW"; }

# copy ARM ALIAS SET TOPIC N REP: one arm copies a pre-loaded data set; window, CPU, peak RSS.
copy() {
  local arm="$1" alias="$2" set="$3" topic="$4" n="$5" rep="$6" out
  blog "copy: $arm copies $n records of $topic (alias $alias)"
  arm_start "$arm" "$alias" "$topic" "bench-$alias"
  out="$("$DRIVER" watch-copy --bootstrap "$TGT" --topic "$alias.$topic" --expect "$n" --pid "$ARM_PID")"
  arm_stop
  record "{\"phase\":\"copy\",\"arm\":\"$arm\",\"set\":\"$set\",\"rep\":$rep,\"result\":$out}"
  blog "copy: $arm $set: $out"
}

# steady ARM ALIAS REP: fixed-rate traffic through the arm; latency, checkpoint freshness, re-reads.
steady() {
  local arm="$1" alias="$2" rep="$3" topic="lat-$2" group="bench-$2" out
  "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$PARTITIONS" "$topic"
  # The group exists before the arm starts: MirrorMaker lists groups every 10 min by default.
  "$DRIVER" init-group --bootstrap "$SRC" --topic "$topic" --group "$group"
  blog "steady: $arm, $RATE records/s for $STEADY_S s (alias $alias)"
  arm_start "$arm" "$alias" "$topic" "$group"
  out="$("$DRIVER" steady --source "$SRC" --target "$TGT" --topic "$topic" --remote "$alias.$topic" \
    --checkpoints "$alias.checkpoints.internal" --group "$group" --rate "$RATE" --size "$BIG_SIZE" \
    --duration-s "$STEADY_S" --settle-s "$SETTLE_S" --pid "$ARM_PID")"
  arm_stop
  record "{\"phase\":\"steady\",\"arm\":\"$arm\",\"rep\":$rep,\"result\":$out}"
  blog "steady: $arm: $out"
}

# --- the clusters' own limit -----------------------------------------------------------------

PRODUCER_PROPS=(acks=all linger.ms=5 batch.size=1048576 compression.type=none)

# pipe SET TOPIC N SIZE REP: what the clusters allow, measured like the arms. Into the target:
# ProducerPerformance (unthrottled) into a fresh topic, rate watched on the target from its first
# record to its last, so the tool's JVM start-up is left out as the arms' start-up is. From the
# source: ConsumerPerformance's fetch rate (group join left out). Once one end at a time, then
# both at once.
pipe() {
  local set="$1" topic="$2" n="$3" size="$4" rep="$5" scratch="pipe-$1-$5" p c ppid
  blog "pipe limit: $set (ProducerPerformance into the target, ConsumerPerformance from the source)"
  "$DRIVER" create-topics --bootstrap "$TGT" --partitions "$PARTITIONS" "$scratch"
  java -Xmx512m -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
    org.apache.kafka.tools.ProducerPerformance --bootstrap-server "$TGT" --topic "$scratch" \
    --num-records "$n" --record-size "$size" --throughput -1 --command-property "${PRODUCER_PROPS[@]}" \
    >"$LOGS/produce-$scratch.log" 2>&1 &
  ppid=$!
  p="$("$DRIVER" watch-copy --bootstrap "$TGT" --topic "$scratch" --expect "$n" --pid "$ppid")"
  wait "$ppid" || die "ProducerPerformance failed (log: $LOGS/produce-$scratch.log)"
  kafka_java org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$SRC" --topic "$topic" \
    --num-records "$n" --timeout 30000 >"$LOGS/consume-$topic-$rep.log" 2>&1
  c="$(tail -n 1 "$LOGS/consume-$topic-$rep.log" | awk -F', *' '{print $10}')"
  [ -n "$c" ] || die "ConsumerPerformance of $set failed (log: $LOGS/consume-$topic-$rep.log)"
  # Both ends at once, as replication runs them: on a small machine they share the cores.
  local both="$scratch-both" bp bc cpid
  "$DRIVER" create-topics --bootstrap "$TGT" --partitions "$PARTITIONS" "$both"
  java -Xmx512m -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
    org.apache.kafka.tools.ProducerPerformance --bootstrap-server "$TGT" --topic "$both" \
    --num-records "$n" --record-size "$size" --throughput -1 --command-property "${PRODUCER_PROPS[@]}" \
    >"$LOGS/produce-$both.log" 2>&1 &
  ppid=$!
  kafka_java org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$SRC" --topic "$topic" \
    --num-records "$n" --timeout 30000 >"$LOGS/consume-$topic-$rep-both.log" 2>&1 &
  cpid=$!
  bp="$("$DRIVER" watch-copy --bootstrap "$TGT" --topic "$both" --expect "$n" --pid "$ppid")"
  wait "$ppid" || die "ProducerPerformance failed (log: $LOGS/produce-$both.log)"
  wait "$cpid" || die "ConsumerPerformance failed (log: $LOGS/consume-$topic-$rep-both.log)"
  bc="$(tail -n 1 "$LOGS/consume-$topic-$rep-both.log" | awk -F', *' '{print $10}')"
  [ -n "$bc" ] || die "ConsumerPerformance of $set failed (log: $LOGS/consume-$topic-$rep-both.log)"
  record "{\"phase\":\"pipe\",\"set\":\"$set\",\"rep\":$rep,\"size\":$size,\"produce\":$p,\"consume_source_rps\":$c,\"both\":{\"produce\":$bp,\"consume_source_rps\":$bc}}"
  blog "pipe limit: $set: produce into target $p; consume from source $c records/s; at once: $bp, $bc records/s"
}

# load TOPIC N SIZE: the data set, on the source (ProducerPerformance).
load() {
  kafka_java org.apache.kafka.tools.ProducerPerformance --bootstrap-server "$SRC" --topic "$1" \
    --num-records "$2" --record-size "$3" --throughput -1 --command-property "${PRODUCER_PROPS[@]}" \
    >"$LOGS/load-$1.log" 2>&1 || die "loading $1 failed (log: $LOGS/load-$1.log)"
}

# --- run -------------------------------------------------------------------------------------

main() {
  local t0=$SECONDS
  mkdir -p "$LOGS"
  : >"$RAW"
  if $BUILD; then
    blog "building the release binaries (cargo build --release)"
    (cd "$ROOT" && cargo build --quiet --release -p mirrorflow -p mirrorflow-bench --bins) || die "cargo build failed"
  fi
  [ -x "$MF_BIN" ] && [ -x "$DRIVER" ] || die "release binaries missing: run without --no-build"
  fetch_kafka
  if [ ! -x "$VENV/bin/python" ]; then
    blog "installing matplotlib $MPL_VERSION into $VENV"
    python3 -m venv "$VENV" && "$VENV/bin/pip" install -q "matplotlib==$MPL_VERSION" || die "installing matplotlib failed"
  fi
  if pid_alive "$(kafka_pidfile source)" || pid_alive "$(kafka_pidfile target)"; then
    die "the bench's clusters already run under $MF_STATE (another bench run?)"
  fi
  trap cleanup EXIT
  rm -rf "$MF_STATE"
  kafka_start source
  kafka_start target

  "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$PARTITIONS" bench-big bench-small
  blog "loading the data sets: $BIG_N x $BIG_SIZE B and $SMALL_N x $SMALL_SIZE B"
  load bench-big "$BIG_N" "$BIG_SIZE"
  load bench-small "$SMALL_N" "$SMALL_SIZE"
  record "{\"phase\":\"config\",\"quick\":$QUICK,\"reps\":$REPS,\"partitions\":$PARTITIONS,\"big_n\":$BIG_N,\"big_size\":$BIG_SIZE,\"small_n\":$SMALL_N,\"small_size\":$SMALL_SIZE,\"rate\":$RATE,\"steady_s\":$STEADY_S,\"settle_s\":$SETTLE_S,\"nproc\":$(nproc),\"date\":\"$(date -u +%FT%TZ)\",\"commit\":\"$(git -C "$ROOT" describe --always --dirty)\",\"binary_built\":\"$(date -u -r "$MF_BIN" +%FT%TZ)\"}"

  # Arms alternate which goes first from one repetition to the next, so drift on the shared
  # machine does not always favour the same one.
  local rep first second
  for rep in $(seq 1 "$REPS"); do
    if ((rep % 2 == 1)); then first=ours second=mm2; else first=mm2 second=ours; fi
    pipe big bench-big "$BIG_N" "$BIG_SIZE" "$rep"
    copy "$first" "${first:0:1}b$rep" big bench-big "$BIG_N" "$rep"
    copy "$second" "${second:0:1}b$rep" big bench-big "$BIG_N" "$rep"
    pipe small bench-small "$SMALL_N" "$SMALL_SIZE" "$rep"
    copy "$first" "${first:0:1}s$rep" small bench-small "$SMALL_N" "$rep"
    copy "$second" "${second:0:1}s$rep" small bench-small "$SMALL_N" "$rep"
  done
  # Latency drifts with the shared machine's load: one steady phase per arm and repetition,
  # alternating who goes first, so the comparison is paired.
  for rep in $(seq 1 "$REPS"); do
    if ((rep % 2 == 1)); then first=ours second=mm2; else first=mm2 second=ours; fi
    steady "$first" "${first:0:1}l$rep" "$rep"
    steady "$second" "${second:0:1}l$rep" "$rep"
  done

  if $PROFILE; then
    command -v perf >/dev/null || die "--profile needs perf (apt-get install linux-perf)"
    blog "profile: our replicator copies the 1 KiB set under perf record (figures not used)"
    ARM_WRAP=(perf record -F 999 -o "$OUT/perf.data" --)
    arm_start ours op bench-big bench-op
    ARM_WRAP=(env)
    local perf_pid="$ARM_PID" child=""
    while [ -z "$child" ]; do child="$(pgrep -P "$perf_pid" | head -n 1)" || sleep 0.1; done
    ARM_PID="$child"
    "$DRIVER" watch-copy --bootstrap "$TGT" --topic op.bench-big --expect "$BIG_N" --pid "$ARM_PID" >"$OUT/profile-copy.json"
    arm_stop
    wait "$perf_pid" 2>/dev/null || true
    {
      echo "# perf record -F 999 of our replicator copying $BIG_N x $BIG_SIZE B (copy: $(cat "$OUT/profile-copy.json"))"
      echo "## CPU samples by thread"
      perf report -i "$OUT/perf.data" --stdio --sort comm 2>/dev/null | grep '%'
      echo "## Top symbols (thread, library, symbol; >= 0.4% of samples)"
      perf report -i "$OUT/perf.data" --stdio --sort comm,dso,symbol --percent-limit 0.4 2>/dev/null |
        grep '%' | sed 's/ *$//'
    } >"$OUT/profile.txt"
    rm -f "$OUT/perf.data" "$OUT/perf.data.old"
  fi

  blog "writing $OUT/results.md and chart.png"
  "$VENV/bin/python" "$HERE/report.py" "$OUT"
  blog "done in $((SECONDS - t0)) s: $OUT/results.md"
}

main
