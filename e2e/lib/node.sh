# shellcheck shell=bash
# The world's node: a real kubelet (lib/build.sh builds it) with containerd and runc from Debian,
# pods in network namespaces on a bridge of this world. Sourced by world.sh after k8s.sh and
# image.sh. What each setting is for, and what this machine kind needs, is in e2e/README.md
# ("The node").
#
#   node_start   containerd, the pod network, kubelet; imports the images; waits for Node Ready
#   node_stop    kubelet, every pod, containerd; removes mounts, network, cgroups it made
#   node_kill    a crash: cuts the node's network, SIGKILLs everything of it; node_stop cleans up
#   node2_use    switches these functions to the optional second node (world.sh node2 ...)
#
# Everything lives under $NODE_DIR (state, sockets, logs), the bridge $NODE_BRIDGE, the
# iptables chains named after it (node_chain) and the cgroup $(node_cgroup_root): `node_stop`
# finds all of them again from those names alone, also after a crash.

NODE_DIR="$MF_STATE/node"
NODE_NAME=mirrorflow-node
# The zone label kubelet registers (topology.kubernetes.io/zone), so zone spread has two
# zones to spread over once the second node runs.
NODE_ZONE=zone-a
# The kubelet's client certificate and key in the control plane's pki dir (without .crt/.key).
NODE_KUBELET_USER=kubelet
# The bridge of the node this one's pods are linked to (node_link_up); the first node has none.
NODE_PEER_BRIDGE=""
# The `kubernetes` Service's ClusterIP: the first address of the apiserver's service range.
NODE_APISERVER_SERVICE_IP=10.0.0.1
PAUSE_VERSION=1
PAUSE_IMAGE="localhost/mirrorflow-pause:$PAUSE_VERSION"
TOOLS_IMAGE="localhost/mirrorflow-tools:1"

node_sock() { echo "$NODE_DIR/containerd/containerd.sock"; }
node_ctr() { ctr --address "$(node_sock)" --namespace k8s.io "$@"; }
node_gateway() { echo "${NODE_POD_CIDR%.0/24}.1"; }
node_chain() { echo "MF-$NODE_BRIDGE"; }
node_chain_out() { echo "MF-$NODE_BRIDGE-OUT"; }
# filter chains: the link to the peer node's pods (node_link_up), and the cut of a crash (node_kill).
node_chain_fwd() { echo "MF-$NODE_BRIDGE-FWD"; }
node_chain_cut() { echo "MF-$NODE_BRIDGE-CUT"; }
# One cgroup per node of each world (its state dir names it), below the one this shell runs in.
node_cgroup_root() { cgroup_below_self "$NODE_NAME-$(printf '%s' "$MF_STATE" | sha256sum | cut -c1-8)"; }

# The second node: the same functions, with its own state dir, name, zone, kubelet identity and
# ports, bridge and pod range, registered to the same control plane. Its pods are linked to the
# first node's (node_link_up). It replaces the first node's settings, so world.sh calls it in a
# subshell or a command of its own.
node2_use() {
  NODE_DIR="$MF_STATE/node2"
  NODE_NAME=mirrorflow-node-2
  NODE_ZONE=zone-b
  NODE_KUBELET_USER=kubelet-node-2
  NODE_PEER_BRIDGE="$NODE_BRIDGE"
  NODE_BRIDGE="$NODE2_BRIDGE"
  NODE_POD_CIDR="$NODE2_POD_CIDR"
  KUBELET_PORT="$KUBELET2_PORT"
  KUBELET_HEALTHZ_PORT="$KUBELET2_HEALTHZ_PORT"
}

node_need_tools() {
  local c
  for c in containerd containerd-shim-runc-v2 ctr runc nsenter iptables ip gcc buildah podman; do
    need "$c" "apt-get install containerd runc containernetworking-plugins iptables iproute2 util-linux gcc (e2e/world.sh node-setup)"
  done
  [ -x /usr/lib/cni/bridge ] || die "the CNI plugins are missing: apt-get install containernetworking-plugins"
  case "$NODE_POD_CIDR" in
    *.0/24) ;;
    *) die "NODE_POD_CIDR must be a /24 ending in .0 (got '$NODE_POD_CIDR')" ;;
  esac
}

