#!/usr/bin/env bash
# hack/runner-image.sh — build (once) the kpssh runner image from
# images/runner/Dockerfile without any registry, and optionally the controller
# image on top of it (images/controller/Dockerfile).
#
#   hack/runner-image.sh                 build if needed; the last stdout line
#                                        is the image ref (localhost/kpssh-runner:<key>)
#   hack/runner-image.sh --controller    also the controller image, built by the
#                                        multi-stage Dockerfile in a local Go
#                                        builder image (its ref is the last line)
#   hack/runner-image.sh --cross ARCH    only the controller Dockerfile's build
#                                        stage for linux/ARCH (cross-compiling);
#                                        the last line is the binary's path
#   hack/runner-image.sh --print-env     print the CONTAINERS_* variables
#                                        (NAME=value lines) that point podman
#                                        at this script's config and storage
#   hack/runner-image.sh --bin           also the lint image (runner + ansible-lint),
#                                        both exported as directories; the last line
#                                        is a bin dir whose ansible-playbook,
#                                        ansible-galaxy, ansible-doc, ansible-inventory,
#                                        ansible-lint and python3 run the images' own
#                                        (bubblewrap): what the tests and the demo run
#   hack/runner-image.sh podman ARGS...  run podman with that config
#
# How (TESTBED §5): the Dockerfile's `FROM ${BASE}` is fed a base made here —
# `debootstrap --variant=minbase trixie` from the machine's Debian mirror,
# imported with buildah (from scratch, mount, copy, commit) as
# localhost/kpssh-runner-base:<base key> — then `buildah bud --pull=never`.
# Podman/buildah settings live in a private config dir (hack/lib/containers.sh);
# /etc/containers is never touched. Images are stored under
# ${KPSSH_CACHE:-<repo>/.cache}/runner/storage.
#
# The controller (images/controller/Dockerfile) gets as its builder (GOLANG)
# localhost/kpssh-go-builder:<key>: the same base plus the Go toolchain of
# go.mod's `toolchain` line, taken from the machine's Go module cache
# (images/controller/builder.Dockerfile); the build stage gets the machine's
# `go env` settings, its module and build caches bind-mounted at their paths.
#
# Caching: the runner key hashes the base key, the Dockerfile, the staged
# context (playbooks/collections and roles/, without __pycache__) and this
# script with its libs; the base key hashes the suite, the apt sources and the
# base recipe. An image tagged with its key is never rebuilt, so a re-run with
# nothing changed takes about a second. `buildah bud --layers` reuses the apt
# layer when only the collection or roles change. Every build also tags
# :dev, and older keyed tags are removed.
#
# Environment: KPSSH_CACHE (cache dir), KPSSH_RUNNER_LOG (build log path).
set -euo pipefail
export KPSSH_PROG=runner-image.sh
HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"
# shellcheck source=lib/containers.sh
source "$HACK/lib/containers.sh"
# shellcheck source=lib/apt.sh
source "$HACK/lib/apt.sh"

REPO=$(repo_root)
CACHE=${KPSSH_CACHE:-$REPO/.cache}
RC=$CACHE/runner
SUITE=trixie
RUNNER_REPO=localhost/kpssh-runner
BASE_REPO=localhost/kpssh-runner-base
CONTROLLER_REPO=localhost/kpssh-controller
CONTROLLER_BUILD_REPO=localhost/kpssh-controller-build
BUILDER_REPO=localhost/kpssh-go-builder
# What images/controller/Dockerfile copies (Dockerfile.dockerignore).
CONTROLLER_CTX=(go.mod go.sum apis cmd internal images/controller/Dockerfile)
LINT_REPO=localhost/kpssh-runner-lint
# Bounds for the long steps (a hung mirror must not hang a test run forever).
STEP_TIMEOUT=${KPSSH_RUNNER_STEP_TIMEOUT:-1800}

usage() { sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

controller=0
bin=0
cross=
case ${1:-} in
"") ;;
--controller) controller=1 ;;
--cross)
	[[ ${2:-} =~ ^[a-z0-9]+$ ]] || usage
	controller=1 cross=$2
	shift
	;;
