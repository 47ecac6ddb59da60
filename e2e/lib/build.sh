# Fetching and building the world's components into $MF_CACHE. Sourced by world.sh after common.sh.
# Each function is a no-op when its versioned cache entry is complete (marked by a `.done` file), so
# re-running set-up costs seconds.

go_env() {
  need go "install Go 1.26+ (https://go.dev/dl is not reachable here; use the machine's toolchain)"
  export GOFLAGS="-mod=mod" CGO_ENABLED=0
  # The checksum database may be unreachable; modules still come from the proxy.
  export GOSUMDB="${GOSUMDB:-off}"
}

# `go build -v` names each package as it compiles it; counted against the packages the targets
# need, that says how far a cold build is (cached packages are not named, so a warm build ends
# early). Usage: go_build_counting <go build args...> -- <targets...>
go_build_counting() {
  local args=() targets=() total
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  targets=("$@")
  total="$(go list -deps "${targets[@]}" 2>/dev/null | wc -l)"
  go build -v "${args[@]}" "${targets[@]}" 2>&1 | {
    local n=0 line
    while IFS= read -r line; do
      case "$line" in
        *" "* | "#"*) printf '%s\n' "$line" >&2 ;; # errors and notes, not package names
        *)
          n=$((n + 1))
          printf '%s of at most %s packages compiled\n' "$n" "$total" >"${MF_PROGRESS_FILE:-/dev/null}"
          ;;
      esac
    done
  }
}

# Kubernetes publishes its binaries only from a module with replace lines, so `go install` refuses
# it. A throw-away wrapper module that pins every staging module to its published twin builds them.
# Usage: go_build_k8s VERSION OUT_DIR CMD... (CMD: a folder under k8s.io/kubernetes/cmd)
go_build_k8s() {
  local version="$1" out="$2"
  shift 2
  go_env
  local minor="${version#v1.}" work="$MF_CACHE/build/k8s-$version-$1" cmds=() c
  minor="v0.$minor"
  for c in "$@"; do cmds+=("k8s.io/kubernetes/cmd/$c"); done
  rm -rf "$work" && mkdir -p "$work" "$out"
  (
    cd "$work"
    go mod init mirrorflow.local/k8s-world >/dev/null 2>&1
    local modfile
    modfile="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    [ -f "$modfile" ] || die "could not download k8s.io/kubernetes@$version's go.mod"
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$modfile" | awk '{print $1}' | while read -r m; do
      echo "replace $m => $m $minor" >>go.mod
    done
    go get -tool "${cmds[@]/%/@$version}"
    # The version the binaries report (kubelet puts it in the Node's status).
    go_build_counting -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version" \
      -o "$out/" -- "${cmds[@]}"
  ) || die "building Kubernetes $version ($*) failed"
  touch "$out/.done"
  rm -rf "$work"
}

build_k8s() {
  [ -f "$K8S_BIN/.done" ] && return 0
  go_build_k8s "$K8S_VERSION" "$K8S_BIN" kube-apiserver kube-controller-manager kubectl
}

build_scheduler() {
  [ -f "$SCHEDULER_BIN/.done" ] && return 0
  go_build_k8s "$K8S_VERSION" "$SCHEDULER_BIN" kube-scheduler
}

# The node's kubelet is older than the control plane on purpose (see e2e/README.md, "The node").
build_kubelet() {
  [ -f "$KUBELET_BIN/.done" ] && return 0
  go_build_k8s "$KUBELET_VERSION" "$KUBELET_BIN" kubelet
}

build_etcd() {
  [ -f "$ETCD_BIN/.done" ] && return 0
  go_env
  local work="$MF_CACHE/build/etcd-$ETCD_VERSION"
  rm -rf "$work" && mkdir -p "$work" "$ETCD_BIN"
  (
    cd "$work"
    go mod init mirrorflow.local/etcd-world >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go_build_counting -trimpath -ldflags "-s -w" -o "$ETCD_BIN/etcd" -- go.etcd.io/etcd/server/v3
  ) || die "building etcd $ETCD_VERSION failed"
  touch "$ETCD_BIN/.done"
  rm -rf "$work"
}

