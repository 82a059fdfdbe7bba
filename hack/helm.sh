#!/usr/bin/env bash
# Build the helm CLI (chart tests, make helm) from the Go module proxy into a
# versioned cache dir and print the binary's absolute path as the only line on
# stdout (progress and errors go to stderr).
#
# The version comes from hack/helm/go.mod (helm.sh/helm/v3); the binary is
#   ${KPSSH_CACHE:-<repo>/.cache}/helm/<version>-<hash>/helm
# where <hash> covers that go.mod/go.sum, the toolchain and the platform. A warm
# run only checks the binary is there. A cold build takes a few minutes; it
# builds into a temp dir and renames into place only when complete.
set -euo pipefail

export GOTOOLCHAIN=go1.27.3
export GOWORK=off

die() {
	echo "helm.sh: $*" >&2
	exit 1
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
mod_dir="${repo_root}/hack/helm"
[[ -f "${mod_dir}/go.mod" && -f "${mod_dir}/go.sum" ]] || die "missing ${mod_dir}/go.mod or go.sum"
# Either "require helm.sh/helm/v3 vX" or a line inside a require block.
version="$(awk '{ if ($1 == "require") { $1 = "" ; $0 = $0 } } $1 == "helm.sh/helm/v3" && $2 ~ /^v/ { print $2; exit }' "${mod_dir}/go.mod")"
[[ "${version}" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "cannot read the helm.sh/helm/v3 version from ${mod_dir}/go.mod (got '${version}')"

# helm's own release build stamps the Kubernetes version it defaults to
# (helm template, lint) from its client-go: v0.N → 1.N.
client_go="$(awk '$1 == "k8s.io/client-go" && $2 ~ /^v0\./ { print $2; exit }' "${mod_dir}/go.mod")"
[[ "${client_go}" =~ ^v0\.([0-9]+)\. ]] || die "cannot read the k8s.io/client-go version from ${mod_dir}/go.mod (got '${client_go}')"
k8s_minor="${BASH_REMATCH[1]}"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${version}"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
	ldflags+=" -X ${p}.k8sVersionMajor=1 -X ${p}.k8sVersionMinor=${k8s_minor}"
done

cache_root="${KPSSH_CACHE:-${repo_root}/.cache}"
key_hash="$(
	{
		cat "${mod_dir}/go.mod" "${mod_dir}/go.sum"
		printf '%s\n' "${GOTOOLCHAIN}" "${ldflags}" "$(uname -s)/$(uname -m)"
	} | sha256sum | cut -c1-12
)"
parent="${cache_root}/helm"
key="${version}-${key_hash}"
final="${parent}/${key}"

if [[ -x "${final}/helm" ]]; then
	echo "${final}/helm"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "go not found in PATH (needed to build helm ${version})"
mkdir -p "${parent}"
parent="$(cd "${parent}" && pwd -P)"
final="${parent}/${key}"
exec 9>"${parent}/.${key}.lock"
flock 9
if [[ -x "${final}/helm" ]]; then
	echo "${final}/helm"
	exit 0
fi
rm -rf "${final}"
tmp="$(mktemp -d "${parent}/.${key}.tmp.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT

echo "helm.sh: building helm ${version} into ${final} (cold build: a few minutes)" >&2
cd "${mod_dir}"
CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "${ldflags}" \
	-o "${tmp}/helm" helm.sh/helm/v3/cmd/helm >&2 ||
	die "go build of helm ${version} failed (see above); nothing was cached"
"${tmp}/helm" version --short >&2 || die "the built helm does not run"
mv -T "${tmp}" "${final}"
echo "${final}/helm"
