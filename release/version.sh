#!/usr/bin/env bash
# Prints the release version: the `mirrorflow` crate's, which the chart's `version` and
# `appVersion` must repeat (one version for the binary, the image and the chart). Fails, naming
# the file, when they differ; with `--tag vX.Y.Z` also when the tag is not that version.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
crate="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)"
chart="$(sed -n 's/^version: *\(.*\)$/\1/p' "$ROOT/charts/mirrorflow/Chart.yaml")"
app="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/mirrorflow/Chart.yaml")"
[ -n "$crate" ] || { echo "no version in Cargo.toml" >&2; exit 1; }
[ "$chart" = "$crate" ] || { echo "charts/mirrorflow/Chart.yaml version $chart is not the crate's $crate" >&2; exit 1; }
[ "$app" = "$crate" ] || { echo "charts/mirrorflow/Chart.yaml appVersion $app is not the crate's $crate" >&2; exit 1; }
grep -q "^## \[$crate\]" "$ROOT/CHANGELOG.md" || { echo "CHANGELOG.md has no section ## [$crate]" >&2; exit 1; }
if [ "${1:-}" = --tag ]; then
  [ "${2:-}" = "v$crate" ] || { echo "tag ${2:-} is not v$crate" >&2; exit 1; }
fi
echo "$crate"
