# The mirrorflow container image, built with podman on a machine that reaches no container
# registry. Sourced after common.sh (world.sh, test.sh).
#
#   image_setup   install podman and friends from Debian (apt) when missing
#   image_build   local base images if absent, then the Dockerfile (skipped when its inputs are
#                 unchanged), an OCI archive in $MF_CACHE, the smoke checks
#   image_smoke   run the image the way a restricted pod runs it
#
# Every FROM is a local image (--pull=never): the Debian base comes from `mmdebstrap` and the Debian
# mirror; the build base adds this machine's Rust toolchain (the one rustup installed, matching the
# public rust:<version>-bookworm the Dockerfile defaults to); the runtime base is distroless-like,
# assembled from the Debian base's own files. podman runs rootful with its settings in a
# containers.conf this file writes under $MF_CACHE (nothing under /etc is changed).

# Bump to rebuild the local base images, e.g. to pick up Debian security updates.
IMAGE_BASE_VERSION="${IMAGE_BASE_VERSION:-1}"
IMAGE_DEBIAN_SUITE="${IMAGE_DEBIAN_SUITE:-bookworm}"
IMAGE_DEBIAN_MIRROR="${IMAGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
IMAGE_DEBIAN_SECURITY_MIRROR="${IMAGE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
IMAGE_NAME="${IMAGE_NAME:-localhost/mirrorflow}"
IMAGE_DIR="$MF_CACHE/image"
# Everything the image is built from (relative to the repository root): the input hash covers
# these, and image_check_inputs refuses a Dockerfile that COPYs anything else (it would not
# trigger a rebuild). .dockerignore lets exactly these into the build context.
IMAGE_INPUTS=(Dockerfile .dockerignore Cargo.toml Cargo.lock build.rs crates src benches bench/driver/Cargo.toml
  e2e/tests/Cargo.toml)

image_setup() {
  local missing=() c
  for c in podman buildah skopeo newuidmap fuse-overlayfs mmdebstrap runc; do
    command -v "$c" >/dev/null 2>&1 || missing+=("$c")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  log "installing container tools (missing: ${missing[*]})"
  [ "$(id -u)" = 0 ] || die "installing podman needs root: apt-get install podman buildah skopeo uidmap fuse-overlayfs mmdebstrap runc"
  # A fresh machine has no package lists yet; an update is cheap next to the install.
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah skopeo uidmap fuse-overlayfs mmdebstrap runc >/dev/null
}

image_need_tools() {
  local c
  for c in podman buildah skopeo mmdebstrap runc; do
    need "$c" "run e2e/world.sh image-setup (apt-get install podman buildah skopeo uidmap fuse-overlayfs mmdebstrap runc)"
  done
  [ "$(id -u)" = 0 ] || die "the image is built with rootful podman (this machine kind runs the world as root)"
}

# The cgroup the containers go in: below this shell's own cgroup (cgroup_below_self, common.sh).
# podman's default (cgroupfs manager) is /libpod_parent at the root of each hierarchy, outside the
# cgroup the world runs in.
image_cgroup_parent() { cgroup_below_self mirrorflow-image; }

# runc creates the parent cgroups as needed, also in hierarchies where this process sits at the
# root; remove what is empty afterwards.
image_cgroup_cleanup() { cgroup_remove_empty "$IMAGE_CGROUP_PARENT"; }

