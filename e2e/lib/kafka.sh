# Single-node KRaft Kafka clusters on loopback. Sourced by world.sh after common.sh and build.sh.
# A cluster is named source, target or third; each has its own ports, data dir and cluster id.

kafka_port() {
  case "$1" in
    source) echo "$KAFKA_SOURCE_PORT" ;;
    target) echo "$KAFKA_TARGET_PORT" ;;
    third) echo "$KAFKA_THIRD_PORT" ;;
    *) die "unknown Kafka cluster '$1' (use source, target or third)" ;;
  esac
}

kafka_dir() { echo "$MF_STATE/kafka/$1"; }
kafka_pidfile() { echo "$(kafka_dir "$1")/broker.pid"; }
kafka_bootstrap() { echo "127.0.0.1:$(kafka_port "$1")"; }

kafka_java() {
  # Runs a class from the Kafka classpath (brokers, tools, MirrorMaker 2).
  java -Xmx512m -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" "$@"
}

kafka_write_config() {
  local name="$1" port dir
  port="$(kafka_port "$name")"
  dir="$(kafka_dir "$name")"
  mkdir -p "$dir"
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$((port + 1))
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$((port + 1))
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
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
# Replication tests must see exactly the topics that were created on purpose.
auto.create.topics.enable=false
EOF
}

kafka_serves() {
  # True once the broker answers a metadata request (not merely accepts TCP).
  timeout 30 java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$(kafka_bootstrap "$1")" --list >/dev/null 2>&1
}

kafka_start() {
  local name="$1" dir pidfile port
  dir="$(kafka_dir "$name")"
  pidfile="$(kafka_pidfile "$name")"
  port="$(kafka_port "$name")"
  if pid_alive "$pidfile"; then
    log "kafka $name already running on 127.0.0.1:$port"
    return 0
  fi
  require_port_free "$port" "Kafka $name broker" "KAFKA_${name^^}_PORT"
  require_port_free "$((port + 1))" "Kafka $name controller" "KAFKA_${name^^}_PORT"
  if [ ! -f "$dir/data/meta.properties" ]; then
    kafka_write_config "$name"
    local id
    id="$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
    kafka_java kafka.tools.StorageTool format --standalone -t "$id" -c "$dir/server.properties" \
      >"$dir/format.log" 2>&1 || die "formatting Kafka $name failed: $(tail -n 5 "$dir/format.log")"
  fi
  log "starting kafka $name on 127.0.0.1:$port"
  nohup java -Xmx512m -Xms256m -XX:+UseG1GC -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" \
    -cp "$KAFKA_HOME/lib/*" kafka.Kafka "$dir/server.properties" >>"$dir/broker.log" 2>&1 &
  echo $! >"$pidfile"
  if ! wait_until 90 "kafka $name to serve requests" kafka_serves "$name"; then
    tail -n 20 "$dir/broker.log" >&2
    die "kafka $name did not come up (log: $dir/broker.log)"
  fi
  log "kafka $name serves on 127.0.0.1:$port"
}

kafka_stop() {
  local name="$1"
  pid_alive "$(kafka_pidfile "$name")" && log "stopping kafka $name"
  stop_pidfile "$(kafka_pidfile "$name")" 60
}

kafka_restart() {
  kafka_stop "$1"
  kafka_start "$1"
}
