# The Go builder for images/controller/Dockerfile on a machine without a
# registry: what the golang image is elsewhere (the Go toolchain in
# /usr/local/go on Debian, GOPATH=/go, CA certificates for a module proxy).
# hack/runner-image.sh builds it FROM the locally debootstrapped base
# (--build-arg BASE=...) with the build context = the Go toolchain of go.mod's
# `toolchain` line as the machine's Go module cache holds it
# (golang.org/toolchain@v0.0.1-goX.Y.Z.linux-<arch>).
ARG BASE
FROM ${BASE}
ARG DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log
COPY --chown=0:0 . /usr/local/go
ENV GOTOOLCHAIN=local GOPATH=/go \
    PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN go version
LABEL org.opencontainers.image.title="kpssh-go-builder"
