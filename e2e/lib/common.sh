# Shared by every e2e script: pinned versions, cache and state locations, logging, waits.
# Sourced, never run. Everything downloaded or built lives under $MF_CACHE keyed by version, so a
# second machine set-up reuses it and a version bump never mixes artefacts.

# Pinned versions: change one here and the matching cache entry is rebuilt.
KAFKA_VERSION="${KAFKA_VERSION:-4.3.1}"
K8S_VERSION="${K8S_VERSION:-v1.36.3}"
# The newest kubelet that runs on cgroup v1 with Debian 12's containerd 1.6 (e2e/README.md, "The node").
KUBELET_VERSION="${KUBELET_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.21.4}"
# Prometheus and promtool (Go module tag v0.316.0 is Prometheus 3.x): alert rule tests and the
# dashboard's queries against a real Prometheus (e2e/monitoring).
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
ACTIONLINT_VERSION="${ACTIONLINT_VERSION:-v1.7.12}"
# krew (as `kubectl krew`) and its manifest validator: the kubectl plugin's krew manifest
# (release/krew.sh) is validated and installed by krew itself (e2e/tests/tests/release.rs).
KREW_VERSION="${KREW_VERSION:-v0.4.3}"

MF_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MF_CACHE="${MF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mirrorflow}"
# Runtime state (logs, data dirs, pids) of the running world; wiped by `world.sh down`.
MF_STATE="${MF_STATE:-${TMPDIR:-/tmp}/mirrorflow-world}"

KAFKA_HOME="$MF_CACHE/kafka-$KAFKA_VERSION"
# A Kafka Streams application for the streams-group world tests, keyed by what builds it.
STREAMS_APP="$MF_CACHE/streams-app-$KAFKA_VERSION-$(cat "$MF_ROOT"/e2e/kafka/streams/{pom.xml,PassThrough.java} | sha256sum | cut -c1-12)"
K8S_BIN="$MF_CACHE/k8s-$K8S_VERSION"
KUBELET_BIN="$MF_CACHE/kubelet-$KUBELET_VERSION"
# A cache entry of its own: the k8s-$K8S_VERSION entry predates the real node and is never rebuilt.
SCHEDULER_BIN="$MF_CACHE/kube-scheduler-$K8S_VERSION"
ETCD_BIN="$MF_CACHE/etcd-$ETCD_VERSION"
HELM_BIN="$MF_CACHE/helm-$HELM_VERSION"
PROMETHEUS_BIN="$MF_CACHE/prometheus-$PROMETHEUS_VERSION/bin"
ACTIONLINT_BIN="$MF_CACHE/actionlint-$ACTIONLINT_VERSION"
KREW_BIN="$MF_CACHE/krew-$KREW_VERSION"

# Loopback ports of the world. Kept in one place so tests and docs agree.
KAFKA_SOURCE_PORT="${KAFKA_SOURCE_PORT:-19092}"
KAFKA_TARGET_PORT="${KAFKA_TARGET_PORT:-29092}"
KAFKA_THIRD_PORT="${KAFKA_THIRD_PORT:-39092}"
ETCD_PORT="${ETCD_PORT:-12379}"
ETCD_PEER_PORT="${ETCD_PEER_PORT:-12380}"
APISERVER_PORT="${APISERVER_PORT:-16443}"
KCM_PORT="${KCM_PORT:-10257}"
# The OAuth token endpoint (lib/oidc.sh); next to the source cluster's ports, so a second world
# that moves those moves it too.
OIDC_PORT="${OIDC_PORT:-$((KAFKA_SOURCE_PORT + 5))}"
SCHEDULER_PORT="${SCHEDULER_PORT:-10259}"
# The OCI registry the image and chart are pushed to and pulled from (lib/registry.sh).
REGISTRY_PORT="${REGISTRY_PORT:-15000}"
REGISTRY_ADDR="127.0.0.1:$REGISTRY_PORT"
# The node (lib/node.sh): kubelet's API and healthz on loopback; the pods' bridge and their /24
# (its .1 is the bridge's own address). Another world beside this one needs other values of all four.
KUBELET_PORT="${KUBELET_PORT:-10250}"
KUBELET_HEALTHZ_PORT="${KUBELET_HEALTHZ_PORT:-10248}"
NODE_BRIDGE="${NODE_BRIDGE:-mfbr0}"
NODE_POD_CIDR="${NODE_POD_CIDR:-10.244.0.0/24}"
# The second node, started only on demand (world.sh node2 ...; lib/node.sh node2_use): the same
# four of its own. Its ports follow the first node's, so a world beside this one that moves those
# moves these too.
KUBELET2_PORT="${KUBELET2_PORT:-$((KUBELET_PORT + 1))}"
KUBELET2_HEALTHZ_PORT="${KUBELET2_HEALTHZ_PORT:-$((KUBELET_HEALTHZ_PORT + 1))}"
NODE2_BRIDGE="${NODE2_BRIDGE:-mfbr1}"
NODE2_POD_CIDR="${NODE2_POD_CIDR:-10.244.1.0/24}"

