#!/usr/bin/env bash
# Our replicator and MirrorMaker 2 (dedicated mode, at its defaults and tuned) side by side, on
# two local Kafka clusters of the bench's own (not the world's), against what the clusters
# allow (librdkafka clients in parallel until one more adds nothing).
#
#   bench/run.sh [--compressed | --wan | --partitions | --brokers3 | --latency | --verify-cost] [--quick | --smoke] [--reps N] [--profile] [--no-build] [--out DIR]
#
#   (default)       1 M records of 1 KiB and 1 M of 100 B over 8 partitions, copied by each arm
#                   (ours, MM2 defaults, MM2 tuned), 90 s of steady traffic per arm; --reps N
#                   repeats the copies and the steady phases (arms rotate which goes first)
#   --compressed    the compressed-data scenario instead: JSON-like 1 KiB records in lz4 and in
#                   zstd batches, copied by each arm (and ours writing uncompressed, as before
#                   issue 20); CPU s per GB, throughput, the codec the target stores
#   --wan           the WAN scenario instead: a source broker of its own in a network namespace,
#                   reached through a link of two TUN devices (real TCP end to end) adding 0, 25,
#                   50 and 100 ms of round trip, and 50 and 100 ms behind a 50 MiB/s cap; 300 k x
#                   1 KiB copied by each arm on each link (a copy is measured over at most
#                   BENCH_WAN_LIMIT_S=60 s: MM2 at its defaults would take minutes)
#   BENCH_WAN_LINKS="50 100c50"  the links to run instead (RTT ms, cCAP for a cap in MiB/s)
#   BENCH_WAN_N=1000000  records in the WAN data set (300000; more for a longer copy to profile)
#   --partitions    the many-partitions scenario instead: 300 k JSON-like 1 KiB records (lz4)
#                   over 8, 200 and 2,000 source partitions (1 topic x 8, 20 and 200 topics x
#                   10), copied by each arm (throughput, peak RSS); then, with our replicator
#                   still running, 500 groups committing every 5 s (checkpoint freshness)
#   BENCH_PARTS_COUNTS="2000"  the partition counts --partitions runs instead (8 200 2000)
#   --brokers3      the three-broker scenario instead: both clusters of 3 KRaft nodes, topics
#                   with replication factor 3 and min.insync.replicas 2; 300 k JSON-like 1 KiB
#                   records (lz4) over 8 partitions copied by each arm while, on each side, the
#                   node leading partition 0 is stopped and started again (a leader change);
#                   throughput, CPU, peak RSS, and the records missing or copied twice
#   BENCH_B3_RESTART=false  --brokers3 with the stopped nodes left down (a broker lost for good);
#                   BENCH_B3_TARGET_AT=5: the target node stopped at 5 % of the copy instead of 30 %;
#                   BENCH_B3_N: records in the data set (300000)
#   --latency       the base scenario's steady phases alone (latency at 1000 records/s, checkpoint
#                   freshness, re-reads): one per arm and repetition, arms rotating
#   --verify-cost   what the checkpoints' verification on the records costs (issue 43): 1 M
#                   JSON-like 1 KiB records (lz4) over 2,000 partitions (200 topics x 10), 500
#                   groups committed mid-way on them (5,000 group-partitions); per repetition each
#                   arm (ours: verification on, the default 1m; oursu: off, verifyInterval 0s)
#                   copies the set (paired throughput, CPU per GB) and then runs BENCH_VC_WINDOW_S
#                   (120) s idle with the groups checkpointed: verifications a minute, CPU s, bytes
#                   its sockets read from each cluster, RSS. BENCH_ARMS="ours oursu oursv" adds
#                   oursv (verifyInterval 5s); BENCH_VC_N the records (1000000)
#   BENCH_OURS_FLOW="checkpoints: {interval: 5s}"  YAML added to our flow (trials; recorded);
#   BENCH_OURS_SOURCE_CONFIG / BENCH_OURS_TARGET_CONFIG="linger.ms: '1'"  client properties of
#                   our flow's source / target (trials; recorded)
#   BENCH_OURSB_LOOP="consumers: 4"  more sourceLoop fields of the oursb arm's flow (trials;
#                   recorded)
#   --quick         100 k records of 1 KiB and 200 k of 100 B (compressed: 100 k), 20 s steady
#   BENCH_ARMS="ours oursn ..."  the arms to run instead of the scenario's (ours, oursn, oursf,
#                   oursq, ours2, oursb, oursr, oursp, mm2, mm2t); ours: the product's default
#                   (whole record batches since 2026-12-07); oursb: whole batches named
#                   (spec.sourceLoop.copy: Batches); oursr: records (copy: Records); oursp (compressed data: --compressed,
#                   --brokers3): the driver's batch-passthrough copy, a measurement of a copy
#                   without re-encoding, not the product
#   --smoke         every phase of every scenario (with a scenario flag: of that one) with a few
#                   seconds each (e2e/test.sh, so CI);
#                   exits non-zero if a phase fails or gives no figure; debug binaries (those
#                   the tests built), so its figures show that a phase works, not how fast
#   BENCH_SMOKE_PHASES="base wan"  the phases --smoke without a scenario runs (default: all of
#                   base compressed wan partitions brokers3)
#   --profile       after the measured runs, one more copy of the 1 KiB set (with --compressed:
#                   the lz4 set) by our replicator under `perf record`; top symbols to
#                   profile.txt (not part of the figures)
#   --no-build      use the release binaries as they are (default: cargo build --release first)
#   --out DIR       results folder (default bench/results/<UTC date>[-compressed|-wan|-partitions|-brokers3][-quick][-smoke])
#
# Writes DIR/results.md (table, ratios, targets), DIR/chart.png, DIR/raw.jsonl (every
# measurement) and DIR/logs/. Every arm's settings: bench/README.md.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"

# The bench's own clusters and state, so it neither disturbs nor is disturbed by the world.
export MF_STATE="${BENCH_STATE:-/tmp/mirrorflow-bench}"
export KAFKA_SOURCE_PORT="${BENCH_SOURCE_PORT:-19392}"
export KAFKA_TARGET_PORT="${BENCH_TARGET_PORT:-29392}"
# Its own token endpoint too (the brokers' OAUTHBEARER listener needs one): an OIDC_PORT
# exported for a world must not be taken over.
export OIDC_PORT="${BENCH_OIDC_PORT:-$((KAFKA_SOURCE_PORT + 5))}"
export RUST_BACKTRACE=0
# shellcheck source=../e2e/lib/common.sh
source "$ROOT/e2e/lib/common.sh"
# shellcheck source=../e2e/lib/build.sh
source "$ROOT/e2e/lib/build.sh"
# shellcheck source=../e2e/lib/kafka.sh
source "$ROOT/e2e/lib/kafka.sh"
# shellcheck source=../e2e/lib/mm2.sh
source "$ROOT/e2e/lib/mm2.sh"

QUICK=false SMOKE=false COMPRESSED=false WAN=false PARTS=false B3=false LATENCY=false VCOST=false REPS=1 PROFILE=false BUILD=true OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=true ;;
    --smoke) SMOKE=true ;;
    --compressed) COMPRESSED=true ;;
    --wan) WAN=true ;;
    --partitions) PARTS=true ;;
    --brokers3) B3=true ;;
    --latency) LATENCY=true ;;
    --verify-cost) VCOST=true ;;
    --reps) REPS="$2"; shift ;;
    --profile) PROFILE=true ;;
    --no-build) BUILD=false ;;
    --out) OUT="$2"; shift ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 2 ;;
  esac
  shift
done

