#!/usr/bin/env bash
# Every test of the project: static checks, unit and property tests, then the tests that run
# against the real local world (Kafka, control plane, a kubelet node), which this script starts.
# A world that is already up is reused and left running; one started here is stopped at the end.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
cd "$ROOT"
step() { printf '\n=== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "unit, property and seed-corpus tests"
cargo test --workspace --exclude mirrorflow-e2e

step "the container image (podman build, smoke run)"
"$HERE/world.sh" image

step "the local world"
started_here=false
if ! "$HERE/world.sh" running; then
  started_here=true
  trap '"$HERE/world.sh" down' EXIT
fi
"$HERE/world.sh" up
eval "$("$HERE/world.sh" env)"

step "tests against the world"
"$HERE/world-tests.sh"

step "benchmark smoke run (bench/run.sh --smoke: its own two clusters, every phase a few seconds)"
"$ROOT/bench/run.sh" --smoke --out "${MF_BENCH_SMOKE_OUT:-${TMPDIR:-/tmp}/mirrorflow-bench-smoke}"
$started_here && echo "(the world started for these tests is stopped now)"
