#!/usr/bin/env bash
# Build the Kubernetes test binaries (kube-apiserver, etcd,
# kube-controller-manager, kube-scheduler, kubelet) from the Go module proxy
# into a versioned cache dir, and print that dir's absolute path as the only
# line on stdout (progress and errors go to stderr).
#
# Usage:
#   hack/k8s-bins.sh                      # build if needed, print the dir
#   export KUBEBUILDER_ASSETS="$(hack/k8s-bins.sh)"   # for envtest
#
# Versions come from hack/k8s-bins/go.mod (k8s.io/kubernetes and
# go.etcd.io/etcd/server/v3). The dir is
#   ${KPSSH_CACHE:-<repo>/.cache}/k8s/<k8s>-etcd<etcd>-<hash>/
# where <hash> covers that go.mod/go.sum, the build recipe below and the host
# platform, so changing any of them builds a fresh dir. A warm run only checks
# that all five binaries are there (no go invocation). A cold build costs
# ~22 CPU-minutes (est. 11-12 min wall on 2 idle cores; 25 min measured when the
# machine is busy), ~0.85 GB of module cache, up to ~4 GB of Go build cache
# and 283 MB of binaries; it builds into a temp dir and renames it into place
# only when complete, so a failed or interrupted build never leaves a dir that
# looks done.
set -euo pipefail

export GOTOOLCHAIN=go1.27.3
export GOWORK=off

