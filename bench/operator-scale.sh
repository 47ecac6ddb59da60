#!/usr/bin/env bash
# Operator scale: N MirrorFlows on one apiserver, the operator's release binary run on the host
# against the world's apiserver and Kafka clusters. Measures the operator's RSS and CPU, how
# stale `.status` is, and the apiserver requests per second it causes; then deletes all flows
# but one and measures whether the memory comes back.
#
#   eval "$(e2e/world.sh env)"    # a world with Kafka and the control plane (`up --kafka-only`
#                                 # plus `k8s start` is enough: no node, no image)
#   bench/operator-scale.sh [--flows 500] [--seconds 120] [--namespaces 5] [--binary PATH]
#                           [--out DIR] [--no-build] [--keep]
#
# Flows: even-numbered ones are `mode: Observe` on one of ALIASES source aliases that a
# replicator really replicated (heartbeats, checkpoints and positions exist on the target), the
# odd ones `mode: Replicate` with `replicas: 1` (the CRD's minimum), each with its own source
# alias (two replicating flows may not share one). Without a node their pods stay Pending: the
# operator applies and watches their StatefulSets, Services and ConfigMaps as in a real cluster. They are spread over --namespaces namespaces, which
# stand for tenants: the operator's probe slots and client sharing are per namespace.
#
# Figures (results.md in --out): RSS (VmRSS, sampled every 5 s, max and median), CPU (utime +
# stime over the window / window), status age = now - status.observedTime of every flow, sampled
# every 5 s (p50, p99, max; a flow without status counts as old as the window), apiserver
# requests/s = apiserver_request_total delta over the window minus the same delta over a
# baseline without the operator (the controller-manager's and this script's own requests),
# and RSS 30, 60 and 120 s after deleting all flows but one.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"

FLOWS=500 SECONDS_=120 NAMESPACES=5 BINARY="" OUT="" BUILD=true KEEP=false
ALIASES=5
while [ $# -gt 0 ]; do
  case "$1" in
    --flows) FLOWS="$2"; shift 2 ;;
    --seconds) SECONDS_="$2"; shift 2 ;;
    --namespaces) NAMESPACES="$2"; shift 2 ;;
    --binary) BINARY="$2"; BUILD=false; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --no-build) BUILD=false; shift ;;
    --keep) KEEP=true; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
: "${KUBECONFIG:?eval \"\$(e2e/world.sh env)\" first (a world with the control plane)}"
: "${MF_SOURCE_BOOTSTRAP:?eval \"\$(e2e/world.sh env)\" first}"
: "${MF_TARGET_BOOTSTRAP:?}" "${KAFKA_HOME:?}" "${MF_STATE:?}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
if $BUILD; then (cd "$ROOT" && cargo build --release --quiet -p mirrorflow --bin mirrorflow); fi
BINARY="${BINARY:-$TARGET_DIR/release/mirrorflow}"
[ -x "$BINARY" ] || { echo "no binary at $BINARY" >&2; exit 1; }
OUT="${OUT:-$HERE/results/$(date -u +%F)-operator-scale-$FLOWS}"
mkdir -p "$OUT"
WORK="$MF_STATE/operator-scale"
mkdir -p "$WORK"
METRICS_PORT="${OPERATOR_SCALE_METRICS_PORT:-$((APISERVER_PORT + 7))}"
log() { echo "[operator-scale $(date -u +%T)] $*" >&2; }
# A class from the Kafka classpath (the world's tools).
kafka_java() {
  java -Xmx256m -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" "$@"
}

kubectl apply --server-side --force-conflicts -f "$ROOT/crds" >/dev/null

# --- Data on the clusters: ALIASES replicated source topics with a committed group each, so the
# Observe flows' probes read real heartbeats, checkpoints and positions (once per world).
prepare() {
  [ -f "$WORK/prepared" ] && return 0
  local a pids=()
  for a in $(seq 0 $((ALIASES - 1))); do
    kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$MF_SOURCE_BOOTSTRAP" --create --if-not-exists \
      --topic "scale-$a" --partitions 4 --replication-factor 1 >/dev/null
    kafka_java org.apache.kafka.tools.ProducerPerformance --topic "scale-$a" --num-records 20000 --record-size 200 \
      --throughput -1 --producer-props bootstrap.servers="$MF_SOURCE_BOOTSTRAP" >/dev/null
    kafka_java org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$MF_SOURCE_BOOTSTRAP" --group "scale-g$a" \
      --topic "scale-$a" --reset-offsets --to-latest --execute >/dev/null
    cat >"$WORK/replicate-$a.yaml" <<EOF
source: {alias: sc$a, bootstrapServers: "$MF_SOURCE_BOOTSTRAP"}
target: {alias: sc$a-t, bootstrapServers: "$MF_TARGET_BOOTSTRAP"}
topics: ["scale-$a"]
groups: ["scale-g$a"]
checkpoints: {interval: 1s}
heartbeats: {interval: 1s}
EOF
  done
  log "replicating the $ALIASES source aliases for 40 s (heartbeats, checkpoints, positions on the target)"
  for a in $(seq 0 $((ALIASES - 1))); do
    "$BINARY" replicate -c "$WORK/replicate-$a.yaml" --secrets-dir "$WORK" \
      --listen "127.0.0.1:$((METRICS_PORT + 1 + a))" >"$WORK/replicate-$a.log" 2>&1 &
    pids+=($!)
  done
  sleep 40
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  touch "$WORK/prepared"
}

