#!/usr/bin/env bash
# Packs one platform's `mirrorflow` binary as the kubectl plugin's release archive:
# OUTDIR/kubectl-mirrorflow_<version>_<os>_<arch>.tar.gz holding `kubectl-mirrorflow` (and the
# repository's LICENSE when there is one); prints the archive's path. The release workflow runs it
# for each platform of the image's build, the world test (e2e/tests/tests/release.rs) for the
# binary it built. Owners, dates and order are fixed, so the same binary gives the same archive
# and the same sha256 in the krew manifest (release/krew.sh).
#   release/plugin-archive.sh BINARY OS ARCH OUTDIR
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage="usage: plugin-archive.sh BINARY OS ARCH OUTDIR"
binary="${1:?$usage}"
os="${2:?$usage}"
arch="${3:?$usage}"
outdir="${4:?$usage}"
[ -f "$binary" ] || { echo "no binary $binary" >&2; exit 1; }
version="$("$ROOT/release/version.sh")"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$binary" "$stage/kubectl-mirrorflow"
files=(kubectl-mirrorflow)
if [ -f "$ROOT/LICENSE" ]; then
  install -m 0644 "$ROOT/LICENSE" "$stage/LICENSE"
  files+=(LICENSE)
fi
mkdir -p "$outdir"
archive="$(cd "$outdir" && pwd)/kubectl-mirrorflow_${version}_${os}_${arch}.tar.gz"
tar -C "$stage" --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -cf - "${files[@]}" |
  gzip -n -9 >"$archive"
echo "$archive"