PARTITIONS=8
BIG_SIZE=1024
SMALL_SIZE=100
JSON_SIZE=1024
RATE=1000 # records/s of 1 KiB in the steady phase: ~1 MB/s, well under every arm's limit
# Pipe limit: seconds per client count, most clients tried.
PIPE_STEP_S=8 PIPE_MAX_CLIENTS=4
# WAN: each link as RTT in ms, and cCAP for a cap in MiB/s; records; the longest copy window.
WAN_LINKS="${BENCH_WAN_LINKS:-0 25 50 100 50c50 100c50}" WAN_N="${BENCH_WAN_N:-300000}" WAN_LIMIT_S="${BENCH_WAN_LIMIT_S:-60}"
# Many partitions: source partition counts, records over them, groups committing, how often
# each commits (Kafka's auto-commit default), for how long.
PARTS_COUNTS="${BENCH_PARTS_COUNTS:-8 200 2000}" PARTS_N=300000 PARTS_GROUPS=500 PARTS_COMMIT_MS=5000 PARTS_FRESH_S=60
# Three brokers: records of the data set; the share of them on the target when each side's
# leader is stopped (percent); how long a copy may stand still before it counts as stalled.
# B3_RESTART=false (smoke): the stopped nodes stay down, which saves the minute they take to
# come back and catch up; the leader changes themselves happen all the same.
B3_N="${BENCH_B3_N:-300000}" B3_SOURCE_AT=10 B3_TARGET_AT="${BENCH_B3_TARGET_AT:-30}" B3_STALL_S=90 B3_RESTART="${BENCH_B3_RESTART:-true}"
if $SMOKE; then
  # SMALL_N: the default copy (whole batches) takes 100,000 records of 100 B in about a tenth of
  # a second, which a watch can find complete at its first look (no rate measured, and the
  # smoke run fails for it): four times as many take about half a second.
  BIG_N=20000 SMALL_N=400000 JSON_N=20000 STEADY_S=3 SETTLE_S=5 REPS=1 PIPE_STEP_S=1 PIPE_MAX_CLIENTS=2
  WAN_LINKS="0 50c50" WAN_N=20000
  PARTS_COUNTS="8 200" PARTS_N=4000 PARTS_GROUPS=20 PARTS_COMMIT_MS=1000 PARTS_FRESH_S=4
  B3_N=10000 B3_STALL_S=45 B3_RESTART=false
elif $QUICK; then
  BIG_N=100000 SMALL_N=200000 JSON_N=100000 STEADY_S=20 SETTLE_S=15 PIPE_STEP_S=3 WAN_N=50000
  PARTS_N=100000 PARTS_FRESH_S=20 B3_N=100000
else
  BIG_N=1000000 SMALL_N=1000000 JSON_N=500000 STEADY_S=90 SETTLE_S=75
fi
# Which phases run: the scenario asked for, the base one, or (smoke without a scenario) every
# phase once.
if $VCOST; then
  PHASES="verify_cost"
elif $B3; then
  PHASES="brokers3"
elif $PARTS; then
  PHASES="partitions"
elif $WAN; then
  PHASES="wan"
elif $COMPRESSED; then
  PHASES="compressed"
elif $LATENCY; then
  PHASES="latency"
elif $SMOKE; then
  PHASES="${BENCH_SMOKE_PHASES:-base compressed wan partitions brokers3}"
else
  PHASES="base"
fi
has_phase() { [[ " $PHASES " == *" $1 "* ]]; }
SUFFIX=""
$COMPRESSED && SUFFIX=-compressed
$WAN && SUFFIX=-wan
$PARTS && SUFFIX=-partitions
$B3 && SUFFIX=-brokers3
$LATENCY && SUFFIX=-latency
$VCOST && SUFFIX=-verify-cost
$QUICK && SUFFIX=$SUFFIX-quick
$SMOKE && SUFFIX=$SUFFIX-smoke
OUT="${OUT:-$HERE/results/$(date -u +%Y-%m-%d)$SUFFIX}"
# The WAN scenario's source broker: its own network namespace, reached from here only through
# the link's two devices and addresses (10.213.0.0/30 is not used on this machine or by the
# world); its port inside the namespace.
WAN_NS=mirrorflow-bench-wan WAN_NEAR_DEV=mfwan0 WAN_FAR_DEV=mfwan1
WAN_NEAR_IP=10.213.0.1 WAN_FAR_IP=10.213.0.2 WAN_PORT=$((KAFKA_SOURCE_PORT + 6))
WAN_SRC="$WAN_FAR_IP:$WAN_PORT"
WAN_PID="" WAN_BROKER_PID=""
# Extra flags of watch-copy (the WAN scenario's window limit).
WATCH_FLAGS=()
LOGS="$OUT/logs"
RAW="$OUT/raw.jsonl"
# The three-broker scenario alone starts its clusters with 3 nodes from the beginning; the
# smoke run of every phase restarts them so just before that phase (b3_clusters).
$B3 && export KAFKA_NODES=3
CARGO_TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
BUILD_PROFILE=release
$SMOKE && BUILD_PROFILE=debug
MF_BIN="$CARGO_TARGET/$BUILD_PROFILE/mirrorflow"
DRIVER="$CARGO_TARGET/$BUILD_PROFILE/mirrorflow-bench"
SRC="$(kafka_bootstrap source)"
TGT="$(kafka_bootstrap target)"
# The source as the arms reach it (the WAN scenario points them at the proxy).
ARM_SRC="$SRC"
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
# MirrorMaker 2 tuned for volume (mm2_tuned SRC_ALIAS TGT_ALIAS), from Kafka's MirrorMaker docs
# (a task per partition; per-cluster producer.* / consumer.* client settings) and Strimzi's
# "handling high volumes of messages" (producer batch.size 327680 and linger.ms 100; consumer
# fetch.max.bytes 52428800, max.partition.fetch.bytes 1048576, max.poll.records 500) plus
# compression of the producer (lz4, the codec ours now writes by default) and, as Kafka's docs
# advise for a high-latency link ("Datacenters"), a consumer receive buffer larger than its
# 64 KiB default (-1: the OS's, which grows with the window). Listed in
# bench/README.md; every other setting as MM2_DEFAULTS.
mm2_tuned() {
  local s="$1" t="$2"
  printf '%s\n' \
    "tasks.max=$MM2_TASKS" \
    "$t.producer.batch.size=327680" \
    "$t.producer.linger.ms=100" \
    "$t.producer.compression.type=lz4" \
    "$s.consumer.fetch.max.bytes=52428800" \
    "$s.consumer.max.partition.fetch.bytes=1048576" \
    "$s.consumer.max.poll.records=500" \
    "$s.consumer.receive.buffer.bytes=-1"
}
# MirrorMaker's internal and remote topics as the clusters' topics: replication factor 1 on
# single nodes (e2e/lib/mm2.sh), 3 on three (b3_clusters).
MM2_CLUSTER=()
# The one-letter alias prefix of each arm (remote topics and offset-syncs never shared).
declare -A ARM_LETTER=([ours]=o [oursr]=c [oursu]=u [oursv]=v [oursn]=n [oursf]=f [oursq]=q [ours2]=r [oursb]=b [oursp]=p [mm2]=m [mm2t]=t)
# Tuned MirrorMaker runs a task per partition of the base data set (8); with 200 or 2,000
# partitions too, since more tasks than that only compete for this machine's 2 cores.
MM2_TASKS=$PARTITIONS

blog() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

ARM_PID=""
# The arm's other processes (ours2's second replica).
ARM_MORE_PIDS=()
ARM_WRAP=(env)
ARM_KIND=""
ARM_ALIAS=""