die() {
	echo "k8s-bins: $*" >&2
	exit 1
}
log() {
	echo "k8s-bins: $*" >&2
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
mod_dir="${repo_root}/hack/k8s-bins"
[[ -f "${mod_dir}/go.mod" && -f "${mod_dir}/go.sum" ]] ||
	die "missing ${mod_dir}/go.mod or go.sum"

bins=(kube-apiserver etcd kube-controller-manager kube-scheduler kubelet)
pkgs=(
	k8s.io/kubernetes/cmd/kube-apiserver
	k8s.io/kubernetes/cmd/kube-controller-manager
	k8s.io/kubernetes/cmd/kube-scheduler
	k8s.io/kubernetes/cmd/kubelet
	go.etcd.io/etcd/server/v3 # builds as "server"; renamed to etcd below
)

# Versions: single source of truth is the build module's go.mod.
mod_version() {
	awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "${mod_dir}/go.mod"
}
k8s_version="$(mod_version k8s.io/kubernetes)"
etcd_version="$(mod_version go.etcd.io/etcd/server/v3)"
[[ "${k8s_version}" =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] ||
	die "cannot read a k8s.io/kubernetes release version from ${mod_dir}/go.mod (got '${k8s_version}')"
k8s_major="${BASH_REMATCH[1]}"
k8s_minor="${BASH_REMATCH[2]}"
[[ -n "${etcd_version}" ]] ||
	die "cannot read the go.etcd.io/etcd/server/v3 version from ${mod_dir}/go.mod"

# Build recipe; part of the cache key. CGO is off for all five (static
# binaries, like upstream's kube-apiserver/-controller-manager/-scheduler; the
# tags are upstream's release tags).
build_tags="selinux,notest,grpcnotrace"
build_cgo=0

ver_pkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
ldflags_base="-s -w"
for p in "${ver_pkgs[@]}"; do
	ldflags_base+=" -X ${p}.gitVersion=${k8s_version}"
	ldflags_base+=" -X ${p}.gitMajor=${k8s_major}"
	ldflags_base+=" -X ${p}.gitMinor=${k8s_minor}"
	ldflags_base+=" -X ${p}.gitCommit=" # no commit id via the proxy; "" beats "$Format:%H$"
done
ldflags_base+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=none"

cache_root="${KPSSH_CACHE:-${repo_root}/.cache}"
key_hash="$(
	{
		cat "${mod_dir}/go.mod" "${mod_dir}/go.sum"
		printf '%s\n' "${GOTOOLCHAIN}" "cgo=${build_cgo}" "tags=${build_tags}" \
			"ldflags=${ldflags_base}" "$(uname -s)/$(uname -m)"
	} | sha256sum | cut -c1-12
)"
parent="${cache_root}/k8s"
key="${k8s_version}-etcd${etcd_version#v}-${key_hash}"
final="${parent}/${key}"

complete() {
	local dir="$1" b
	for b in "${bins[@]}"; do
		[[ -f "${dir}/${b}" && -x "${dir}/${b}" ]] || return 1
	done
}

# Warm path: no go, no lock.
if complete "${final}"; then
	(cd "${final}" && pwd -P)
	exit 0
fi

command -v go >/dev/null 2>&1 ||
	die "go not found in PATH (needed to build ${key}; GOTOOLCHAIN=${GOTOOLCHAIN} is then fetched from the Go module proxy)"
go_out="$(go version 2>&1)" ||
	die "cannot run go with GOTOOLCHAIN=${GOTOOLCHAIN} (fetched from the Go module proxy on first use): ${go_out##*$'\n'}"
mkdir -p "${parent}" || die "cannot create cache dir ${parent}"
parent="$(cd "${parent}" && pwd -P)"
final="${parent}/${key}"

# Serialise concurrent builds of the same key; the second waits, then finds it done.
if command -v flock >/dev/null 2>&1; then
	exec 9>"${parent}/.${key}.lock"
	if ! flock -n 9; then
		log "another build of ${key} is running; waiting for it"
		flock 9
	fi
	if complete "${final}"; then
		echo "${final}"
		exit 0
	fi
fi

# A dir that exists but is incomplete was not made by this script's rename
# (e.g. someone deleted a binary); don't trust it.
if [[ -e "${final}" ]]; then
	log "removing incomplete ${final}"
	rm -rf "${final}" || die "cannot remove incomplete ${final}"
fi

tmp="$(mktemp -d "${parent}/.${key}.tmp.XXXXXX")" || die "cannot create a temp dir in ${parent}"
build_pid=""
cleanup() {
	if [[ -n "${build_pid}" ]]; then
		kill "${build_pid}" 2>/dev/null || true
		wait "${build_pid}" 2>/dev/null || true
	fi
	if [[ -n "${tmp:-}" && -d "${tmp}" ]]; then
		rm -rf "${tmp}"
	fi
	return 0
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

cd "${mod_dir}"

# buildDate: the release time the module proxy records for k8s.io/kubernetes
# (reproducible, unlike the wall clock). Also downloads modules up front so a
# network failure is reported as such.
log "resolving modules for kubernetes ${k8s_version}, etcd ${etcd_version} (first run downloads ~0.85 GB)"
build_date="$(go list -mod=readonly -m -f '{{with .Time}}{{.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)" ||
	die "go list -m k8s.io/kubernetes failed (module proxy unreachable or ${mod_dir}/go.mod broken)"
go mod download >&2 ||
	die "go mod download failed in ${mod_dir} (module proxy unreachable?)"

ldflags="${ldflags_base}"
if [[ -n "${build_date}" ]]; then
	for p in "${ver_pkgs[@]}"; do
		ldflags+=" -X ${p}.buildDate=${build_date}"
	done
fi

log "building ${bins[*]} into ${tmp} (cold build: several minutes)"
start=${SECONDS}
# In the background + wait, so a signal to this script is handled at once
# (cleanup stops the build and removes the temp dir).
CGO_ENABLED=${build_cgo} go build -mod=readonly -trimpath -tags "${build_tags}" \
	-ldflags "${ldflags}" -o "${tmp}/" "${pkgs[@]}" >&2 &
build_pid=$!
wait "${build_pid}" ||
	die "go build failed for ${pkgs[*]} (see the go output above); nothing was cached"
build_pid=""

mv "${tmp}/server" "${tmp}/etcd" || die "etcd binary missing after build (expected ${tmp}/server)"
complete "${tmp}" || die "build finished but not all of ${bins[*]} exist in ${tmp}"
chmod 0755 "${tmp}" || die "cannot chmod ${tmp}"

if ! mv -T "${tmp}" "${final}" 2>/dev/null; then
	# Only possible without flock: a concurrent run finished first.
	complete "${final}" || die "cannot rename ${tmp} to ${final}"
	log "${final} was completed by a concurrent run; using it"
else
	tmp=""
fi
log "built ${key} in $((SECONDS - start))s"
echo "${final}"
