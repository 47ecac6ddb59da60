#!/usr/bin/env bash
# Packages the chart at the release version and pushes it as an OCI artefact to
# oci://REGISTRY/charts; prints the pushed digest. Run by the release workflow and by the local
# world (lib/registry.sh), so the published chart is the one the world installs.
#   release/publish-chart.sh REGISTRY [--plain-http]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
registry="${1:?usage: publish-chart.sh REGISTRY [--plain-http]}"
plain=()
[ "${2:-}" = --plain-http ] && plain=(--plain-http)
version="$("$ROOT/release/version.sh")"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
helm package "$ROOT/charts/mirrorflow" -d "$dir" >/dev/null
helm push "$dir/mirrorflow-$version.tgz" "oci://$registry/charts" "${plain[@]}" 2>&1 |
  sed -n 's/^Digest: //p'