# A cgroup path below this process's own cgroup in every hierarchy: with cgroup v1 one path
# serves all hierarchies (runc's and kubelet's cgroupfs drivers take one), so take the deepest
# path this process has and require the others to be its prefixes (here: memory is
# /process_api/<id>, the rest are /). Usage: cgroup_below_self NAME
cgroup_below_self() {
  local deepest="" path
  while IFS=: read -r _ _ path; do
    [ "${#path}" -gt "${#deepest}" ] && deepest="$path"
  done </proc/self/cgroup
  while IFS=: read -r _ _ path; do
    case "${deepest%/}/" in
      "${path%/}/"*) ;;
      *) die "cannot place containers below this process's cgroups: '$path' is not a prefix of '$deepest' (/proc/self/cgroup)" ;;
    esac
  done </proc/self/cgroup
  echo "${deepest%/}/$1"
}

# Removes the cgroup PATH and what is below it in every v1 hierarchy, leaves first, then its
# parents as long as they are empty. rmdir refuses a cgroup that still has processes or children,
# so this never removes one in use (ours stops the walk upwards).
cgroup_remove_empty() {
  local mnt dir
  [ -n "$1" ] || return 0
  for mnt in /sys/fs/cgroup/*/; do
    dir="${mnt%/}$1"
    [ -d "$dir" ] && find "$dir" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
    while [ "$dir" != "${mnt%/}" ] && [ -d "$dir" ] && rmdir "$dir" 2>/dev/null; do dir="${dir%/*}"; done
  done
  return 0
}

log() { printf '[world %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[world] error: %s\n' "$*" >&2; exit 1; }

need() {
  # need CMD "how to get it"
  command -v "$1" >/dev/null 2>&1 || die "'$1' is required but not on PATH: $2"
}

port_free() {
  # true when nothing listens on 127.0.0.1:$1
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

require_port_free() {
  port_free "$1" || die "port 127.0.0.1:$1 ($2) is already in use; stop what holds it (ss -ltnp 'sport = :$1') or set $3"
}

wait_until() {
  # wait_until SECONDS DESCRIPTION CMD...: polls CMD every 0.5 s.
  local deadline=$((SECONDS + $1)) what="$2"
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {
  # stop_pidfile FILE [GRACE_SECONDS]: SIGTERM, then SIGKILL after the grace period.
  local f="$1" grace="${2:-20}" pid
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + grace))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$f"
}

# Runs a long step with a heartbeat line every 30 s so a cold set-up shows it is alive; a step
# that knows how far along it is writes that into $MF_PROGRESS_FILE (see go_build_counting),
# and the heartbeat shows it.
with_progress() {
  local what="$1"
  shift
  log "$what ..."
  local start=$SECONDS
  MF_PROGRESS_FILE="$(mktemp)"
  export MF_PROGRESS_FILE
  "$@" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (((SECONDS - start) % 30 == 0)); then
      local far
      far="$(tail -n 1 "$MF_PROGRESS_FILE" 2>/dev/null || true)"
      log "$what: still working ($((SECONDS - start)) s${far:+; $far})"
    fi
  done
  rm -f "$MF_PROGRESS_FILE"
  wait "$pid" || die "$what failed (see output above)"
  log "$what: done in $((SECONDS - start)) s"
}
