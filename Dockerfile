# syntax=docker/dockerfile:1
# The `mirrorflow` image: one binary (operator, replicator and CLI) as /mirrorflow, uid 65532, no
# shell. Build from the repository root on any machine with public registries:
#
#   docker build -t ghcr.io/mirrorflow/mirrorflow:0.2.0 .          (BuildKit)
#   podman build -t ghcr.io/mirrorflow/mirrorflow:0.2.0 .
#
# Both base images are build arguments so a machine without a registry can use its own: the test
# world builds them from Debian packages (e2e/lib/image.sh, `e2e/world.sh image`) and passes
# --build-arg BUILD_IMAGE=... --build-arg RUNTIME_IMAGE=... --pull=never.
#
# Runtime base, chosen on purpose: distroless/cc (Debian 12), i.e. glibc and libgcc_s, CA
# certificates, /etc/passwd with nonroot (65532), no shell, no package manager.
# - Not distroless/static + musl: building for musl needs either Alpine (no Alpine mirror is
#   reachable where the world builds) or the musl Rust target plus musl-built OpenSSL; and musl's
#   allocator and DNS resolver behave worse for a networked, multi-threaded replicator.
# - glibc is the only C runtime the binary loads. OpenSSL (for librdkafka's TLS), libcurl (for its
#   OAuth token client), zlib and zstd are linked statically, so the runtime image needs no
#   libssl and an OpenSSL mismatch between the build and runtime images cannot happen; the
#   build fails if the binary needs any other shared library (check below). The cost: an
#   OpenSSL or libcurl fix means rebuilding the image, which a fix in the base image needs
#   anyway.
ARG BUILD_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
# rdkafka-sys builds librdkafka from source with CMake (its cmake-build feature: only that build
# links the libcurl curl-sys builds, which librdkafka's OIDC token client needs), C and C++;
# curl-sys builds libcurl from its bundled source; openssl-sys needs the OpenSSL headers and
# static libraries (libssl-dev ships both). ca-certificates lets cargo fetch from crates.io
# over TLS.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        bash binutils ca-certificates cmake g++ gcc libc6-dev libssl-dev make perl pkg-config \
    && rm -rf /var/lib/apt/lists/*
# OPENSSL_STATIC alone is not enough: openssl-sys asks pkg-config first, and the pkg-config crate
# links libraries in system directories dynamically whatever it is told (measured: the binary
# needed libssl.so.3). Without pkg-config, and with the lib dir given (in the RUN below: it
# depends on the architecture), openssl-sys links libssl.a and libcrypto.a.
ENV CARGO_HOME=/usr/local/cargo \
    CARGO_TERM_COLOR=never \
    OPENSSL_STATIC=1 \
    OPENSSL_NO_PKG_CONFIG=1 \
    OPENSSL_INCLUDE_DIR=/usr/include \
    LIBZ_SYS_STATIC=1
WORKDIR /src
# Only what the build reads, so a change elsewhere (tests, docs, charts) keeps this layer cached.
# Cargo loads every workspace member's manifest (and --locked checks Cargo.lock against all of
# them), so the other members' manifests come in with empty sources: they are never compiled.
COPY Cargo.toml Cargo.lock build.rs ./
COPY bench/driver/Cargo.toml bench/driver/
COPY e2e/tests/Cargo.toml e2e/tests/
COPY benches benches
COPY crates crates
COPY src src
RUN mkdir -p bench/driver/src e2e/tests/src \
    && touch bench/driver/src/main.rs e2e/tests/src/lib.rs
# Cache mounts keep downloaded crates and build outputs between builds, so a source change
# recompiles only the mirrorflow crate. The target dir is not part of the layer: the binary is
# copied out, without the DWARF line tables the release profile keeps (151 MB -> 31 MB measured;
# symbols stay, so a panic's backtrace still names functions). The last step fails the build rather than ship a binary that needs a shared
# library the runtime image lacks (only glibc's and libgcc_s are there).
# The target cache is shared by every checkout built on the machine, and cargo takes an
# artifact as fresh when it is newer than its sources: a checkout whose files are older than
# another's build would get that build's crates. The workspace's own sources are stamped with
# the build's time first, so they always compile from what was copied (the dependencies stay
# cached).
RUN --mount=type=cache,id=mirrorflow-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=mirrorflow-target,target=/src/target \
    find build.rs crates src benches -type f -exec touch {} + \
    && OPENSSL_LIB_DIR="/usr/lib/$(gcc -print-multiarch)" \
        cargo build --release --locked -p mirrorflow --bin mirrorflow \
    && mkdir -p /out && objcopy --strip-debug target/release/mirrorflow /out/mirrorflow \
    && ldd /out/mirrorflow \
    && ! ldd /out/mirrorflow | awk '{print $1}' \
        | grep -vE '^(linux-vdso\.so\.1|linux-gate\.so\.1|libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|/lib.*/ld-linux[-a-z0-9_.]*\.so\.[0-9])$'

FROM ${RUNTIME_IMAGE}
# OpenSSL (statically linked, Debian's build) looks in /usr/lib/ssl by default; distroless and
# the world's runtime base keep the CA bundle here.
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/mirrorflow /mirrorflow
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/mirrorflow"]
CMD ["--help"]
