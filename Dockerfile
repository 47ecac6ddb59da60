# syntax=docker/dockerfile:1
# The `mirrorflow` image: one static binary (operator and replicator), on distroless/static,
# running as uid 65532. Build from the repository root:
#
#   docker build -t ghcr.io/mirrorflow/mirrorflow:0.1.0 .
#
# Not built in this project's CI: the machine has no container engine. Kept as close to correct
# as can be checked by reading; build it once on a machine with BuildKit before relying on it.

# Native musl build on Alpine: the host target is x86_64-unknown-linux-musl (aarch64 on arm64
# builders), which links statically by default, proc-macros included.
FROM rust:1.95-alpine AS build
# librdkafka is built from source by rdkafka-sys (its `configure` is bash, then make + gcc);
# cmake and perl cover the `cmake-build` / `ssl-vendored` rdkafka features should Cargo.toml
# move to them (the usual route when cross-compiling to musl from a glibc host). Today the crate
# uses `ssl` + `zstd`: OpenSSL comes from Alpine's static libraries (OPENSSL_STATIC), zstd and
# zlib are built from their bundled sources.
RUN apk add --no-cache build-base bash cmake perl pkgconf linux-headers \
        openssl-dev openssl-libs-static zlib-static
ENV OPENSSL_STATIC=1 \
    LIBZ_SYS_STATIC=1 \
    CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build outputs between builds; the binary is copied out
# because the target dir is not part of the layer. The last check fails the build rather than
# ship a binary that needs a dynamic loader the runtime image lacks.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p mirrorflow --bin mirrorflow \
    && cp target/release/mirrorflow /mirrorflow \
    && ! (ldd /mirrorflow 2>&1 | grep -q '=>')

# distroless/static: CA certificates, /etc/passwd with nonroot (65532), no shell, no libc.
FROM gcr.io/distroless/static-debian12:nonroot
# Alpine's OpenSSL looks for /etc/ssl/cert.pem; distroless keeps the bundle here.
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
COPY --from=build /mirrorflow /mirrorflow
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/mirrorflow"]
CMD ["--help"]
