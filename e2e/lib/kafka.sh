# Single-node KRaft Kafka clusters on loopback. Sourced by world.sh after common.sh and build.sh.
# A cluster is named source, target or third; each has its own ports, data dir and cluster id.
# Ports: PORT plaintext clients, PORT+1 controller, PORT+2 SASL_SSL clients (SCRAM-SHA-512 over
# TLS with the world's own certificate; user and password in kafka_secure_env), PORT+3 mTLS
# clients (SSL with a client certificate the world's client CA signed, required), PORT+4
# OAUTHBEARER clients (SASL_PLAINTEXT; JWTs from the world's token endpoint, lib/oidc.sh,
# validated against its JWKS; a connection re-authenticates when its token expires).
#
# KAFKA_NODES=3 (default 1, the world's) makes every cluster started from then on 3 combined
# broker+controller nodes with a static 3-voter quorum (bench/run.sh --brokers3): node K has the
# same listeners 10*(K-1) ports higher and its own data dir (kafka_node_dir), topics get
# replication factor 3 and min.insync.replicas 2 by default, internal topics too.
# kafka_start/kafka_stop NAME K start or stop node K alone (a leader change on purpose).

# The OAUTHBEARER listener needs the token endpoint; whoever starts brokers gets it too.
# shellcheck source=oidc.sh
source "$(dirname "${BASH_SOURCE[0]}")/oidc.sh"

kafka_port() {
  case "$1" in
    source) echo "$KAFKA_SOURCE_PORT" ;;
    target) echo "$KAFKA_TARGET_PORT" ;;
    third) echo "$KAFKA_THIRD_PORT" ;;
    *) die "unknown Kafka cluster '$1' (use source, target or third)" ;;
  esac
}

kafka_dir() { echo "$MF_STATE/kafka/$1"; }
kafka_nodes() { echo "${KAFKA_NODES:-1}"; }
# Node K of a cluster: node 1 is the single node of a one-node cluster (same dir and ports).
kafka_node_port() { echo $(($(kafka_port "$1") + 10 * (${2:-1} - 1))); }
kafka_node_dir() { if [ "${2:-1}" = 1 ]; then kafka_dir "$1"; else echo "$MF_STATE/kafka/$1.$2"; fi; }
kafka_secure_bootstrap() { echo "127.0.0.1:$(($(kafka_port "$1") + 2))"; }
kafka_mtls_bootstrap() { echo "127.0.0.1:$(($(kafka_port "$1") + 3))"; }
kafka_oauth_bootstrap() { echo "127.0.0.1:$(($(kafka_port "$1") + 4))"; }
kafka_tls_dir() { echo "$MF_STATE/kafka/tls"; }

kafka_tls_material() {
  # One self-signed certificate for 127.0.0.1, shared by every cluster of this world: the
  # PKCS#12 keystore for brokers, its certificate as the CA PEM for clients, and the SCRAM
  # password. Made once per world (MF_STATE), never in the repository.
  local tls
  tls="$(kafka_tls_dir)"
  [ -f "$tls/broker.p12" ] && return 0
  mkdir -p "$tls"
  # Brokers of one world may start at once: one makes the material, the others wait for it.
  exec 9>"$tls/.lock"
  flock 9
  if [ -f "$tls/broker.p12" ]; then
    flock -u 9
    return 0
  fi
  need keytool "Java 17 (keytool)"
  local pass
  pass="$(openssl rand -hex 12)"
  keytool -genkeypair -alias broker -keyalg RSA -keysize 2048 -validity 3650 \
    -dname "CN=127.0.0.1,O=mirrorflow-world" -ext "SAN=IP:127.0.0.1" \
    -keystore "$tls/broker.p12.tmp" -storetype PKCS12 -storepass "$pass" >/dev/null 2>&1 ||
    die "keytool could not make the brokers' TLS keystore"
  keytool -exportcert -rfc -alias broker -keystore "$tls/broker.p12.tmp" -storepass "$pass" \
    >"$tls/ca.pem" 2>/dev/null || die "keytool could not export the brokers' certificate"
  printf '%s' "$pass" >"$tls/keystore-password"
  openssl rand -hex 16 | tr -d '\n' >"$tls/scram-password"
  chmod 600 "$tls/keystore-password" "$tls/scram-password"
  mv "$tls/broker.p12.tmp" "$tls/broker.p12"
  flock -u 9
}