# Debian 12's containerd 1.6 and CNI plugins 1.1 (see e2e/README.md for why not containerd 2).
node_setup() {
  local missing=() c
  for c in containerd runc; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  [ "${#missing[@]}" -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "installing the node's runtime needs root: apt-get install ${missing[*]}"
  log "installing the node's runtime (missing: ${missing[*]})"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd runc containernetworking-plugins >/dev/null
}

# The pod sandbox image, built here: the usual one is in a registry this machine cannot reach.
# Keyed by the source's hash so a change rebuilds it.
node_pause_archive() {
  local hash dir
  hash="$(sha256sum "$MF_ROOT/e2e/node/pause.c" | cut -c1-12)"
  dir="$MF_CACHE/node-pause-$PAUSE_VERSION-$hash"
  if [ ! -f "$dir/pause.oci.tar" ]; then
    mkdir -p "$dir"
    gcc -static -Os -Wall -Wextra -Werror -o "$dir/pause" "$MF_ROOT/e2e/node/pause.c" ||
      die "compiling the pause program failed"
    local c
    c="$(buildah from --quiet scratch)"
    buildah copy --quiet "$c" "$dir/pause" /pause >/dev/null
    buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
    buildah commit --quiet --rm "$c" "$PAUSE_IMAGE" >/dev/null
    podman save --quiet --format oci-archive -o "$dir/pause.oci.tar.new" "$PAUSE_IMAGE"
    mv "$dir/pause.oci.tar.new" "$dir/pause.oci.tar"
  fi
  echo "$dir/pause.oci.tar"
}

# The tests' image with a shell (e2e/node/tools.Containerfile), keyed by its file and base.
node_tools_archive() {
  local hash dir
  hash="$( (cat "$MF_ROOT/e2e/node/tools.Containerfile" && podman image inspect --format '{{.Id}}' "$(image_debian_tag)") |
    sha256sum | cut -c1-12)"
  dir="$MF_CACHE/node-tools-$hash"
  if [ ! -f "$dir/tools.oci.tar" ]; then
    mkdir -p "$dir"
    podman build "${IMAGE_BUILD_ARGS[@]}" --build-arg BASE_IMAGE="$(image_debian_tag)" -t "$TOOLS_IMAGE" \
      -f "$MF_ROOT/e2e/node/tools.Containerfile" "$MF_ROOT/e2e/node" >"$dir/build.log" 2>&1 ||
      die "building $TOOLS_IMAGE failed (log: $dir/build.log)"
    podman save --quiet --format oci-archive -o "$dir/tools.oci.tar.new" "$TOOLS_IMAGE"
    mv "$dir/tools.oci.tar.new" "$dir/tools.oci.tar"
    image_cgroup_cleanup
  fi
  echo "$dir/tools.oci.tar"
}

