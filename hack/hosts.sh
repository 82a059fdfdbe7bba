#!/usr/bin/env bash
# hack/hosts.sh — a "world" of N SSH-reachable test hosts for kpssh.
#
# Each host is a systemd-nspawn container booting the image built by
# hack/rootfs.sh (read-only overlay lower layer), in its own network namespace
# wired to a per-world bridge, in its own cgroup in every hierarchy.
#
#   hosts.sh up N [--release R | --releases R1,R2,...]
#                        bring hosts h1..hN up (idempotent; adds missing hosts)
#                        booting Debian release R (bookworm, the default, or
#                        trixie); --releases gives hI release RI, hosts past
#                        the end of the list get its last entry
#   hosts.sh down        stop every host, remove bridge, cgroups, state (idempotent)
#   hosts.sh reboot I    stop + start host I, keeping its disk
#   hosts.sh wipe I      stop host I, give it a fresh disk, new host key + machine-id, start
#                        (a host keeps its release for life; reboot, stop/start too)
#   hosts.sh cut I       take host I's link down        hosts.sh heal I   bring it back
#   hosts.sh stop I      power host I off (SIGKILL of its PID 1, like a power cut; disk kept)
#   hosts.sh start I     boot a stopped host I again on the same disk
#   hosts.sh inventory   print the world as JSON        hosts.sh status   human summary
#   hosts.sh gc          down every world whose owner process (KPSSH_OWNER_PID) is gone
#
# Environment:
#   KPSSH_WORLD      world name (default "default"; [A-Za-z0-9_.-], ≤ 100 chars)
#   KPSSH_HOST_RELEASES  "up" without --release(s): the same as --releases
#   KPSSH_OWNER_PID  optional: pid owning the world (used by "gc")
#   KPSSH_CACHE      rootfs cache dir (see hack/rootfs.sh)
#   KPSSH_SSH_WAIT   seconds to wait for a host's sshd (default 120)
#   KPSSH_HOST_DISK  size of every host's own disk (default 16G; sparse)
#   KPSSH_MIRROR     optional, read by "up": a directory (hack/node-assets.sh)
#                    every host of the world sees read-only at /srv/kpssh-mirror;
#                    its images/*.tar are imported into containerd (k8s.io
#                    namespace) whenever containerd starts on a host — the test
#                    world's stand-in for a registry; nothing is pre-joined
#
# Every host has a disk of its own: an ext4 filesystem of KPSSH_HOST_DISK
# (a sparse file on a loop device) holding its writable layer (the overlay's
# upper dir over the image) and containerd's store. Its kubelet judges disk
# pressure by it, as a fleet machine's does by its disk, not by what is left
# on the machine running the world: a CI machine below 10 % free had every
# kubelet evicting its pods.
#
# Every host is stock, like a fleet's: sshd serves rsa, ecdsa and ed25519
# host keys (the inventory's hostKey/fingerprint and known_hosts: ed25519)
# on port 22 and on 2222 (altPort); root logs in with the world's key, and
# so does "admin" (altUser, passwordless sudo); /etc/hosts names every host
# the world can have, h<i>.<tag>.kpssh.test (dnsName), the lines of the
# world's hostsFile, which the machine's /etc/hosts never gets.
#
# Several worlds can exist at once: each has its own state dir
# /run/kpssh-world/<world>/, bridge kpb-<tag>, 10.231.<k>.0/24 subnet (bridge
# .1, host i at .(10+i)), and netns / veth / machine / cgroup names carrying
# <tag> (8 hex chars of sha256(world)). Each release's image (hack/rootfs.sh
# RELEASE) is the read-only lower layer of the world's hosts of that release.
set -euo pipefail
export KPSSH_PROG=hosts.sh
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

REPO=$(repo_root)
RUN_BASE=/run/kpssh-world
SUBNET_PREFIX=10.231
HOST_OFFSET=10
MAX_HOSTS=240
DEFAULT_RELEASE=bookworm
ALT_USER=admin # every host's second login (passwordless sudo) ...
ALT_UID=1000
ALT_PORT=2222 # ... and sshd's second port
SSH_WAIT=${KPSSH_SSH_WAIT:-120}
HOST_DISK=${KPSSH_HOST_DISK:-16G}
[[ $HOST_DISK =~ ^[1-9][0-9]*[MG]$ ]] || die "invalid KPSSH_HOST_DISK '$HOST_DISK' (a size such as 16G or 4096M)"
# Never inherit nspawn tuning knobs (USE_CGNS=0 breaks boot, UNIFIED_HIERARCHY=1 breaks pods).
for v in "${!SYSTEMD_NSPAWN_@}"; do unset "$v"; done

WORLD=${KPSSH_WORLD:-default}
[[ $WORLD =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$ ]] ||
	die "invalid KPSSH_WORLD '$WORLD' (use [A-Za-z0-9_.-], at most 100 chars)"
TAG=$(printf '%s' "$WORLD" | sha256sum | cut -c1-8)
STATE=$RUN_BASE/$WORLD
BRIDGE=kpb-$TAG
CG_NAME=kpssh-$TAG # per-world cgroup dir under the root of every hierarchy

# ---------------------------------------------------------------- naming --

machine_of() { echo "kpssh-$TAG-h$1"; }
netns_of() { echo "kpssh-$TAG-h$1"; }
veth_of() { echo "kpv$TAG$1"; } # machine-side end, a port of the bridge (≤15 chars)
mac_of() { printf '02:%s:%s:%s:%s:%02x\n' "${TAG:0:2}" "${TAG:2:2}" "${TAG:4:2}" "${TAG:6:2}" "$1"; }
ip_of() { echo "$SUBNET_PREFIX.$SUBNET_K.$((HOST_OFFSET + $1))"; }
hdir_of() { echo "$STATE/hosts/h$1"; }
disk_of() { echo "$STATE/hosts/h$1/disk"; } # the host's own filesystem: upper/, work/, containerd/
dns_of() { echo "h$1.$TAG.kpssh.test"; } # the host's name in the world's hosts file