kafka_client_tls_material() {
  # The clients CA the mTLS listener trusts, and one client certificate it signed, as PEM
  # (cert + key: Strimzi's user.crt / user.key) and as PKCS#12 with a password (user.p12 /
  # user.password). Made once per world; separate from the brokers' material so a world made
  # by an older checkout gets it too.
  local tls
  tls="$(kafka_tls_dir)"
  [ -f "$tls/client.p12" ] && return 0
  mkdir -p "$tls"
  exec 8>"$tls/.client-lock"
  flock 8
  if [ ! -f "$tls/client.p12" ]; then
    need openssl "openssl"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=mirrorflow-world-clients-ca"       -keyout "$tls/client-ca.key" -out "$tls/client-ca.pem" >/dev/null 2>&1 ||
      die "openssl could not make the clients CA"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=mirrorflow-flow"       -keyout "$tls/client.key" -out "$tls/client.csr" >/dev/null 2>&1 ||
      die "openssl could not make the client key"
    openssl x509 -req -in "$tls/client.csr" -CA "$tls/client-ca.pem" -CAkey "$tls/client-ca.key"       -CAcreateserial -days 3650 -out "$tls/client.pem" >/dev/null 2>&1 ||
      die "openssl could not sign the client certificate"
    openssl rand -hex 12 | tr -d '\n' >"$tls/client-p12-password"
    openssl pkcs12 -export -in "$tls/client.pem" -inkey "$tls/client.key" -name mirrorflow-flow \
      -passout "file:$tls/client-p12-password" -out "$tls/client.p12.tmp" >/dev/null 2>&1 ||
      die "openssl could not make the client PKCS#12 keystore"
    chmod 600 "$tls/client.key" "$tls/client-ca.key" "$tls/client-p12-password"
    mv "$tls/client.p12.tmp" "$tls/client.p12"
  fi
  flock -u 8
}

kafka_add_scram_user() {
  # SCRAM credentials live in the cluster metadata: added once per data dir through the
  # plaintext listener (its principal, ANONYMOUS, is a super user). `mirrorflow` is the flows'
  # user (a super user); `reader` is an ordinary consumer that only ACLs let read a topic
  # someone put ACLs on (the topic ACL sync test), with the same password.
  local name="$1" dir user
  dir="$(kafka_dir "$name")"
  for user in mirrorflow reader; do
    [ -f "$dir/scram-$user.done" ] && continue
    [ "$user" = mirrorflow ] && [ -f "$dir/scram.done" ] && continue
    kafka_java kafka.admin.ConfigCommand --bootstrap-server "$(kafka_bootstrap "$name")" \
      --alter --entity-type users --entity-name "$user" \
      --add-config "SCRAM-SHA-512=[password=$(cat "$(kafka_tls_dir)/scram-password")]" \
      >"$dir/scram.log" 2>&1 || die "adding the SCRAM user $user to kafka $name failed: $(tail -n 5 "$dir/scram.log")"
    touch "$dir/scram-$user.done"
  done
}
kafka_pidfile() { echo "$(kafka_node_dir "$1" "${2:-1}")/broker.pid"; }
# Every node's plaintext listener, so a client still bootstraps while one node is down.
kafka_bootstrap() {
  local k out="127.0.0.1:$(kafka_port "$1")"
  for ((k = 2; k <= $(kafka_nodes); k++)); do out="$out,127.0.0.1:$(kafka_node_port "$1" "$k")"; done
  echo "$out"
}

kafka_java() {
  # Runs a class from the Kafka classpath (brokers, tools, MirrorMaker 2).
  java -Xmx512m -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" "$@"
}

# The internal topics and group settings of a one-node cluster (later keys win: three nodes
# raise them below), shared with the bench's WAN source.
kafka_small_cluster_settings() {
  cat <<EOF
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
EOF
}

