#!/usr/bin/env bash
# The local world: two Kafka clusters (source, target; optionally a third), a Kubernetes control
# plane (etcd, kube-apiserver, kube-controller-manager) and the process node that runs its pods.
#
#   e2e/world.sh setup            fetch and build everything into the cache (no servers started)
#   e2e/world.sh image [-setup]   build the container image (podman; lib/image.sh) [install podman]
#   e2e/world.sh up [--kafka-only] start the world (idempotent); prints where things are
#   e2e/world.sh down             stop everything and delete the world's state
#   e2e/world.sh status           what runs (`running` exits 0 when the whole world is alive)
#   e2e/world.sh env              shell exports for the running world (eval "$(e2e/world.sh env)")
#   e2e/world.sh kafka start|stop|restart source|target|third
#   e2e/world.sh node start|stop|restart
#   e2e/world.sh k8s start|stop    the control plane alone (no Kafka, no process node)
#   e2e/world.sh mm2 start|stop|log NAME ...  a real MirrorMaker 2 (see lib/mm2.sh)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/common.sh
source "$HERE/lib/common.sh"
# shellcheck source=lib/build.sh
source "$HERE/lib/build.sh"
# shellcheck source=lib/kafka.sh
source "$HERE/lib/kafka.sh"
# shellcheck source=lib/k8s.sh
source "$HERE/lib/k8s.sh"
# shellcheck source=lib/mm2.sh
source "$HERE/lib/mm2.sh"
# shellcheck source=lib/image.sh
source "$HERE/lib/image.sh"

CARGO_TARGET="${CARGO_TARGET_DIR:-$MF_ROOT/target}"
NODE_BIN="$CARGO_TARGET/debug/mirrorflow-process-node"
MF_BIN="$CARGO_TARGET/debug/mirrorflow"
NODE_DIR="$MF_STATE/node"

build_rust() {
  need cargo "install Rust with rustup"
  (cd "$MF_ROOT" && cargo build --quiet -p mirrorflow -p mirrorflow-process-node) || die "cargo build failed"
}

setup() {
  need java "install a Java 17+ JDK"
  need go "install Go 1.26+"
  mkdir -p "$MF_CACHE"
  with_progress "fetching Kafka $KAFKA_VERSION, its tools and MirrorMaker 2 (Maven Central)" fetch_kafka
  with_progress "building etcd $ETCD_VERSION (Go modules)" build_etcd
  with_progress "building kube-apiserver, kube-controller-manager, kubectl $K8S_VERSION (Go modules; 10-25 min cold)" build_k8s
  with_progress "building Helm $HELM_VERSION (Go modules)" build_helm
  with_progress "building the mirrorflow binaries (cargo)" build_rust
  image_setup
  image_build
}

node_start() {
  if pid_alive "$NODE_DIR/node.pid"; then return 0; fi
  mkdir -p "$NODE_DIR"
  log "starting the process node"
  sed "s|@MIRRORFLOW_BIN@|$MF_BIN|" "$HERE/world/image-map.yaml" >"$NODE_DIR/image-map.yaml"
  nohup "$NODE_BIN" --kubeconfig "$(k8s_dir)/process-node.kubeconfig" --node-name mirrorflow-node \
    --state-dir "$NODE_DIR" --image-map "$NODE_DIR/image-map.yaml" \
    --apiserver-host 127.0.0.1 --apiserver-port "$APISERVER_PORT" >>"$NODE_DIR/node.log" 2>&1 &
  echo $! >"$NODE_DIR/node.pid"
  wait_until 60 "the process node to register" k8s_kubectl get node mirrorflow-node ||
    die "the process node did not register (log: $NODE_DIR/node.log)"
}

node_stop() { stop_pidfile "$NODE_DIR/node.pid" 40; }

write_env() {
  cat >"$MF_STATE/env" <<EOF
export MF_STATE='$MF_STATE'
export MF_CACHE='$MF_CACHE'
export KAFKA_HOME='$KAFKA_HOME'
export MF_SOURCE_BOOTSTRAP='$(kafka_bootstrap source)'
export MF_TARGET_BOOTSTRAP='$(kafka_bootstrap target)'
export MF_THIRD_BOOTSTRAP='$(kafka_bootstrap third)'
export MF_SOURCE_SECURE_BOOTSTRAP='$(kafka_secure_bootstrap source)'
export MF_TARGET_SECURE_BOOTSTRAP='$(kafka_secure_bootstrap target)'
export MF_KAFKA_CA_PEM='$(kafka_tls_dir)/ca.pem'
export MF_SOURCE_MTLS_BOOTSTRAP='$(kafka_mtls_bootstrap source)'
export MF_TARGET_MTLS_BOOTSTRAP='$(kafka_mtls_bootstrap target)'
export MF_KAFKA_CLIENT_CERT_PEM='$(kafka_tls_dir)/client.pem'
export MF_KAFKA_CLIENT_KEY_PEM='$(kafka_tls_dir)/client.key'
export MF_KAFKA_CLIENT_P12='$(kafka_tls_dir)/client.p12'
export MF_KAFKA_CLIENT_P12_PASSWORD_FILE='$(kafka_tls_dir)/client-p12-password'
export MF_KAFKA_SCRAM_USER='mirrorflow'
export MF_KAFKA_SCRAM_PASSWORD_FILE='$(kafka_tls_dir)/scram-password'
export MF_SOURCE_OAUTH_BOOTSTRAP='$(kafka_oauth_bootstrap source)'
export MF_TARGET_OAUTH_BOOTSTRAP='$(kafka_oauth_bootstrap target)'
export MF_OIDC_URL='$(oidc_url)'
export MF_OIDC_CLIENT_ID='$OIDC_CLIENT_ID'
export MF_OIDC_CLIENT_SECRET_FILE='$(oidc_dir)/client-secret'
export MF_OIDC_CLIENTS_FILE='$(oidc_dir)/clients.json'
export MF_NODE_STATE='$NODE_DIR'
export PATH='$K8S_BIN:$HELM_BIN:'"\$PATH"
EOF
  if [ -f "$(KUBECONFIG_PATH)" ]; then echo "export KUBECONFIG='$(KUBECONFIG_PATH)'" >>"$MF_STATE/env"; fi
}

