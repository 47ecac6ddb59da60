#!/usr/bin/env bash
# The local world: two Kafka clusters (source, target; optionally a third), a Kubernetes control
# plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and a node that runs its
# pods as containers (kubelet, containerd, runc; lib/node.sh); a second node on demand.
#
#   e2e/world.sh setup            fetch and build everything into the cache (no servers started)
#   e2e/world.sh image [-setup]   build the container image (podman; lib/image.sh) [install podman];
#                                 with the world up, push it to the world's registry (lib/registry.sh)
#   e2e/world.sh previous         build the previous release's image and chart from its fixed commit
#                                 (e2e/previous-release.env; cached by commit); with the world up,
#                                 push them to the world's registry under previous/
#   e2e/world.sh up [--kafka-only] start the world (idempotent); prints where things are
#                                 (--kafka-only: only the Kafka clusters, and only their jars set up)
#   e2e/world.sh down             stop everything and delete the world's state
#   e2e/world.sh status           what runs (`running` exits 0 when the whole world is alive)
#   e2e/world.sh env              shell exports for the running world (eval "$(e2e/world.sh env)")
#   e2e/world.sh kafka start|stop|restart source|target|third
#   e2e/world.sh node start|stop|restart   kubelet, containerd and every pod of the node
#   e2e/world.sh node2 start|stop|kill      a second node (mirrorflow-node-2), never started by up;
#                                 kill crashes it (no shutdown, no API call), stop also deletes its Node
#   e2e/world.sh k8s start|stop    the control plane alone (no Kafka, no node)
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
# shellcheck source=lib/node.sh
source "$HERE/lib/node.sh"
# shellcheck source=lib/registry.sh
source "$HERE/lib/registry.sh"
# shellcheck source=lib/previous.sh
source "$HERE/lib/previous.sh"


build_rust() {
  need cargo "install Rust with rustup"
  (cd "$MF_ROOT" && cargo build --quiet -p mirrorflow) || die "cargo build failed"
}

# The downloads and Go builds: no Debian packages, no Rust, so they may run beside the Rust
# builds (e2e/test.sh starts them first).
tools() {
  need java "install a Java 17+ JDK"
  need go "install Go 1.26+"
  mkdir -p "$MF_CACHE"
  with_progress "fetching Kafka $KAFKA_VERSION, its tools and MirrorMaker 2 (Maven Central)" fetch_kafka
  with_progress "fetching Kafka Streams $KAFKA_VERSION and compiling the test application" fetch_streams_app
  with_progress "building etcd $ETCD_VERSION (Go modules)" build_etcd
  with_progress "building kube-apiserver, kube-controller-manager, kubectl $K8S_VERSION (Go modules; 10-25 min cold)" build_k8s
  with_progress "building kube-scheduler $K8S_VERSION (Go modules; a few minutes cold)" build_scheduler
  with_progress "building kubelet $KUBELET_VERSION (Go modules; about 4 min cold)" build_kubelet
  with_progress "building Helm $HELM_VERSION (Go modules)" build_helm
  with_progress "building Prometheus and promtool $PROMETHEUS_VERSION (Go modules; about 6 min cold)" build_prometheus
  with_progress "building the world's OCI registry (Go modules)" build_registry
  with_progress "building actionlint $ACTIONLINT_VERSION (Go modules)" build_actionlint
  with_progress "building krew and validate-krew-manifest $KREW_VERSION (Go modules; about 1 min cold)" build_krew
}

setup() {
  tools
  node_setup
  with_progress "building the mirrorflow binaries (cargo)" build_rust
  image_setup
  image_build
}

# What a Kafka-only world needs: the Kafka jars (no Kubernetes, node or image build).
kafka_setup() {
  need java "install a Java 17+ JDK"
  mkdir -p "$MF_CACHE"
  with_progress "fetching Kafka $KAFKA_VERSION, its tools and MirrorMaker 2 (Maven Central)" fetch_kafka
}

write_env() {
  cat >"$MF_STATE/env" <<EOF
export MF_STATE='$MF_STATE'
export MF_CACHE='$MF_CACHE'
export KAFKA_HOME='$KAFKA_HOME'
export MF_STREAMS_APP='$STREAMS_APP'
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
export MF_CHART_VALUES='$(registry_chart_values)'
export MF_REGISTRY='$REGISTRY_ADDR' REGISTRY_PORT='$REGISTRY_PORT'
export MF_TOOLS_IMAGE='$TOOLS_IMAGE'
export CONTAINERD_ADDRESS='$(node_sock)' CONTAINERD_NAMESPACE=k8s.io
# This world's ports and names, so world.sh run from this environment acts on this world only.
export KAFKA_SOURCE_PORT='$KAFKA_SOURCE_PORT' KAFKA_TARGET_PORT='$KAFKA_TARGET_PORT' KAFKA_THIRD_PORT='$KAFKA_THIRD_PORT'
export ETCD_PORT='$ETCD_PORT' ETCD_PEER_PORT='$ETCD_PEER_PORT' APISERVER_PORT='$APISERVER_PORT' KCM_PORT='$KCM_PORT'
export SCHEDULER_PORT='$SCHEDULER_PORT' KUBELET_PORT='$KUBELET_PORT' KUBELET_HEALTHZ_PORT='$KUBELET_HEALTHZ_PORT'
export NODE_BRIDGE='$NODE_BRIDGE' NODE_POD_CIDR='$NODE_POD_CIDR'
export KUBELET2_PORT='$KUBELET2_PORT' KUBELET2_HEALTHZ_PORT='$KUBELET2_HEALTHZ_PORT'
export NODE2_BRIDGE='$NODE2_BRIDGE' NODE2_POD_CIDR='$NODE2_POD_CIDR' MF_NODE2_STATE='$MF_STATE/node2'
export PATH='$K8S_BIN:$HELM_BIN:$PROMETHEUS_BIN:$ACTIONLINT_BIN:$KREW_BIN:'"\$PATH"
EOF
  if [ -f "$(KUBECONFIG_PATH)" ]; then echo "export KUBECONFIG='$(KUBECONFIG_PATH)'" >>"$MF_STATE/env"; fi
}