kafka_write_config() {
  local name="$1" node="${2:-1}" port dir quorum k
  port="$(kafka_node_port "$name" "$node")"
  dir="$(kafka_node_dir "$name" "$node")"
  mkdir -p "$dir"
  quorum="controller.quorum.bootstrap.servers=127.0.0.1:$((port + 1))"
  if [ "$(kafka_nodes)" -gt 1 ]; then
    quorum="controller.quorum.voters="
    for ((k = 1; k <= $(kafka_nodes); k++)); do
      quorum="$quorum$k@127.0.0.1:$(($(kafka_node_port "$name" "$k") + 1)),"
    done
    quorum="${quorum%,}"
  fi
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=$node
$quorum
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$((port + 1)),SECURE://127.0.0.1:$((port + 2)),MTLS://127.0.0.1:$((port + 3)),OAUTH://127.0.0.1:$((port + 4))
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SECURE://127.0.0.1:$((port + 2)),MTLS://127.0.0.1:$((port + 3)),OAUTH://127.0.0.1:$((port + 4))
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SECURE:SASL_SSL,MTLS:SSL,OAUTH:SASL_PLAINTEXT
listener.name.mtls.ssl.client.auth=required
listener.name.mtls.ssl.keystore.type=PKCS12
listener.name.mtls.ssl.keystore.location=$(kafka_tls_dir)/broker.p12
listener.name.mtls.ssl.keystore.password=$(cat "$(kafka_tls_dir)/keystore-password")
listener.name.mtls.ssl.truststore.type=PEM
listener.name.mtls.ssl.truststore.location=$(kafka_tls_dir)/client-ca.pem
listener.name.secure.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.secure.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.secure.ssl.keystore.type=PKCS12
listener.name.secure.ssl.keystore.location=$(kafka_tls_dir)/broker.p12
listener.name.secure.ssl.keystore.password=$(cat "$(kafka_tls_dir)/keystore-password")
listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER
listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;
listener.name.oauth.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler
# Any positive value ties a session to its token's expiry: clients must re-authenticate with a
# fresh token (KIP-368), which is what shows that they fetch one.
listener.name.oauth.oauthbearer.connections.max.reauth.ms=3600000
sasl.oauthbearer.jwks.endpoint.url=$(oidc_jwks_url)
sasl.oauthbearer.expected.audience=$OIDC_AUDIENCE
sasl.oauthbearer.expected.issuer=$(oidc_url)
log.dirs=$dir/data
$(kafka_small_cluster_settings)
# Replication tests must see exactly the topics that were created on purpose.
auto.create.topics.enable=false
# An authorizer, so topic ACL sync has ACLs to copy and to enforce. A resource without ACLs
# stays open to everyone. Any ACL on a resource (ALLOW or DENY, for anyone) closes it to every
# principal it does not allow, so the principals the world's brokers and flows use are super
# users and an ACL a test puts on its own topic restricts only ordinary ones (reader, OAuth
# clients a test adds). ANONYMOUS: PLAINTEXT and CONTROLLER listeners; mirrorflow: the SCRAM
# user and the OAuth client's token subject; CN=mirrorflow-flow: the mTLS client certificate.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=true
super.users=User:ANONYMOUS;User:mirrorflow;User:CN=mirrorflow-flow
EOF
  [ "$(kafka_nodes)" -gt 1 ] || return 0
  # Later keys win: every topic on 3 nodes, writes acknowledged by 2 of them, so one node can
  # be stopped without stopping writes (the way clusters are run in production).
  cat >>"$dir/server.properties" <<EOF
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
EOF
}

kafka_serves() {
  # True once the broker (node K alone, when given) answers a metadata request (not merely
  # accepts TCP).
  local bootstrap
  bootstrap="$(kafka_bootstrap "$1")"
  if [ -n "${2:-}" ]; then
    bootstrap="127.0.0.1:$(kafka_node_port "$1" "$2")"
    # Several nodes starting on two cores: a probe JVM every half second per node while its
    # port is still closed would slow them all down.
    [ "$(kafka_nodes)" -gt 1 ] && port_free "$(kafka_node_port "$1" "$2")" && return 1
  fi
  timeout 30 java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --list >/dev/null 2>&1
}

# "kafka source", or "kafka source node 2" in a cluster of several nodes.
kafka_what() { if [ "$(kafka_nodes)" -gt 1 ]; then echo "kafka $1 node ${2:-1}"; else echo "kafka $1"; fi; }