# cgroup_roots prints every cgroup hierarchy mount point (v1 controllers,
# name=systemd and the unified v2 one).
mapfile -t CG_ROOTS < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts | sort -u)
cgroup_roots() {
	((${#CG_ROOTS[@]} == 0)) || printf '%s\n' "${CG_ROOTS[@]}"
}

# ------------------------------------------------------------ preflight --

preflight() {
	need_root
	need_cmd systemd-nspawn systemd-container
	need_cmd ip iproute2
	need_cmd ssh openssh-client
	need_cmd ssh-keygen openssh-client
	need_cmd unshare util-linux
	need_cmd setsid util-linux
	need_cmd flock util-linux
	need_cmd pgrep procps
	need_cmd sha256sum coreutils
	need_cmd mkfs.ext4 e2fsprogs
	need_cmd mountpoint util-linux
	[[ -e /dev/loop-control ]] || modprobe loop 2>/dev/null ||
		die "kernel has no loop device support (every host's disk is a loop-mounted file)"
	grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null ||
		die "kernel has no overlay filesystem support"
	[[ -n $(cgroup_roots) ]] || die "no cgroup hierarchies mounted under /sys/fs/cgroup"
	inotify_limits
}

# inotify limits are per user of the machine's user namespace, so every
# host's systemd, journald, containerd and kubelet (all root here) share one
# budget; Debian's default of 128 instances runs out with a few node-capable
# hosts (the kubelet then exits: "inotify_init: too many open files"). Only
# ever raised, never lowered (the values kind documents for the same reason).
inotify_limits() {
	local kv key want cur
	for kv in max_user_instances=8192 max_user_watches=524288; do
		key=/proc/sys/fs/inotify/${kv%%=*} want=${kv#*=}
		[[ -r $key ]] || continue
		cur=$(<"$key")
		if ((cur < want)); then
			echo "$want" >"$key" 2>/dev/null || die "cannot raise $key from $cur to $want (the hosts' kubelets need it)"
			log "raised $key: $cur -> $want"
		fi
	done
}

# ------------------------------------------------------------- world --

load_world() {
	[[ -f $STATE/world.env ]] || return 1
	# shellcheck source=/dev/null
	source "$STATE/world.env"
	[[ ${SUBNET_K:-} =~ ^[0-9]+$ ]] || die "corrupt $STATE/world.env"
	# (a world made before hosts had releases has one image: ROOTFS, bookworm)
	[[ -n ${ROOTFS_bookworm:-} || -z ${ROOTFS:-} ]] || ROOTFS_bookworm=$ROOTFS
}

# world_rootfs RELEASE prints the world's image dir for RELEASE (empty if it
# has none yet).
world_rootfs() {
	local v=ROOTFS_$1
	echo "${!v:-}"
}

# usable_rootfs DIR: DIR is a finished host image.
usable_rootfs() { [[ -n $1 && -x $1/lib/systemd/systemd && -f $1/etc/kpssh-image ]]; }

# alloc_subnet picks a free 10.231.<k>.0/24 (1..254) not used by another world
# or by any interface on the machine. Caller holds the global lock.
alloc_subnet() {
	local used k f
	used=" "
	for f in "$RUN_BASE"/*/world.env; do
		[[ -f $f ]] || continue
		k=$(sed -n 's/^SUBNET_K=//p' "$f")
		used+="$k "
	done
	local addrs
	addrs=$(ip -4 -o addr show 2>/dev/null | awk '{print $4}')
	for ((k = 1; k <= 254; k++)); do
		[[ $used == *" $k "* ]] && continue
		grep -q "^$SUBNET_PREFIX\.$k\." <<<"$addrs" && continue
		echo "$k"
		return 0
	done
	return 1
}

# create_world RELEASE...: the world (state, key, cgroups, bridge) with an
# image for each RELEASE its hosts boot.
create_world() {
	mkdir -p "$RUN_BASE"
	chmod 0755 "$RUN_BASE"
	local k rel rootfs images=()
	# An existing world keeps its image of a release (all its hosts of that
	# release boot the same one). Otherwise build (or reuse) the image before
	# taking locks: it can take minutes. (hack/rootfs.sh prunes a release's
	# images no world.env names any more.)
	load_world || true
	for rel in "$@"; do
		rootfs=$(world_rootfs "$rel")
		usable_rootfs "$rootfs" && continue
		# (rootfs.sh prints its own one-line reason on failure)
		rootfs=$("$REPO/hack/rootfs.sh" "$rel") || exit 1
		usable_rootfs "$rootfs" || die "hack/rootfs.sh $rel returned no usable rootfs ($rootfs)"
		images+=("ROOTFS_$rel=$rootfs")
	done
	{
		flock 8
		if ! load_world; then
			if ip link show "$BRIDGE" >/dev/null 2>&1; then
				die "bridge $BRIDGE of world '$WORLD' exists without state; run: KPSSH_WORLD=$WORLD $0 down"
			fi
			k=$(alloc_subnet) || die "no free $SUBNET_PREFIX.<k>.0/24 subnet left for a new world"
			CREATED_WORLD=1
			mkdir -p "$STATE/hosts"
			chmod 0700 "$STATE"
			cat >"$STATE/world.env.tmp" <<-EOF
				WORLD=$WORLD
				TAG=$TAG
				SUBNET_K=$k
				OWNER_PID=${KPSSH_OWNER_PID:-}
				OWNER_START=$( [[ -n ${KPSSH_OWNER_PID:-} ]] && proc_start "$KPSSH_OWNER_PID" )
			EOF
			mv "$STATE/world.env.tmp" "$STATE/world.env"
		fi
	} 8>"$RUN_BASE/.lock"
	# Record the new images (under the world's lock; replaced atomically:
	# hack/rootfs.sh reads every world.env to know which images are in use).
	if ((${#images[@]})); then
		local kv
		cp "$STATE/world.env" "$STATE/world.env.tmp"
		for kv in "${images[@]}"; do
			sed -i "/^${kv%%=*}=/d" "$STATE/world.env.tmp"
			echo "$kv" >>"$STATE/world.env.tmp"
		done
		mv "$STATE/world.env.tmp" "$STATE/world.env"
	fi
	load_world

	# Client key pair of the world (what kpssh / the tests log in with).
	if [[ ! -f $STATE/id_ed25519 ]]; then
		rm -f "$STATE/id_ed25519.pub"
		ssh-keygen -q -t ed25519 -N '' -C "kpssh-world-$WORLD" -f "$STATE/id_ed25519" >/dev/null
	fi
	chmod 0600 "$STATE/id_ed25519"
	touch "$STATE/known_hosts"
	# The world's names (every host it can have): in each host's /etc/hosts,
	# and for whoever resolves them on the machine (e.g. a controller in a
	# mount namespace of its own, this file bound over its /etc/hosts).
	if [[ ! -f $STATE/etc-hosts ]]; then
		local i
		# (ip_of and dns_of inline: no fork per line)
		for ((i = 1; i <= MAX_HOSTS; i++)); do
			printf '%s.%s.%s\th%s.%s.kpssh.test\n' "$SUBNET_PREFIX" "$SUBNET_K" $((HOST_OFFSET + i)) "$i" "$TAG"
		done >"$STATE/etc-hosts.tmp"
		mv "$STATE/etc-hosts.tmp" "$STATE/etc-hosts"
	fi

	# Per-world cgroup in every hierarchy.
	local root
	while IFS= read -r root; do
		mkdir -p "$root/$CG_NAME"
		cpuset_init "$root" "$root/$CG_NAME"
	done < <(cgroup_roots)

	# Bridge: fixed MAC, .1/24, no STP delay.
	if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
		ip link add "$BRIDGE" type bridge stp_state 0 forward_delay 0
		ip link set "$BRIDGE" address "$(mac_of 0)"
	fi
	# (grep on a here-string: `ip … | grep -q` under pipefail fails when grep
	# exits early and ip gets SIGPIPE)
	if ! grep -qwF "$SUBNET_PREFIX.$SUBNET_K.1/24" <<<"$(ip -4 -o addr show dev "$BRIDGE")"; then
		ip addr add "$SUBNET_PREFIX.$SUBNET_K.1/24" dev "$BRIDGE"
	fi
	ip link set "$BRIDGE" up
}

# cpuset_init ROOT DIR: a new v1 cpuset cgroup starts with empty cpus/mems and
# refuses tasks; copy them from the parent.
cpuset_init() {
	local root=$1 dir=$2
	[[ -f $dir/cpuset.cpus && ! -f $root/cgroup.controllers ]] || return 0
	[[ -n $(<"$dir/cpuset.cpus") ]] || cat "$(dirname "$dir")/cpuset.cpus" >"$dir/cpuset.cpus"
	[[ -n $(<"$dir/cpuset.mems") ]] || cat "$(dirname "$dir")/cpuset.mems" >"$dir/cpuset.mems"
}

proc_start() { # start time of a pid (field 22 of /proc/pid/stat), empty if gone
	local s a
	{ read -r s <"/proc/$1/stat"; } 2>/dev/null || return 0
	s=${s##*) }
	read -ra a <<<"$s"
	echo "${a[19]}"
}

# ------------------------------------------------------------- host --

host_indices() { # indices of the world's hosts, ascending
	local d
	for d in "$STATE"/hosts/h*; do
		[[ -f $d/host.env ]] && echo "${d##*/h}"
	done | sort -n
}

host_exists() { [[ -f $(hdir_of "$1")/host.env ]]; }

# host_release I prints the Debian release host I boots (recorded in its
# host.env when it was made; hosts made before releases existed: bookworm).
host_release() {
	local k v rel=""
	{
		while IFS='=' read -r k v; do
			[[ $k == RELEASE ]] && rel=$v
		done <"$(hdir_of "$1")/host.env"
	} 2>/dev/null || true
	echo "${rel:-$DEFAULT_RELEASE}"
}

# cmdline_has PID WORD: the process's argv contains WORD (no forks: this
# runs in polling loops).
cmdline_has() {
	local args=()
	{ mapfile -d '' args <"/proc/$1/cmdline"; } 2>/dev/null || return 1
	[[ " ${args[*]} " == *" $2 "* ]]
}

# nspawn_pid I prints the recorded nspawn pid if that process is still the
# nspawn of this host, else nothing.
nspawn_pid() {
	local f=$STATE/hosts/h$1/nspawn.pid p
	[[ -f $f ]] || return 0
	{ read -r p <"$f"; } 2>/dev/null || return 0
	[[ $p =~ ^[0-9]+$ ]] || return 0
	if cmdline_has "$p" "--machine=kpssh-$TAG-h$1"; then echo "$p"; fi
	return 0
}

# container_pid1 I prints the PID (machine view) of the host's PID 1: the
# child of nspawn (preferably the one running systemd).
container_pid1() {
	local np c first="" comm
	np=$(nspawn_pid "$1")
	[[ -n $np ]] || return 0
	for c in $(pgrep -P "$np" 2>/dev/null); do
		[[ -n $first ]] || first=$c
		{ read -r comm <"/proc/$c/comm"; } 2>/dev/null || continue
		if [[ $comm == systemd ]]; then
			echo "$c"
			return 0
		fi
	done
	[[ -z $first ]] || echo "$first"
}

# live_pid1 I prints the host's PID 1 now: the recorded one while it is
# still the running nspawn's child, else (the container rebooted itself and
# nspawn was started again) the current one, recorded anew. Empty when the
# host is not running.
live_pid1() {
	local d np p="" pp
	d=$STATE/hosts/h$1
	np=$(nspawn_pid "$1")
	[[ -n $np ]] || return 0
	{ read -r p <"$d/pid1"; } 2>/dev/null || true
	if [[ $p =~ ^[0-9]+$ ]] && pp=$(ps -o ppid= -p "$p" 2>/dev/null) && ((pp == np)); then
		echo "$p"
		return 0
	fi
	p=$(container_pid1 "$1")
	[[ -z $p ]] || echo "$p" >"$d/pid1"
	echo "$p"
}

# launcher_alive I: the recorded launcher process still exists and is not a
# zombie: either the launcher shell (machine name is one of its arguments),
# nspawn itself, or a process in the middle of exec'ing one into the other.
launcher_alive() {
	local f=$STATE/hosts/h$1/nspawn.pid p args=()
	[[ -f $f ]] || return 1
	{ read -r p <"$f"; } 2>/dev/null || return 1
	[[ $p =~ ^[0-9]+$ ]] || return 1
	[[ -n $(proc_state "$p") && $(proc_state "$p") != Z ]] || return 1
	{ mapfile -d '' args <"/proc/$p/cmdline"; } 2>/dev/null || return 1
	((${#args[@]} == 0)) && return 0 # exec in progress
	[[ " ${args[*]} " == *" kpssh-$TAG-h$1 "* || " ${args[*]} " == *" --machine=kpssh-$TAG-h$1 "* ]]
}

# seed_upper I: a fresh identity in the host's (empty) upper dir, and what
# makes the world a fleet rather than a lab: the three host keys of a stock
# Debian install (rsa, ecdsa, ed25519; the inventory pins ed25519), a second
# login ($ALT_USER, the world's key, passwordless sudo) and a second sshd
# port ($ALT_PORT; root@22 stays for the harness), and the world's host
# names in /etc/hosts (what a Job pod on the host network resolves).
seed_upper() {
	local i=$1 h up t rootfs bits
	h=$(hdir_of "$i")
	up=$(disk_of "$i")/upper
	install -d -m 0755 "$up/etc" "$up/etc/ssh" "$up/etc/ssh/sshd_config.d" "$up/etc/sudoers.d" "$up/home"
	install -d -m 0700 "$up/root" "$up/root/.ssh"
	# (rsa of 2048 bits, not Debian's 3072: a third of the keygen time, the
	# same negotiation)
	for t in ed25519 ecdsa rsa; do
		rm -f "$up/etc/ssh/ssh_host_${t}_key" "$up/etc/ssh/ssh_host_${t}_key.pub"
		bits=()
		[[ $t != rsa ]] || bits=(-b 2048)
		ssh-keygen -q -t "$t" "${bits[@]}" -N '' -C "root@h$i" -f "$up/etc/ssh/ssh_host_${t}_key" >/dev/null
	done
	cat >"$up/etc/ssh/sshd_config.d/20-kpssh-world.conf" <<-EOF
		# hack/hosts.sh: every key of a stock host (ed25519: 10-kpssh.conf) and a second port.
		HostKey /etc/ssh/ssh_host_rsa_key
		HostKey /etc/ssh/ssh_host_ecdsa_key
		Port 22
		Port $ALT_PORT
	EOF
	od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$up/etc/machine-id"
	echo >>"$up/etc/machine-id"
	chmod 0444 "$up/etc/machine-id"
	echo "h$i" >"$up/etc/hostname"
	{
		printf '127.0.0.1\tlocalhost\n127.0.1.1\th%s\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\tkpssh-bridge\n' \
			"$i" "$SUBNET_PREFIX.$SUBNET_K.1"
		cat "$STATE/etc-hosts"
	} >"$up/etc/hosts"
	install -m 0600 "$STATE/id_ed25519.pub" "$up/root/.ssh/authorized_keys"
	# The second login: the image's account files plus one user (uid 1000 is
	# free in both images), like a cloud image's default user.
	rootfs=$(world_rootfs "$(host_release "$i")")
	cp -p "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/shadow" "$rootfs/etc/gshadow" "$up/etc/"
	echo "$ALT_USER:x:$ALT_UID:$ALT_UID:kpssh test world login:/home/$ALT_USER:/bin/bash" >>"$up/etc/passwd"
	echo "$ALT_USER:x:$ALT_UID:" >>"$up/etc/group"
	echo "$ALT_USER:*:20000:0:99999:7:::" >>"$up/etc/shadow"
	echo "$ALT_USER:!::" >>"$up/etc/gshadow"
	install -d -m 0700 -o "$ALT_UID" -g "$ALT_UID" "$up/home/$ALT_USER" "$up/home/$ALT_USER/.ssh"
	install -m 0600 -o "$ALT_UID" -g "$ALT_UID" "$STATE/id_ed25519.pub" "$up/home/$ALT_USER/.ssh/authorized_keys"
	echo "$ALT_USER ALL=(ALL:ALL) NOPASSWD: ALL" >"$up/etc/sudoers.d/90-$ALT_USER"
	chmod 0440 "$up/etc/sudoers.d/90-$ALT_USER"
	# known_hosts of the world: replace this host's entry (its ed25519 key:
	# what OpenSSH then negotiates).
	local ip kh key
	ip=$(ip_of "$i")
	kh=$STATE/known_hosts
	{
		flock 7
		awk -v ip="$ip" -v alt="[$ip]:$ALT_PORT" '$1 != ip && $1 != alt' "$kh" >"$kh.tmp"
		key=$(cut -d' ' -f1,2 "$up/etc/ssh/ssh_host_ed25519_key.pub")
		printf '%s %s\n[%s]:%s %s\n' "$ip" "$key" "$ip" "$ALT_PORT" "$key" >>"$kh.tmp"
		mv "$kh.tmp" "$kh"
	} 7>"$STATE/.known_hosts.lock"
}

new_disk() { # I: (re)create the host's disk, its writable layer with a new identity
	local h d
	h=$(hdir_of "$1")
	d=$(disk_of "$1")
	umount_under "$d"
	rm -rf --one-file-system "$d" "$h/disk.img"
	mkdir -p "$h/merged"
	truncate -s "$HOST_DISK" "$h/disk.img"
	# No reserved blocks (the kubelet's thresholds are of what is free);
	# inode tables and journal left for the kernel, and noinit_itable on mount
	# keeps it from zeroing them: the file stays sparse (a few MB).
	mkfs.ext4 -q -F -m 0 -E lazy_itable_init=1,lazy_journal_init=1,nodiscard "$h/disk.img" >/dev/null ||
		die "h$1: mkfs.ext4 of its disk failed"
	mount_disk "$1"
	mkdir -p "$d/upper" "$d/work" "$d/containerd"
	chmod 0711 "$d/containerd"
	seed_upper "$1"
}

mount_disk() { # I: mount the host's disk (a no-op when it is)
	local h d
	h=$(hdir_of "$1")
	d=$(disk_of "$1")
	[[ -f $h/disk.img ]] || die "h$1 has no disk ($h/disk.img; a host made before disks of their own: down the world)"
	mountpoint -q "$d" && return 0
	mkdir -p "$d"
	mount -o loop,noatime,noinit_itable "$h/disk.img" "$d" || die "h$1: cannot mount its disk $h/disk.img"
}

net_up() { # I: netns + veth (fixed MAC) into the bridge, address, on-link route only
	local i=$1 ns veth ip
	ns=$(netns_of "$i")
	veth=$(veth_of "$i")
	ip=$(ip_of "$i")
	net_down "$i"
	ip netns add "$ns"
	# Two batches (root netns, host netns) instead of a dozen ip processes.
	ip -batch - <<-EOF
		link add $veth type veth peer name eth0 address $(mac_of "$i") netns $ns
		link set $veth master $BRIDGE
		link set $veth up
	EOF
	ip -n "$ns" -batch - <<-EOF
		link set lo up
		addr add $ip/24 dev eth0
		link set eth0 up
	EOF
	# A stale neighbour entry (e.g. a previous world's MAC) would blackhole the IP.
	ip neigh del "$ip" dev "$BRIDGE" 2>/dev/null || true
	rm -f "$(hdir_of "$i")/cut"
}

net_down() { # I
	local ns veth
	ns=$(netns_of "$1")
	veth=$(veth_of "$1")
	if [[ -e /sys/class/net/$veth ]]; then ip link del "$veth" 2>/dev/null || true; fi
	if [[ -e /run/netns/$ns ]]; then ip netns del "$ns" 2>/dev/null || true; fi
	return 0
}

host_cgroups() { # I: prints the host's cgroup dir in every hierarchy
	local root
	while IFS= read -r root; do echo "$root/$CG_NAME/h$1"; done < <(cgroup_roots)
}

start_host() { # I: launch (no wait); requires the disk to exist
	local i=$1 h machine ns cg root rel rootfs
	h=$(hdir_of "$i")
	machine=$(machine_of "$i")
	ns=$(netns_of "$i")
	[[ -z $(nspawn_pid "$i") ]] || return 0
	rel=$(host_release "$i")
	rootfs=$(world_rootfs "$rel")
	usable_rootfs "$rootfs" || die "h$i: the world has no usable $rel image (${rootfs:-none recorded}); run: KPSSH_WORLD=$WORLD $0 up $i"
	rm -rf "/run/systemd/nspawn/propagate/$machine"
	net_up "$i"
	local cgs=()
	while IFS= read -r root; do
		cg=$root/$CG_NAME/h$i
		mkdir -p "$cg"
		cpuset_init "$root" "$cg"
		cgs+=("$cg")
	done < <(cgroup_roots)
	rm -f "$h/nspawn.pid" "$h/launcher.pid" "$h/pid1"
	umount_under "$h/merged"
	mount_disk "$i"
	local mirror="" d
	d=$(disk_of "$i")
	if [[ -f $STATE/mirror ]]; then
		mirror=$(<"$STATE/mirror")
		[[ -d $mirror ]] || die "h$i: the world's mirror $mirror is gone"
		mirror_dropin "$d/upper"
	fi
	START_TS[$i]=$EPOCHREALTIME
	echo "=== start $(date -u +%FT%TZ)" >>"$h/console.log"
	# The launcher moves itself into the host's cgroups, mounts the overlay in a
	# private mount namespace (it vanishes with the host) and runs nspawn.
	# A reboot inside the container ends nspawn with 133: the launcher boots
	# it again on the same mount, like systemd-nspawn@.service's
	# RestartForceExitStatus=133. The pidfile names the running nspawn (each
	# boot's), so signals and nspawn_pid reach nspawn itself; any other
	# exit (stop's SIGKILL of PID 1, poweroff) ends the launcher with it.
	# Arguments are passed positionally: no quoting games.
	# shellcheck disable=SC2016
	setsid unshare --mount --propagation private -- bash -c '
		set -e
		pidfile=$1 lower=$2 upper=$3 work=$4 merged=$5 machine=$6 ns=$7 cdir=$8 mirror=$9
		shift 9
		for cg in "$@"; do echo $$ >"$cg/cgroup.procs"; done
		echo $$ >"$pidfile"
		echo $$ >"${pidfile%/*}/launcher.pid"
		mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$merged"
		nspawn=""
		trap '\''[ -z "$nspawn" ] || kill -TERM "$nspawn" 2>/dev/null; exit 143'\'' TERM
		trap '\''[ -z "$nspawn" ] || kill -INT "$nspawn" 2>/dev/null; exit 130'\'' INT
		while :; do
			systemd-nspawn --quiet --boot --directory="$merged" --machine="$machine" \
				--register=no --keep-unit --network-namespace-path="/run/netns/$ns" \
				--console=read-only --capability=all --bind=/dev/kmsg \
				--system-call-filter=@keyring --bind="$cdir:/var/lib/containerd" \
				${mirror:+"--bind-ro=$mirror:/srv/kpssh-mirror"} &
			nspawn=$!
			echo "$nspawn" >"$pidfile"
			rc=0
			wait "$nspawn" || rc=$?
			nspawn=""
			# (the reason when it had none to print: CI once saw an empty console)
			[ "$rc" = 133 ] || { echo "=== systemd-nspawn exited with status $rc"; exit "$rc"; }
			echo "=== reboot $(date -u +%FT%TZ)"
		done
	' kpssh-launch "$h/nspawn.pid" "$rootfs" "$d/upper" "$d/work" "$h/merged" "$machine" "$ns" "$d/containerd" \
		"$mirror" "${cgs[@]}" </dev/null >>"$h/console.log" 2>&1 6>&- 7>&- 8>&- 9>&- &
	LAUNCH_PID[$i]=$!
}

# mirror_dropin UPPER: a containerd drop-in (test world only, not a profile's)
# importing the mirror's images when containerd starts without them (a fresh
# or wiped store; like a registry's images already pulled, a rejoin finds
# them: importing again cost every start ≈ 0.2 s); kubelet orders after
# containerd, so the images exist before the first pod sandbox.
mirror_dropin() {
	local d=$1/etc/systemd/system/containerd.service.d
	install -d -m 0755 "$1/etc" "$1/etc/systemd" "$1/etc/systemd/system" "$d"
	cat >"$d/90-kpssh-test-images.conf" <<-'EOF'
		# Written by hack/hosts.sh (KPSSH_MIRROR): the test world's images.
		[Service]
		ExecStartPost=/bin/sh -c 'have=$$(ctr -n k8s.io images ls -q) || exit 1; while read -r n; do echo "$$have" | grep -qxF "$$n" || { for f in /srv/kpssh-mirror/images/*.tar; do ctr -n k8s.io images import "$$f" >/dev/null || exit 1; done; exit 0; }; done </srv/kpssh-mirror/images/names'
	EOF
}

ssh_opts() { # world client options shared with test/hostenv
	echo -F /dev/null -i "$STATE/id_ed25519" -o IdentitiesOnly=yes -o BatchMode=yes \
		-o StrictHostKeyChecking=yes -o "UserKnownHostsFile=$STATE/known_hosts" \
		-o GlobalKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout="${1:-2}"
}

ssh_ok() { # I [timeout]
	# shellcheck disable=SC2046
	timeout $((${2:-2} + 3)) ssh $(ssh_opts "${2:-2}") "root@$(ip_of "$1")" true </dev/null >/dev/null 2>&1
}

# wait_host I: wait until the host answers SSH, then record its PID 1 and
# check that it lives in the host's own cgroup on every hierarchy.
wait_host() {
	local i=$1 h deadline np pid1="" comm="" ip
	h=$(hdir_of "$i")
	ip=$(ip_of "$i")
	deadline=$((SECONDS + SSH_WAIT))
	while :; do
		np=$(nspawn_pid "$i")
		if [[ -z $np ]]; then
			# the launcher may not have written its pid / exec'ed nspawn yet
			if { [[ ! -f $h/nspawn.pid && -n ${LAUNCH_PID[$i]:-} && -n $(proc_state "${LAUNCH_PID[$i]}") &&
				$(proc_state "${LAUNCH_PID[$i]}") != Z ]] || launcher_alive "$i"; } && ((SECONDS < deadline)); then
				sleep 0.1
				continue
			fi
			host_fail "$i" "h$i: systemd-nspawn exited during boot"
		fi
		# Only try ssh once sshd listens in the host's netns (read from
		# /proc/<pid1>/net/tcp*: no fork, never blocks).
		# (resolve PID 1 until it is systemd: early on nspawn's child may
		# still be its intermediate process, outside the host's netns)
		[[ -n $pid1 && $comm == systemd ]] || {
			pid1=$(container_pid1 "$i")
			comm=""
			[[ -z $pid1 ]] || { read -r comm <"/proc/$pid1/comm"; } 2>/dev/null || true
		}
		if [[ $comm == systemd ]] && listens_on_22 "$pid1"; then
			ssh_ok "$i" 2 && break
		fi
		((SECONDS < deadline)) || host_fail "$i" "h$i: sshd not reachable at $ip after ${SSH_WAIT}s"
		sleep 0.1
	done
	pid1=$(container_pid1 "$i")
	[[ -n $pid1 ]] || host_fail "$i" "h$i: cannot find the container's PID 1 (child of nspawn $np)"
	check_cgroup "$i" "$pid1"
	echo "$pid1" >"$h/pid1"
	if [[ -n ${START_TS[$i]:-} ]]; then
		log "h$i ($(host_release "$i"), $(ip_of "$i")): ssh ready $(awk -v a="${START_TS[$i]}" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')s after launch"
	fi
}

# listens_on_22 PID: a TCP socket listens on port 22 in PID's network namespace.
listens_on_22() {
	local f _sl laddr _rem st _rest
	for f in "/proc/$1/net/tcp" "/proc/$1/net/tcp6"; do
		{
			while read -r _sl laddr _rem st _rest; do
				[[ $laddr == *:0016 && $st == 0A ]] && return 0
			done <"$f"
		} 2>/dev/null
	done
	return 1
}

# check_cgroup I PID: every line of /proc/PID/cgroup must be inside /kpssh-<tag>/hI.
check_cgroup() {
	local i=$1 pid=$2 want line path n=0
	want=/$CG_NAME/h$i
	while IFS= read -r line; do
		path=${line#*:*:}
		n=$((n + 1))
		[[ $path == "$want" || $path == "$want/"* ]] ||
			host_fail "$i" "h$i: PID 1 ($pid) is in cgroup '$line', not under $want"
	done <"/proc/$pid/cgroup"
	((n > 0)) || host_fail "$i" "h$i: cannot read /proc/$pid/cgroup"
}

host_fail() { # I MSG: one-line reason, then the host's console tail
	local h
	h=$(hdir_of "$1")
	echo "hosts.sh: error: $2" >&2
	if [[ -f $h/console.log ]]; then
		echo "--- last lines of $h/console.log:" >&2
		tail -n 30 "$h/console.log" >&2
	fi
	exit 1
}

# kill_host I: SIGKILL the host's PID 1 (its PID namespace dies with it).
kill_host() {
	local np pid1
	np=$(nspawn_pid "$1")
	[[ -n $np ]] || return 0
	# Remember nspawn by pid + start time: once it exits its cmdline is empty
	# but it lingers as a zombie until PID 1 reaps it.
	KILLED_NSPAWN[$1]="$np:$(proc_start "$np")"
	launcher_rec "$1"
	pid1=$(container_pid1 "$1")
	if [[ -n $pid1 ]]; then kill -KILL "$pid1" 2>/dev/null || true; fi
}

# launcher_rec I remembers host I's launcher (the shell that runs nspawn
# and boots it again after a reboot) by pid + start time: it exits with
# nspawn and, like nspawn before it, lingers as a zombie until PID 1 reaps it.
launcher_rec() {
	local lp
	{ read -r lp <"$STATE/hosts/h$1/launcher.pid"; } 2>/dev/null || return 0
	[[ $lp =~ ^[0-9]+$ ]] && cmdline_has "$lp" "kpssh-$TAG-h$1" || return 0
	KILLED_LAUNCHER[$1]="$lp:$(proc_start "$lp")"
}

# same_proc PID START: the process PID still exists (maybe as a zombie) and
# is the one that started at START.
same_proc() { [[ -n $2 && $(proc_start "$1") == "$2" ]]; }

# reap_host I: after kill_host, wait for nspawn (bounded), kill whatever is
# left in the host's cgroups, drop them depth-first, then the netns, veth
# and nspawn leftovers. Keeps the disk.
reap_host() {
	local i=$1 h np machine p tries left d
	h=$(hdir_of "$i")
	machine=$(machine_of "$i")
	local rec=${KILLED_NSPAWN[$i]:-} st=""
	if [[ -z $rec ]]; then
		np=$(nspawn_pid "$i")
		[[ -z $np ]] || rec="$np:$(proc_start "$np")"
	fi
	if [[ -n $rec ]]; then
		np=${rec%%:*}
		st=${rec#*:}
		# nspawn exits once the container's PID namespace is gone (~0.2 s);
		# the machine's PID 1 reaps it later (see wait_reaped).
		for ((tries = 0; tries < 200; tries++)); do
			same_proc "$np" "$st" && [[ $(proc_state "$np") != Z ]] || break
			if ((tries == 100)); then
				log "h$i: nspawn $np did not exit after its PID 1 was killed; killing it"
				kill -KILL "$np" 2>/dev/null || true
			fi
			sleep 0.05
		done
		if same_proc "$np" "$st"; then
			[[ $(proc_state "$np") == Z ]] || log "warning: h$i: nspawn $np still running"
			ZOMBIES+=("$np:$st")
		fi
	fi
	unset "KILLED_NSPAWN[$i]"
	[[ -n ${KILLED_LAUNCHER[$i]:-} ]] || launcher_rec "$i"
	rec=${KILLED_LAUNCHER[$i]:-}
	if [[ -n $rec ]]; then
		np=${rec%%:*}
		st=${rec#*:}
		for ((tries = 0; tries < 100; tries++)); do
			same_proc "$np" "$st" && [[ $(proc_state "$np") != Z ]] || break
			((tries == 50)) && kill -KILL "$np" 2>/dev/null
			sleep 0.05
		done
		same_proc "$np" "$st" && ZOMBIES+=("$np:$st")
	fi
	unset "KILLED_LAUNCHER[$i]"
	# All cgroup dirs of the host, in every hierarchy, children before
	# parents (reverse lexical order of a recursive glob; no forks).
	local cgs=() dirs=() all=()
	mapfile -t cgs < <(host_cgroups "$i")
	shopt -s globstar nullglob
	for d in "${cgs[@]}"; do
		[[ -d $d ]] && all+=("$d"/**/)
	done
	shopt -u globstar nullglob
	for ((d = ${#all[@]} - 1; d >= 0; d--)); do dirs+=("${all[d]%/}"); done
	# Whatever is still in the host's cgroups was started by this host.
	local procs=()
	for ((tries = 0; tries < 100; tries++)); do
		left=0
		for d in "${dirs[@]}"; do
			{ mapfile -t procs <"$d/cgroup.procs"; } 2>/dev/null || continue
			for p in "${procs[@]}"; do
				[[ -n $p ]] || continue
				left=1
				kill -KILL "$p" 2>/dev/null || true
			done
		done
		((left)) || break
		sleep 0.05
	done
	for ((tries = 0; tries < 100; tries++)); do
		left=()
		for d in "${dirs[@]}"; do [[ -d $d ]] && left+=("$d"); done
		((${#left[@]})) || break
		rmdir "${left[@]}" 2>/dev/null || true
		for d in "${left[@]}"; do [[ -d $d ]] && { sleep 0.05; continue 2; }; done
		break
	done
	for d in "${cgs[@]}"; do
		if [[ -d $d ]]; then log "warning: could not remove cgroup $d"; fi
	done
	umount_under "$h/merged"
	net_down "$i"
	rm -rf "/run/systemd/nspawn/propagate/$machine" "/run/systemd/nspawn/unix-export/$machine"
	rm -f "$h/nspawn.pid" "$h/launcher.pid" "$h/pid1" "$h/cut"
}

# proc_state PID: the state letter of a process (R, S, D, Z, ...), empty if gone.
proc_state() {
	local s a
	{ read -r s <"/proc/$1/stat"; } 2>/dev/null || return 0
	s=${s##*) }
	read -ra a <<<"$s"
	echo "${a[0]}"
}

# wait_reaped: wait (bounded) until the exited nspawn processes are reaped
# by the machine's PID 1, so nothing of the world is left once down returns.
wait_reaped() {
	local z tries
	for z in "${ZOMBIES[@]}"; do
		for ((tries = 0; tries < 100; tries++)); do
			same_proc "${z%%:*}" "${z#*:}" || break
			sleep 0.05
		done
		same_proc "${z%%:*}" "${z#*:}" && log "warning: exited nspawn (or its launcher) ${z%%:*} not reaped by PID 1 yet"
	done
	ZOMBIES=()
}

# stop_hosts I...: stop hosts (in parallel: kill all, then reap each).
stop_hosts() {
	local i
	for i in "$@"; do kill_host "$i"; done
	for i in "$@"; do reap_host "$i"; done
}

# ------------------------------------------------------------ commands --

lock_world() { # hold the world's lock until exit (fd 6; never passed to hosts)
	mkdir -p "$STATE"
	exec 6>"$STATE/.lock"
	flock 6
}

CREATED_WORLD=0
declare -A START_TS=()
declare -A KILLED_NSPAWN=()
declare -A KILLED_LAUNCHER=()
declare -A LAUNCH_PID=()
ZOMBIES=()
CREATED_HOSTS=()
STARTED_HOSTS=()

up_cleanup() {
	local rc=$? i
	trap - EXIT
	if ((rc != 0)); then
		# (silent: the reason was already printed as one line)
		if ((CREATED_WORLD)); then
			down_world >/dev/null 2>&1 || true
		else
			stop_hosts "${STARTED_HOSTS[@]}" >/dev/null 2>&1 || true
			for i in "${CREATED_HOSTS[@]}"; do
				umount_under "$(hdir_of "$i")"
				rm -rf --one-file-system "$(hdir_of "$i")"
			done
		fi
	fi
	exit "$rc"
}

# up_releases N LIST: set REL[1..N], the release of each host: the existing
# hosts' own, the others' from LIST (comma-separated, entry I for hI, the last
# entry for hosts past its end; empty: bookworm). A LIST naming another
# release for an existing host is an error: a host keeps its release.
declare -A REL=()
up_releases() {
	local n=$1 list=$2 i want have wants=()
	[[ -z $list ]] || IFS=, read -ra wants <<<"$list"
	for want in "${wants[@]}"; do
		[[ $want =~ ^[a-z][a-z0-9]*$ ]] || die "bad release '$want' in '$list' (a Debian codename such as bookworm or trixie)"
	done
	for ((i = 1; i <= n; i++)); do
		want=$DEFAULT_RELEASE
		if ((${#wants[@]})); then
			want=${wants[i <= ${#wants[@]} ? i - 1 : ${#wants[@]} - 1]}
		fi
		if host_exists "$i"; then
			have=$(host_release "$i")
			[[ -z $list || $have == "$want" ]] ||
				die "h$i runs $have, not $want: a host keeps its release (down the world, or use another KPSSH_WORLD)"
			want=$have
		fi
		REL[$i]=$want
	done
}

cmd_up() {
	local n=${1:-} list=${KPSSH_HOST_RELEASES:-}
	[[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= MAX_HOSTS)) || die "usage: hosts.sh up N [--release R | --releases R1,R2,...] (N: 1..$MAX_HOSTS)"
	shift
	while (($#)); do
		case $1 in
		--release | --releases)
			[[ -n ${2:-} ]] || die "usage: hosts.sh up N $1 RELEASE[,...]"
			[[ $1 == --releases || $2 != *,* ]] || die "--release takes one release; use --releases R1,R2,... for one per host"
			list=$2
			shift 2
			;;
		--release=* | --releases=*)
			set -- "${1%%=*}" "${1#*=}" "${@:2}"
			;;
		*) die "usage: hosts.sh up N [--release R | --releases R1,R2,...] (unknown argument '$1')" ;;
		esac
	done
	preflight
	[[ -d $STATE ]] || CREATED_WORLD=1
	trap up_cleanup EXIT
	trap 'exit 130' INT TERM
	lock_world
	up_releases "$n" "$list"
	create_world $(printf '%s\n' "${REL[@]}" | sort -u)
	if [[ -n ${KPSSH_MIRROR:-} ]]; then
		[[ $KPSSH_MIRROR == /* && -d $KPSSH_MIRROR ]] || die "KPSSH_MIRROR must be an existing absolute directory, got '$KPSSH_MIRROR'"
		echo "$KPSSH_MIRROR" >"$STATE/mirror"
	fi
	local i pending=() disks=()
	for ((i = 1; i <= n; i++)); do
		if host_exists "$i" && [[ -n $(nspawn_pid "$i") ]]; then
			[[ -f $(hdir_of "$i")/cut ]] && continue # deliberately cut: leave it alone
			ssh_ok "$i" 2 && [[ -f $(hdir_of "$i")/pid1 ]] && continue
			log "h$i: running but not answering SSH; restarting it"
			stop_hosts "$i"
		fi
		if ! host_exists "$i"; then
			CREATED_HOSTS+=("$i")
			mkdir -p "$(hdir_of "$i")"
			printf 'INDEX=%s\nRELEASE=%s\n' "$i" "${REL[$i]}" >"$(hdir_of "$i")/host.env"
			# New disks side by side: their rsa host keys are most of the cost.
			new_disk "$i" 6>&- &
			disks+=($!)
		fi
		pending+=("$i")
	done
	for i in "${disks[@]}"; do wait "$i" || die "making a new host disk failed"; done
	for i in "${pending[@]}"; do
		STARTED_HOSTS+=("$i")
		start_host "$i"
	done
	for i in "${pending[@]}"; do wait_host "$i"; done
	trap - EXIT
}

down_world() {
	local d i root all=()
	if [[ -d $STATE/hosts ]]; then
		for d in "$STATE"/hosts/h*; do
			[[ -d $d ]] || continue
			i=${d##*/h}
			[[ $i =~ ^[0-9]+$ ]] && all+=("$i")
		done
	fi
	# Sweep by name too: covers a partial up or lost state.
	local ns
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^kpssh-${TAG}-h[0-9]*$" || true); do
		i=${ns##*-h}
		[[ " ${all[*]} " == *" $i "* ]] || all+=("$i")
	done
	((${#all[@]} == 0)) || stop_hosts "${all[@]}"
	for d in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^kpv${TAG}[0-9]*$" || true); do
		ip link del "$d" 2>/dev/null || true
	done
	ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
	while IFS= read -r root; do
		[[ -d $root/$CG_NAME ]] || continue
		for d in "$root/$CG_NAME"/h*/; do
			[[ -d $d ]] || continue
			i=${d%/}
			i=${i##*/h}
			[[ $i =~ ^[0-9]+$ ]] && stop_hosts "$i"
		done
		find "$root/$CG_NAME" -depth -type d -exec rmdir {} + 2>/dev/null || true
		[[ -d $root/$CG_NAME ]] && log "warning: could not remove cgroup $root/$CG_NAME"
	done < <(cgroup_roots)
	wait_reaped
	umount_under "$STATE"
	# Releasing the subnet = removing world.env, under the allocation lock.
	if [[ -d $RUN_BASE ]]; then
		{
			flock 8
			rm -rf --one-file-system "$STATE"
		} 8>"$RUN_BASE/.lock"
	fi
	return 0
}

cmd_down() {
	need_root
	preflight_soft
	if [[ -d $STATE ]]; then
		lock_world
		load_world || true
	fi
	down_world
}

preflight_soft() { # what down/status need; never fails on missing nspawn
	need_cmd ip iproute2
	need_cmd pgrep procps
	need_cmd flock util-linux
}

need_host() { # I
	local i=${1:-}
	[[ $i =~ ^[0-9]+$ ]] || die "usage: hosts.sh $CMD I (host index)"
	load_world || die "world '$WORLD' is not up"
	host_exists "$i" || die "world '$WORLD' has no host h$i"
}

cmd_reboot() {
	preflight
	need_host "$@"
	lock_world
	stop_hosts "$1"
	start_host "$1"
	wait_host "$1"
}

cmd_wipe() {
	preflight
	need_host "$@"
	lock_world
	stop_hosts "$1"
	new_disk "$1"
	start_host "$1"
	wait_host "$1"
}

cmd_stop() {
	preflight
	need_host "$@"
	lock_world
	stop_hosts "$1"
}

cmd_start() {
	preflight
	need_host "$@"
	lock_world
	[[ -z $(nspawn_pid "$1") ]] || die "h$1 is already running (hosts.sh reboot $1 restarts it)"
	start_host "$1"
	wait_host "$1"
}

cmd_cut() {
	need_root
	need_host "$@"
	[[ -n $(nspawn_pid "$1") ]] || die "h$1 is not running"
	ip link set "$(veth_of "$1")" down
	touch "$(hdir_of "$1")/cut"
}

cmd_heal() {
	need_root
	need_host "$@"
	[[ -n $(nspawn_pid "$1") ]] || die "h$1 is not running"
	ip link set "$(veth_of "$1")" up
	rm -f "$(hdir_of "$1")/cut"
}

# Inventory values need no JSON escaping: world names are [A-Za-z0-9_.-],
# paths are built from them, keys are base64, releases [a-z0-9].
cmd_inventory() {
	load_world || die "world '$WORLD' is not up"
	local d up i first=1 pub fp pid1 cut t keys
	printf '{"world":"%s","tag":"%s","stateDir":"%s","bridge":"%s","bridgeAddress":"%s","clientKey":"%s","knownHosts":"%s","hostsFile":"%s","cgroup":"%s","hosts":[' \
		"$WORLD" "$TAG" "$STATE" "$BRIDGE" "$SUBNET_PREFIX.$SUBNET_K.1" "$STATE/id_ed25519" "$STATE/known_hosts" "$STATE/etc-hosts" "/$CG_NAME"
	for i in $(host_indices); do
		d=$(hdir_of "$i")
		up=$(disk_of "$i")/upper
		pub="" fp="" pid1=0 cut=false keys=""
		{ read -r pub <"$up/etc/ssh/ssh_host_ed25519_key.pub"; } 2>/dev/null || true
		pub=${pub% *} # drop the comment
		fp=$(ssh-keygen -lf "$up/etc/ssh/ssh_host_ed25519_key.pub" 2>/dev/null | awk '{print $2}' || true)
		for t in rsa ecdsa ed25519; do
			[[ -f $up/etc/ssh/ssh_host_${t}_key.pub ]] || continue # (a host made before stock keys)
			{ read -r t <"$up/etc/ssh/ssh_host_${t}_key.pub"; } 2>/dev/null || continue
			keys+="${keys:+,}\"${t% *}\""
		done
		pid1=$(live_pid1 "$i")
		pid1=${pid1:-0}
		[[ -f $d/cut ]] && cut=true
		((first)) || printf ','
		first=0
		printf '{"name":"h%s","index":%d,"machine":"kpssh-%s-h%s","address":"%s","dnsName":"%s","port":22,"user":"root","altPort":%d,"altUser":"%s","hostKey":"%s","fingerprint":"%s","hostKeys":[%s],"netns":"kpssh-%s-h%s","veth":"kpv%s%s","mac":"%s","cgroup":"/%s/h%s","pid":%d,"cut":%s,"release":"%s"}' \
			"$i" "$i" "$TAG" "$i" "$SUBNET_PREFIX.$SUBNET_K.$((HOST_OFFSET + i))" "$(dns_of "$i")" "$ALT_PORT" "$ALT_USER" "$pub" "$fp" "$keys" "$TAG" "$i" "$TAG" "$i" \
			"$(mac_of "$i")" "$CG_NAME" "$i" "$pid1" "$cut" "$(host_release "$i")"
	done
	printf ']}\n'
}

cmd_status() {
	if ! load_world; then
		echo "world '$WORLD': down"
		return 0
	fi
	echo "world '$WORLD' tag=$TAG bridge=$BRIDGE $SUBNET_PREFIX.$SUBNET_K.1/24 state=$STATE"
	local d i st
	for i in $(host_indices); do
		d=$(hdir_of "$i")
		host_exists "$i" || continue
		if [[ -z $(nspawn_pid "$i") ]]; then
			st=stopped
		elif [[ -f $d/cut ]]; then
			st="running, cut"
		elif ssh_ok "$i" 2; then
			st="running, ssh ok"
		else
			st="running, ssh FAILING"
		fi
		printf '  h%-3s %-15s %-24s %-9s nspawn=%-7s pid1=%-7s %s\n' "$i" "$(ip_of "$i")" "$(machine_of "$i")" \
			"$(host_release "$i")" "$(nspawn_pid "$i")" "$(live_pid1 "$i")" "$st"
	done
}

cmd_gc() { # down every world whose recorded owner process is gone
	need_root
	local f w op os
	for f in "$RUN_BASE"/*/world.env; do
		[[ -f $f ]] || continue
		w=$(sed -n 's/^WORLD=//p' "$f")
		op=$(sed -n 's/^OWNER_PID=//p' "$f")
		os=$(sed -n 's/^OWNER_START=//p' "$f")
		[[ -n $op ]] || continue
		if [[ -d /proc/$op && $(proc_start "$op") == "$os" ]]; then continue; fi
		log "world '$w': owner $op is gone; tearing it down"
		KPSSH_WORLD=$w bash "${BASH_SOURCE[0]}" down || true
	done
}

CMD=${1:-}
shift || true
case $CMD in
up) cmd_up "$@" ;;
down) cmd_down ;;
reboot) cmd_reboot "$@" ;;
wipe) cmd_wipe "$@" ;;
stop) cmd_stop "$@" ;;
start) cmd_start "$@" ;;
cut) cmd_cut "$@" ;;
heal) cmd_heal "$@" ;;
inventory) cmd_inventory ;;
status) cmd_status ;;
gc) cmd_gc ;;
*)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