cleanup() {
  local rc=$?
  arm_stop || true
  wan_link_down || true
  wan_source_stop || true
  kafka_stop target || true
  kafka_stop source || true
  oidc_stop || true
  # Three nodes a side: the brokers' own view of the leader changes (broker-source.2.log.gz...).
  if [ "$(kafka_nodes)" -gt 1 ]; then
    local d
    for d in "$MF_STATE"/kafka/source* "$MF_STATE"/kafka/target*; do
      [ -f "$d/broker.log" ] && gzip -c "$d/broker.log" >"$LOGS/broker-${d##*/}.log.gz"
    done
  fi
  rm -rf "$MF_STATE"
  exit "$rc"
}

# --- the two arms ----------------------------------------------------------------------------

# arm_start ARM ALIAS TOPIC GROUP: starts a replicator of TOPIC (source alias
# ALIAS, target alias tALIAS, so no two runs share an offset-syncs topic) that also checkpoints
# GROUP; returns at once (the watchers wait for it). oursn: ours writing uncompressed batches
# (the producer default before issue 20); oursf: ours with 4x the fetch bytes in flight (a
# trial for long round trips); oursq: ours with 8x the producer queue (32 MiB, a trial for
# slow acknowledgements); ours2: the flow with 2 replicas, each a process with its own share of
# the partitions and its own source connection (a trial for long round trips, where one
# connection carries one window per round trip; copies only); oursp: `mirrorflow-bench
# passthrough`, the source's record batches written to the target as they are (what a copy costs
# without decoding and compressing every record again; no offset syncs or checkpoints: copies
# only); oursb: ours copying whole record batches (`sourceLoop: {copy: Batches}`, the default
# since 2026-12-07, named); oursr: ours copying records (`sourceLoop: {copy: Records}`); oursu: ours
# with the checkpoints' verification off (`checkpoints: {verifyInterval: 0s}`); oursv: ours
# verifying every 5 s (the flow's cap still holds); mm2t: MirrorMaker 2 tuned.
arm_start() {
  ARM_KIND="$1" ARM_ALIAS="$2"
  local topic="$3" group="$4"
  case "$ARM_KIND" in
    ours | oursr | oursn | oursf | oursq | ours2 | oursb | oursu | oursv)
      local dir="$MF_STATE/ours/$ARM_ALIAS" target_config="" source_config="" replicas=(bench) r
      local copy_unit="" checkpoints=""
      [ "$ARM_KIND" = oursu ] && checkpoints="checkpoints: {verifyInterval: 0s}"
      [ "$ARM_KIND" = oursv ] && checkpoints="checkpoints: {verifyInterval: 5s}"
      [ "$ARM_KIND" = oursb ] && copy_unit="sourceLoop: {copy: Batches${BENCH_OURSB_LOOP:+, $BENCH_OURSB_LOOP}}"
      [ "$ARM_KIND" = oursr ] && copy_unit="sourceLoop: {copy: Records}"
      [ "$ARM_KIND" = oursn ] && target_config=", config: {compression.type: none}"
      [ "$ARM_KIND" = oursq ] && target_config=", config: {queue.buffering.max.kbytes: '32768', queue.buffering.max.messages: '100000'}"
      [ "$ARM_KIND" = oursf ] && source_config=", config: {fetch.max.bytes: '16777216', queued.max.messages.kbytes: '16384'}"
      [ -n "${BENCH_OURS_SOURCE_CONFIG:-}" ] && source_config=", config: {$BENCH_OURS_SOURCE_CONFIG}"
      [ -n "${BENCH_OURS_TARGET_CONFIG:-}" ] && target_config=", config: {$BENCH_OURS_TARGET_CONFIG}"
      mkdir -p "$dir/secrets"
      cat >"$dir/flow.yaml" <<EOF
source: {alias: $ARM_ALIAS, bootstrapServers: '$ARM_SRC'$source_config}
target: {alias: t$ARM_ALIAS, bootstrapServers: '$TGT'$target_config}
topics: ['$topic']
groups: ['$group']
$copy_unit
$checkpoints
${BENCH_OURS_FLOW:-}
EOF
      [ "$ARM_KIND" = ours2 ] && replicas=(bench-0 bench-1)
      for r in "${!replicas[@]}"; do
        # The allocator's environment of replicator pods (src/operator/desired.rs: ALLOCATOR_ENV).
        MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=131072 MALLOC_TRIM_THRESHOLD_=131072 \
        RUST_LOG="${BENCH_RUST_LOG:-info,mirrorflow::replicator::checkpoint=debug}" \
          "${ARM_WRAP[@]}" "$MF_BIN" replicate --config "$dir/flow.yaml" --listen "127.0.0.1:$((METRICS_PORT + r))" \
          --replica "${replicas[$r]}" --secrets-dir "$dir/secrets" >"$LOGS/ours-$ARM_ALIAS${r/#0/}.log" 2>&1 &
        if [ "$r" = 0 ]; then ARM_PID=$!; else ARM_MORE_PIDS+=($!); fi
      done
      ;;
    oursp)
      "$DRIVER" passthrough --source "$ARM_SRC" --target "$TGT" --topic "$topic" \
        --remote-topic "$ARM_ALIAS.$topic" >"$LOGS/passthrough-$ARM_ALIAS.log" 2>&1 &
      ARM_PID=$!
      ;;
    mm2 | mm2t)
      local tuned=()
      [ "$ARM_KIND" = mm2t ] && mapfile -t tuned < <(mm2_tuned "$ARM_ALIAS" "t$ARM_ALIAS")
      MM2_WAIT=none mm2_start "$ARM_ALIAS" "$ARM_ALIAS" "$ARM_SRC" "t$ARM_ALIAS" "$TGT" \
        "topics=$topic" "groups=$group" "${MM2_DEFAULTS[@]}" "${MM2_CLUSTER[@]}" "${tuned[@]}"
      ARM_PID="$(cat "$(mm2_dir "$ARM_ALIAS")/mm2.pid")"
      ;;
  esac
}

arm_stop() {
  [ -n "$ARM_PID" ] || return 0
  case "$ARM_KIND" in
    ours | oursr | oursn | oursf | oursq | ours2 | oursb | oursp | oursu | oursv)
      local pid
      for pid in "$ARM_PID" "${ARM_MORE_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
        local deadline=$((SECONDS + 30))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
      done
      ARM_MORE_PIDS=()
      ;;
    mm2 | mm2t)
      mm2_stop "$ARM_ALIAS"
      cp "$(mm2_log "$ARM_ALIAS")" "$LOGS/mm2-$ARM_ALIAS.log" 2>/dev/null || true
      ;;
  esac
  ARM_PID=""
}

# record JSON: one line of raw.jsonl, with the load average when it was taken (the machine is
# shared; every figure is read next to it).
record() { printf '%s,"load_average":"%s"}\n' "${1%\}}" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$RAW"; }

# arm_failed ARM SET REP: a MirrorMaker arm that died during its copy (out of heap, say) ends
# that copy, not the run, recorded with its log's first OutOfMemoryError (else its first ERROR
# line); ours dying still fails the run (what the smoke run checks).
arm_failed() {
  local arm="$1" set="$2" rep="$3" why
  [[ "$arm" == mm2* ]] || die "$arm failed in $set (logs: $LOGS)"
  arm_stop
  local log="$LOGS/mm2-$ARM_ALIAS.log"
  why="$({ grep -h -m 1 OutOfMemoryError "$log" || grep -h -m 1 ' ERROR ' "$log"; } 2>/dev/null |
    cut -c1-200 | tr -d '"\\\t' || true)"
  blog "$arm failed in $set: ${why:-see its log}"
  record "{\"phase\":\"failed\",\"arm\":\"$arm\",\"set\":\"$set\",\"rep\":$rep,\"why\":\"${why:-see logs/mm2-$ARM_ALIAS.log}\"}"
}

