# shellcheck shell=bash
# Private podman/buildah configuration for kpssh's images (hack/runner-image.sh
# and the tests that run the images). Source it after lib/common.sh.
#
# The machine's /etc/containers is never edited: everything goes through the
# CONTAINERS_* variables that containers_env exports.

# containers_env CACHE writes (idempotently) the config under CACHE/containers
# and exports CONTAINERS_CONF, CONTAINERS_STORAGE_CONF and
# CONTAINERS_REGISTRIES_CONF pointing at it.
#
# Why each setting (TESTBED §5):
#   runtime = runc       crun refuses this machine's v1/v2 hybrid cgroup layout
#   cgroupfs, file logs  PID 1 is not systemd (no systemd cgroup manager, no journald)
#   default_ulimits      podman's defaults ask for more open files and processes
#                        than root may have here (no CAP_SYS_RESOURCE), and a
#                        --ulimit flag replaces the whole list: nofile = our hard
#                        limit; nproc ≤ 32768 because podman/buildah lower their
#                        own hard nproc limit to that at start (seen in
#                        /proc/<podman>/limits) and runc cannot set more
#   graphroot            images live in the cache dir (rm -rf .cache resets all)
#   runroot, tmp_dir     on tmpfs (/dev/shm), as the defaults are, so a reboot
#                        clears them; keyed by the graphroot (two caches never
#                        share state)
#   registries           no search registries: an unqualified name fails at once
#                        instead of reaching out; builds use --pull=never
containers_env() {
	local cache=$1 dir nofile nproc graph run
	dir=$cache/containers
	graph=$cache/storage
	mkdir -p "$dir" "$graph"
	graph=$(cd "$graph" && pwd -P)
	run=/dev/shm/kpssh-podman-$(printf '%s' "$graph" | sha256sum | cut -c1-12)
	nofile=$(ulimit -Hn)
	[[ $nofile == unlimited ]] && nofile=1048576
	nproc=$(ulimit -Hu)
	[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768

	_containers_write "$dir/containers.conf" <<EOF
# Written by hack/lib/containers.sh; see there for why.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$run/events.log"
tmp_dir = "$run/libpod"
static_dir = "$graph/libpod"
volume_path = "$graph/volumes"
EOF
	_containers_write "$dir/storage.conf" <<EOF
# Written by hack/lib/containers.sh; see there for why.
[storage]
driver = "overlay"
graphroot = "$graph"
runroot = "$run/storage"
EOF
	_containers_write "$dir/registries.conf" <<EOF
# Written by hack/lib/containers.sh: no registry is ever searched.
unqualified-search-registries = []
short-name-mode = "enforcing"
EOF
	export CONTAINERS_CONF=$dir/containers.conf
	export CONTAINERS_STORAGE_CONF=$dir/storage.conf
	export CONTAINERS_REGISTRIES_CONF=$dir/registries.conf
}

# _containers_write FILE: replace FILE with stdin when the content differs
# (atomically: concurrent callers never see a half-written file). No fork
# when nothing changed.
_containers_write() {
	local f=$1 want have="" tmp
	IFS= read -r -d '' want || true
	[[ -f $f ]] && { IFS= read -r -d '' have <"$f" || true; }
	[[ $want == "$have" ]] && return 0
	tmp=$(mktemp "$f.XXXXXX")
	printf '%s' "$want" >"$tmp"
	chmod 0644 "$tmp"
	mv -f "$tmp" "$f"
}