# kafka_start NAME [K]: every node of cluster NAME (or node K alone), waiting until each serves.
# The nodes of a new cluster start together: none serves before a quorum of them runs.
kafka_start() {
  local name="$1" nodes=() todo=() k dir port
  if [ -n "${2:-}" ]; then nodes=("$2"); else mapfile -t nodes < <(seq 1 "$(kafka_nodes)"); fi
  for k in "${nodes[@]}"; do
    if pid_alive "$(kafka_pidfile "$name" "$k")"; then
      log "$(kafka_what "$name" "$k") already running on 127.0.0.1:$(kafka_node_port "$name" "$k")"
    else
      todo+=("$k")
    fi
  done
  if [ "${#todo[@]}" = 0 ]; then
    kafka_add_scram_user "$name"
    return 0
  fi
  for k in "${todo[@]}"; do
    port="$(kafka_node_port "$name" "$k")"
    require_port_free "$port" "Kafka $name broker" "KAFKA_${name^^}_PORT"
    require_port_free "$((port + 1))" "Kafka $name controller" "KAFKA_${name^^}_PORT"
    require_port_free "$((port + 2))" "Kafka $name SASL_SSL listener" "KAFKA_${name^^}_PORT"
    require_port_free "$((port + 3))" "Kafka $name mTLS listener" "KAFKA_${name^^}_PORT"
    require_port_free "$((port + 4))" "Kafka $name OAUTHBEARER listener" "KAFKA_${name^^}_PORT"
  done
  # The OAUTHBEARER listener reads the token endpoint's JWKS.
  oidc_start
  kafka_tls_material
  kafka_client_tls_material
  # Written on every start, so a world made by an older checkout gets today's listeners.
  for k in "${todo[@]}"; do kafka_write_config "$name" "$k"; done
  if [ "$(kafka_nodes)" -gt 1 ] && [ ! -s "$(kafka_dir "$name")/cluster.id" ]; then
    # One cluster id for all nodes; the voters are in the config (a static quorum).
    kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1 >"$(kafka_dir "$name")/cluster.id"
  fi
  # Formatting is a JVM per node: they run side by side.
  local pids=() pid
  for k in "${todo[@]}"; do
    dir="$(kafka_node_dir "$name" "$k")"
    [ -f "$dir/data/meta.properties" ] && continue
    if [ "$(kafka_nodes)" = 1 ]; then
      local id
      id="$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
      kafka_java kafka.tools.StorageTool format --standalone -t "$id" -c "$dir/server.properties" \
        >"$dir/format.log" 2>&1 || die "formatting Kafka $name failed: $(tail -n 5 "$dir/format.log")"
    else
      (kafka_java kafka.tools.StorageTool format -t "$(cat "$(kafka_dir "$name")/cluster.id")" \
        -c "$dir/server.properties" >"$dir/format.log" 2>&1 ||
        die "formatting $(kafka_what "$name" "$k") failed: $(tail -n 5 "$dir/format.log")") &
      pids+=($!)
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || die "formatting Kafka $name failed"; done
  for k in "${todo[@]}"; do
    dir="$(kafka_node_dir "$name" "$k")"
    log "starting $(kafka_what "$name" "$k") on 127.0.0.1:$(kafka_node_port "$name" "$k")"
    # Kafka 4 reads OAuth URLs only from an allow-list given as a system property.
    nohup java -Xmx512m -Xms256m -XX:+UseG1GC -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" \
      -Dorg.apache.kafka.sasl.oauthbearer.allowed.urls="$(oidc_jwks_url)" \
      -cp "$KAFKA_HOME/lib/*" kafka.Kafka "$dir/server.properties" >>"$dir/broker.log" 2>&1 &
    echo $! >"$(kafka_pidfile "$name" "$k")"
  done
  for k in "${todo[@]}"; do
    dir="$(kafka_node_dir "$name" "$k")"
    # 180 s: on two cores with three world tests at once, a restarted broker has been seen to
    # take 48 s before its controller activated and each probe's JVM tens of seconds more.
    if ! wait_until 180 "$(kafka_what "$name" "$k") to serve requests" kafka_serves "$name" "$k"; then
      tail -n 20 "$dir/broker.log" >&2
      die "$(kafka_what "$name" "$k") did not come up (log: $dir/broker.log)"
    fi
  done
  kafka_add_scram_user "$name"
  if [ "$(kafka_nodes)" = 1 ]; then
    log "kafka $name serves on 127.0.0.1:$(kafka_port "$name") (SASL_SSL on $(kafka_secure_bootstrap "$name"), mTLS on $(kafka_mtls_bootstrap "$name"), OAUTHBEARER on $(kafka_oauth_bootstrap "$name"))"
  else
    for k in "${todo[@]}"; do log "$(kafka_what "$name" "$k") serves on 127.0.0.1:$(kafka_node_port "$name" "$k")"; done
  fi
}

# kafka_stop NAME [K]: every node of cluster NAME that runs (or node K alone). Nodes stop
# together: one after the other, the last ones would wait for a controller quorum already gone.
kafka_stop() {
  local name="$1" f pids=()
  if [ -n "${2:-}" ]; then
    pid_alive "$(kafka_pidfile "$name" "$2")" && log "stopping $(kafka_what "$name" "$2")"
    stop_pidfile "$(kafka_pidfile "$name" "$2")" 60
    return 0
  fi
  pid_alive "$(kafka_pidfile "$name")" && log "stopping kafka $name"
  for f in "$MF_STATE/kafka/$name".[0-9]*/broker.pid; do
    [ -f "$f" ] || continue
    stop_pidfile "$f" 60 &
    pids+=($!)
  done
  stop_pidfile "$(kafka_pidfile "$name")" 60
  [ "${#pids[@]}" = 0 ] || wait "${pids[@]}"
}

kafka_restart() {
  kafka_stop "$1"
  kafka_start "$1"
}