up() {
  local kafka_only=false
  [ "${1:-}" = "--kafka-only" ] && kafka_only=true
  if $kafka_only; then kafka_setup; else setup; fi
  mkdir -p "$MF_STATE"
  # A half-started world is worse than none: tear down what this call started if a step fails.
  trap 'log "start-up failed; tearing the world down"; down_quiet' ERR
  kafka_start source
  kafka_start target
  if [ "${MF_THIRD_CLUSTER:-0}" = 1 ]; then kafka_start third; fi
  if ! $kafka_only; then
    # Before the node: its pods pull the image from here.
    registry_start
    registry_publish
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
  # The second node first: its link to the first node's pods names the first node's bridge.
  (node2_use && node2_stop)
  node_stop
  registry_stop
  k8s_stop
  kafka_stop third
  kafka_stop target
  kafka_stop source
  oidc_stop
}

down() {
  down_quiet
  # node_stop removed every mount under the state dir; rm would not cross into one anyway.
  rm -rf --one-file-system "$MF_STATE"
  log "world is down"
}

# The first node's bridge is made anew when it starts: a running second node's link to it is
# set up again.
node2_relink() {
  (
    node2_use
    if [ -f "$NODE_DIR/link" ]; then node_link_up; fi
  )
}

status() {
  local c
  for c in source target third; do
    if pid_alive "$(kafka_pidfile "$c")"; then echo "kafka $c: running on $(kafka_bootstrap "$c")"; else echo "kafka $c: stopped"; fi
  done
  for c in etcd apiserver kcm; do
    if pid_alive "$(k8s_dir)/$c.pid"; then echo "$c: running"; else echo "$c: stopped"; fi
  done
  if pid_alive "$REGISTRY_DIR/registry.pid"; then echo "registry: running on $REGISTRY_ADDR"; else echo "registry: stopped"; fi
  node_status
  (node2_use && node_status)
  [ -f "$(KUBECONFIG_PATH)" ] && echo "KUBECONFIG=$(KUBECONFIG_PATH)"
  return 0
}

case "${1:-}" in
  setup) setup ;;
  tools) tools ;;
  image)
    image_setup && image_build
    # A running world pulls from its registry: the new image goes there too.
    if pid_alive "$REGISTRY_DIR/registry.pid"; then registry_publish; fi
    ;;
  image-setup) image_setup ;;
  previous)
    image_setup && previous_build
    if pid_alive "$REGISTRY_DIR/registry.pid"; then previous_publish; fi
    ;;
  up) up "${2:-}" ;;
  down) down ;;
  status) status ;;
  running)
    # Exit 0 only when every component of a full world is alive (used by test.sh).
    pid_alive "$(kafka_pidfile source)" && pid_alive "$(kafka_pidfile target)" &&
      pid_alive "$(k8s_dir)/apiserver.pid" && pid_alive "$NODE_DIR/kubelet.pid" &&
      pid_alive "$REGISTRY_DIR/registry.pid"
    ;;
  env)
    [ -f "$MF_STATE/env" ] || die "the world is not up (run e2e/world.sh up)"
    cat "$MF_STATE/env"
    # A world started before krew joined the tools has no krew on its PATH: the tools are
    # stateless, so a running world gets them without a restart.
    grep -qF "$KREW_BIN" "$MF_STATE/env" || echo "export PATH='$KREW_BIN:'\"\$PATH\""
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
      start) mkdir -p "$MF_STATE" && build_etcd && build_k8s && build_scheduler && k8s_start && write_env ;;
      stop) k8s_stop ;;
      *) die "usage: world.sh k8s start|stop" ;;
    esac
    ;;
  node)
    case "${2:-}" in
      start) node_start && node2_relink ;;
      stop) node_stop ;;
      restart) node_stop && node_start && node2_relink ;;
      *) die "usage: world.sh node start|stop|restart" ;;
    esac
    ;;
  node2)
    node2_use
    case "${2:-}" in
      start) node_start ;;
      stop) node2_stop ;;
      kill) node_kill ;;
      *) die "usage: world.sh node2 start|stop|kill" ;;
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
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
