# Real MirrorMaker 2 (dedicated mode, `connect-mirror-maker`) processes from the world's Kafka
# classpath, for interoperability tests and comparisons. Sourced after common.sh and kafka.sh.
#
#   mm2_start NAME SRC_ALIAS SRC_BOOTSTRAP TGT_ALIAS TGT_BOOTSTRAP [KEY=VALUE ...]
#       writes $MF_STATE/mm2/NAME/mm2.properties, starts MirrorMaker and waits until its source
#       task replicates at least one topic-partition (so create the topics first). KEY=VALUE lines
#       are appended to the generated properties and override its defaults; unprefixed keys apply
#       to the SRC->TGT flow, e.g. topics=orders.* groups=app-.* sync.group.offsets.enabled=true
#       replication.policy.separator=_ . Env: MM2_START_TIMEOUT (s, default 180), MM2_WAIT=none
#       to return as soon as the process runs.
#   mm2_stop NAME          SIGTERM, SIGKILL after 30 s; keeps the log and properties
#   mm2_log NAME           path of its log (MirrorMaker's own loggers at info)
#   mm2_running NAME       exit 0 while it runs
#   mm2_wait_log NAME SECONDS EXTENDED-REGEX   waits until the log has a matching line
#
# Only SRC->TGT is enabled. Dedicated mode would also run a heartbeat emitter for TGT->SRC,
# writing into the source's `heartbeats` topic: switched off so that a run leaves the source
# cluster as it found it apart from MirrorMaker's offset-syncs topic.

mm2_dir() { echo "${MM2_STATE:-$MF_STATE/mm2}/$1"; }
mm2_log() { echo "$(mm2_dir "$1")/mm2.log"; }
mm2_running() { pid_alive "$(mm2_dir "$1")/mm2.pid"; }

mm2_write_config() {
  local dir="$1" src="$2" src_bs="$3" tgt="$4" tgt_bs="$5"
  shift 5
  cat >"$dir/mm2.properties" <<EOF
clusters = $src, $tgt
$src.bootstrap.servers = $src_bs
$tgt.bootstrap.servers = $tgt_bs
$src->$tgt.enabled = true
$tgt->$src.enabled = false
$tgt->$src.emit.heartbeats.enabled = false
# Single-broker clusters.
replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
config.storage.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
# Test pace instead of production defaults (600 s refreshes, 60 s checkpoints).
refresh.topics.interval.seconds = 5
refresh.groups.interval.seconds = 5
emit.checkpoints.interval.seconds = 1
emit.heartbeats.interval.seconds = 1
sync.group.offsets.interval.seconds = 1
# Worker settings are taken from the target cluster's properties: unprefixed, this one would
# be ignored and the source connector's progress flushed once a minute.
$tgt.offset.flush.interval.ms = 1000
EOF
  local kv
  for kv in "$@"; do
    case "$kv" in
      *=*) printf '%s\n' "$kv" >>"$dir/mm2.properties" ;;
      *) die "mm2_start: '$kv' is not KEY=VALUE" ;;
    esac
  done
  # MirrorMaker's own progress at info (the start-up wait reads it), the rest of Connect quiet.
  cat >"$dir/log4j2.properties" <<EOF
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
logger.mirror.name = org.apache.kafka.connect.mirror
logger.mirror.level = info
EOF
}

mm2_wait_log() {
  local name="$1" seconds="$2" regex="$3"
  wait_until "$seconds" "MirrorMaker $name: /$regex/ in its log" grep -Eq -- "$regex" "$(mm2_log "$name")"
}

mm2_start() {
  [ "$#" -ge 5 ] || die "usage: mm2_start NAME SRC_ALIAS SRC_BOOTSTRAP TGT_ALIAS TGT_BOOTSTRAP [KEY=VALUE ...]"
  local name="$1" dir
  dir="$(mm2_dir "$name")"
  if mm2_running "$name"; then
    log "MirrorMaker $name already running"
    return 0
  fi
  [ -d "$KAFKA_HOME/lib" ] || die "Kafka is not in the cache ($KAFKA_HOME); run e2e/world.sh setup"
  mkdir -p "$dir"
  shift
  mm2_write_config "$dir" "$@"
  log "starting MirrorMaker $name ($1 -> $3)"
  nohup java -Xmx384m -XX:+UseSerialGC -Dlog4j2.configurationFile="$dir/log4j2.properties" \
    -cp "$KAFKA_HOME/lib/*" org.apache.kafka.connect.mirror.MirrorMaker "$dir/mm2.properties" \
    >>"$dir/mm2.log" 2>&1 &
  echo $! >"$dir/mm2.pid"
  [ "${MM2_WAIT:-}" = none ] && return 0
  # The source task logs its assignment once the connector found topic-partitions to copy.
  if ! mm2_wait_log "$name" "${MM2_START_TIMEOUT:-180}" 'replicating [1-9][0-9]* topic-partitions'; then
    tail -n 30 "$dir/mm2.log" >&2
    mm2_stop "$name"
    die "MirrorMaker $name did not start replicating (log: $dir/mm2.log)"
  fi
  mm2_running "$name" || die "MirrorMaker $name exited (log: $dir/mm2.log)"
  log "MirrorMaker $name replicates"
}

mm2_stop() {
  local name="$1"
  mm2_running "$name" && log "stopping MirrorMaker $name"
  stop_pidfile "$(mm2_dir "$name")/mm2.pid" 30
}