# copy ARM SET TOPIC N SIZE REP: one arm copies a pre-loaded data set; window, CPU, peak RSS, and
# the codecs of the batches the target stored (read from the broker's disk).
copy() {
  local arm="$1" set="$2" topic="$3" n="$4" size="$5" rep="$6" alias out codec
  alias="${ARM_LETTER[$arm]}${set}r$rep"
  blog "copy: $arm copies $n records of $topic (alias $alias)"
  arm_start "$arm" "$alias" "$topic" "bench-$alias"
  local pids=(--pid "$ARM_PID") pid
  for pid in "${ARM_MORE_PIDS[@]}"; do pids+=(--pid "$pid"); done
  if ! out="$("$DRIVER" watch-copy --bootstrap "$TGT" --topic "$alias.$topic" --expect "$n" "${pids[@]}" "${WATCH_FLAGS[@]}")"; then
    arm_failed "$arm" "$set" "$rep"
    "$DRIVER" delete-topics --bootstrap "$TGT" "$alias.$topic"
    return 0
  fi
  arm_stop
  codec="$("$DRIVER" codec --data "$(kafka_dir target)/data" --topic "$alias.$topic")"
  record "{\"phase\":\"copy\",\"arm\":\"$arm\",\"set\":\"$set\",\"rep\":$rep,\"size\":$size,\"result\":$out,\"target_codec\":$codec}"
  blog "copy: $arm $set: $out; target batches: $codec"
  # The copies are not needed again; 1 GB each on a tight disk.
  "$DRIVER" delete-topics --bootstrap "$TGT" "$alias.$topic"
}

# steady ARM REP [PHASE]: fixed-rate traffic through the arm; latency, checkpoint freshness,
# re-reads; recorded as PHASE (default steady: what the report reads).
steady() {
  local arm="$1" rep="$2" phase="${3:-steady}" alias out
  alias="${ARM_LETTER[$arm]}latr$rep"
  local topic="lat-$alias" group="bench-$alias"
  "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$PARTITIONS" "$topic"
  # The group exists before the arm starts: MirrorMaker lists groups every 10 min by default.
  "$DRIVER" init-group --bootstrap "$SRC" --topic "$topic" --group "$group"
  blog "steady: $arm, $RATE records/s for $STEADY_S s (alias $alias)"
  arm_start "$arm" "$alias" "$topic" "$group"
  out="$("$DRIVER" steady --source "$SRC" --target "$TGT" --topic "$topic" --remote "$alias.$topic" \
    --checkpoints "$alias.checkpoints.internal" --group "$group" --rate "$RATE" --size "$BIG_SIZE" \
    --duration-s "$STEADY_S" --settle-s "$SETTLE_S" --pid "$ARM_PID")"
  arm_stop
  record "{\"phase\":\"$phase\",\"arm\":\"$arm\",\"rep\":$rep,\"result\":$out}"
  blog "$phase: $arm: $out"
}

# --- the clusters' own limit -----------------------------------------------------------------

PRODUCER_PROPS=(acks=all linger.ms=5 batch.size=1048576 compression.type=none)

# pipe SET TOPIC SIZE REP: what the clusters allow, just before the copies of SET: librdkafka
# producers into the target, consumers draining TOPIC on the source, then both at once, each
# with clients added until one more raises the rate by less than 5 % (bench/driver/src/pipe.rs).
pipe() {
  local set="$1" topic="$2" size="$3" rep="$4" out
  blog "pipe limit: $set (1..$PIPE_MAX_CLIENTS parallel clients, $PIPE_STEP_S s each)"
  out="$("$DRIVER" pipe --source "$SRC" --target "$TGT" --topic "$topic" --size "$size" \
    --step-s "$PIPE_STEP_S" --max-clients "$PIPE_MAX_CLIENTS")"
  record "{\"phase\":\"pipe\",\"set\":\"$set\",\"rep\":$rep,\"size\":$size,\"result\":$out}"
  blog "pipe limit: $set: $out"
}

# load TOPIC N SIZE: the data set, on the source (ProducerPerformance), run by LOAD_WRAP.
LOAD_WRAP=()
load() {
  "${LOAD_WRAP[@]}" java -Xmx512m -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
    org.apache.kafka.tools.ProducerPerformance --bootstrap-server "$SRC" --topic "$1" \
    --num-records "$2" --record-size "$3" --throughput -1 --command-property "${PRODUCER_PROPS[@]}" \
    >"$LOGS/load-$1.log" 2>&1 || die "loading $1 failed (log: $LOGS/load-$1.log)"
}

# load_json TOPIC N CODEC: JSON-like records of JSON_SIZE bytes in CODEC batches, on the source.
load_json() {
  local out
  out="$("$DRIVER" load-json --bootstrap "$SRC" --topic "$1" --n "$2" --size "$JSON_SIZE" --codec "$3")"
  record "{\"phase\":\"load\",\"topic\":\"$1\",\"result\":$out,\"source_codec\":$("$DRIVER" codec --data "$(kafka_dir source)/data" --topic "$1")}"
  blog "loaded $1: $out"
}

# The arms in the order of repetition REP: rotated by one each repetition, so drift on the
# shared machine does not always favour the same one.
arms_for() {
  local rep="$1"
  shift
  local arms=("$@") n=$#
  local i
  for ((i = 0; i < n; i++)); do printf '%s ' "${arms[$(((i + rep - 1) % n))]}"; done
}

# The base scenario: pipe limit and copies of the 1 KiB and 100 B sets, then steady traffic.
base() {
  local arms=(ours mm2 mm2t) rep arm
  # BENCH_ARMS="ours oursn": other arms, e.g. the product's codec default against none.
  [ -n "${BENCH_ARMS:-}" ] && read -r -a arms <<<"$BENCH_ARMS"
  local steady_arms=("${arms[@]}")
  # Smoke: every phase once; MirrorMaker (40 s a start on a busy CI machine) in one copy.
  if $SMOKE; then arms=(ours mm2) steady_arms=(ours); fi
  "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$PARTITIONS" bench-big bench-small
  blog "loading the data sets: $BIG_N x $BIG_SIZE B and $SMALL_N x $SMALL_SIZE B"
  load bench-big "$BIG_N" "$BIG_SIZE"
  load bench-small "$SMALL_N" "$SMALL_SIZE"
  for rep in $(seq 1 "$REPS"); do
    pipe big bench-big "$BIG_SIZE" "$rep"
    for arm in $(arms_for "$rep" "${arms[@]}"); do copy "$arm" big bench-big "$BIG_N" "$BIG_SIZE" "$rep"; done
    pipe small bench-small "$SMALL_SIZE" "$rep"
    if $SMOKE; then arms=(ours); fi
    for arm in $(arms_for "$rep" "${arms[@]}"); do copy "$arm" small bench-small "$SMALL_N" "$SMALL_SIZE" "$rep"; done
  done
  steadies "${steady_arms[@]}"
}

# steadies ARM...: latency drifts with the shared machine's load: one steady phase per arm and
# repetition, rotating who goes first, so the comparison is paired.
steadies() {
  local rep arm
  for rep in $(seq 1 "$REPS"); do
    for arm in $(arms_for "$rep" "$@"); do steady "$arm" "$rep"; done
  done
}

