#!/usr/bin/env bash
# One run of every scenario, one after the other on the same binaries, with the two copy units
# side by side: the evidence the choice of the default copy rests on (issue 41: whole batches at
# least as good as records on every scenario). Each scenario's results go to DIR/<scenario>/.
#
#   bench/side-by-side.sh [--no-build] [--out DIR]     about 55 min on 2 cores
#
# Arms (bench/run.sh): ours is the product's default (whole batches since 2026-12-07), oursr
# copies records (spec.sourceLoop.copy: Records); MirrorMaker 2 tuned (mm2t) for throughput, at
# its defaults (mm2) for latency and memory. BENCH_SBS_RECORDS / BENCH_SBS_BATCHES name the two
# arms (the run of 2026-12-07, on c045e1d where the default copied records, was
# BENCH_SBS_RECORDS=ours BENCH_SBS_BATCHES=oursb); BENCH_SBS_SCENARIOS limits the scenarios
# (default: "base compressed wan partitions brokers3 latency").
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="" BUILD=true
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=false ;;
    --out) OUT="$2"; shift ;;
    *) echo "usage: $0 [--no-build] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$HERE/results/$(date -u +%F)-side-by-side}"
mkdir -p "$OUT"
$BUILD && (cd "$HERE/.." && cargo build --release -q)
BATCHES="${BENCH_SBS_BATCHES:-ours}" RECORDS="${BENCH_SBS_RECORDS:-oursr}"
scenario() {
  local name="$1" arms="$2"
  shift 2
  echo "[side-by-side $(date -u +%T)] $name: arms $arms"
  BENCH_ARMS="$arms" "$HERE/run.sh" --no-build --out "$OUT/$name" "$@"
}
for s in ${BENCH_SBS_SCENARIOS:-base compressed wan partitions brokers3 latency}; do
  case "$s" in
    base) scenario base "$RECORDS $BATCHES mm2t" ;;
    compressed) scenario compressed "$RECORDS $BATCHES mm2t" --compressed ;;
    wan) scenario wan "$RECORDS $BATCHES mm2t" --wan ;;
    # 2,000 partitions (the target scenario; 8 and 200 are in earlier runs), MirrorMaker 2 at
    # its defaults for the memory target; freshness with 500 groups for both copies.
    partitions) BENCH_PARTS_COUNTS=2000 PARTS_FRESH_ARMS="$RECORDS $BATCHES" \
      scenario partitions "$RECORDS $BATCHES mm2" --partitions ;;
    brokers3) scenario brokers3 "$RECORDS $BATCHES mm2t" --brokers3 ;;
    latency) scenario latency "$RECORDS $BATCHES mm2" --latency ;;
    *) echo "unknown scenario $s" >&2; exit 2 ;;
  esac
done
echo "[side-by-side $(date -u +%T)] done: $OUT"
