# shellcheck shell=bash
# The world's OCI registry (e2e/registry/main.go) on loopback: the build pushes the image and the
# chart there, the node's containerd pulls the image from it (lib/node.sh names it as a plain-http
# registry) and helm installs the chart from it, as from any registry. Sourced after common.sh and
# build.sh.
#
#   registry_start          the registry, serving until registry_stop (idempotent)
#   registry_stop
#   registry_publish        push the image built last (tag: the release version, and `dev`) and
#                           the packaged chart; write the chart values that pull the image by digest

REGISTRY_DIR="$MF_STATE/registry"
# Keyed by its source and module files (the library version is in go.mod).
REGISTRY_BIN="$MF_CACHE/registry-$(cat "$MF_ROOT"/e2e/registry/{main.go,go.mod,go.sum} | sha256sum | cut -c1-12)"

# The release version: the crate's, which the chart's version and appVersion repeat
# (release/version.sh checks they agree).
release_version() { "$MF_ROOT/release/version.sh"; }

# The chart values a world install uses: the world's own settings and the image by digest.
registry_chart_values() { echo "$MF_STATE/chart-values.yaml"; }

build_registry() {
  [ -x "$REGISTRY_BIN/registry" ] && return 0
  go_env
  mkdir -p "$REGISTRY_BIN"
  (cd "$MF_ROOT/e2e/registry" && go build -trimpath -ldflags "-s -w" -o "$REGISTRY_BIN/registry.new" .) ||
    die "building the world's registry failed"
  mv "$REGISTRY_BIN/registry.new" "$REGISTRY_BIN/registry"
}

registry_up() { curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1; }

registry_start() {
  build_registry
  mkdir -p "$REGISTRY_DIR"
  if ! pid_alive "$REGISTRY_DIR/registry.pid"; then
    require_port_free "$REGISTRY_PORT" registry REGISTRY_PORT
    log "starting the registry on $REGISTRY_ADDR"
    nohup "$REGISTRY_BIN/registry" -listen "$REGISTRY_ADDR" -dir "$REGISTRY_DIR/blobs" \
      >>"$REGISTRY_DIR/registry.log" 2>&1 &
    echo $! >"$REGISTRY_DIR/registry.pid"
  fi
  wait_until 20 "the registry" registry_up || die "the registry did not start (log: $REGISTRY_DIR/registry.log)"
}

registry_stop() {
  [ -f "$REGISTRY_DIR/registry.pid" ] && stop_pidfile "$REGISTRY_DIR/registry.pid" 10
  return 0
}

# registry_publish: the image (from the archive image_build made) and the chart; prints nothing,
# writes $(registry_chart_values). Manifests live in the registry's memory: after a restart of it
# this pushes again.
registry_publish() {
  local version archive digest
  version="$(release_version)"
  archive="${IMAGE_ARCHIVE:-$(find "$IMAGE_DIR" -maxdepth 1 -name 'mirrorflow-*.oci.tar' -printf '%T@ %p\n' 2>/dev/null |
    sort -rn | head -n 1 | cut -d' ' -f2-)}"
  [ -f "$archive" ] || die "no image archive in $IMAGE_DIR: run e2e/world.sh image"
  # The release's own steps (release/), as its workflow runs them against a real registry.
  digest="$("$MF_ROOT/release/publish-image.sh" "$archive" "$REGISTRY_ADDR/mirrorflow" --plain-http --tag dev)" ||
    die "pushing the image to the world's registry failed"
  PATH="$HELM_BIN:$PATH" "$MF_ROOT/release/publish-chart.sh" "$REGISTRY_ADDR" --plain-http >/dev/null ||
    die "pushing the chart to the world's registry failed"
  {
    cat "$MF_ROOT/e2e/world/values.yaml"
    echo "# Written by e2e/lib/registry.sh: the image pushed to the world's registry, pulled by digest."
    echo "image:"
    echo "  repository: $REGISTRY_ADDR/mirrorflow"
    echo "  digest: $digest"
    echo "  pullPolicy: IfNotPresent"
  } >"$(registry_chart_values).new"
  mv "$(registry_chart_values).new" "$(registry_chart_values)"
  log "published mirrorflow $version to $REGISTRY_ADDR (image $digest, chart oci://$REGISTRY_ADDR/charts/mirrorflow)"
  # The previous release, when built (e2e/world.sh previous): the upgrade test starts from it.
  if previous_built; then previous_publish; fi
}