# ours_trial: what the BENCH_OURS_* settings change in our flow, for the results (one line).
ours_trial() {
  local parts=()
  [ -n "${BENCH_OURS_FLOW:-}" ] && parts+=("${BENCH_OURS_FLOW}")
  [ -n "${BENCH_OURS_SOURCE_CONFIG:-}" ] && parts+=("source config {${BENCH_OURS_SOURCE_CONFIG}}")
  [ -n "${BENCH_OURS_TARGET_CONFIG:-}" ] && parts+=("target config {${BENCH_OURS_TARGET_CONFIG}}")
  [ -n "${BENCH_OURSB_LOOP:-}" ] && parts+=("oursb sourceLoop {${BENCH_OURSB_LOOP}}")
  local IFS=';'
  printf '%s' "${parts[*]}"
}

# The latency scenario: the base scenario's steady phases alone.
latency() {
  local arms=(ours mm2 mm2t) arm
  [ -n "${BENCH_ARMS:-}" ] && read -r -a arms <<<"$BENCH_ARMS"
  # Fresh brokers answer slowly for their first seconds of traffic (their JVMs compile the
  # paths it takes: 100-220 ms at first, about 20 ms ten seconds later, for every arm;
  # results/2026-12-04-latency-quick), so whoever went first lost. One unreported phase per
  # arm first (raw.jsonl: steady_warmup), as the base scenario's copies do before its steady
  # phases; users' brokers are long warm.
  $SMOKE || for arm in "${arms[@]}"; do steady "$arm" 0 steady_warmup; done
  steadies "${arms[@]}"
}

# The compressed scenario: JSON-like 1 KiB records in lz4 and in zstd batches, copied by ours
# (lz4 writes by default), ours writing uncompressed (the default before), MM2 defaults (writes
# uncompressed) and MM2 tuned (lz4); with BENCH_ARMS also by the batch passthrough (oursp, the
# source's codec kept).
compressed() {
  local arms=(ours oursn mm2 mm2t) rep arm codec
  [ -n "${BENCH_ARMS:-}" ] && read -r -a arms <<<"$BENCH_ARMS"
  # Smoke: the whole-batch copy and the passthrough measurement too, so they keep working
  # (seconds: no JVM to start).
  if $SMOKE; then arms=(ours oursr oursp mm2t); fi
  "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$PARTITIONS" bench-lz4 bench-zstd
  blog "loading the compressed data sets: $JSON_N x $JSON_SIZE B JSON-like, lz4 and zstd batches"
  load_json bench-lz4 "$JSON_N" lz4
  load_json bench-zstd "$JSON_N" zstd
  for rep in $(seq 1 "$REPS"); do
    for codec in lz4 zstd; do
      for arm in $(arms_for "$rep" "${arms[@]}"); do
        copy "$arm" "$codec" "bench-$codec" "$JSON_N" "$JSON_SIZE" "$rep"
      done
      if $SMOKE; then arms=(ours); fi
    done
  done
}

# wan_source_start: the WAN scenario's source, one KRaft node in the namespace WAN_NS with its
# client listener advertised at WAN_FAR_IP, where the link's far device will be. Plaintext, no
# authorizer: the scenario measures the link, not the security the world's brokers test.
wan_source_start() {
  local dir="$MF_STATE/kafka/wan" id
  mkdir -p "$dir"
  # A run killed before its cleanup leaves the namespace behind.
  ip netns del "$WAN_NS" 2>/dev/null || true
  ip netns add "$WAN_NS"
  ip -n "$WAN_NS" link set lo up
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$((WAN_PORT + 1))
listeners=PLAINTEXT://0.0.0.0:$WAN_PORT,CONTROLLER://127.0.0.1:$((WAN_PORT + 1))
advertised.listeners=PLAINTEXT://$WAN_SRC
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
$(kafka_small_cluster_settings)
auto.create.topics.enable=false
# Kafka's docs ("Datacenters"): across a high-latency link, raise the brokers' socket buffers.
# -1 leaves them to the OS, which grows them with the window; the default (100 KiB) would hold
# every connection to about 2-4 MiB/s at 50 ms, whatever the client does.
socket.send.buffer.bytes=-1
socket.receive.buffer.bytes=-1
# Kafka's default, as on users' brokers (the world's test pace has 0, which above overrides):
# a new group waits 3 s for more members before its first assignment, so a replica's source
# consumers, which reach the coordinator a few ms apart, form one generation instead of
# splitting the partitions seconds into the copy (results/2026-12-04-wan-consumers). MM2's
# source consumers are in no group on the source.
group.initial.rebalance.delay.ms=3000
EOF
  id="$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
  kafka_java kafka.tools.StorageTool format --standalone -t "$id" -c "$dir/server.properties" \
    >"$dir/format.log" 2>&1 || die "formatting the WAN source failed: $(tail -n 5 "$dir/format.log")"
  blog "starting the WAN source broker in network namespace $WAN_NS ($WAN_SRC)"
  ip netns exec "$WAN_NS" java -Xmx512m -Xms256m -XX:+UseG1GC \
    -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
    kafka.Kafka "$dir/server.properties" >"$LOGS/broker-wan.log" 2>&1 &
  WAN_BROKER_PID=$!
}

wan_source_serves() {
  timeout 30 java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$WAN_SRC" --list >/dev/null 2>&1
}

wan_source_stop() {
  if [ -n "$WAN_BROKER_PID" ]; then
    kill "$WAN_BROKER_PID" 2>/dev/null || true
    local deadline=$((SECONDS + 60))
    while kill -0 "$WAN_BROKER_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$WAN_BROKER_PID" 2>/dev/null || true
    wait "$WAN_BROKER_PID" 2>/dev/null || true
    WAN_BROKER_PID=""
  fi
  ip netns del "$WAN_NS" 2>/dev/null || true
}

# wan_link_up LINK REP: the link (RTT in ms, then cCAP for a cap in MiB/s) between this
# namespace and WAN_NS; its devices go when the link process exits.
wan_link_up() {
  local link="$1" rep="$2" rtt="${1%c*}" cap=()
  [[ "$link" == *c* ]] && cap=(--rate-mib-s "${link#*c}")
  "$DRIVER" wan-link --near "$WAN_NEAR_DEV" --far "$WAN_FAR_DEV" --rtt-ms "$rtt" "${cap[@]}" \
    >"$LOGS/wan-link-$link-$rep.log" 2>&1 &
  WAN_PID=$!
  wait_until 10 "the WAN link's devices" ip link show "$WAN_FAR_DEV"
  ip link set "$WAN_FAR_DEV" netns "$WAN_NS"
  ip addr add "$WAN_NEAR_IP/32" peer "$WAN_FAR_IP/32" dev "$WAN_NEAR_DEV"
  ip link set "$WAN_NEAR_DEV" up
  ip -n "$WAN_NS" addr add "$WAN_FAR_IP/32" peer "$WAN_NEAR_IP/32" dev "$WAN_FAR_DEV"
  ip -n "$WAN_NS" link set "$WAN_FAR_DEV" up
}

wan_link_down() {
  [ -n "$WAN_PID" ] || return 0
  kill "$WAN_PID" 2>/dev/null || true
  wait "$WAN_PID" 2>/dev/null || true
  WAN_PID=""
}