# podman's settings for this machine kind, in a file of our own (CONTAINERS_CONF) rather than
# /etc/containers: no systemd as PID 1 (cgroupfs, file events); crun refuses cgroup v1 hybrid
# (runc); runc cannot raise rlimits (no CAP_SYS_RESOURCE), so containers ask for no more than the
# hard limits podman itself runs with: nofile as this shell, nproc at most 32768 (podman runs its
# children with 32768; asking for the shell's 96363 failed with "error setting rlimit type 6").
image_podman_env() {
  image_need_tools
  mkdir -p "$IMAGE_DIR"
  local nofile nproc
  nofile="$(ulimit -Hn)"
  nproc="$(ulimit -Hu)"
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
  [ "$nofile" = unlimited ] && nofile=1048576
  cat >"$IMAGE_DIR/containers.conf.new" <<EOF
# Written by e2e/lib/image.sh; see there why.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
EOF
  mv "$IMAGE_DIR/containers.conf.new" "$IMAGE_DIR/containers.conf"
  export CONTAINERS_CONF="$IMAGE_DIR/containers.conf"
  IMAGE_CGROUP_PARENT="$(image_cgroup_parent)"
  # cgroup_parent and cgroups=no-conmon in containers.conf are ignored by podman 4.3 (measured:
  # /libpod_parent/conmon appeared anyway), so they go on every command line. Builds use the host
  # network: a private one would add a bridge and NAT rules to a shared machine's network.
  IMAGE_RUN_ARGS=(--cgroups=no-conmon --cgroup-parent="$IMAGE_CGROUP_PARENT" --network=none)
  IMAGE_BUILD_ARGS=(--cgroup-parent="$IMAGE_CGROUP_PARENT" --network=host --pull=never)
}

