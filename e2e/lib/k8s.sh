# A Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler, with certificates made here. Sourced by world.sh; the node is lib/node.sh.

k8s_dir() { echo "$MF_STATE/k8s"; }
KUBECONFIG_PATH() { echo "$(k8s_dir)/admin.kubeconfig"; }

k8s_kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$(KUBECONFIG_PATH)" "$@"; }

# Certificates: one CA signs the serving cert, the client certs and (as the cluster signer) CSRs.
k8s_certs() {
  local d
  d="$(k8s_dir)/pki"
  [ -f "$d/.done" ] && return 0
  need openssl "install openssl (apt-get install openssl)"
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 365 \
      -subj "/CN=mirrorflow-world-ca" 2>/dev/null
    cat >serving.ext <<EOF
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EOF
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
      -extfile serving.ext -out apiserver.crt 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    # The apiserver's client certificate for kubelet's API (logs, exec, port-forward).
    for who in "admin:system:masters" "kube-controller-manager:" "kube-scheduler:" \
      "apiserver-kubelet-client:system:masters"; do
      local cn="${who%%:*}" org="${who#*:}" subj
      subj="/CN=$cn"
      case "$cn" in kube-controller-manager | kube-scheduler) subj="/CN=system:$cn" ;; esac
      [ -n "$org" ] && subj="/O=$org$subj"
      openssl req -newkey rsa:2048 -nodes -keyout "$cn.key" -out "$cn.csr" -subj "$subj" 2>/dev/null
      openssl x509 -req -in "$cn.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
        -extfile client.ext -out "$cn.crt" 2>/dev/null
    done
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  ) || die "making the control plane's certificates failed"
  touch "$d/.done"
}

k8s_kubeconfig() {
  # k8s_kubeconfig USER FILE: a kubeconfig with everything embedded, readable by kubectl and kube-rs.
  local pki user="$1" out="$2"
  pki="$(k8s_dir)/pki"
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: world
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$pki/$user.crt")
    client-key-data: $(base64 -w0 "$pki/$user.key")
contexts:
- name: world
  context:
    cluster: world
    user: $user
    namespace: default
current-context: world
EOF
}

etcd_healthy() { (exec 3<>"/dev/tcp/127.0.0.1/$ETCD_PORT") 2>/dev/null && "$ETCD_BIN/etcd" --version >/dev/null; }
apiserver_ready() { k8s_kubectl get --raw /readyz; }

k8s_start() {
  local d
  d="$(k8s_dir)"
  mkdir -p "$d"
  k8s_certs
  k8s_kubeconfig admin "$d/admin.kubeconfig"
  k8s_kubeconfig kube-controller-manager "$d/kcm.kubeconfig"
  k8s_kubeconfig kube-scheduler "$d/scheduler.kubeconfig"

  if ! pid_alive "$d/etcd.pid"; then
    require_port_free "$ETCD_PORT" etcd ETCD_PORT
    require_port_free "$ETCD_PEER_PORT" "etcd peer" ETCD_PEER_PORT
    log "starting etcd $ETCD_VERSION on 127.0.0.1:$ETCD_PORT"
    nohup "$ETCD_BIN/etcd" --name world --data-dir "$d/etcd" --unsafe-no-fsync \
      --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
      --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
      --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
      --initial-cluster "world=http://127.0.0.1:$ETCD_PEER_PORT" --log-level warn \
      >>"$d/etcd.log" 2>&1 &
    echo $! >"$d/etcd.pid"
    wait_until 30 etcd etcd_healthy || die "etcd did not start (log: $d/etcd.log)"
  fi

  if ! pid_alive "$d/apiserver.pid"; then
    require_port_free "$APISERVER_PORT" kube-apiserver APISERVER_PORT
    log "starting kube-apiserver $K8S_VERSION on 127.0.0.1:$APISERVER_PORT"
    local pki="$d/pki"
    nohup "$K8S_BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
      --bind-address 127.0.0.1 --secure-port "$APISERVER_PORT" --advertise-address 127.0.0.1 \
      --endpoint-reconciler-type none --cert-dir "$d/apiserver-certs" \
      --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
      --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
      --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
      --kubelet-client-key "$pki/apiserver-kubelet-client.key" --kubelet-preferred-address-types InternalIP \
      --service-account-issuer https://kubernetes.default.svc.cluster.local \
      --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
      --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true --profiling=false \
      >>"$d/apiserver.log" 2>&1 &
    echo $! >"$d/apiserver.pid"
    wait_until 120 kube-apiserver apiserver_ready || {
      tail -n 20 "$d/apiserver.log" >&2
      die "kube-apiserver did not become ready (log: $d/apiserver.log)"
    }
  fi

  if ! pid_alive "$d/kcm.pid"; then
    require_port_free "$KCM_PORT" kube-controller-manager KCM_PORT
    log "starting kube-controller-manager"
    local pki="$d/pki"
    # --node-monitor-grace-period: how long a node may stay silent before its Ready condition
    # turns Unknown and its pods are marked not ready. The default (50 s) would make the node
    # loss test (e2e/tests/tests/node_loss.rs) wait most of a minute for nothing but the
    # detection; 20 s is still two of kubelet's lease renewals (every 10 s), so a kubelet that
    # is slow for one renewal is not taken for lost. Nothing else in the world stops a kubelet
    # for that long but a `node restart`, which then shows NotReady for a moment.
    nohup "$K8S_BIN/kube-controller-manager" --kubeconfig "$d/kcm.kubeconfig" \
      --authentication-kubeconfig "$d/kcm.kubeconfig" --authorization-kubeconfig "$d/kcm.kubeconfig" \
      --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --controllers '*' --leader-elect=false \
      --use-service-account-credentials=true \
      --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
      --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
      --node-monitor-grace-period 20s --profiling=false >>"$d/kcm.log" 2>&1 &
    echo $! >"$d/kcm.pid"
    # The default ServiceAccount appears once the controllers run: pods need it to be admitted.
    wait_until 90 "kube-controller-manager (default ServiceAccount)" k8s_kubectl get serviceaccount default -n default ||
      die "kube-controller-manager did not start its controllers (log: $d/kcm.log)"
  fi
  if ! pid_alive "$d/scheduler.pid"; then
    require_port_free "$SCHEDULER_PORT" kube-scheduler SCHEDULER_PORT
    log "starting kube-scheduler"
    nohup "$SCHEDULER_BIN/kube-scheduler" --kubeconfig "$d/scheduler.kubeconfig" \
      --authentication-kubeconfig "$d/scheduler.kubeconfig" --authorization-kubeconfig "$d/scheduler.kubeconfig" \
      --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false --profiling=false \
      >>"$d/scheduler.log" 2>&1 &
    echo $! >"$d/scheduler.pid"
    wait_until 60 kube-scheduler curl -skf "https://127.0.0.1:$SCHEDULER_PORT/healthz" ||
      die "kube-scheduler did not start (log: $d/scheduler.log)"
  fi
  log "control plane ready: KUBECONFIG=$(KUBECONFIG_PATH)"
}

k8s_stop() {
  local d
  d="$(k8s_dir)"
  stop_pidfile "$d/scheduler.pid" 10
  stop_pidfile "$d/kcm.pid" 10
  stop_pidfile "$d/apiserver.pid" 20
  stop_pidfile "$d/etcd.pid" 10
}
