#!/usr/bin/env bash
# hack/node-assets.sh — the node binaries and images a test host installs when
# it joins, as a local mirror (the tls-bootstrap profile's `binarySource`).
# Prints the mirror dir as the only line on stdout (progress on stderr):
#
#   <dir>/amd64/{kubelet,containerd,containerd-shim-runc-v2,ctr,runc,cni-plugins.tgz}
#   <dir>/images/{pause,busybox}.tar     docker-archive tars for `ctr images import`
#   <dir>/images/names                   the image references inside them
#
# Nothing is installed on this machine: containerd, runc and the CNI plugins
# come from Debian's .debs (apt-get download + dpkg-deb -x), the kubelet from
# hack/k8s-bins.sh, the pause image from a static Go binary built here, the
# busybox image from Debian's busybox-static. Cached under
# ${KPSSH_CACHE:-<repo>/.cache}/node-assets/<key>/, the key hashing this
# script, the package versions apt offers and the kubelet's build dir; built in
# a temp dir and renamed into place when complete.
#
# Image references are local names (never pulled; pods use imagePullPolicy: Never):
PAUSE_IMAGE=kpssh.local/pause:3.10
BUSYBOX_IMAGE=kpssh.local/busybox:1.35
set -euo pipefail
export KPSSH_PROG=node-assets
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
export GOTOOLCHAIN=go1.27.3

REPO=$(repo_root)
CACHE=${KPSSH_CACHE:-$REPO/.cache}/node-assets
PKGS=(containerd runc containernetworking-plugins busybox-static)
ARCH=amd64
[[ $(dpkg --print-architecture 2>/dev/null) == "$ARCH" ]] || die "only $ARCH machines are supported (dpkg says $(dpkg --print-architecture 2>/dev/null || echo none))"
need_cmd apt-get apt
need_cmd dpkg-deb dpkg
need_cmd go golang
need_cmd sha256sum coreutils
need_cmd flock util-linux

K8S_DIR=$("$REPO/hack/k8s-bins.sh") || die "hack/k8s-bins.sh failed"
[[ -x $K8S_DIR/kubelet ]] || die "hack/k8s-bins.sh printed $K8S_DIR, which has no kubelet"

