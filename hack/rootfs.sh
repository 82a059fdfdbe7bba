#!/usr/bin/env bash
# hack/rootfs.sh — build (once) the Debian root filesystem used as the
# read-only lower layer of every kpssh test host (see hack/hosts.sh).
#
#   hack/rootfs.sh [RELEASE]  build if needed; print the rootfs dir (only stdout line)
#
# RELEASE is the Debian release of the image: bookworm (Debian 12, the
# default) or trixie (Debian 13). Both come from the machine's Debian mirror
# (hack/lib/apt.sh maps its sources to the release).
#
# The result lives in ${KPSSH_CACHE:-<repo>/.cache}/rootfs/<key>/ where <key>
# hashes the release, the apt sources, this script and hack/host-image/, so
# editing either of them rebuilds. The build happens in a temp dir that is
# renamed into place only when complete; concurrent callers wait on a lock and
# reuse the result. Older images of the same release are removed unless a
# world still boots them (/run/kpssh-world/*/world.env).
#
# Environment: KPSSH_CACHE (cache dir), KPSSH_ROOTFS_LOG (build log path).
set -euo pipefail
export KPSSH_PROG=rootfs.sh
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"

REPO=$(repo_root)
HACK=$REPO/hack
IMAGE=$HACK/host-image/rootfs
RELEASES=(bookworm trixie)
SUITE=${1:-bookworm}
[[ " ${RELEASES[*]} " == *" $SUITE "* ]] || die "unsupported release '$SUITE' (supported: ${RELEASES[*]})"
INCLUDE=python3,openssh-server,iproute2,procps,sudo,ca-certificates
EXTRA_PKGS=(systemd systemd-sysv dbus iptables kmod)
# Units that are useless or slow inside a container; masked in the image.
MASK_UNITS=(
	console-getty.service getty@tty1.service getty-static.service
	systemd-networkd-wait-online.service systemd-udevd.service
	systemd-udev-trigger.service systemd-udev-settle.service
	apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer
	e2scrub_all.timer e2scrub_reap.service fstrim.timer
	systemd-timesyncd.service
	modprobe@.service systemd-modules-load.service
	dev-hugepages.mount sys-kernel-debug.mount sys-kernel-tracing.mount
	sys-kernel-config.mount sys-fs-fuse-connections.mount
	systemd-update-utmp.service systemd-update-utmp-runlevel.service
	sshd-keygen.service
)

need_root
need_cmd debootstrap debootstrap
need_cmd chroot coreutils
need_cmd sha256sum coreutils
need_cmd flock util-linux
need_cmd mount mount

MIRROR=$(debian_mirror)
# The image's apt sources: the machine's mirrors for SUITE (and its -updates
# and -security suites).
SOURCES=$(debian_source_lines_as "$SUITE")
[[ -n $SOURCES ]] || SOURCES="deb $MIRROR $SUITE main"

# image_key hashes everything that determines the image's content.
image_key() {
	(
		cd "$HACK"
		{
			echo "suite=$SUITE include=$INCLUDE extra=${EXTRA_PKGS[*]}"
			echo "$SOURCES"
			find rootfs.sh host-image -type f -print0 | LC_ALL=C sort -z |
				while IFS= read -r -d '' f; do
					printf '%s %s ' "$f" "$(stat -c %a "$f")"
					sha256sum <"$f"
				done
		} | sha256sum | cut -c1-16
	)
}

CACHE=${KPSSH_CACHE:-$REPO/.cache}
BASE=$CACHE/rootfs
KEY=$(image_key)
DEST=$BASE/$KEY
MARKER=etc/kpssh-image

is_done() { [[ -f $DEST/$MARKER ]] && grep -qx "key=$KEY" "$DEST/$MARKER"; }

# prune_release: remove the cached images of SUITE other than DEST that no
# world boots (a world records its images as ROOTFS*=<dir> in its
# world.env). Images of other releases are left alone. Skipped while the
# cache is locked (a build is under way).
prune_release() {
	local d used suite
	used=$(sed -n 's/^ROOTFS[A-Za-z0-9_]*=//p' /run/kpssh-world/*/world.env 2>/dev/null || true)
	(
		flock -n 9 || exit 0
		for d in "$BASE"/*/; do
			d=${d%/}
			[[ $d != "$DEST" && -f $d/$MARKER ]] || continue
			suite=$(sed -n 's/^suite=//p' "$d/$MARKER")
			[[ ${suite:-bookworm} == "$SUITE" ]] || continue
			grep -qxF "$d" <<<"$used" && continue
			[[ -z $(mounts_under "$d") ]] || continue
			log "pruning unused $SUITE host image $d"
			rm -rf --one-file-system "${d:?}"
		done
	) 9>"$BASE/.lock"
}

if is_done; then
	prune_release
	echo "$DEST"
	exit 0
fi

mkdir -p "$BASE"
exec 9>"$BASE/.lock"
flock 9
if is_done; then # someone else built it while we waited
	echo "$DEST"
	exit 0
fi
# Holding the lock, any leftover build dir belongs to a build that died
# (e.g. SIGKILL): unmount what debootstrap may have left mounted, remove it.
for stale in "$BASE"/.build-*/; do
	[[ -d $stale ]] || continue
	log "removing stale build dir $stale"
	umount_under "${stale%/}"
	rm -rf --one-file-system "${stale%/}"