node_write_configs() {
  local d="$NODE_DIR" gw
  gw="$(node_gateway)"
  mkdir -p "$d/containerd" "$d/cni/bin" "$d/cni/net.d" "$d/kubelet" "$d/pod-logs"
  cat >"$d/containerd/config.toml" <<EOF
# Written by e2e/lib/node.sh.
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$(node_sock)"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: a negative oom_score_adj is refused ("can't get final child's PID").
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$d/cni/bin"
    conf_dir = "$d/cni/net.d"
    max_conf_num = 1
  # Registries by host, one directory each: the world's own (lib/registry.sh) speaks plain http.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$d/containerd/certs.d"
EOF
  mkdir -p "$d/containerd/certs.d/$REGISTRY_ADDR"
  cat >"$d/containerd/certs.d/$REGISTRY_ADDR/hosts.toml" <<EOF
# Written by e2e/lib/node.sh: the world's registry on loopback, without TLS.
server = "http://$REGISTRY_ADDR"
[host."http://$REGISTRY_ADDR"]
  capabilities = ["pull", "resolve"]
EOF
  local p
  for p in bridge host-local loopback; do ln -sfn "/usr/lib/cni/$p" "$d/cni/bin/$p"; done
  ln -sfn "$MF_ROOT/e2e/node/cni-host-loopback" "$d/cni/bin/mirrorflow-host-loopback"
  cat >"$d/cni/net.d/10-mirrorflow.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "mirrorflow-pods",
  "plugins": [
    {
      "type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": false, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$d/cni/ipam",
        "ranges": [[{"subnet": "$NODE_POD_CIDR", "gateway": "$gw", "rangeStart": "${gw%.1}.10"}]],
        "routes": [{"dst": "0.0.0.0/0", "gw": "$gw"}]
      }
    },
    {
      "type": "mirrorflow-host-loopback", "gateway": "$gw",
      "apiserver": {"serviceIP": "$NODE_APISERVER_SERVICE_IP", "servicePort": 443, "port": $APISERVER_PORT}
    }
  ]
}
EOF
  # Pods get no nameserver: the host's is not reachable from the bridge, and nothing the world
  # runs needs DNS (names like localhost come from the pod's /etc/hosts).
  printf '# written by e2e/lib/node.sh: no DNS for pods\n' >"$d/resolv.conf"
  cat >"$d/kubelet/config.yaml" <<EOF
# Written by e2e/lib/node.sh.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
containerRuntimeEndpoint: unix://$(node_sock)
cgroupDriver: cgroupfs
cgroupRoot: $NODE_CGROUP_ROOT
oomScoreAdj: 0
failSwapOn: false
# kubelet's own iptables chains would go into the host's tables, shared with other worlds.
makeIPTablesUtilChains: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $(k8s_dir)/pki/ca.crt}
authorization:
  mode: Webhook
resolvConf: $d/resolv.conf
podLogsDir: $d/pod-logs
volumePluginDir: $d/kubelet/volume-plugins
# The machine's disk is shared: never evict pods or remove the imported images because of it.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
syncFrequency: 10s
EOF
}

node_certs() {
  local pki
  local user="$NODE_KUBELET_USER"
  pki="$(k8s_dir)/pki"
  [ -f "$pki/$user.crt" ] && return 0
  # The Node authorizer knows a kubelet by this name and group.
  if ! openssl req -newkey rsa:2048 -nodes -keyout "$pki/$user.key" -out "$pki/$user.csr" \
    -subj "/O=system:nodes/CN=system:node:$NODE_NAME" 2>/dev/null ||
    ! openssl x509 -req -in "$pki/$user.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 365 -extfile "$pki/client.ext" -out "$pki/$user.crt" 2>/dev/null; then
    die "making the kubelet's client certificate failed"
  fi
}

# The bridge (its address is the pods' gateway) and the host half of cni-host-loopback: what a
# pod sends to the gateway goes to the host's loopback. Forwarding stays off, so nothing from a
# pod is routed anywhere else. The same for the host's own connections to the gateway: the Node's
# address is the gateway (kubelet refuses a loopback node IP), and the apiserver reaches kubelet,
# which listens on 127.0.0.1 only, through it.
node_network_up() {
  local gw chain out
  gw="$(node_gateway)"
  chain="$(node_chain)"
  out="$(node_chain_out)"
  if ip route show "$NODE_POD_CIDR" | grep -qv "dev $NODE_BRIDGE "; then
    die "$NODE_POD_CIDR is already routed elsewhere ($(ip route show "$NODE_POD_CIDR")): set NODE_POD_CIDR"
  fi
  ip link show "$NODE_BRIDGE" >/dev/null 2>&1 || ip link add "$NODE_BRIDGE" type bridge ||
    die "could not create the bridge $NODE_BRIDGE"
  ip addr replace "$gw/24" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  sysctl -qw "net.ipv4.conf.$NODE_BRIDGE.route_localnet=1"
  iptables -w -t nat -N "$chain" 2>/dev/null || iptables -w -t nat -F "$chain"
  iptables -w -t nat -A "$chain" -i "$NODE_BRIDGE" -d "$gw/32" -p tcp -j DNAT --to-destination 127.0.0.1
  iptables -w -t nat -C PREROUTING -j "$chain" 2>/dev/null || iptables -w -t nat -A PREROUTING -j "$chain"
  iptables -w -t nat -N "$out" 2>/dev/null || iptables -w -t nat -F "$out"
  iptables -w -t nat -A "$out" -d "$gw/32" -p tcp -j DNAT --to-destination 127.0.0.1
  iptables -w -t nat -C OUTPUT -j "$out" 2>/dev/null || iptables -w -t nat -A OUTPUT -j "$out"
  # The bridge and chains are named by NODE_BRIDGE, which a world started from this one's
  # environment inherits (the tests' private Kafka-only worlds): only the world that made
  # them takes them down.
  echo "$NODE_BRIDGE" >"$NODE_DIR/network"
}