# Versions apt would download (the key changes when Debian publishes an update).
versions() {
	local p v
	for p in "${PKGS[@]}"; do
		v=$(apt-cache policy "$p" 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')
		[[ -n $v && $v != "(none)" ]] || die "apt offers no candidate for $p (run apt-get update?)"
		echo "$p=$v"
	done
}
# A fresh machine may have no package lists yet.
if ! VERSIONS=$(versions 2>/dev/null); then
	need_root
	log "apt has no candidates for ${PKGS[*]}: running apt-get update"
	apt-get update -qq >&2 || die "apt-get update failed"
	VERSIONS=$(versions)
fi
KEY=$({
	sha256sum <"${BASH_SOURCE[0]}"
	echo "$VERSIONS"
	echo "$K8S_DIR"
	go env GOVERSION
} | sha256sum | cut -c1-16)
OUT=$CACHE/$KEY

if [[ -f $OUT/.complete ]]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [[ -f $OUT/.complete ]]; then
	echo "$OUT"
	exit 0
fi
log "building the node assets ($KEY) …"
TMP=$(mktemp -d "$CACHE/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# apt's sandbox user must be able to write the download dir.
chmod 0755 "$TMP"
mkdir -p "$TMP/debs" "$TMP/x" "$TMP/mirror/$ARCH" "$TMP/mirror/images"

# --- .debs: download only, extract into a scratch dir ---
chown _apt "$TMP/debs" 2>/dev/null || true
(cd "$TMP/debs" && apt-get download -qq "${PKGS[@]}" >&2) || die "apt-get download ${PKGS[*]} failed"
for d in "$TMP"/debs/*.deb; do dpkg-deb -x "$d" "$TMP/x"; done
M=$TMP/mirror/$ARCH
for b in containerd containerd-shim-runc-v2 ctr; do
	[[ -x $TMP/x/usr/bin/$b ]] || die "the containerd .deb has no usr/bin/$b"
	install -m 0755 "$TMP/x/usr/bin/$b" "$M/$b"
done
[[ -x $TMP/x/usr/sbin/runc ]] || die "the runc .deb has no usr/sbin/runc"
install -m 0755 "$TMP/x/usr/sbin/runc" "$M/runc"
[[ -x $TMP/x/usr/lib/cni/bridge ]] || die "the containernetworking-plugins .deb has no usr/lib/cni/bridge"
# Plugins at the top level of the tarball, as the profile expects.
tar -C "$TMP/x/usr/lib/cni" --owner=0 --group=0 -czf "$M/cni-plugins.tgz" .
install -m 0755 "$K8S_DIR/kubelet" "$M/kubelet"

# --- images ---
# docker_archive NAME REF ROOTDIR ENTRYPOINT_JSON: write images/NAME.tar (the
# `docker save` layout: manifest.json, config, one layer).
docker_archive() {
	local name=$1 ref=$2 root=$3 entry=$4 w layer_sum cfg cfg_sum
	w=$TMP/img-$name
	mkdir -p "$w"
	tar -C "$root" --owner=0 --group=0 --numeric-owner --sort=name --mtime=@0 -cf "$w/layer.tar" .
	layer_sum=$(sha256sum <"$w/layer.tar" | cut -d' ' -f1)
	mkdir -p "$w/out/$layer_sum"
	mv "$w/layer.tar" "$w/out/$layer_sum/layer.tar"
	cfg=$(printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":%s,"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"hack/node-assets.sh"}]}' \
		"$ARCH" "$entry" "$layer_sum")
	cfg_sum=$(printf '%s' "$cfg" | sha256sum | cut -d' ' -f1)
	printf '%s' "$cfg" >"$w/out/$cfg_sum.json"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfg_sum" "$ref" "$layer_sum" >"$w/out/manifest.json"
	# (member names without "./": importers match "manifest.json" literally)
	tar -C "$w/out" --owner=0 --group=0 --sort=name --mtime=@0 -cf "$TMP/mirror/images/$name.tar" \
		manifest.json "$cfg_sum.json" "$layer_sum"
	echo "$ref" >>"$TMP/mirror/images/names"
}

# pause: PID 1 of every pod sandbox. Exits on SIGINT/SIGTERM, reaps children.
mkdir -p "$TMP/pause/src" "$TMP/pause/root"
cat >"$TMP/pause/src/go.mod" <<'EOF'
module kpssh.local/pause

go 1.22
EOF
cat >"$TMP/pause/src/main.go" <<'EOF'
// Command pause is a pod sandbox's PID 1: it waits for a signal, reaping
// any child re-parented to it meanwhile.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
EOF
(cd "$TMP/pause/src" && CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$TMP/pause/root/pause" .) ||
	die "building the pause binary failed"
docker_archive pause "$PAUSE_IMAGE" "$TMP/pause/root" '["/pause"]'

# busybox: the static binary plus its applet links.
B=$TMP/busybox/root
mkdir -p "$B/bin" "$B/tmp" "$B/etc"
[[ -x $TMP/x/bin/busybox ]] || die "the busybox-static .deb has no bin/busybox"
install -m 0755 "$TMP/x/bin/busybox" "$B/bin/busybox"
while IFS= read -r a; do
	[[ -n $a && $a != busybox ]] && ln -sf busybox "$B/bin/$a"
done < <("$B/bin/busybox" --list)
echo 'root:x:0:0:root:/:/bin/sh' >"$B/etc/passwd"
chmod 1777 "$B/tmp"
docker_archive busybox "$BUSYBOX_IMAGE" "$B" '["/bin/sh"]'

echo "$VERSIONS" >"$TMP/mirror/VERSIONS"
touch "$TMP/mirror/.complete"
rm -rf "$OUT"
mv "$TMP/mirror" "$OUT"
# Older keys are dead weight (each ~150 MB), unless a world's hosts still
# mount them (hosts.sh records the mirror in /run/kpssh-world/<world>/mirror).
for d in "$CACHE"/*/; do
	d=${d%/}
	[[ $d != "$OUT" ]] || continue
	# grep reads the files itself: `cat … | grep -q` under pipefail fails
	# (and would delete a mirror in use) when grep exits before cat is done.
	if grep -qxF "$d" /run/kpssh-world/*/mirror 2>/dev/null; then continue; fi
	rm -rf --one-file-system "$d"
done
log "node assets ready in $OUT"
echo "$OUT"
