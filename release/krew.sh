#!/usr/bin/env bash
# Writes to stdout the krew plugin manifest of the kubectl plugin `kubectl mirrorflow` for
# VERSION: one platform per ARCHIVE (named by release/plugin-archive.sh:
# kubectl-mirrorflow_<version>_<os>_<arch>.tar.gz), each with the archive's download URL on the
# release of tag vVERSION and the sha256 of the file given. Installable before the plugin is in
# krew's index with `kubectl krew install --manifest=FILE`; checked by krew's own
# validate-krew-manifest and installed by krew in e2e/tests/tests/release.rs.
#   release/krew.sh VERSION ARCHIVE...
# The repository the release lives in is GITHUB_REPOSITORY (set in GitHub Actions), by default
# the chart's home.
set -euo pipefail
version="${1:?usage: krew.sh VERSION ARCHIVE...}"
shift
[ "$#" -gt 0 ] || { echo "usage: krew.sh VERSION ARCHIVE...: no archive given" >&2; exit 2; }
case "$version" in
  v*) echo "VERSION is the release version without the tag's v (got $version)" >&2; exit 2 ;;
esac
repository="${GITHUB_REPOSITORY:-mirrorflow/mirrorflow}"
homepage="https://github.com/$repository"
download="$homepage/releases/download/v$version"

# One `platforms` entry; fails naming the archive when its name is not this version's or it does
# not hold the plugin's binary, so a manifest never points at a file krew cannot install.
platform() {
  local archive="$1" prefix="kubectl-mirrorflow_${version}_" name os_arch os arch sha listing
  name="$(basename "$archive")"
  if [[ "$name" != "$prefix"?*_?*.tar.gz ]]; then
    echo "$name is not named ${prefix}<os>_<arch>.tar.gz" >&2
    return 1
  fi
  os_arch="${name#"$prefix"}"
  os_arch="${os_arch%.tar.gz}"
  os="${os_arch%%_*}"
  arch="${os_arch#*_}"
  [ -f "$archive" ] || { echo "no archive $archive" >&2; return 1; }
  listing="$(tar -tzf "$archive")" || { echo "$name is not a gzipped tar archive" >&2; return 1; }
  grep -qx 'kubectl-mirrorflow' <<<"$listing" ||
    { echo "$name does not hold kubectl-mirrorflow at its top" >&2; return 1; }
  # Quoted below: a digest of digits and one `e` would otherwise be read as a YAML number.
  sha="$(sha256sum "$archive" | cut -d' ' -f1)"
  cat <<YAML
  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: "$download/$name"
    sha256: "$sha"
    bin: kubectl-mirrorflow
    files:
    - from: kubectl-mirrorflow
      to: .
YAML
  if grep -qx 'LICENSE' <<<"$listing"; then
    printf '    - from: LICENSE\n      to: .\n'
  fi
}

platforms=""
for archive in "$@"; do
  platforms+="$(platform "$archive")"$'\n'
done

cat <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: mirrorflow
spec:
  version: v$version
  homepage: $homepage
  shortDescription: Fail Kafka consumers over with MirrorMaker 2 offsets
  description: |
    The CLI of the MirrorFlow operator, which replicates Kafka topics between clusters on-wire
    compatible with MirrorMaker 2 and reports failover readiness in each MirrorFlow's status.
    It reads a flow from the cluster (or a file) and translates consumer group offsets from
    the source cluster to the target: failover, failback, drill, switchover, takeover,
    translate and status. Nothing is committed without --apply.
  platforms:
${platforms%$'\n'}
YAML