done
if [[ -e $DEST ]]; then
	log "removing incomplete image dir $DEST"
	umount_under "$DEST"
	rm -rf --one-file-system "$DEST"
fi

TMP=$BASE/.build-$KEY-$$
LOGF=${KPSSH_ROOTFS_LOG:-$BASE/.build-$KEY.log}
: >"$LOGF"
cleanup() {
	local rc=$?
	if [[ -n ${TMP:-} && -d $TMP ]]; then
		umount_under "$TMP"
		# --one-file-system: never descend into anything still mounted.
		rm -rf --one-file-system "$TMP"
	fi
	if [[ $rc -ne 0 ]]; then
		echo "rootfs.sh: build failed; last lines of $LOGF:" >&2
		tail -n 25 "$LOGF" >&2 || true
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
log "building $SUITE rootfs $KEY from $MIRROR (log: $LOGF)"

# Reuse a .deb cache (one per release) between builds so edits to the image
# rebuild fast.
DEBCACHE=$BASE/.debs/$SUITE
mkdir -p "$DEBCACHE"

debootstrap --variant=minbase --include="$INCLUDE" --cache-dir="$DEBCACHE" \
	"$SUITE" "$TMP" "$MIRROR" >>"$LOGF" 2>&1 ||
	die "debootstrap failed (see $LOGF)"

# Never let package scripts start services, inside the chroot either.
printf '#!/bin/sh\nexit 101\n' >"$TMP/usr/sbin/policy-rc.d"
chmod 0755 "$TMP/usr/sbin/policy-rc.d"
mount -t proc proc "$TMP/proc"
in_chroot() { chroot "$TMP" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
# The chroot resolves the mirror with the machine's resolver config.
cp -L /etc/resolv.conf "$TMP/etc/resolv.conf" 2>/dev/null || true
printf '%s\n' "$SOURCES" >"$TMP/etc/apt/sources.list"
cp "$DEBCACHE"/*.deb "$TMP/var/cache/apt/archives/" 2>/dev/null || true
in_chroot apt-get -o Acquire::Retries=3 update >>"$LOGF" 2>&1 || die "apt-get update in the chroot failed (see $LOGF)"
in_chroot apt-get -o Acquire::Retries=3 install -y --no-install-recommends "${EXTRA_PKGS[@]}" >>"$LOGF" 2>&1 ||
	die "apt-get install ${EXTRA_PKGS[*]} in the chroot failed (see $LOGF)"
cp -n "$TMP"/var/cache/apt/archives/*.deb "$DEBCACHE/" 2>/dev/null || true
in_chroot apt-get clean >>"$LOGF" 2>&1
umount_under "$TMP"
[[ -z $(mounts_under "$TMP") ]] || die "cannot unmount $(mounts_under "$TMP" | head -1)"

# kpssh files (units, scripts, sshd drop-in, ...).
cp -a --no-preserve=ownership "$IMAGE/." "$TMP/"
chmod 0755 "$TMP"/usr/local/sbin/kpssh-*
systemctl --root="$TMP" enable kpssh-cgroup-rw.service kpssh-sysctl-shadow.service kpssh-sysfs-net.service ssh.service >>"$LOGF" 2>&1 ||
	die "enabling units failed (see $LOGF)"
for u in "${MASK_UNITS[@]}"; do
	systemctl --root="$TMP" mask "$u" >>"$LOGF" 2>&1 || die "masking $u failed (see $LOGF)"
done
ln -sf /lib/systemd/system/multi-user.target "$TMP/etc/systemd/system/default.target"

# Per-host identity is seeded by hosts.sh into each host's overlay upper dir;
# the image must not carry one (else every host shares keys / ids).
rm -f "$TMP"/etc/ssh/ssh_host_*
: >"$TMP/etc/machine-id"
rm -f "$TMP/var/lib/dbus/machine-id"
echo localhost >"$TMP/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$TMP/etc/hosts"
: >"$TMP/etc/resolv.conf"
rm -f "$TMP/usr/sbin/policy-rc.d"
rm -rf "$TMP"/var/lib/apt/lists/* "$TMP"/var/log/*.log "$TMP"/var/log/apt/* "$TMP"/tmp/*

# Sanity checks: a broken image must not be published.
for f in lib/systemd/systemd usr/sbin/sshd usr/bin/python3 usr/sbin/iptables sbin/modprobe \
	etc/systemd/system/sysinit.target.wants/kpssh-cgroup-rw.service \
	etc/systemd/system/sysinit.target.wants/kpssh-sysctl-shadow.service \
	etc/systemd/system/sysinit.target.wants/kpssh-sysfs-net.service \
	etc/systemd/system/multi-user.target.wants/ssh.service; do
	[[ -e $TMP/$f || -L $TMP/$f ]] || die "image check failed: /$f missing"
done
if compgen -G "$TMP/etc/ssh/ssh_host_*" >/dev/null; then die "image check failed: host keys present"; fi

printf 'key=%s\nsuite=%s\nbuilt=%s\n' "$KEY" "$SUITE" "$(date -u +%FT%TZ)" >"$TMP/etc/kpssh-image.tmp"
grep -x "key=$KEY" "$TMP/etc/kpssh-image.tmp" >/dev/null
mv "$TMP/etc/kpssh-image.tmp" "$TMP/$MARKER"
mv -T "$TMP" "$DEST"
TMP=
log "built $DEST in $(($(date +%s) - start))s"
exec 9>&-
prune_release
echo "$DEST"
