#!/usr/bin/env bash
# The main job: the local world with the operator installed by its Helm chart and a sample flow
# replicating live data, left running for you to look at.
#
# Steps: world up (builds the image, pushes it and the chart to the world's registry) -> helm
# install the chart from that registry with the world's values
# (the operator runs as a container on the world's node) ->
# create the sample topics and a live producer + consumer groups on the source -> apply the
# sample MirrorFlow -> wait until it is FailoverReady -> print `kubectl get mf`.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
# shellcheck source=lib/common.sh
source "$HERE/lib/common.sh"
# shellcheck source=lib/kafka.sh
source "$HERE/lib/kafka.sh"

"$HERE/world.sh" up
eval "$("$HERE/world.sh" env)"

# The demo operator watches only the sample's namespace, so the tests' own operators (each
# watching its test namespace) can run in the same world without two operators on one flow.
# As a user installs a release: the chart from the (world's) OCI registry, the image it names
# pulled from there by digest.
log "installing the operator from oci://$MF_REGISTRY/charts/mirrorflow"
kubectl create namespace demo --dry-run=client -o yaml | kubectl apply -f - >/dev/null
helm upgrade --install mirrorflow "oci://$MF_REGISTRY/charts/mirrorflow" --version "$("$ROOT/release/version.sh")" \
  --plain-http --namespace mirrorflow-system --create-namespace \
  -f "$MF_CHART_VALUES" --set watchNamespace=demo --wait --timeout 180s

log "creating the sample topics and starting a live producer on the source"
for t in orders payments; do
  kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$MF_SOURCE_BOOTSTRAP" \
    --create --if-not-exists --topic "$t" --partitions 3 >/dev/null 2>&1 || true
done
mkdir -p "$MF_STATE/demo"
for t in orders payments; do
  if ! pid_alive "$MF_STATE/demo/producer-$t.pid"; then
    nohup java -Xmx128m -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
      org.apache.kafka.tools.ProducerPerformance --topic "$t" --num-records 100000000 --record-size 200 \
      --throughput 20 --producer-props bootstrap.servers="$MF_SOURCE_BOOTSTRAP" acks=all \
      >"$MF_STATE/demo/producer-$t.log" 2>&1 &
    echo $! >"$MF_STATE/demo/producer-$t.pid"
  fi
done
for g in billing shipping; do
  if ! pid_alive "$MF_STATE/demo/consumer-$g.pid"; then
    nohup java -Xmx128m -Dlog4j2.configurationFile="$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/lib/*" \
      org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$MF_SOURCE_BOOTSTRAP" \
      --include 'orders|payments' --group "$g" >/dev/null 2>"$MF_STATE/demo/consumer-$g.log" &
    echo $! >"$MF_STATE/demo/consumer-$g.pid"
  fi
done

log "applying the sample MirrorFlow"
# The sample names the default ports; a world on other ports gets its own addresses.
sed -e "s/127.0.0.1:19092/$MF_SOURCE_BOOTSTRAP/" -e "s/127.0.0.1:29092/$MF_TARGET_BOOTSTRAP/" \
  "$HERE/samples/demo-flow.yaml" | kubectl apply -f -
log "waiting for FailoverReady with both sample groups checkpointed"
groups_seen() { [ "$(kubectl get mf demo -n demo -o jsonpath='{.status.groups}' 2>/dev/null)" = 2 ]; }
wait_until 240 "the sample groups to appear in the status" groups_seen || true
if ! kubectl wait --for=condition=FailoverReady mf/demo -n demo --timeout=240s; then
  kubectl describe mf demo -n demo
  die "the sample flow did not become FailoverReady"
fi
kubectl get mf -n demo
kubectl get mf demo -n demo -o jsonpath='{.status}' | python3 -m json.tool
log "the world is up with the operator and the sample flow; stop it with: e2e/world.sh down"