# The active segment of a compacted topic is not compacted (segment.ms: 7 days), so a
# checkpoints or positions topic written to for days holds many superseded records that a
# reader from the start goes through. PAD_RECORDS keyed records of about 200 B (undecodable:
# readers skip them, as they pass over superseded ones) stand for that in each of them.
PAD_RECORDS="${PAD_RECORDS:-100000}"
pad() {
  [ -f "$WORK/padded-$PAD_RECORDS" ] && return 0
  local a t
  log "padding each alias's checkpoints and positions topics with $PAD_RECORDS records"
  python3 -c '
import sys
value = "x" * 190
for i in range(int(sys.argv[1])):
    print(f"pad-{i % 1000}:{value}")
' "$PAD_RECORDS" >"$WORK/pad.txt"
  for a in $(seq 0 $((ALIASES - 1))); do
    for t in "sc$a.checkpoints.internal" "mirrorflow-positions.sc$a.internal"; do
      kafka_java org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$MF_TARGET_BOOTSTRAP" --topic "$t" \
        --property parse.key=true --property key.separator=: --producer-property linger.ms=50 \
        <"$WORK/pad.txt" >"$WORK/pad.log" 2>&1 || { tail -5 "$WORK/pad.log" >&2; exit 1; }
    done
  done
  rm -f "$WORK/pad.txt"
  touch "$WORK/padded-$PAD_RECORDS"
}

flows_yaml() {
  local i ns alias
  for i in $(seq 0 $((FLOWS - 1))); do
    ns="scale-$((i % NAMESPACES))" a=$((i % ALIASES))
    echo "---"
    if [ $((i % 2)) -eq 0 ]; then
      cat <<EOF
apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {name: f$i, namespace: $ns}
spec:
  mode: Observe
  source: {alias: sc$a, bootstrapServers: "$MF_SOURCE_BOOTSTRAP"}
  target: {alias: sc$a-t, bootstrapServers: "$MF_TARGET_BOOTSTRAP"}
  topics: ["scale-$a"]
  groups: ["scale-g$a"]
EOF
    else
      alias="r$i"
      cat <<EOF
apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {name: f$i, namespace: $ns}
spec:
  replicas: 1
  source: {alias: $alias, bootstrapServers: "$MF_SOURCE_BOOTSTRAP"}
  target: {alias: $alias-t, bootstrapServers: "$MF_TARGET_BOOTSTRAP"}
  topics: ["scale-$a"]
  groups: ["scale-g$a"]
EOF
    fi
  done
}

# Sum of apiserver_request_total (every verb, resource and code).
requests_total() {
  kubectl get --raw /metrics | awk '/^apiserver_request_total\{/ { s += $NF } END { printf "%.0f\n", s }'
}

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
# utime + stime in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# Ages (s) of every flow's status: now - status.observedTime.
status_ages() {
  kubectl get mirrorflows -A -o json | python3 -c '
import json, sys, datetime
now = datetime.datetime.now(datetime.timezone.utc)
window = float(sys.argv[1])
for f in json.load(sys.stdin)["items"]:
    t = (f.get("status") or {}).get("observedTime")
    if not t:
        print(window); continue
    t = datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
    print(max(0.0, (now - t).total_seconds()))
' "$SECONDS_"
}

prepare
pad
# Flows (and their statuses) left by an interrupted run would count as stale or as settled.
kubectl delete mirrorflows -A --all --wait=true >/dev/null 2>&1 || true
for n in $(seq 0 $((NAMESPACES - 1))); do
  kubectl create namespace "scale-$n" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
done
flows_yaml >"$WORK/flows.yaml"
kubectl apply --server-side -f "$WORK/flows.yaml" >/dev/null
log "$FLOWS flows in $NAMESPACES namespaces"

log "baseline: apiserver requests for 20 s without the operator"
b0=$(requests_total); sleep 20; b1=$(requests_total)
baseline=$(python3 -c "print(($b1 - $b0 - 1) / 20)")