# The WAN scenario: the 1 KiB set copied by each arm over each link.
wan() {
  local arms=(ours mm2 mm2t) rep arm link
  [ -n "${BENCH_ARMS:-}" ] && read -r -a arms <<<"$BENCH_ARMS"
  if $SMOKE; then arms=(ours); fi
  wan_source_start
  wan_link_up 0 0
  wait_until 180 "the WAN source broker to serve requests" wan_source_serves ||
    die "the WAN source broker did not come up (log: $LOGS/broker-wan.log)"
  "$DRIVER" create-topics --bootstrap "$WAN_SRC" --partitions "$PARTITIONS" bench-wan
  blog "loading the WAN data set: $WAN_N x $BIG_SIZE B (inside $WAN_NS, not through the link)"
  LOAD_WRAP=(ip netns exec "$WAN_NS")
  SRC="$WAN_SRC" load bench-wan "$WAN_N" "$BIG_SIZE"
  LOAD_WRAP=()
  wan_link_down
  WATCH_FLAGS=(--limit-s "$WAN_LIMIT_S")
  for rep in $(seq 1 "$REPS"); do
    for link in $WAN_LINKS; do
      wan_link_up "$link" "$rep"
      ARM_SRC="$WAN_SRC"
      for arm in $(arms_for "$rep" "${arms[@]}"); do
        copy "$arm" "w$link" bench-wan "$WAN_N" "$BIG_SIZE" "$rep"
      done
      ARM_SRC="$SRC"
      wan_link_down
    done
  done
  WATCH_FLAGS=()
  wan_source_stop
}

# parts_topics COUNT: the source topics holding COUNT partitions (8: one topic of 8; otherwise
# topics of 10), and parts_per_topic COUNT their partition count.
parts_per_topic() { if [ "$1" -le 8 ]; then echo "$1"; else echo 10; fi; }
parts_topics() {
  local count="$1" per i
  per="$(parts_per_topic "$count")"
  for ((i = 0; i < count / per; i++)); do printf 'mp%s-%s\n' "$count" "$i"; done
}

# parts_copy ARM COUNT REP: one arm copies the many-partitions data set of COUNT partitions;
# ours then also checkpoints PARTS_GROUPS groups committing (freshness), still running.
parts_copy() {
  local arm="$1" count="$2" rep="$3" alias out fresh="null" t
  alias="${ARM_LETTER[$arm]}p${count}r$rep"
  local topics=() remote=() remote_flags=() topic_flags=() group_prefix="mpg-$alias-"
  mapfile -t topics < <(parts_topics "$count")
  for t in "${topics[@]}"; do
    topic_flags+=(--topic "$t")
    remote+=("$alias.$t")
    remote_flags+=(--topic "$alias.$t")
  done
  # The groups exist before the arm starts (MirrorMaker lists groups every 10 min by default).
  "$DRIVER" init-groups --bootstrap "$SRC" "${topic_flags[@]}" --groups "$PARTS_GROUPS" \
    --group-prefix "$group_prefix" >/dev/null
  blog "partitions: $arm copies $PARTS_N records over $count partitions (alias $alias)"
  arm_start "$arm" "$alias" "mp$count-.*" "mpg-$alias-.*"
  if ! out="$("$DRIVER" watch-copy --bootstrap "$TGT" "${remote_flags[@]}" --expect "$PARTS_N" --pid "$ARM_PID")"; then
    arm_failed "$arm" "p$count" "$rep"
    "$DRIVER" delete-topics --bootstrap "$TGT" "${remote[@]}"
    return 0
  fi
  blog "partitions: $arm $count: $out"
  if [[ " ${PARTS_FRESH_ARMS:-ours} " == *" $arm "* ]]; then
    blog "partitions: $PARTS_GROUPS groups commit every $PARTS_COMMIT_MS ms for $PARTS_FRESH_S s through $arm"
    fresh="$("$DRIVER" groups --source "$SRC" --target "$TGT" "${topic_flags[@]}" --remote-prefix "$alias." \
      --checkpoints "$alias.checkpoints.internal" --groups "$PARTS_GROUPS" --group-prefix "$group_prefix" \
      --duration-s "$PARTS_FRESH_S" --commit-every-ms "$PARTS_COMMIT_MS" --settle-s "$SETTLE_S" --pid "$ARM_PID")"
    blog "partitions: $arm $count groups: $fresh"
  fi
  arm_stop
  record "{\"phase\":\"partitions\",\"arm\":\"$arm\",\"partitions\":$count,\"topics\":${#topics[@]},\"rep\":$rep,\"result\":$out,\"groups\":$fresh}"
  "$DRIVER" delete-topics --bootstrap "$TGT" "${remote[@]}"
}

# The many-partitions scenario: for each partition count, the data set spread over its topics,
# copied by each arm.
partitions() {
  local arms=(ours mm2 mm2t) rep arm count out
  [ -n "${BENCH_ARMS:-}" ] && read -r -a arms <<<"$BENCH_ARMS"
  if $SMOKE; then arms=(ours); fi
  for count in $PARTS_COUNTS; do
    local topics=()
    mapfile -t topics < <(parts_topics "$count")
    "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$(parts_per_topic "$count")" "${topics[@]}"
    local flags=()
    for t in "${topics[@]}"; do flags+=(--topic "$t"); done
    out="$("$DRIVER" load-json --bootstrap "$SRC" "${flags[@]}" --n "$PARTS_N" --size "$JSON_SIZE" --codec lz4)"
    record "{\"phase\":\"parts_load\",\"partitions\":$count,\"result\":$out}"
    blog "partitions: loaded $count partitions: $out"
    for rep in $(seq 1 "$REPS"); do
      for arm in $(arms_for "$rep" "${arms[@]}"); do parts_copy "$arm" "$count" "$rep"; done
    done
    # 300 MB a count on a tight disk.
    "$DRIVER" delete-topics --bootstrap "$SRC" "${topics[@]}"
  done
}

# --- the verification's cost ------------------------------------------------------------------

VC_N="${BENCH_VC_N:-1000000}" VC_COUNT=2000 VC_GROUPS=500 VC_WINDOW_S="${BENCH_VC_WINDOW_S:-120}"
# Seconds after the copy before the window: every group's checkpoints written, the first burst
# of verifications spent.
VC_SETTLE_S=30
if $SMOKE; then VC_N=20000 VC_COUNT=200 VC_GROUPS=20 VC_WINDOW_S=5 VC_SETTLE_S=5; fi

# vc_sample: the arm's counters now (bench/vc_sample.py: CPU, RSS, socket bytes per cluster,
# the verification metrics).
vc_sample() {
  python3 "$HERE/vc_sample.py" --pid "$ARM_PID" --source-port "$KAFKA_SOURCE_PORT" \
    --target-port "$KAFKA_TARGET_PORT" --metrics "http://127.0.0.1:$METRICS_PORT/metrics"
}

