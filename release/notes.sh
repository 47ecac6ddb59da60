#!/usr/bin/env bash
# Prints the CHANGELOG.md section of the release version: the release's notes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="$("$ROOT/release/version.sh")"
awk -v v="$version" '
  /^## \[/ { inside = index($0, "## [" v "]") == 1; next }
  inside { print }
' "$ROOT/CHANGELOG.md" | sed -e '/./,$!d'