RUST_LOG="${RUST_LOG:-warn}" "$BINARY" operator --listen "127.0.0.1:$METRICS_PORT" >"$OUT/operator.log" 2>&1 &
OP=$!
trap 'kill $OP 2>/dev/null || true' EXIT
start=$(date +%s)
log "operator pid $OP; waiting for every flow's first status"
while :; do
  missing=$(kubectl get mirrorflows -A -o json | python3 -c '
import json, sys
print(sum(1 for f in json.load(sys.stdin)["items"] if not (f.get("status") or {}).get("observedTime")))')
  [ "$missing" = 0 ] && break
  if [ $(($(date +%s) - start)) -gt 600 ]; then log "$missing flows still without status after 600 s"; break; fi
  sleep 5
done
settle=$(($(date +%s) - start))
log "all statuses written after $settle s; measuring $SECONDS_ s"

: >"$OUT/samples.tsv"
: >"$OUT/ages.txt"
c0=$(cpu_ticks $OP); r0=$(requests_total); t0=$(date +%s.%N); samples=0
while python3 -c "import sys,time; sys.exit(0 if time.time() - $t0 < $SECONDS_ else 1)"; do
  sleep 5
  rss=$(rss_kib $OP)
  status_ages >>"$OUT/ages.txt"
  samples=$((samples + 1))
  printf '%s\t%s\n' "$(date +%s)" "$rss" >>"$OUT/samples.tsv"
done
c1=$(cpu_ticks $OP); r1=$(requests_total); t1=$(date +%s.%N)
tick=$(getconf CLK_TCK)

log "deleting all flows but one; RSS after 30, 60 and 120 s"
kubectl delete mirrorflows -A --all --wait=false >/dev/null 2>&1 || true
kubectl delete mirrorflows -A --all --wait=true >/dev/null 2>&1 || true
kubectl apply --server-side -f <(flows_yaml | python3 -c '
import sys
docs = sys.stdin.read().split("---\n")
print(next(d for d in docs if d.strip()))') >/dev/null
deleted=$(date +%s)
after=()
for at in 30 60 120; do
  sleep $((deleted + at - $(date +%s)))
  after+=("$(rss_kib $OP)")
done
peak=$(awk '/^VmHWM:/ { print $2 }' "/proc/$OP/status")
kill $OP; wait $OP 2>/dev/null || true
trap - EXIT

python3 - "$OUT" "$FLOWS" "$NAMESPACES" "$SECONDS_" "$settle" "$c0" "$c1" "$tick" "$t0" "$t1" "$r0" "$r1" \
  "$baseline" "$samples" "$peak" "${after[@]}" "$BINARY" <<'EOF'
import statistics, sys
(out, flows, nss, window, settle, c0, c1, tick, t0, t1, r0, r1, baseline, samples, peak,
 a30, a60, a120, binary) = sys.argv[1:]
elapsed = float(t1) - float(t0)
cpu = (int(c1) - int(c0)) / int(tick) / elapsed
rss = [int(l.split()[1]) / 1024 for l in open(f"{out}/samples.tsv") if l.strip()]
ages = sorted(float(l) for l in open(f"{out}/ages.txt") if l.strip())
def pct(p):
    return ages[min(len(ages) - 1, int(p * len(ages)))] if ages else float("nan")
# Each sample lists the flows once (one LIST) and the metrics are read twice.
rate = (int(r1) - int(r0) - int(samples) - 1) / elapsed - float(baseline)
rows = [
    ("flows", f"{flows} in {nss} namespaces (half Observe, half Replicate with pods Pending)"),
    ("first status of every flow after", f"{settle} s"),
    ("window", f"{elapsed:.0f} s, {samples} samples"),
    ("RSS max / median", f"{max(rss):.0f} / {statistics.median(rss):.0f} MiB"),
    ("peak RSS (VmHWM)", f"{int(peak) / 1024:.0f} MiB"),
    ("CPU", f"{cpu:.3f} cores"),
    ("status age p50 / p99 / max", f"{pct(0.5):.1f} / {pct(0.99):.1f} / {ages[-1]:.1f} s"),
    ("apiserver requests/s (operator)", f"{rate:.1f} (baseline without it {float(baseline):.1f})"),
    ("RSS 30 / 60 / 120 s after deleting all flows but one",
     f"{int(a30) / 1024:.0f} / {int(a60) / 1024:.0f} / {int(a120) / 1024:.0f} MiB"),
    ("binary", binary),
]
text = "| figure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
open(f"{out}/results.md", "w").write(text)
print(text)
EOF
if ! $KEEP; then
  kubectl delete mirrorflows -A --all --wait=true >/dev/null 2>&1 || true
  for n in $(seq 0 $((NAMESPACES - 1))); do kubectl delete namespace "scale-$n" --wait=false >/dev/null 2>&1 || true; done
fi