build_helm() {
  [ -f "$HELM_BIN/.done" ] && return 0
  go_env
  mkdir -p "$HELM_BIN"
  GOBIN="$HELM_BIN" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ||
    die "building Helm $HELM_VERSION failed"
  touch "$HELM_BIN/.done"
}

# promtool and the Prometheus server without its web UI's assets (the tests use the HTTP API),
# with Kubernetes service discovery only: the other discovery plugins (clouds' SDKs) would
# triple a cold build.
build_prometheus() {
  [ -f "$PROMETHEUS_BIN/.done" ] && return 0
  go_env
  mkdir -p "$PROMETHEUS_BIN"
  local cmd
  for cmd in promtool prometheus; do
    GOBIN="$PROMETHEUS_BIN" go install -trimpath -ldflags "-s -w" -tags remove_all_sd,enable_kubernetes_sd \
      "github.com/prometheus/prometheus/cmd/$cmd@$PROMETHEUS_VERSION" ||
      die "building $cmd $PROMETHEUS_VERSION failed"
  done
  touch "$PROMETHEUS_BIN/.done"
}

# actionlint checks the release workflow (.github/workflows) in CI, so it cannot rot unseen.
build_actionlint() {
  [ -x "$ACTIONLINT_BIN/actionlint" ] && return 0
  go_env
  mkdir -p "$ACTIONLINT_BIN"
  GOBIN="$ACTIONLINT_BIN" go install -trimpath -ldflags "-s -w" \
    "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" ||
    die "building actionlint $ACTIONLINT_VERSION failed"
}

# krew and validate-krew-manifest check the kubectl plugin's krew manifest the way krew's own
# index checks a plugin. kubectl finds krew as a plugin only under the name `kubectl-krew`.
build_krew() {
  [ -x "$KREW_BIN/kubectl-krew" ] && [ -x "$KREW_BIN/validate-krew-manifest" ] && return 0
  go_env
  mkdir -p "$KREW_BIN"
  GOBIN="$KREW_BIN" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/krew/cmd/krew@$KREW_VERSION" \
    "sigs.k8s.io/krew/cmd/validate-krew-manifest@$KREW_VERSION" ||
    die "building krew $KREW_VERSION failed"
  mv "$KREW_BIN/krew" "$KREW_BIN/kubectl-krew"
}

# Kafka, its tools and MirrorMaker 2 come as jars from Maven Central; one classpath holds them all so
# interop tests and benchmarks run the real MM2 beside the brokers.
fetch_kafka() {
  [ -f "$KAFKA_HOME/.done" ] && return 0
  need java "install a Java 17+ JDK (apt-get install openjdk-17-jdk-headless)"
  need mvn "install Maven (apt-get install maven)"
  mkdir -p "$KAFKA_HOME"
  sed "s/@KAFKA_VERSION@/$KAFKA_VERSION/" "$MF_ROOT/e2e/kafka/pom.xml" >"$KAFKA_HOME/pom.xml"
  (cd "$KAFKA_HOME" && mvn -B -q dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime) ||
    die "fetching Kafka $KAFKA_VERSION jars from Maven Central failed"
  cp "$MF_ROOT/e2e/kafka/log4j2.properties" "$KAFKA_HOME/log4j2.properties"
  touch "$KAFKA_HOME/.done"
}

# Kafka Streams from Maven Central and e2e/kafka/streams/PassThrough.java compiled against it.
fetch_streams_app() {
  [ -f "$STREAMS_APP/.done" ] && return 0
  need javac "install a Java 17+ JDK (apt-get install openjdk-17-jdk-headless)"
  mkdir -p "$STREAMS_APP"
  sed "s/@KAFKA_VERSION@/$KAFKA_VERSION/" "$MF_ROOT/e2e/kafka/streams/pom.xml" >"$STREAMS_APP/pom.xml"
  (cd "$STREAMS_APP" && mvn -B -q dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime) ||
    die "fetching Kafka Streams $KAFKA_VERSION from Maven Central failed"
  javac -cp "$STREAMS_APP/lib/*" -d "$STREAMS_APP/classes" "$MF_ROOT/e2e/kafka/streams/PassThrough.java" ||
    die "compiling e2e/kafka/streams/PassThrough.java failed"
  touch "$STREAMS_APP/.done"
}
