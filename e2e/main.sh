#!/usr/bin/env bash
# The main job: the local world with everything running in it, left up for you to use.
# Today that is the two Kafka clusters, the control plane and the process node; the operator
# and a sample flow join here as they land.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/world.sh" up