node_network_down() {
  local chain
  [ "$(cat "$NODE_DIR/network" 2>/dev/null)" = "$NODE_BRIDGE" ] || return 0
  node_link_down
  node_chain_remove filter "$(node_chain_cut)" INPUT FORWARD OUTPUT
  node_chain_remove nat "$(node_chain)" PREROUTING
  node_chain_remove nat "$(node_chain_out)" OUTPUT
  ip link del "$NODE_BRIDGE" 2>/dev/null || true
  rm -f "$NODE_DIR/network"
}

# node_chain_remove TABLE CHAIN HOOK...: the jumps from the hooks, then the chain itself.
node_chain_remove() {
  local table="$1" chain="$2" hook
  shift 2
  for hook in "$@"; do
    while iptables -w -t "$table" -D "$hook" -j "$chain" 2>/dev/null; do :; done
  done
  iptables -w -t "$table" -F "$chain" 2>/dev/null || true
  iptables -w -t "$table" -X "$chain" 2>/dev/null || true
}

# A second node's pods and the first node's reach each other as pods on two machines of one
# cluster network do, through their gateways: the host forwards between the two bridges. Only
# there: forwarding is switched on for these two interfaces alone (the machine's ip_forward stays
# off) and anything else arriving on either bridge is dropped before it could be forwarded, so
# nothing a pod sends leaves the machine. Traffic between pods of one node is bridged, not
# routed; with br_netfilter it passes FORWARD as in and out on the same bridge, and is left alone.
node_link_up() {
  local fwd
  [ -n "$NODE_PEER_BRIDGE" ] || return 0
  ip link show "$NODE_PEER_BRIDGE" >/dev/null 2>&1 || die "the first node's bridge $NODE_PEER_BRIDGE is missing"
  fwd="$(node_chain_fwd)"
  iptables -w -N "$fwd" 2>/dev/null || iptables -w -F "$fwd"
  iptables -w -A "$fwd" -i "$NODE_BRIDGE" -o "$NODE_PEER_BRIDGE" -j ACCEPT
  iptables -w -A "$fwd" -i "$NODE_PEER_BRIDGE" -o "$NODE_BRIDGE" -j ACCEPT
  iptables -w -A "$fwd" -i "$NODE_BRIDGE" ! -o "$NODE_BRIDGE" -j DROP
  iptables -w -A "$fwd" -i "$NODE_PEER_BRIDGE" ! -o "$NODE_PEER_BRIDGE" -j DROP
  iptables -w -C FORWARD -j "$fwd" 2>/dev/null || iptables -w -I FORWARD -j "$fwd"
  sysctl -qw "net.ipv4.conf.$NODE_BRIDGE.forwarding=1" "net.ipv4.conf.$NODE_PEER_BRIDGE.forwarding=1"
  echo "$NODE_PEER_BRIDGE" >"$NODE_DIR/link"
}

node_link_down() {
  local peer
  peer="$(cat "$NODE_DIR/link" 2>/dev/null)" || return 0
  if ip link show "$peer" >/dev/null 2>&1; then sysctl -qw "net.ipv4.conf.$peer.forwarding=0"; fi
  node_chain_remove filter "$(node_chain_fwd)" FORWARD
  rm -f "$NODE_DIR/link"
}

