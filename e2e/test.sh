#!/usr/bin/env bash
# Every test of the project: static checks, unit and property tests, then the tests that run
# against the real local world (Kafka, control plane, a kubelet node), which this script starts.
# A world that is already up is reused and left running; one started here is stopped at the end.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
cd "$ROOT"
step() { printf '\n=== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

# On a fresh machine the world's downloads and Go builds (about 12 minutes) run beside the Rust
# builds below instead of after them: each leaves the cores idle at times (downloads, linking,
# a last crate alone). On a warm machine they find everything cached within seconds.
step "the world's tools, in the background (Kafka jars, etcd, Kubernetes, Helm)"
tools_log="$(mktemp "${TMPDIR:-/tmp}/mirrorflow-world-tools.XXXXXX")"
# A session of its own, so stopping it early (a failed lint) stops its builds too.
setsid "$HERE/world.sh" tools >"$tools_log" 2>&1 &
tools_pid=$!
stop_tools() { kill -- -"$tools_pid" 2>/dev/null || true; }
trap stop_tools EXIT
echo "log: $tools_log"

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "unit, property and seed-corpus tests"
cargo test --workspace --exclude mirrorflow-e2e

step "the container image (podman build, smoke run)"
"$HERE/world.sh" image

# The nightly set (e2e/README.md, "Nightly"): the previous release's image and chart, built
# from their commit (minutes cold, nothing once cached), so upgrade_traffic upgrades from it.
# Without it a cold run's upgrade_traffic is a smoke from the world's own release; a cached
# previous release is published and used by every run.
if [ "${MF_NIGHTLY:-0}" = 1 ]; then
  step "nightly: the previous release (e2e/world.sh previous)"
  "$HERE/world.sh" previous
  export MF_UPGRADE_FROM_PREVIOUS=1
fi

step "the local world"
tools_ok=true
wait "$tools_pid" || tools_ok=false
trap - EXIT
sed -n 's/^\(\[world [0-9:]*\] .*done in .*\)$/\1/p' "$tools_log"
$tools_ok || { cat "$tools_log"; echo "the world's tools failed to build (log above)" >&2; exit 1; }
rm -f "$tools_log"
started_here=false
smoke_pid=""
# Stops what this script started and is still running when it ends (a failure included).
# No `a && b` here: under `set -e` a failing b (a smoke run already ended, so nothing to kill)
# ends the trap before the world is stopped.
finish() {
  if [ -n "$smoke_pid" ]; then
    kill -- -"$smoke_pid" 2>/dev/null || true
    echo "(the benchmark smoke run's output so far: $smoke_log)"
  fi
  if $started_here; then
    # The world's state goes with it: keep the test logs of a failed run (the pods' logs of
    # each failed test included) where the next look finds them.
    if grep -qs "^FAIL" "${MF_STATE:-/nonexistent}/test-logs/summary"; then
      kept="$(mktemp -d "${TMPDIR:-/tmp}/mirrorflow-test-logs.XXXXXX")"
      cp -r "$MF_STATE/test-logs/." "$kept/" 2>/dev/null || true
      echo "(the failed run's test logs are kept in $kept)"
    fi
    "$HERE/world.sh" down
  fi
  return 0
}
trap finish EXIT
if ! "$HERE/world.sh" running; then
  started_here=true
fi
"$HERE/world.sh" up
eval "$("$HERE/world.sh" env)"

# The world tests mostly wait on brokers and pods, so the benchmark's smoke run, on clusters
# and ports of its own, runs beside them on the idle CPU: niced, it takes what the tests leave
# instead of slowing them. It used to run after them and added 4-5 minutes to every run. Its
# three-node phase runs after the tests instead: six broker JVMs starting at once, niced under
# the tests' peak load (10-21 on 2 cores), were starved past their 3-minute start limit while
# their controllers timed out on each other.
smoke_out="${MF_BENCH_SMOKE_OUT:-${TMPDIR:-/tmp}/mirrorflow-bench-smoke}"
step "benchmark smoke run, in the background at low CPU priority (bench/run.sh --smoke: its own two clusters, every single-node phase a few seconds)"
smoke_log="$(mktemp "${TMPDIR:-/tmp}/mirrorflow-bench-smoke.XXXXXX")"
BENCH_SMOKE_PHASES="base compressed wan partitions" setsid nice -n 10 "$ROOT/bench/run.sh" --smoke \
  --out "$smoke_out" >"$smoke_log" 2>&1 &
smoke_pid=$!
echo "log: $smoke_log"

step "tests against the world"
"$HERE/world-tests.sh"

step "benchmark smoke run: its output"
smoke_ok=true
wait "$smoke_pid" || smoke_ok=false
smoke_pid=""
cat "$smoke_log"
$smoke_ok || { echo "the benchmark smoke run failed (output above)" >&2; exit 1; }
rm -f "$smoke_log"

step "benchmark smoke run, the three-node phase (bench/run.sh --smoke --brokers3: both clusters of 3 nodes, a leader change on each side)"
"$ROOT/bench/run.sh" --smoke --brokers3 --no-build --out "$smoke_out-brokers3"
# An `if`, not `$started_here && echo`: as the script's last command, that list's false (a
# world that was already up, so the main job's order) was the script's exit status, 1.
if $started_here; then echo "(the world started for these tests is stopped now)"; fi