--bin) bin=1 ;;
--print-env)
	mkdir -p "$RC"
	containers_env "$RC"
	printf 'CONTAINERS_CONF=%s\nCONTAINERS_STORAGE_CONF=%s\nCONTAINERS_REGISTRIES_CONF=%s\n' \
		"$CONTAINERS_CONF" "$CONTAINERS_STORAGE_CONF" "$CONTAINERS_REGISTRIES_CONF"
	exit 0
	;;
podman)
	shift
	need_cmd podman podman
	mkdir -p "$RC"
	containers_env "$RC"
	exec podman "$@"
	;;
-h | --help) usage ;;
*) echo "runner-image.sh: unknown argument '$1'" >&2; usage ;;
esac
[[ $# -le 1 ]] || usage

need_root
need_cmd debootstrap debootstrap
need_cmd buildah buildah
need_cmd podman podman
need_cmd runc runc
need_cmd sha256sum coreutils
need_cmd flock util-linux
need_cmd timeout coreutils
mkdir -p "$RC"
containers_env "$RC"

# hash_files DIR PATH...: the names, modes (symlinks: targets) and content
# hashes of the files under the PATHs (relative to DIR), __pycache__ ignored.
# A handful of processes in all: a warm run is mostly this.
hash_files() {
	local dir=$1
	shift
	(
		cd "$dir"
		find "$@" \( -name __pycache__ -o -name '*.pyc' \) -prune -o \( -type f -o -type l \) -printf '%p %m %l\n' 2>/dev/null | LC_ALL=C sort
		find "$@" \( -name __pycache__ -o -name '*.pyc' \) -prune -o -type f -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0r sha256sum
	)
}

# The base: what debootstrap makes, plus the machine's Debian sources (so
# apt inside the build reaches the same mirror, updates and security).
MIRROR=$(debian_mirror)
SOURCES=$(debian_source_lines_as "$SUITE")
[[ -n $SOURCES ]] || SOURCES="deb $MIRROR $SUITE main"

build_base() {
	local img=$1 tmp=$RC/.base-$$ c mnt
	TMPDIRS+=("$tmp")
	step "debootstrap --variant=minbase $SUITE from $MIRROR"
	mkdir -p "$RC/debs"
	timeout -k 30 "$STEP_TIMEOUT" debootstrap --variant=minbase --cache-dir="$RC/debs" \
		"$SUITE" "$tmp" "$MIRROR" >>"$LOGF" 2>&1 || die "debootstrap failed (see $LOGF)"
	umount_under "$tmp"
	[[ -z $(mounts_under "$tmp") ]] || die "cannot unmount $(mounts_under "$tmp" | head -1)"
	printf '%s\n' "$SOURCES" >"$tmp/etc/apt/sources.list"
	# A container runtime provides these; an image carries none of them.
	rm -rf --one-file-system "${tmp:?}"/dev/* "$tmp"/proc/* "$tmp"/sys/* "$tmp"/tmp/* "$tmp"/var/tmp/* \
		"$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin "$tmp"/var/cache/apt/archives/*.deb \
		"$tmp"/var/log/*.log "$tmp"/var/log/apt/*
	: >"$tmp/etc/resolv.conf"
	: >"$tmp/etc/machine-id"
	echo localhost >"$tmp/etc/hostname"

	c=$(buildah from --pull=never scratch)
	CONTAINERS+=("$c")
	mnt=$(buildah mount "$c")
	# tar keeps owners, modes, setuid bits and hard links as debootstrap made them.
	tar -C "$tmp" --numeric-owner -cf - . | tar -C "$mnt" --numeric-owner -xpf - ||
		die "copying the base rootfs into the working container failed"
	buildah umount "$c" >/dev/null
	buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--cmd /bin/bash --label org.opencontainers.image.title=kpssh-runner-base \
		--label "kpssh.base-key=$BASE_KEY" "$c"
	step "committing $img"
	buildah commit --quiet --rm "$c" "$img" >>"$LOGF" 2>&1 || die "buildah commit of the base failed (see $LOGF)"
	CONTAINERS=()
	rm -rf --one-file-system "$tmp"
}

BASE_KEY=$(
	{
		echo "v1 suite=$SUITE variant=minbase"
		echo "$SOURCES"
		declare -f build_base
	} | sha256sum | cut -c1-16
)
BASE_IMG=$BASE_REPO:$BASE_KEY

# The build context: only what the Dockerfile copies (the repository root
# also holds .cache, bin/, ... which buildah would otherwise walk and send).
CTX_PATHS=(images/runner/Dockerfile playbooks/collections roles)
KEY=$(
	{
		echo "base=$BASE_KEY"
		hash_files "$REPO" "${CTX_PATHS[@]}"
		hash_files "$HACK" runner-image.sh lib/common.sh lib/containers.sh lib/apt.sh
	} | sha256sum | cut -c1-16
)
IMG=$RUNNER_REPO:$KEY

# step MESSAGE: a progress line on stderr and, timestamped, in the build log.
step() {
	log "$*"
	printf '=== %s %s\n' "$(date -u +%T)" "$*" >>"$LOGF"
}

image_exists() { podman image exists "$1" 2>/dev/null; }

# take_lock serializes builds of this cache dir (concurrent test processes).
locked=0
take_lock() {
	[[ $locked == 1 ]] && return 0
	exec 9>"$RC/.lock"
	flock 9
	locked=1
}

TMPDIRS=()
CONTAINERS=()
LOGF=${KPSSH_RUNNER_LOG:-$RC/build.log}
cleanup() {
	local rc=$? c d
	for c in "${CONTAINERS[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
	for d in "${TMPDIRS[@]}"; do
		[[ -d $d ]] || continue
		umount_under "$d"
		rm -rf --one-file-system "$d"
	done
	if [[ $rc -ne 0 && -f $LOGF ]]; then
		echo "runner-image.sh: build failed; last lines of $LOGF:" >&2
		tail -n 30 "$LOGF" >&2 || true
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# prune REPO KEEP...: remove REPO's tags other than KEEP..., :dev and the
# newest six others (podman lists newest first): checkouts sharing a cache
# (worktrees with other roles) build other keys, and a build of one must not
# remove the image another's test run is about to use. An image still used
# by a container is kept (rmi refuses).
prune_tags() {
	local repo=$1 ref others=0
	shift
	while IFS= read -r ref; do
		[[ -n $ref ]] || continue
		local keep=0 k
		for k in "$@" "$repo:dev"; do [[ $ref == "$k" ]] && keep=1; done
		[[ $keep == 1 ]] && continue
		others=$((others + 1))
		[[ $others -le 6 ]] && continue
		log "removing old image $ref"
		podman rmi "$ref" >/dev/null 2>&1 || true
	done < <(podman images --sort created --noheading --format '{{.Repository}}:{{.Tag}}' "$repo" 2>/dev/null)
}

build_runner() {
	if image_exists "$IMG"; then
		podman tag "$IMG" "$RUNNER_REPO:dev"
		return 0
	fi
	take_lock
	if image_exists "$IMG"; then # built by someone else while we waited
		podman tag "$IMG" "$RUNNER_REPO:dev"
		return 0
	fi
	: >"$LOGF"
	local start
	start=$(date +%s)
	# Leftovers of a build that died (SIGKILL): we hold the lock, so they are stale.
	local stale
	for stale in "$RC"/.base-*/ "$RC"/.ctx-*/; do
		[[ -d $stale ]] || continue
		log "removing stale build dir $stale"
		umount_under "${stale%/}"
		rm -rf --one-file-system "${stale%/}"
	done

	if ! image_exists "$BASE_IMG"; then
		step "building base $BASE_IMG (log: $LOGF)"
		build_base "$BASE_IMG"
		prune_tags "$BASE_REPO" "$BASE_IMG"
	fi

	local ctx=$RC/.ctx-$$
	TMPDIRS+=("$ctx")
	mkdir -p "$ctx"
	tar -C "$REPO" --exclude=__pycache__ --exclude='*.pyc' -cf - "${CTX_PATHS[@]}" | tar -C "$ctx" -xf - ||
		die "staging the build context failed"

	step "building $IMG FROM $BASE_IMG (log: $LOGF)"
	timeout -k 30 "$STEP_TIMEOUT" buildah bud --pull=never --layers --force-rm --network=host \
		--runtime=runc --build-arg "BASE=$BASE_IMG" \
		-f "$ctx/images/runner/Dockerfile" -t "$IMG" "$ctx" >>"$LOGF" 2>&1 ||
		die "buildah bud of images/runner/Dockerfile failed (see $LOGF)"
	rm -rf --one-file-system "$ctx"

	# A broken image must not be published under its key.
	step "checking $IMG"
	if ! podman run --rm --network=none "$IMG" sh -c \
		'ansible-playbook --version >/dev/null &&
		 test -f /usr/share/kpssh/collections/ansible_collections/dklesev/kpssh/plugins/action/stdin_exec.py &&
		 test -d /usr/lib/python3/dist-packages/ansible_collections/ansible/posix' >>"$LOGF" 2>&1; then
		podman rmi "$IMG" >/dev/null 2>&1 || true
		die "image check failed: $IMG cannot run ansible-playbook or lacks a collection (see $LOGF)"
	fi
	podman tag "$IMG" "$RUNNER_REPO:dev"
	prune_tags "$RUNNER_REPO" "$IMG"
	# Dangling leftovers of replaced images (the --layers cache of the current
	# build is kept: its layers are parents of tagged images).
	podman image prune -f >/dev/null 2>&1 || true
	step "built $IMG in $(($(date +%s) - start))s"
}

# go_setup: the machine's Go (go env) for the controller builds: the host
# arch, the toolchain of go.mod's `toolchain` line (downloaded into the
# module cache through the machine's GOPROXY unless it is there already), the
# builder image's key, and the Go settings the build stage gets: the
# machine's own, caches included (bind-mounted), so what this machine has
# fetched or compiled is not fetched or compiled again.
go_setup() {
	[[ -n ${BUILDER_IMG:-} ]] && return 0
	need_cmd go golang
	local tc mod json i
	local names=(GOHOSTARCH GOMODCACHE GOCACHE GOPROXY GOSUMDB GOPRIVATE GONOPROXY GONOSUMDB GOINSECURE GOFLAGS) vals
	mapfile -t vals < <(go env "${names[@]}")
	[[ ${#vals[@]} == "${#names[@]}" ]] || die "go env ${names[*]} printed ${#vals[@]} lines"
	GOHOSTARCH=${vals[0]}
	tc=$(cd "$REPO" && go mod edit -json | sed -n 's/^\t"Toolchain": "\(.*\)",\{0,1\}$/\1/p')
	[[ -n $tc ]] || tc=go$(cd "$REPO" && go mod edit -json | sed -n 's/^\t"Go": "\(.*\)",\{0,1\}$/\1/p')
	mod=golang.org/toolchain@v0.0.1-$tc.linux-$GOHOSTARCH
	json=$(cd / && GOFLAGS= timeout -k 30 "$STEP_TIMEOUT" go mod download -json "$mod" 2>>"$LOGF") ||
		die "go mod download $mod failed (see $LOGF)"
	GO_TOOLCHAIN_DIR=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$json")
	[[ -x $GO_TOOLCHAIN_DIR/bin/go ]] || die "$mod: no bin/go in '$GO_TOOLCHAIN_DIR'"
	BUILDER_IMG=$BUILDER_REPO:$(
		{
			echo "base=$BASE_KEY"
			echo "$mod"
			sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$json"
			hash_files "$REPO" images/controller/builder.Dockerfile
		} | sha256sum | cut -c1-16
	)
	GO_BUILD_ARGS=(--build-arg "BUILDPLATFORM=linux/$GOHOSTARCH")
	# The caches, not at the paths of the Dockerfile's cache mounts (those
	# would cover them).
	mkdir -p "${vals[1]}" "${vals[2]}"
	GO_BUILD_ARGS+=(--build-arg GOMODCACHE=/kpssh-go/mod -v "${vals[1]}:/kpssh-go/mod"
		--build-arg GOCACHE=/kpssh-go/cache -v "${vals[2]}:/kpssh-go/cache")
	for ((i = 3; i < ${#names[@]}; i++)); do
		# By name only: buildah takes the value from the environment
		# (a GOPROXY may carry credentials; argv is world-readable).
		export "${names[i]}=${vals[i]}"
		GO_BUILD_ARGS+=(--build-arg "${names[i]}")
	done
}

# build_builder: the Go builder image (images/controller/builder.Dockerfile:
# the base plus the toolchain), once per key.
build_builder() {
	image_exists "$BUILDER_IMG" && return 0
	local start
	start=$(date +%s)
	step "building $BUILDER_IMG FROM $BASE_IMG with $GO_TOOLCHAIN_DIR (log: $LOGF)"
	timeout -k 30 "$STEP_TIMEOUT" buildah bud --pull=never --layers --force-rm --network=host \
		--runtime=runc --build-arg "BASE=$BASE_IMG" -f "$REPO/images/controller/builder.Dockerfile" \
		-t "$BUILDER_IMG" "$GO_TOOLCHAIN_DIR" >>"$LOGF" 2>&1 ||
		die "buildah bud of images/controller/builder.Dockerfile failed (see $LOGF)"
	prune_tags "$BUILDER_REPO" "$BUILDER_IMG"
	step "built $BUILDER_IMG in $(($(date +%s) - start))s"
}

# build_controller [ARCH]: images/controller/Dockerfile with buildah, the
# builder as GOLANG and the runner as RUNNER. With ARCH, only its build stage
# for linux/ARCH (a cross-compile: the runner exists here for the machine's
# arch only), and the binary is copied out to $RC/bin/controller-linux-ARCH;
# the last stdout line is the image ref or that path. The key hashes the
# runner and builder keys, the staged context and GOFLAGS.
build_controller() {
	local arch=${1:-} ctx=$RC/.ctx-controller-$$ key ref start c
	start=$(date +%s)
	take_lock
	go_setup
	if ! image_exists "$BASE_IMG"; then # pruned since the runner was built
		step "building base $BASE_IMG (log: $LOGF)"
		build_base "$BASE_IMG"
	fi
	build_builder
	TMPDIRS+=("$ctx")
	mkdir -p "$ctx"
	# What Dockerfile.dockerignore lets through.
	tar -C "$REPO" --exclude='*_test.go' --exclude=testdata -cf - "${CONTROLLER_CTX[@]}" | tar -C "$ctx" -xf - ||
		die "staging the controller build context failed"
	key=$(
		{
			echo "runner=$KEY builder=$BUILDER_IMG goflags=$GOFLAGS"
			hash_files "$ctx" "${CONTROLLER_CTX[@]}"
		} | sha256sum | cut -c1-16
	)
	local args=(--build-arg "GOLANG=$BUILDER_IMG" --build-arg "RUNNER=$IMG")
	if [[ -n $arch ]]; then
		ref=$CONTROLLER_BUILD_REPO:$key-$arch
		args+=(--platform "linux/$arch" --target build)
	else
		ref=$CONTROLLER_REPO:$key
	fi
	if ! image_exists "$ref"; then
		step "building $ref FROM $BUILDER_IMG${arch:+ (cross-compiling for linux/$arch)} (log: $LOGF)"
		mkdir -p "$RC/tmp"
		# TMPDIR: where buildah keeps the Dockerfile's cache mounts (empty
		# here: the machine's caches are used instead).
		TMPDIR=$RC/tmp timeout -k 30 "$STEP_TIMEOUT" buildah bud --pull=never --layers --force-rm \
			--network=host --runtime=runc "${args[@]}" "${GO_BUILD_ARGS[@]}" \
			-f "$ctx/images/controller/Dockerfile" -t "$ref" "$ctx" >>"$LOGF" 2>&1 ||
			die "buildah bud of images/controller/Dockerfile${arch:+ (build stage, linux/$arch)} failed (see $LOGF)"
		prune_tags "${ref%:*}" "$ref"
		podman image prune -f >/dev/null 2>&1 || true
		step "built $ref in $(($(date +%s) - start))s"
	fi
	rm -rf --one-file-system "$ctx"
	if [[ -z $arch ]]; then
		podman tag "$ref" "$CONTROLLER_REPO:dev"
		echo "$ref"
		return 0
	fi
	local out=$RC/bin/controller-linux-$arch
	mkdir -p "$RC/bin"
	c=$(buildah from --pull=never "$ref") || die "buildah from $ref failed"
	CONTAINERS+=("$c")
	local mnt
	mnt=$(buildah mount "$c") || die "buildah mount $ref failed"
	cp "$mnt/out/controller" "$out.tmp-$$" && mv "$out.tmp-$$" "$out" || die "copying the binary out of $ref failed"
	buildah umount "$c" >/dev/null
	buildah rm "$c" >/dev/null
	CONTAINERS=()
	echo "$out"
}

# The lint image: the runner plus Debian's ansible-lint, for the tests
# (the shipped image does not carry it). Keyed by the runner's key.
build_lint() {
	LINT_IMG=$LINT_REPO:$(
		{
			echo "runner=$KEY"
			hash_files "$REPO" images/runner/lint.Dockerfile
		} | sha256sum | cut -c1-16
	)
	image_exists "$LINT_IMG" && return 0
	take_lock
	image_exists "$LINT_IMG" && return 0
	local ctx=$RC/.ctx-lint-$$ start
	start=$(date +%s)
	TMPDIRS+=("$ctx")
	mkdir -p "$ctx"
	cp "$REPO/images/runner/lint.Dockerfile" "$ctx/Dockerfile"
	step "building $LINT_IMG FROM $IMG (log: $LOGF)"
	timeout -k 30 "$STEP_TIMEOUT" buildah bud --pull=never --layers --force-rm --network=host \
		--runtime=runc --build-arg "RUNNER=$IMG" -f "$ctx/Dockerfile" -t "$LINT_IMG" "$ctx" >>"$LOGF" 2>&1 ||
		die "buildah bud of images/runner/lint.Dockerfile failed (see $LOGF)"
	rm -rf --one-file-system "$ctx"
	prune_tags "$LINT_REPO" "$LINT_IMG"
	podman image prune -f >/dev/null 2>&1 || true
	step "built $LINT_IMG in $(($(date +%s) - start))s"
}

# export_root IMG DIR: IMG's filesystem unpacked into DIR (once; DIR exists
# only when complete).
export_root() {
	local img=$1 dir=$2 tmp c
	[[ -d $dir ]] && return 0
	tmp=$dir.tmp-$$
	TMPDIRS+=("$tmp")
	mkdir -p "$tmp"
	step "exporting $img to $dir"
	c=$(podman create --pull=never "$img" true) || die "podman create $img failed"
	CONTAINERS+=("$c")
	timeout -k 30 "$STEP_TIMEOUT" podman export "$c" | tar -C "$tmp" --numeric-owner -xpf - ||
		die "exporting $img failed"
	podman rm "$c" >/dev/null 2>&1 || true
	CONTAINERS=()
	mv "$tmp" "$dir"
}

# build_bin: the runner and lint images as directories under
# $RC/sandbox/<runner key>/, and bin/ with one wrapper per tool. Every wrapper
# runs the image's own binary in a bubblewrap sandbox whose / is the image's
# root and which sees the machine's /dev, /proc, /sys, /tmp, /run (run dirs,
# test worlds' keys), the checkout, the cache and the working directory at
# their own paths, and its network (the test hosts); PATH is the image's (a
# tool inside never runs a wrapper again). Nothing is namespaced but
# the mounts: the process group, signals, exit status and the pid are the
# caller's, so the engine's timeout, group kill and reaping work unchanged.
# ansible-playbook keeps the image's Python entry script, behind a shebang
# naming the python3 wrapper: the engine reads that shebang to start its
# pre-warmed runner with the same interpreter.
build_bin() {
	need_cmd bwrap bubblewrap
	local sb=$RC/sandbox/$KEY ok bd
	[[ -n $KEY && -n $RC ]] || die "no image key"
	# One image root per key, one bin dir per checkout and cache: the
	# wrappers bind the checkout, so worktrees sharing a cache must not share
	# wrappers (a worktree's wrapper would not see another's files).
	bd=$sb/checkout-$(printf '%s\n%s' "$REPO" "$CACHE" | sha256sum | cut -c1-8)/bin
	ok=$bd/.complete-$(hash_files "$HACK" runner-image.sh | sha256sum | cut -c1-12)
	if [[ -f $ok ]]; then
		echo "$bd"
		return 0
	fi
	build_lint
	take_lock
	export_root "$IMG" "$sb/root"
	export_root "$LINT_IMG" "$sb/lint-root"
	# Older keys: the newest six stay, a test run that started before this
	# build may still be running their wrappers (role edits make a new key
	# each: several people editing roles while a long e2e runs).
	local d
	while IFS= read -r d; do
		[[ -n $d && $d != "$sb" ]] && rm -rf --one-file-system "${d:?}"
	done < <(ls -1dt "$RC"/sandbox/*/ 2>/dev/null | sed 's#/$##' | tail -n +7)
	rm -rf "${bd:?}"
	mkdir -p "$bd"
	local b binds="" cases=""
	# The machine's files the tools may need: temp dirs, the checkout and
	# the cache, and home directories (an author's roles: make
	# molecule-role ROLE=~/roles/x, kpssh validate --content ~/roles).
	for b in /tmp /run /root /home "$REPO" "$CACHE"; do
		[[ -d $b ]] || continue
		binds+=$(printf '\t--bind %q %q \\\n' "$b" "$b")$'\n'
		cases+=$(printf '%q | %q/* | ' "$b" "$b")
	done
	cat >"$bd/sandbox" <<SANDBOX
#!/bin/sh
# Written by hack/runner-image.sh --bin: run a command of the runner image
# (ROOT: root or lint-root beside this bin dir) in a bubblewrap sandbox.
# usage: sandbox ROOT COMMAND [ARG]...
set -e
root=$sb/\$1
shift
# The working directory is bound after the image's root (bwrap mounts in
# order: bound before it, the root would cover it) unless a bind holds it.
case \$PWD in
${cases}/) set -- --die-with-parent -- "\$@" ;;
*) set -- --bind "\$PWD" "\$PWD" --die-with-parent -- "\$@" ;;
esac
set -- --bind "\$root" / --dev-bind /dev /dev --proc /proc --ro-bind /sys /sys \\
	--ro-bind /etc/hosts /etc/hosts --ro-bind /etc/resolv.conf /etc/resolv.conf \\
	--setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
${binds}	"\$@"
exec bwrap --chdir "\$PWD" "\$@"
SANDBOX
	local t
	for t in ansible ansible-galaxy ansible-doc ansible-inventory ansible-config python3; do
		printf '#!/bin/sh\nexec %q root /usr/bin/%s "$@"\n' "$bd/sandbox" "$t" >"$bd/$t"
	done
	printf '#!/bin/sh\nexec %q lint-root /usr/bin/ansible-lint "$@"\n' "$bd/sandbox" >"$bd/ansible-lint"
	{
		echo "#!$bd/python3"
		tail -n +2 "$sb/root/usr/bin/ansible-playbook"
	} >"$bd/ansible-playbook"
	chmod 0755 "$bd"/*
	"$bd/ansible-playbook" --version >>"$LOGF" 2>&1 || die "$bd/ansible-playbook --version failed (see $LOGF)"
	"$bd/ansible-lint" --version >>"$LOGF" 2>&1 || die "$bd/ansible-lint --version failed (see $LOGF)"
	touch "$ok"
	echo "$bd"
}

build_runner
if [[ $bin == 1 ]]; then
	build_bin
	exit 0
fi
if [[ $controller == 1 ]]; then
	echo "$IMG"
	build_controller "$cross"
	exit 0
fi
echo "$IMG"
