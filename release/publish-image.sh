#!/usr/bin/env bash
# Pushes an OCI archive of the image (one platform, or an index of several) to REPOSITORY under
# the release version and prints the pushed digest. The release workflow runs it on the archive
# `docker buildx` made; the local world runs it on the archive podman made (lib/registry.sh).
#   release/publish-image.sh ARCHIVE REPOSITORY [--plain-http] [--tag TAG]...
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
archive="${1:?usage: publish-image.sh ARCHIVE REPOSITORY [--plain-http] [--tag TAG]...}"
repository="${2:?repository, e.g. ghcr.io/mirrorflow/mirrorflow}"
shift 2
tls=true
tags=("$("$ROOT/release/version.sh")")
while [ "$#" -gt 0 ]; do
  case "$1" in
    --plain-http) tls=false ;;
    --tag) tags+=("${2:?--tag needs a value}"); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -f "$archive" ] || { echo "no archive $archive" >&2; exit 1; }
for tag in "${tags[@]}"; do
  skopeo copy --quiet --all --dest-tls-verify="$tls" "oci-archive:$archive" "docker://$repository:$tag"
done
skopeo inspect --tls-verify="$tls" --raw "docker://$repository:${tags[0]}" | sha256sum | sed 's/^\([0-9a-f]*\).*/sha256:\1/'