# Extra CAs this machine trusts (see image_build_base).
shopt -s nullglob
IMAGE_LOCAL_CAS=(/usr/local/share/ca-certificates/*.crt)
shopt -u nullglob

image_debian_tag() { echo "localhost/mirrorflow-debian:$IMAGE_DEBIAN_SUITE-$IMAGE_BASE_VERSION"; }
image_runtime_tag() { echo "localhost/mirrorflow-runtime-base:$IMAGE_DEBIAN_SUITE-$IMAGE_BASE_VERSION"; }
image_build_tag() {
  # Keyed by the toolchain and the machine's extra CAs too: either changing is a new build base.
  local v ca
  v="$(rustc --version | awk '{print $2}')"
  ca="$(cat /dev/null "${IMAGE_LOCAL_CAS[@]}" | sha256sum | cut -c1-8)"
  echo "localhost/mirrorflow-build-base:$IMAGE_DEBIAN_SUITE-rust$v-ca$ca-$IMAGE_BASE_VERSION"
}

image_rootfs() { echo "$IMAGE_DIR/debian-$IMAGE_DEBIAN_SUITE-$IMAGE_BASE_VERSION.tar"; }

# Debian with apt and CA certificates (apt can install more in RUN steps), security updates
# included so the runtime base's glibc is current.
image_debian_base() {
  local tag rootfs
  tag="$(image_debian_tag)"
  rootfs="$(image_rootfs)"
  podman image exists "$tag" && [ -f "$rootfs" ] && return 0
  if [ ! -f "$rootfs" ]; then
    mmdebstrap --quiet --variant=apt --include=ca-certificates "$IMAGE_DEBIAN_SUITE" "${rootfs%.tar}.partial.tar" \
      "deb $IMAGE_DEBIAN_MIRROR $IMAGE_DEBIAN_SUITE main" \
      "deb $IMAGE_DEBIAN_MIRROR $IMAGE_DEBIAN_SUITE-updates main" \
      "deb $IMAGE_DEBIAN_SECURITY_MIRROR $IMAGE_DEBIAN_SUITE-security main" ||
      die "mmdebstrap of Debian $IMAGE_DEBIAN_SUITE failed (is $IMAGE_DEBIAN_MIRROR reachable?)"
    # mmdebstrap picks the output format from the name's ending, hence .partial.tar.
    mv "${rootfs%.tar}.partial.tar" "$rootfs"
  fi
  podman import --quiet "$rootfs" "$tag" >/dev/null
}

# The Debian base plus the Rust toolchain rustup put on this machine, laid out like the public
# rust image (cargo on PATH, CARGO_HOME=/usr/local/cargo). Docs are left out (800 MB).
image_build_base() {
  local tag sysroot ctr d
  tag="$(image_build_tag)"
  podman image exists "$tag" && return 0
  need rustc "install Rust with rustup (its toolchain goes into the build base image)"
  sysroot="$(rustc --print sysroot)"
  ctr="$(buildah from --pull-never --quiet "$(image_debian_tag)")"
  # This machine reaches crates.io through a TLS-inspecting proxy whose CA only the host trusts
  # (/usr/local/share/ca-certificates). The build base, a local image never shipped, trusts the
  # same: as a local CA (kept if apt regenerates the bundle) and in the bundle cargo reads. The
  # runtime base is made from the plain Debian tree, so the image carries Debian's CAs only.
  if [ "${#IMAGE_LOCAL_CAS[@]}" -gt 0 ]; then
    buildah copy --quiet "$ctr" "${IMAGE_LOCAL_CAS[@]}" /usr/local/share/ca-certificates/ >/dev/null
    buildah copy --quiet "$ctr" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt >/dev/null
  fi
  for d in bin lib libexec etc; do
    [ -d "$sysroot/$d" ] && buildah copy --quiet "$ctr" "$sysroot/$d" "/usr/local/rust/$d" >/dev/null
  done
  buildah config --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label "org.opencontainers.image.description=Debian $IMAGE_DEBIAN_SUITE with $(rustc --version)" "$ctr"
  buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
}

# distroless/cc-like, from the Debian base's files: glibc's and libgcc_s's shared libraries (gconv
# left out: nothing here uses iconv), the CA bundle, passwd/group with root and nonroot (65532),
# nsswitch.conf (files before DNS, as Kubernetes' /etc/hosts expects), os-release and dpkg status
# entries so image scanners know what is inside. No shell, no coreutils, no apt.
image_runtime_base() {
  local tag work rootfs stage arch p
  tag="$(image_runtime_tag)"
  podman image exists "$tag" && return 0
  work="$IMAGE_DIR/runtime-base.work"
  rm -rf "$work" && mkdir -p "$work/rootfs" "$work/stage"
  rootfs="$work/rootfs"
  stage="$work/stage"
  tar -C "$rootfs" -xf "$(image_rootfs)"
  arch="$(head -n 1 "$rootfs/var/lib/dpkg/arch" 2>/dev/null || true)"
  [ -n "$arch" ] || arch="$(dpkg --print-architecture)"
  # Debian's merged /usr: /lib, /lib64 are links into /usr; the files are listed under /lib.
  for p in lib lib32 lib64 libx32; do
    if [ -L "$rootfs/$p" ]; then
      cp -a "$rootfs/$p" "$stage/"
      mkdir -p "$stage/$(readlink "$rootfs/$p")"
    fi
  done
  cat "$rootfs/var/lib/dpkg/info/libc6:$arch.list" "$rootfs/var/lib/dpkg/info/libgcc-s1:$arch.list" |
    grep -E '^/(usr/)?lib[^/]*/' | grep -v '/gconv/' | while read -r p; do
      if [ -L "$rootfs$p" ] || [ -f "$rootfs$p" ]; then echo "${p#/}"; fi
    done >"$work/files"
  (cd "$rootfs" && tar -c --no-recursion -T "$work/files") | (cd "$stage" && tar -x)
  mkdir -p "$stage/etc/ssl/certs" "$stage/usr/lib" "$stage/var/lib/dpkg/status.d" "$stage/tmp" "$stage/home/nonroot"
  cp "$rootfs/etc/ssl/certs/ca-certificates.crt" "$stage/etc/ssl/certs/"
  cp -L "$rootfs/etc/os-release" "$stage/usr/lib/os-release"
  ln -s ../usr/lib/os-release "$stage/etc/os-release"
  for p in libc6 libgcc-s1; do
    dpkg-query --admindir="$rootfs/var/lib/dpkg" -s "$p" >"$stage/var/lib/dpkg/status.d/$p"
  done
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$stage/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$stage/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$stage/etc/nsswitch.conf"
  chmod 1777 "$stage/tmp"
  chown 65532:65532 "$stage/home/nonroot"
  [ -e "$stage/lib64/ld-linux-x86-64.so.2" ] || [ "$arch" != amd64 ] || die "runtime base: the dynamic loader is missing"
  tar -C "$stage" --numeric-owner -c . | podman import --quiet \
    --change 'USER=65532:65532' --change 'WORKDIR=/home/nonroot' \
    --change 'ENV=PATH=/usr/local/bin:/usr/bin:/bin' \
    --change 'ENV=SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' - "$tag" >/dev/null
  rm -rf "$work"
}

image_bases() {
  image_debian_base
  image_build_base
  image_runtime_base
}

