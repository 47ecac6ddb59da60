# shellcheck shell=bash
# The previous release, for the upgrade test (e2e/tests/tests/upgrade_traffic.rs): its image and
# chart built from the fixed commit e2e/previous-release.env names, with that commit's own
# Dockerfile and chart, the way the world builds the working tree's (lib/image.sh). Sourced after
# common.sh, image.sh and registry.sh.
#
#   previous_build     the image (OCI archive) and the packaged chart, cached in
#                      $MF_CACHE/previous-<commit>: a warm run pays nothing
#   previous_publish   push both to the world's registry under `previous/`, beside the working
#                      tree's release and never over it: image $REGISTRY_ADDR/previous/mirrorflow,
#                      chart oci://$REGISTRY_ADDR/previous/charts/mirrorflow, both at the
#                      previous version
#   previous_built     exit 0 when the cache holds both

# shellcheck source=../previous-release.env
source "$MF_ROOT/e2e/previous-release.env"

previous_dir() { echo "$MF_CACHE/previous-$PREVIOUS_COMMIT"; }
previous_archive() { echo "$(previous_dir)/mirrorflow.oci.tar"; }
previous_chart() { echo "$(previous_dir)/mirrorflow-$PREVIOUS_VERSION.tgz"; }
previous_built() { [ -f "$(previous_archive)" ] && [ -f "$(previous_chart)" ]; }

# The commit's tree, as `git archive` gives it (no work tree changes, no .git), in $1.
previous_tree() {
  local into="$1"
  git -C "$MF_ROOT" cat-file -e "$PREVIOUS_COMMIT^{commit}" 2>/dev/null ||
    die "commit $PREVIOUS_COMMIT (release $PREVIOUS_VERSION) is not in this clone: git fetch --unshallow"
  git -C "$MF_ROOT" archive "$PREVIOUS_COMMIT" | tar -x -C "$into"
  local v
  v="$("$into/release/version.sh")" || die "release/version.sh of $PREVIOUS_COMMIT failed"
  [ "$v" = "$PREVIOUS_VERSION" ] || die "commit $PREVIOUS_COMMIT is version $v, not $PREVIOUS_VERSION (e2e/previous-release.env)"
}

# lib/image.sh's build, run on the commit's tree in a subshell (MF_ROOT moved there).
previous_podman_build() {
  (
    MF_ROOT="$1"
    export IMAGE_REVISION="$PREVIOUS_COMMIT"
    : >"$3"
    image_podman_build "$2" "$3"
  )
}

previous_build() {
  previous_built && { log "previous release $PREVIOUS_VERSION ($PREVIOUS_COMMIT) is cached in $(previous_dir)"; return 0; }
  local start=$SECONDS dir src hash tag
  dir="$(previous_dir)"
  mkdir -p "$dir"
  src="$(mktemp -d "${TMPDIR:-/tmp}/mirrorflow-previous.XXXXXX")"
  previous_tree "$src"
  image_podman_env
  with_progress "container base images" image_bases
  # The same input hash as lib/image.sh, over the commit's tree: a tree the world built
  # already (the commit is the world's own) is not built again.
  hash="$(MF_ROOT="$src" image_input_hash)"
  tag="$IMAGE_NAME:$hash"
  if podman image exists "$tag"; then
    log "image $tag (the inputs of $PREVIOUS_COMMIT) exists: not built again"
  else
    with_progress "building release $PREVIOUS_VERSION's image from $PREVIOUS_COMMIT (podman build; log: $dir/build.log)" \
      previous_podman_build "$src" "$tag" "$dir/build.log"
  fi
  image_smoke "$tag"
  podman save --quiet --format oci-archive -o "$(previous_archive).new" "$tag"
  mv "$(previous_archive).new" "$(previous_archive)"
  PATH="$HELM_BIN:$PATH" helm package "$src/charts/mirrorflow" -d "$dir" >/dev/null ||
    die "packaging the chart of $PREVIOUS_COMMIT failed"
  rm -rf "$src"
  image_cgroup_cleanup
  log "previous release $PREVIOUS_VERSION built from $PREVIOUS_COMMIT in $((SECONDS - start)) s: $(previous_dir)"
}

previous_publish() {
  previous_built || die "the previous release is not built: run e2e/world.sh previous"
  skopeo copy --quiet --all --dest-tls-verify=false "oci-archive:$(previous_archive)" \
    "docker://$REGISTRY_ADDR/previous/mirrorflow:$PREVIOUS_VERSION" ||
    die "pushing the previous release's image failed"
  PATH="$HELM_BIN:$PATH" helm push "$(previous_chart)" "oci://$REGISTRY_ADDR/previous/charts" --plain-http >/dev/null 2>&1 ||
    die "pushing the previous release's chart failed"
  log "published release $PREVIOUS_VERSION ($PREVIOUS_COMMIT) to $REGISTRY_ADDR/previous (image mirrorflow:$PREVIOUS_VERSION, chart oci://$REGISTRY_ADDR/previous/charts/mirrorflow)"
}