# vc_run ARM REP: the arm copies the set with the groups committed mid-way (throughput while
# it verifies), then runs idle for the window (what verifying the groups' checkpoints costs).
vc_run() {
  local arm="$1" rep="$2" alias out before after t
  alias="${ARM_LETTER[$arm]}vc$rep"
  local topics=() remote=() remote_flags=() topic_flags=() group_prefix="vcg-$alias-"
  mapfile -t topics < <(parts_topics "$VC_COUNT")
  for t in "${topics[@]}"; do
    topic_flags+=(--topic "$t")
    remote+=("$alias.$t")
    remote_flags+=(--topic "$alias.$t")
  done
  # Mid-way in every partition, so each verification reads records on both sides.
  "$DRIVER" init-groups --bootstrap "$SRC" "${topic_flags[@]}" --groups "$VC_GROUPS" \
    --group-prefix "$group_prefix" --offset "$((VC_N / VC_COUNT / 2))" >/dev/null
  blog "verify-cost: $arm copies $VC_N records over $VC_COUNT partitions, $VC_GROUPS groups (alias $alias)"
  arm_start "$arm" "$alias" "mp$VC_COUNT-.*" "$group_prefix.*"
  out="$("$DRIVER" watch-copy --bootstrap "$TGT" "${remote_flags[@]}" --expect "$VC_N" --pid "$ARM_PID")" ||
    die "$arm failed its copy (logs: $LOGS)"
  record "{\"phase\":\"vc_copy\",\"arm\":\"$arm\",\"rep\":$rep,\"result\":$out}"
  blog "verify-cost: $arm copy: $out"
  sleep "$VC_SETTLE_S"
  before="$(vc_sample)"
  sleep "$VC_WINDOW_S"
  after="$(vc_sample)"
  arm_stop
  record "{\"phase\":\"vc_window\",\"arm\":\"$arm\",\"rep\":$rep,\"window_s\":$VC_WINDOW_S,\"groups\":$VC_GROUPS,\"partitions\":$VC_COUNT,\"before\":$before,\"after\":$after}"
  blog "verify-cost: $arm window done"
  "$DRIVER" delete-topics --bootstrap "$TGT" "${remote[@]}"
}

verify_cost() {
  local arms=(ours oursu) rep arm out
  [ -n "${BENCH_ARMS:-}" ] && read -r -a arms <<<"$BENCH_ARMS"
  local topics=() flags=() t
  mapfile -t topics < <(parts_topics "$VC_COUNT")
  "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$(parts_per_topic "$VC_COUNT")" "${topics[@]}"
  for t in "${topics[@]}"; do flags+=(--topic "$t"); done
  out="$("$DRIVER" load-json --bootstrap "$SRC" "${flags[@]}" --n "$VC_N" --size "$JSON_SIZE" --codec lz4)"
  record "{\"phase\":\"vc_load\",\"partitions\":$VC_COUNT,\"result\":$out}"
  blog "verify-cost: loaded $VC_COUNT partitions: $out"
  for rep in $(seq 1 "$REPS"); do
    for arm in $(arms_for "$rep" "${arms[@]}"); do vc_run "$arm" "$rep"; done
  done
}

# --- three brokers ---------------------------------------------------------------------------

# Both clusters as 3 KRaft nodes each (replication factor 3, min.insync.replicas 2 by default:
# e2e/lib/kafka.sh). The smoke run of every phase gets here with single-node clusters: they
# are stopped and their data deleted first.
b3_clusters() {
  if [ "$(kafka_nodes)" != 3 ]; then
    blog "brokers3: replacing the single-node clusters by clusters of 3 nodes"
    kafka_stop target
    kafka_stop source
    rm -rf "$(kafka_dir source)" "$(kafka_dir target)"
    export KAFKA_NODES=3
  fi
  SRC="$(kafka_bootstrap source)" TGT="$(kafka_bootstrap target)"
  ARM_SRC="$SRC"
  MM2_CLUSTER=()
  local k
  for k in replication.factor checkpoints.topic.replication.factor heartbeats.topic.replication.factor \
    offset-syncs.topic.replication.factor config.storage.replication.factor \
    offset.storage.replication.factor status.storage.replication.factor; do
    MM2_CLUSTER+=("$k=3")
  done
  # The token endpoint first: both clusters start at once and would both start it.
  oidc_start
  local pids=() pid
  kafka_start source &
  pids+=($!)
  kafka_start target &
  pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || die "the 3-node clusters did not start"; done
}

# b3_leader_change SIDE TOPIC REMOTE AT EVENTS: once the target holds AT records of REMOTE,
# stops the node of cluster SIDE leading partition 0 of TOPIC (SIGTERM: a controlled shutdown,
# as a rolling restart does it), starts it again, waits until every replica is back in sync and
# moves leadership back to the preferred replicas (kafka-leader-election): two leader changes.
# What happened when (epoch seconds) goes to EVENTS as JSON.
b3_leader_change() {
  local side="$1" topic="$2" remote="$3" at="$4" events="$5" bs node after t_stop t_down t_up t_sync t_back sync
  bs="$(kafka_bootstrap "$side")"
  "$DRIVER" watch-copy --bootstrap "$TGT" --topic "$remote" --expect "$at" --pid "$ARM_PID" \
    --stall-s "$B3_STALL_S" >/dev/null
  node="$("$DRIVER" leader --bootstrap "$bs" --topic "$topic" --partition 0)"
  t_stop="$(date +%s.%N)"
  kafka_stop "$side" "$node"
  t_down="$(date +%s.%N)"
  after="$("$DRIVER" leader --bootstrap "$bs" --topic "$topic" --partition 0)"
  blog "brokers3: $side node $node (leader of $topic-0) stopped; $topic-0 now led by node $after"
  if ! $B3_RESTART; then
    printf '{"side":"%s","node":%s,"topic":"%s","at_records":%s,"leader_after_stop":%s,"stop":%s,"stopped":%s,"started":null,"in_sync":null,"preferred_back":null,"wait_in_sync":null}\n' \
      "$side" "$node" "$topic" "$at" "$after" "$t_stop" "$t_down" >"$events"
    return 0
  fi
  kafka_start "$side" "$node"
  t_up="$(date +%s.%N)"
  sync="$("$DRIVER" wait-in-sync --bootstrap "$bs" --timeout-s 300)"
  t_sync="$(date +%s.%N)"
  kafka_java org.apache.kafka.tools.LeaderElectionCommand --bootstrap-server "$bs" --election-type PREFERRED \
    --all-topic-partitions >"$LOGS/leader-election-$side-$ARM_ALIAS.log" 2>&1 ||
    grep -q "none of the partitions\|No partition" "$LOGS/leader-election-$side-$ARM_ALIAS.log" ||
    die "preferred leader election on $side failed (log: $LOGS/leader-election-$side-$ARM_ALIAS.log)"
  t_back="$(date +%s.%N)"
  blog "brokers3: $side node $node back, in sync, preferred leaders elected"
  printf '{"side":"%s","node":%s,"topic":"%s","at_records":%s,"leader_after_stop":%s,"stop":%s,"stopped":%s,"started":%s,"in_sync":%s,"preferred_back":%s,"wait_in_sync":%s}\n' \
    "$side" "$node" "$topic" "$at" "$after" "$t_stop" "$t_down" "$t_up" "$t_sync" "$t_back" "$sync" >"$events"
}

# b3_copy ARM REP: one arm copies the data set while each side loses and regains the leader of
# partition 0; then the copy is read back (missing, duplicates).
b3_copy() {
  local arm="$1" rep="$2" alias out verify t_arm t_end jobs=() job
  alias="${ARM_LETTER[$arm]}b3r$rep"
  local remote="$alias.bench-b3" events="$MF_STATE/b3-events-$alias"
  mkdir -p "$events"
  blog "brokers3: $arm copies $B3_N records of bench-b3 (alias $alias); leader changes at $B3_SOURCE_AT % (source) and $B3_TARGET_AT % (target)"
  t_arm="$(date +%s.%N)"
  arm_start "$arm" "$alias" bench-b3 "bench-$alias"
  b3_leader_change source bench-b3 "$remote" $((B3_N * B3_SOURCE_AT / 100)) "$events/source.json" &
  jobs+=($!)
  b3_leader_change target "$remote" "$remote" $((B3_N * B3_TARGET_AT / 100)) "$events/target.json" &
  jobs+=($!)
  out="$("$DRIVER" watch-copy --bootstrap "$TGT" --topic "$remote" --expect "$B3_N" --pid "$ARM_PID" --stall-s "$B3_STALL_S" --timeline)"
  t_end="$(date +%s.%N)"
  blog "brokers3: $arm: $out"
  for job in "${jobs[@]}"; do wait "$job" || die "a leader change of $arm's copy failed (see above)"; done
  # Read back with the arm still running: a copy that fell behind gets until its end offsets
  # stand still for 5 s.
  verify="$("$DRIVER" verify --bootstrap "$TGT" --topic "$remote" --expect "$B3_N" --source "$SRC" --source-topic bench-b3)"
  blog "brokers3: $arm read back: $verify"
  arm_stop
  record "{\"phase\":\"brokers3\",\"arm\":\"$arm\",\"rep\":$rep,\"arm_started\":$t_arm,\"copy_seen_done\":$t_end,\"result\":$out,\"verify\":$verify,\"leader_changes\":[$(cat "$events/source.json"),$(cat "$events/target.json")]}"
  "$DRIVER" delete-topics --bootstrap "$TGT" "$remote"
}