# What a crashed machine does to the network: it stops answering. From here on nothing from this
# node's pods gets anywhere and nothing reaches them, not even the FIN or RST their sockets send
# when node_kill kills them, and nobody reaches its kubelet: brokers, the apiserver and the other
# node's pods find out by their own timeouts, as they would. node_network_down removes it.
node_network_cut() {
  local cut hook
  cut="$(node_chain_cut)"
  iptables -w -N "$cut" 2>/dev/null || iptables -w -F "$cut"
  iptables -w -A "$cut" -i "$NODE_BRIDGE" -j DROP
  iptables -w -A "$cut" -o "$NODE_BRIDGE" -j DROP
  # The apiserver's connections to kubelet reach it on loopback (node_network_up's OUTPUT DNAT).
  iptables -w -A "$cut" -o lo -d 127.0.0.1/32 -p tcp --dport "$KUBELET_PORT" -j DROP
  for hook in INPUT FORWARD OUTPUT; do
    iptables -w -C "$hook" -j "$cut" 2>/dev/null || iptables -w -I "$hook" -j "$cut"
  done
}

# kubelet refuses a cgroup root that does not exist in every hierarchy. cpuset needs its cpus and
# mems filled in before anything can join it: copied from the parent, as runc does.
node_cgroup_up() {
  local mnt dir parent f
  for mnt in /sys/fs/cgroup/*/; do
    [ -e "${mnt}cgroup.procs" ] || continue
    dir="${mnt%/}$NODE_CGROUP_ROOT"
    mkdir -p "$dir"
    case "$mnt" in
      */cpuset/)
        parent="${mnt%/}"
        for f in ${NODE_CGROUP_ROOT//\// }; do
          parent="$parent/$f"
          for c in cpus mems; do
            [ -s "$parent/cpuset.$c" ] && [ -n "$(tr -d '\n' <"$parent/cpuset.$c")" ] && continue
            cat "${parent%/*}/cpuset.$c" >"$parent/cpuset.$c"
          done
        done
        ;;
    esac
  done
}

node_import() {
  # node_import ARCHIVE: into containerd's k8s.io namespace, where the CRI looks.
  node_ctr images import --no-unpack=false "$1" >>"$NODE_DIR/import.log" 2>&1 ||
    die "importing $1 into containerd failed (log: $NODE_DIR/import.log)"
}

node_images() {
  local start=$SECONDS
  # The sandbox and the tests' tools image are the world's own plumbing; the mirrorflow image is
  # pulled from the world's registry like any image a user installs (lib/registry.sh).
  node_import "$(node_pause_archive)"
  node_import "$(node_tools_archive)"
  log "images imported into containerd in $((SECONDS - start)) s"
}

node_containerd_start() {
  pid_alive "$NODE_DIR/containerd.pid" && return 0
  log "starting containerd $(containerd --version | awk '{print $3}') (socket $(node_sock))"
  # The nofile hard limit here is 20000; containers get containerd's defaults within it.
  nohup containerd --config "$NODE_DIR/containerd/config.toml" >>"$NODE_DIR/containerd.log" 2>&1 &
  echo $! >"$NODE_DIR/containerd.pid"
  wait_until 30 containerd node_ctr version || die "containerd did not start (log: $NODE_DIR/containerd.log)"
}