# A COPY in the Dockerfile from outside IMAGE_INPUTS would not change the hash: the image would
# silently go stale. Checked on every build (cheap).
image_check_inputs() {
  local line src covered in
  while read -r line; do
    # shellcheck disable=SC2086 # word-splitting the COPY arguments is the point
    set -- $line
    shift
    while [ "$#" -gt 1 ]; do
      src="${1%/}"
      shift
      case "$src" in --*) continue ;; esac
      covered=false
      for in in "${IMAGE_INPUTS[@]}"; do
        case "$src" in "$in" | "$in"/*) covered=true ;; esac
      done
      $covered || die "Dockerfile COPYs '$src', which IMAGE_INPUTS (e2e/lib/image.sh) does not hash"
    done
  done < <(grep -E '^COPY ' "$MF_ROOT/Dockerfile" | grep -v -- '--from=')
}

# Content hash of every input plus the base images' ids: same hash, same image.
image_input_hash() {
  (
    cd "$MF_ROOT" || exit 1
    find "${IMAGE_INPUTS[@]}" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    podman image inspect --format '{{.Id}}' "$(image_build_tag)" "$(image_runtime_tag)"
  ) | sha256sum | cut -c1-16
}

# podman build with its output in a log; cargo's "Compiling" lines counted against the crates
# mirrorflow depends on feed with_progress's heartbeat.
image_podman_build() {
  local tag="$1" log="$2" total=""
  # Best effort: without cargo or a local registry index the heartbeat shows no total.
  if command -v cargo >/dev/null 2>&1; then
    total="$(cd "$MF_ROOT" && { timeout 60 cargo tree --locked --offline -p mirrorflow -e normal,build \
      --prefix none 2>/dev/null || true; } | sed 's/ (\*)$//' | sort -u | wc -l)"
  fi
  local rc=0
  (
    cd "$MF_ROOT" || exit 1
    nice -n "${IMAGE_NICE:-10}" podman build "${IMAGE_BUILD_ARGS[@]}" \
      --build-arg BUILD_IMAGE="$(image_build_tag)" --build-arg RUNTIME_IMAGE="$(image_runtime_tag)" \
      --label "org.opencontainers.image.revision=${IMAGE_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" \
      -t "$tag" -f Dockerfile . 2>&1
  ) | {
    local n=0 line
    while IFS= read -r line; do
      printf '%s\n' "$line" >>"$log"
      case "$line" in
        *"Compiling "*)
          n=$((n + 1))
          printf 'cargo: %s of %s crates compiled\n' "$n" "${total:-?}" >"${MF_PROGRESS_FILE:-/dev/null}"
          ;;
        STEP*) printf '%s\n' "$line" >"${MF_PROGRESS_FILE:-/dev/null}" ;;
      esac
    done
  } || rc=$?
  if ! podman image exists "$tag"; then
    tail -n 40 "$log" >&2
    log "podman build failed (exit ${rc}); whole log: $log"
    return 1
  fi
}

image_smoke() {
  local img="${1:-$IMAGE_NAME:dev}" out user ro sh
  local run=(podman run --rm "${IMAGE_RUN_ARGS[@]}" --read-only --user 65532:65532 --cap-drop=ALL
    --security-opt no-new-privileges)
  "${run[@]}" "$img" --help >/dev/null || die "smoke: '$img --help' failed"
  out="$("${run[@]}" "$img" --version)" || die "smoke: '$img --version' failed"
  case "$out" in "mirrorflow "*) ;; *) die "smoke: --version printed '$out'" ;; esac
  # A real subcommand, not only clap: the CRD generator runs the library code.
  # (Into a variable first: grep -q would close the pipe early and podman report a broken pipe.)
  out="$("${run[@]}" "$img" crd)" || die "smoke: '$img crd' failed"
  grep -q '^kind: CustomResourceDefinition' <<<"$out" || die "smoke: '$img crd' printed no CRD"
  out="$("${run[@]}" "$img" --version)"
  user="$(podman image inspect --format '{{.Config.User}}' "$img")"
  [ "$user" = "65532:65532" ] || die "smoke: the image's user is '$user', not 65532:65532"
  # No shell: starting one must fail (runc cannot find it).
  for sh in /bin/sh /bin/bash /bin/busybox /usr/bin/sh; do
    if "${run[@]}" --entrypoint "$sh" "$img" -c true >/dev/null 2>&1; then die "smoke: the image has a shell ($sh)"; fi
  done
  # --read-only really applied to the container (the binary has no file-writing command to try).
  local id
  id="$(podman create "${IMAGE_RUN_ARGS[@]}" --read-only --user 65532:65532 --cap-drop=ALL "$img" --version)"
  ro="$(podman inspect --format '{{.HostConfig.ReadonlyRootfs}}' "$id")"
  podman rm "$id" >/dev/null
  [ "$ro" = true ] || die "smoke: the container's root file system is not read-only"
  log "smoke: --help, --version ($out), crd run as 65532 with a read-only root, no capabilities; no shell in the image"
}

# Keep the cache from growing with every change: the archives of the three images built or used
# last and their tags stay, the rest go. Three, not one: worktrees of one machine share this
# cache, and each would otherwise delete the image the other's world is about to import.
IMAGE_KEEP=3
image_prune_old() {
  local keep="$1" t f kept=()
  touch "$IMAGE_DIR/mirrorflow-$keep.oci.tar"
  while IFS= read -r f; do
    kept+=("$(basename "$f" .oci.tar)")
  done < <(find "$IMAGE_DIR" -maxdepth 1 -name 'mirrorflow-*.oci.tar' -printf '%T@ %p\n' | sort -rn |
    head -n "$IMAGE_KEEP" | cut -d' ' -f2-)
  for t in $(podman images --format '{{.Repository}}:{{.Tag}}' "$IMAGE_NAME"); do
    case " dev ${kept[*]/#mirrorflow-/} " in
      *" ${t##*:} "*) ;;
      *) podman rmi "$t" >/dev/null 2>&1 || true ;;
    esac
  done
  for f in "$IMAGE_DIR"/mirrorflow-*.oci.tar; do
    case " ${kept[*]} " in
      *" $(basename "$f" .oci.tar) "*) ;;
      *) rm -f "$f" ;;
    esac
  done
  # Build logs of the images kept stay; a log of a build in progress is newer than any archive.
  for f in "$IMAGE_DIR"/build-*.log "$IMAGE_DIR/build.log"; do
    [ -e "$f" ] || continue
    case " ${kept[*]/#mirrorflow-/build-} " in
      *" $(basename "$f" .log) "*) ;;
      *) [ "$f" -nt "$IMAGE_DIR/mirrorflow-$keep.oci.tar" ] || rm -f "$f" ;;
    esac
  done
  return 0
}

image_build() {
  local start=$SECONDS hash tag archive size build_log
  image_podman_env
  # Empty cgroups left by an earlier run that failed half-way go first; this run's at the end.
  image_cgroup_cleanup
  image_check_inputs
  with_progress "container base images (Debian $IMAGE_DEBIAN_SUITE via mmdebstrap; about a minute when absent)" image_bases
  hash="$(image_input_hash)"
  tag="$IMAGE_NAME:$hash"
  if podman image exists "$tag"; then
    log "image $tag is up to date (inputs unchanged)"
  else
    # A log per input hash: two worlds building different trees at once (one MF_CACHE) keep
    # their logs apart.
    local build_log="$IMAGE_DIR/build-$hash.log"
    : >"$build_log"
    with_progress "building $tag (podman build; 10-20 min cold, log: $build_log)" image_podman_build "$tag" "$build_log"
  fi
  podman tag "$tag" "$IMAGE_NAME:dev"
  archive="$IMAGE_DIR/mirrorflow-$hash.oci.tar"
  if [ ! -f "$archive" ]; then
    # For a later import into containerd (ctr -n k8s.io images import); tagged :dev inside.
    podman save --quiet --format oci-archive -o "$archive.new" "$IMAGE_NAME:dev"
    mv "$archive.new" "$archive"
  fi
  image_prune_old "$hash"
  IMAGE_ARCHIVE="$archive"
  image_smoke "$IMAGE_NAME:dev"
  image_cgroup_cleanup
  size="$(podman image inspect --format '{{.Size}}' "$tag")"
  log "image $IMAGE_NAME:dev = $tag: $((size / 1000000)) MB ($size bytes), archive $archive ($(du -m "$archive" | cut -f1) MiB); $((SECONDS - start)) s"
}