# The three-broker scenario: the data set over 8 partitions with 3 replicas each, copied by
# each arm through a leader change on each side.
brokers3() {
  local arms=(ours mm2 mm2t) rep arm out
  [ -n "${BENCH_ARMS:-}" ] && read -r -a arms <<<"$BENCH_ARMS"
  if $SMOKE; then arms=(ours); fi
  # A node left down on each side: a second copy would stop a second one, and a cluster of 3
  # with 2 down has neither a controller quorum nor min.insync.replicas.
  if ! $B3_RESTART && ((REPS * ${#arms[@]} > 1)); then
    die "BENCH_B3_RESTART=false leaves a node down on each side: one arm and one repetition only"
  fi
  b3_clusters
  "$DRIVER" create-topics --bootstrap "$SRC" --partitions "$PARTITIONS" --replication-factor 3 bench-b3
  out="$("$DRIVER" load-json --bootstrap "$SRC" --topic bench-b3 --n "$B3_N" --size "$JSON_SIZE" --codec lz4)"
  record "{\"phase\":\"b3_load\",\"result\":$out}"
  blog "brokers3: loaded $out"
  for rep in $(seq 1 "$REPS"); do
    for arm in $(arms_for "$rep" "${arms[@]}"); do b3_copy "$arm" "$rep"; done
  done
}

# --- run -------------------------------------------------------------------------------------

main() {
  local t0=$SECONDS
  mkdir -p "$LOGS"
  : >"$RAW"
  if $BUILD; then
    blog "building the $BUILD_PROFILE binaries"
    local flags=(--quiet -p mirrorflow -p mirrorflow-bench --bins)
    [ "$BUILD_PROFILE" = release ] && flags+=(--release)
    (cd "$ROOT" && cargo build "${flags[@]}") || die "cargo build failed"
  fi
  [ -x "$MF_BIN" ] && [ -x "$DRIVER" ] || die "$BUILD_PROFILE binaries missing: run without --no-build"
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
  # The three-broker scenario starts its clusters itself (b3_clusters: 6 nodes at once).
  if [ "$PHASES" != brokers3 ]; then
    kafka_start source
    kafka_start target
  fi
  record "{\"phase\":\"config\",\"phases\":\"$PHASES\",\"quick\":$QUICK,\"smoke\":$SMOKE,\"reps\":$REPS,\"partitions\":$PARTITIONS,\"big_n\":$BIG_N,\"big_size\":$BIG_SIZE,\"small_n\":$SMALL_N,\"small_size\":$SMALL_SIZE,\"json_n\":$JSON_N,\"wan_n\":$WAN_N,\"wan_links\":\"$WAN_LINKS\",\"wan_limit_s\":$WAN_LIMIT_S,\"parts_counts\":\"$PARTS_COUNTS\",\"parts_n\":$PARTS_N,\"parts_groups\":$PARTS_GROUPS,\"parts_commit_ms\":$PARTS_COMMIT_MS,\"parts_fresh_s\":$PARTS_FRESH_S,\"b3_n\":$B3_N,\"b3_source_at\":$B3_SOURCE_AT,\"b3_target_at\":$B3_TARGET_AT,\"b3_stall_s\":$B3_STALL_S,\"kafka_nodes\":$(kafka_nodes),\"json_size\":$JSON_SIZE,\"rate\":$RATE,\"steady_s\":$STEADY_S,\"settle_s\":$SETTLE_S,\"ours_flow\":\"$(ours_trial | sed 's/[\\"]/\\&/g')\",\"nproc\":$(nproc),\"date\":\"$(date -u +%FT%TZ)\",\"commit\":\"$(git -C "$ROOT" describe --always --dirty)\",\"binary_built\":\"$(date -u -r "$MF_BIN" +%FT%TZ)\"}"

  has_phase base && base
  has_phase compressed && compressed
  has_phase wan && wan
  has_phase partitions && partitions
  has_phase brokers3 && brokers3
  has_phase latency && latency
  has_phase verify_cost && verify_cost

  # The compressed scenario profiles the copy of its lz4 set, the base scenario its 1 KiB set.
  local prof_topic=bench-big prof_n="$BIG_N" prof_size="$BIG_SIZE"
  has_phase compressed && prof_topic=bench-lz4 prof_n="$JSON_N" prof_size="$JSON_SIZE JSON-like lz4"
  if $PROFILE && { has_phase base || has_phase compressed; }; then
    command -v perf >/dev/null || die "--profile needs perf (apt-get install linux-perf)"
    blog "profile: our replicator copies $prof_topic under perf record (figures not used)"
    ARM_WRAP=(perf record -F 999 -o "$OUT/perf.data" --)
    arm_start ours op "$prof_topic" bench-op
    ARM_WRAP=(env)
    local perf_pid="$ARM_PID" child=""
    while [ -z "$child" ]; do child="$(pgrep -P "$perf_pid" | head -n 1)" || sleep 0.1; done
    ARM_PID="$child"
    "$DRIVER" watch-copy --bootstrap "$TGT" --topic "op.$prof_topic" --expect "$prof_n" --pid "$ARM_PID" >"$OUT/profile-copy.json"
    arm_stop
    wait "$perf_pid" 2>/dev/null || true
    {
      echo "# perf record -F 999 of our replicator copying $prof_n x $prof_size B (copy: $(cat "$OUT/profile-copy.json"))"
      echo "## CPU samples by thread"
      perf report -i "$OUT/perf.data" --stdio --sort comm 2>/dev/null | grep '%'
      echo "## Top symbols (thread, library, symbol; >= 0.4% of samples)"
      perf report -i "$OUT/perf.data" --stdio --sort comm,dso,symbol --percent-limit 0.4 2>/dev/null |
        grep '%' | sed 's/ *$//'
    } >"$OUT/profile.txt"
    rm -f "$OUT/perf.data" "$OUT/perf.data.old"
  fi

  record "{\"phase\":\"end\",\"date\":\"$(date -u +%FT%TZ)\",\"seconds\":$((SECONDS - t0))}"
  if [ "$PHASES" = verify_cost ]; then
    python3 "$HERE/vc_report.py" "$OUT"
    blog "done in $((SECONDS - t0)) s: $OUT/results.md"
    return 0
  fi
  blog "writing $OUT/results.md and chart.png"
  # --smoke: the report fails when a phase it expects gave no figure.
  local check=()
  $SMOKE && check=(--check)
  "$VENV/bin/python" "$HERE/report.py" "$OUT" "${check[@]}"
  blog "done in $((SECONDS - t0)) s: $OUT/results.md"
}

main
