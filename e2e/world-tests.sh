#!/usr/bin/env bash
# Runs the world test binaries (crate mirrorflow-e2e) against a running world: several binaries
# at once (`cargo test` would run them one after another, and most of their time is waiting on
# brokers and pods), then, alone, the ones that stop or restart the shared brokers.
#
#   e2e/world-tests.sh [NAME...]     all test binaries, or only those named (e.g. operator chaos)
#
# Env: MF_TEST_JOBS (binaries at once, default 3); MF_TEST_TIMEOUT (seconds one binary may run,
# default 1200: the longest, chaos, takes about 500). Each binary's output goes to
# $MF_STATE/test-logs/<name>.log; a failure or a timeout prints its tail. Exit status 1 if any
# failed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
cd "$ROOT"
: "${MF_STATE:?run through e2e/test.sh, or eval \"\$(e2e/world.sh env)\" first}"
JOBS="${MF_TEST_JOBS:-3}"
TIMEOUT="${MF_TEST_TIMEOUT:-1200}"
LOGS="$MF_STATE/test-logs"
mkdir -p "$LOGS"

# These stop or restart the shared world's brokers, or (operator_switchover) write onto the
# shared source what the other tests' flows would copy, or (node_loss) start a second node that
# other tests' pods would be scheduled on and then crash it, or (operator_upgrade) change the
# cluster-wide CRD every flow is served through, or (share_groups, streams_groups) make a share
# or streams group every flow selecting all groups (the default) would see: run alone, after
# the others.
EXCLUSIVE=" share_groups streams_groups world_kafka_restart operator_faults replicator_fidelity replicator_aligned operator_switchover node_loss operator_upgrade "

# name<TAB>executable for every test binary of the crate, built once.
cargo test -p mirrorflow-e2e --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("kind") == ["test"]:
        print(t["name"] + "\t" + m["executable"])
' | sort >"$LOGS/binaries.tsv"
[ -s "$LOGS/binaries.tsv" ] || { echo "no test binaries built" >&2; exit 1; }

wanted() { [ "$#" -eq 0 ] || [[ " $* " == *" $NAME "* ]]; }
parallel=() exclusive=()
while IFS=$'\t' read -r NAME EXE; do
  wanted "$@" || continue
  if [[ "$EXCLUSIVE" == *" $NAME "* ]]; then exclusive+=("$NAME=$EXE"); else parallel+=("$NAME=$EXE"); fi
done <"$LOGS/binaries.tsv"

run_one() {
  local name="${1%%=*}" exe="${1#*=}" start=$SECONDS status=PASS rc=0
  # Tests find the repository from the crate's directory, as under cargo.
  # --nocapture: the figures tests print (chaos losses and duplicates, ...) stay in the log.
  # A hung binary would hold the whole run until CI's limit: `timeout` runs it in a process
  # group of its own and stops the group (the binary, the replicators and brokers it started).
  (cd "$ROOT/e2e/tests" && timeout -k 30 "$TIMEOUT" "$exe" --test-threads 2 --nocapture) \
    >"$LOGS/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status=FAIL
    echo "(stopped: still running after ${TIMEOUT} s, MF_TEST_TIMEOUT)" >>"$LOGS/$name.log"
  elif [ "$rc" -ne 0 ]; then
    status=FAIL
  fi
  printf '%s %-28s %4d s\n' "$status" "$name" "$((SECONDS - start))" >>"$LOGS/summary"
  printf '%s %-28s %4d s\n' "$status" "$name" "$((SECONDS - start))"
  if [ "$status" = FAIL ]; then
    # A failed test leaves its pods behind; their logs are what explains the failure, and
    # the kubelet removes them with the pods.
    cp -r "$MF_STATE/node/pod-logs" "$LOGS/$name.pods" 2>/dev/null || true
    cp -r "$MF_STATE/node2/pod-logs" "$LOGS/$name.node2-pods" 2>/dev/null || true
    echo "----- $name (last 40 lines of $LOGS/$name.log, backtraces left out; pods' logs: $LOGS/$name.pods)"
    grep -Ev '^ +([0-9]+: |at )' "$LOGS/$name.log" | tail -n 40
    echo "-----"
    return 1
  fi
}
export -f run_one
export ROOT LOGS MF_STATE TIMEOUT

: >"$LOGS/summary"
start=$SECONDS
failed=0
if [ "${#parallel[@]}" -gt 0 ]; then
  printf '%s\n' "${parallel[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_one "$@"' _ {} || failed=1
fi
for e in "${exclusive[@]}"; do run_one "$e" || failed=1; done
grep -h -e '^chaos\[' -e '^node_loss' -e '^upgrade_' "$LOGS"/*.log 2>/dev/null || true
echo "$(grep -c '^PASS' "$LOGS/summary") passed, $(grep -c '^FAIL' "$LOGS/summary" || true) failed, in $((SECONDS - start)) s ($JOBS at once; logs in $LOGS)"
exit "$failed"