node_ready() {
  [ "$(k8s_kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

node_kubelet_start() {
  pid_alive "$NODE_DIR/kubelet.pid" && return 0
  require_port_free "$KUBELET_PORT" kubelet KUBELET_PORT
  require_port_free "$KUBELET_HEALTHZ_PORT" "kubelet healthz" KUBELET_HEALTHZ_PORT
  log "starting kubelet $KUBELET_VERSION (node $NODE_NAME, 127.0.0.1:$KUBELET_PORT, pods in $NODE_POD_CIDR)"
  nohup "$KUBELET_BIN/kubelet" --config "$NODE_DIR/kubelet/config.yaml" \
    --kubeconfig "$NODE_DIR/kubelet.kubeconfig" --root-dir "$NODE_DIR/kubelet/root" \
    --cert-dir "$NODE_DIR/kubelet/pki" --hostname-override "$NODE_NAME" --node-ip "$(node_gateway)" \
    --node-labels "topology.kubernetes.io/zone=$NODE_ZONE" \
    >>"$NODE_DIR/kubelet.log" 2>&1 &
  echo $! >"$NODE_DIR/kubelet.pid"
  wait_until 90 "the node to be Ready" node_ready || {
    tail -n 20 "$NODE_DIR/kubelet.log" >&2
    die "the node did not become Ready (log: $NODE_DIR/kubelet.log)"
  }
}

node_start() {
  node_need_tools
  # Checked before anything starts, so a refused start leaves nothing to clean up.
  if [ -n "$NODE_PEER_BRIDGE" ] && ! ip link show "$NODE_PEER_BRIDGE" >/dev/null 2>&1; then
    die "the first node's bridge $NODE_PEER_BRIDGE is missing: start the world (e2e/world.sh up) before a second node"
  fi
  if ! pid_alive "$NODE_DIR/kubelet.pid"; then
    require_port_free "$KUBELET_PORT" "kubelet of $NODE_NAME" KUBELET_PORT
    require_port_free "$KUBELET_HEALTHZ_PORT" "kubelet healthz of $NODE_NAME" KUBELET_HEALTHZ_PORT
  fi
  build_kubelet
  mkdir -p "$NODE_DIR/kubelet/root"
  NODE_CGROUP_ROOT="$(node_cgroup_root)"
  image_podman_env
  node_certs
  k8s_kubeconfig "$NODE_KUBELET_USER" "$NODE_DIR/kubelet.kubeconfig"
  node_write_configs
  node_network_up
  node_link_up
  node_cgroup_up
  # kubelet's mount propagation needs a shared mount; this one is ours alone (/ stays private).
  if ! mountpoint -q "$NODE_DIR/kubelet/root"; then
    mount --bind "$NODE_DIR/kubelet/root" "$NODE_DIR/kubelet/root"
    mount --make-rshared "$NODE_DIR/kubelet/root"
  fi
  node_containerd_start
  node_images
  node_kubelet_start
  log "node $NODE_NAME is Ready (logs: $NODE_DIR/kubelet.log, containers: $NODE_DIR/pod-logs)"
}

# Pids of every process in the node's pod cgroups (kubelet's tree below the cgroup root).
node_pod_pids() {
  local dir
  dir="/sys/fs/cgroup/memory$NODE_CGROUP_ROOT"
  [ -d "$dir" ] && find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null
  return 0
}

node_shim_pids() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd="$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" || continue
    case "$cmd" in "containerd-shim-runc-v2 "*"-address $(node_sock) "* | */containerd-shim-runc-v2\ *"-address $(node_sock) "*) echo "${p#/proc/}" ;; esac
  done
}