up() {
  local kafka_only=false
  [ "${1:-}" = "--kafka-only" ] && kafka_only=true
  setup
  mkdir -p "$MF_STATE"
  # A half-started world is worse than none: tear down what this call started if a step fails.
  trap 'log "start-up failed; tearing the world down"; down_quiet' ERR
  kafka_start source
  kafka_start target
  if [ "${MF_THIRD_CLUSTER:-0}" = 1 ]; then kafka_start third; fi
  if ! $kafka_only; then
    k8s_start
    node_start
  fi
  trap - ERR
  write_env
  log "world is up. Use it with: eval \"\$(e2e/world.sh env)\""
  status
}

down_quiet() {
  local f
  # Sample producers and consumers the main job started.
  for f in "$MF_STATE"/demo/*.pid; do [ -e "$f" ] && stop_pidfile "$f" 10; done
  for f in "$MF_STATE"/mm2/*/mm2.pid; do [ -e "$f" ] && stop_pidfile "$f" 30; done
  node_stop
  k8s_stop
  kafka_stop third
  kafka_stop target
  kafka_stop source
  oidc_stop
}

down() {
  down_quiet
  # Mounts made for pods live in the pods' own namespaces; nothing is left mounted on the host.
  rm -rf "$MF_STATE"
  log "world is down"
}

status() {
  local c
  for c in source target third; do
    if pid_alive "$(kafka_pidfile "$c")"; then echo "kafka $c: running on $(kafka_bootstrap "$c")"; else echo "kafka $c: stopped"; fi
  done
  for c in etcd apiserver kcm; do
    if pid_alive "$(k8s_dir)/$c.pid"; then echo "$c: running"; else echo "$c: stopped"; fi
  done
  if pid_alive "$NODE_DIR/node.pid"; then echo "process node: running (pods' logs under $NODE_DIR)"; else echo "process node: stopped"; fi
  [ -f "$(KUBECONFIG_PATH)" ] && echo "KUBECONFIG=$(KUBECONFIG_PATH)"
  return 0
}

case "${1:-}" in
  setup) setup ;;
  image) image_setup && image_build ;;
  image-setup) image_setup ;;
  up) up "${2:-}" ;;
  down) down ;;
  status) status ;;
  running)
    # Exit 0 only when every component of a full world is alive (used by test.sh).
    pid_alive "$(kafka_pidfile source)" && pid_alive "$(kafka_pidfile target)" &&
      pid_alive "$(k8s_dir)/apiserver.pid" && pid_alive "$NODE_DIR/node.pid"
    ;;
  env)
    [ -f "$MF_STATE/env" ] || die "the world is not up (run e2e/world.sh up)"
    cat "$MF_STATE/env"
    ;;
  kafka)
    case "${2:-}" in
      start) kafka_start "${3:?cluster name}" ;;
      stop) kafka_stop "${3:?cluster name}" ;;
      restart) kafka_restart "${3:?cluster name}" ;;
      *) die "usage: world.sh kafka start|stop|restart source|target|third" ;;
    esac
    ;;
  k8s)
    case "${2:-}" in
      start) mkdir -p "$MF_STATE" && build_etcd && build_k8s && k8s_start && write_env ;;
      stop) k8s_stop ;;
      *) die "usage: world.sh k8s start|stop" ;;
    esac
    ;;
  node)
    case "${2:-}" in
      start) node_start ;;
      stop) node_stop ;;
      restart) node_stop && node_start ;;
      *) die "usage: world.sh node start|stop|restart" ;;
    esac
    ;;
  mm2)
    case "${2:-}" in
      start) shift 2 && mm2_start "$@" ;;
      stop) mm2_stop "${3:?MirrorMaker name}" ;;
      log) mm2_log "${3:?MirrorMaker name}" ;;
      *) die "usage: world.sh mm2 start NAME SRC_ALIAS SRC_BOOTSTRAP TGT_ALIAS TGT_BOOTSTRAP [KEY=VALUE ...] | stop NAME | log NAME" ;;
    esac
    ;;
  *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
