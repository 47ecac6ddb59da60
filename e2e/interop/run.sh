#!/usr/bin/env bash
# MirrorMaker 2's and Kafka's own Java code reading what a replicator wrote (interop tests).
# The Java programs here are compiled against the world's Kafka jars on first use and cached
# under $MF_CACHE, keyed by Kafka version and source hash.
#
#   e2e/interop/run.sh translate BOOTSTRAP REMOTE_ALIAS GROUP... [--prop KEY=VALUE]...
#       RemoteClusterUtils.translateOffsets for each group, as JSON (see TranslateOffsets.java)
#   e2e/interop/run.sh format checkpoint|heartbeat|offset-sync BOOTSTRAP TOPIC [COUNT]
#       partition 0 of TOPIC from the beginning through Kafka's console consumer with
#       MirrorMaker's formatter, one record a line; ends after COUNT records, or without COUNT
#       after INTEROP_IDLE_MS (default 5000) without a new record
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/common.sh
source "$HERE/../lib/common.sh"
# shellcheck source=../lib/kafka.sh
source "$HERE/../lib/kafka.sh"

[ -d "$KAFKA_HOME/lib" ] || die "Kafka is not in the cache ($KAFKA_HOME); run e2e/world.sh setup"

interop_java() {
  java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" "$@"
}

classes() {
  # Compiled once per Kafka version and source; a concurrent first use compiles twice and
  # keeps one (the rename is atomic).
  local sum dir tmp
  sum="$(cat "$HERE"/*.java | sha256sum | cut -c1-12)"
  dir="$MF_CACHE/interop-$KAFKA_VERSION-$sum"
  if [ ! -d "$dir" ]; then
    need javac "install a Java 17+ JDK"
    mkdir -p "$MF_CACHE"
    tmp="$(mktemp -d "$MF_CACHE/interop-tmp.XXXXXX")"
    javac -nowarn -d "$tmp" -cp "$KAFKA_HOME/lib/*" "$HERE"/*.java || { rm -rf "$tmp"; die "javac failed"; }
    mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
  fi
  echo "$dir"
}

case "${1:-}" in
  translate)
    shift
    [ "$#" -ge 3 ] || die "usage: run.sh translate BOOTSTRAP REMOTE_ALIAS GROUP... [--prop KEY=VALUE]..."
    interop_java -cp "$(classes):$KAFKA_HOME/lib/*" TranslateOffsets "$@"
    ;;
  format)
    [ "$#" -eq 4 ] || [ "$#" -eq 5 ] || die "usage: run.sh format checkpoint|heartbeat|offset-sync BOOTSTRAP TOPIC [COUNT]"
    case "$2" in
      checkpoint) formatter=CheckpointFormatter ;;
      heartbeat) formatter=HeartbeatFormatter ;;
      offset-sync) formatter=OffsetSyncFormatter ;;
      *) die "unknown record kind '$2' (checkpoint, heartbeat or offset-sync)" ;;
    esac
    # With a count, a slow start (a loaded machine) cannot end the read early.
    if [ -n "${5:-}" ]; then
      [ "$5" -gt 0 ] || exit 0
      limit=(--max-messages "$5" --timeout-ms 60000)
    else
      limit=(--timeout-ms "${INTEROP_IDLE_MS:-5000}")
    fi
    interop_java -cp "$KAFKA_HOME/lib/*" org.apache.kafka.tools.consumer.ConsoleConsumer \
      --bootstrap-server "$3" --topic "$4" --partition 0 --offset earliest \
      --formatter "org.apache.kafka.connect.mirror.formatters.$formatter" "${limit[@]}"
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