# What containerd would clean up on its next start for tasks whose shim is gone (always after
# node_kill): runc's state of each container and the shim's socket, both kept outside $NODE_DIR
# (/run/containerd/runc and /run/containerd/s are fixed in containerd 1.6 and its shim). Only the
# tasks in this node's state dir, whose socket names hash in this node's containerd socket.
node_task_leftovers() {
  local bundle sock
  for bundle in "$NODE_DIR"/containerd/state/io.containerd.runtime.v2.task/k8s.io/*/; do
    [ -d "$bundle" ] || continue
    runc --root /run/containerd/runc/k8s.io delete --force "$(basename "$bundle")" >/dev/null 2>&1 || true
    sock="$(cat "$bundle/address" 2>/dev/null)" || continue
    sock="${sock#unix://}"
    case "$sock" in /run/containerd/s/*) rm -f "$sock" ;; esac
  done
}

node_stop() {
  # A world that never started a node (Kafka only) has nothing to stop.
  [ -d "$NODE_DIR" ] || return 0
  NODE_CGROUP_ROOT="$(node_cgroup_root)"
  stop_pidfile "$NODE_DIR/kubelet.pid" 20
  # Pods: their tasks killed through containerd, then anything left in their cgroups, then the
  # shims (containerd started them; their pid files are in its state dir).
  if pid_alive "$NODE_DIR/containerd.pid"; then
    local id
    for id in $(node_ctr tasks ls -q 2>/dev/null); do node_ctr tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  fi
  local pid deadline=$((SECONDS + 20))
  while [ -n "$(node_pod_pids)" ] && ((SECONDS < deadline)); do
    for pid in $(node_pod_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.2
  done
  stop_pidfile "$NODE_DIR/containerd.pid" 20
  # A shim whose task containerd never deleted outlives containerd; this world's shims are the
  # ones started with its socket.
  for pid in $(node_shim_pids); do kill -TERM "$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + 10))
  while [ -n "$(node_shim_pids)" ] && ((SECONDS < deadline)); do sleep 0.2; done
  for pid in $(node_shim_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  node_task_leftovers
  # Mounts (overlay roots, volumes, network namespaces, the shared bind mount), deepest first;
  # a network namespace with no process and no mount goes away with its veth.
  local m
  awk -v d="$NODE_DIR/" 'index($5, d) == 1 || $5 == substr(d, 1, length(d) - 1) {print $5}' /proc/self/mountinfo |
    sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  node_network_down
  cgroup_remove_empty "$NODE_CGROUP_ROOT"
}

# A crash of the node, as a power cut does it: the network first (node_network_cut), then
# SIGKILL for kubelet, containerd, the shims and every process of every container at once.
# Nothing shuts down gracefully and nothing tells the apiserver: the Node object stays as it
# was, and kube-controller-manager finds out by itself when kubelet's updates stop. node_stop
# removes what is left afterwards (mounts, network, cgroups), and node_start starts it again.
node_kill() {
  [ -f "$NODE_DIR/network" ] || die "node $NODE_NAME is not running"
  NODE_CGROUP_ROOT="$(node_cgroup_root)"
  node_network_cut
  local pids=() f pid deadline
  for f in kubelet containerd; do
    if pid_alive "$NODE_DIR/$f.pid"; then pids+=("$(cat "$NODE_DIR/$f.pid")"); fi
  done
  # shellcheck disable=SC2207 # pids: one word each
  pids+=($(node_shim_pids) $(node_pod_pids))
  [ "${#pids[@]}" -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null || true
  # A container process may have forked between the listing and the kill.
  deadline=$((SECONDS + 20))
  while [ -n "$(node_pod_pids)" ] && ((SECONDS < deadline)); do
    for pid in $(node_pod_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.1
  done
  # The pid files go once their processes are gone, so a later stop never signals a reused pid.
  for f in kubelet containerd; do
    [ -f "$NODE_DIR/$f.pid" ] || continue
    pid="$(cat "$NODE_DIR/$f.pid")"
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    rm -f "$NODE_DIR/$f.pid"
  done
  log "node $NODE_NAME killed (network cut, ${#pids[@]} processes; its stop cleans up)"
}

# The second node's stop also takes it out of the cluster: its Node object is deleted (as a
# cloud's node controller does for a machine that is gone), so pods bound to it are removed by
# kube-controller-manager and the scheduler never looks at it again. The first node's stays:
# `node restart` keeps its pods.
node2_stop() {
  [ -d "$NODE_DIR" ] || return 0
  node_stop
  if apiserver_ready >/dev/null 2>&1; then
    k8s_kubectl delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null ||
      log "deleting the Node $NODE_NAME failed; it stays NotReady"
  fi
}

node_status() {
  if pid_alive "$NODE_DIR/kubelet.pid"; then
    echo "node $NODE_NAME: kubelet running (log $NODE_DIR/kubelet.log, containers' logs under $NODE_DIR/pod-logs)"
  elif [ -f "$NODE_DIR/network" ]; then
    echo "node $NODE_NAME: killed or crashed (its Node object left as it was; stop cleans up)"
  else
    echo "node $NODE_NAME: stopped"
  fi
}
