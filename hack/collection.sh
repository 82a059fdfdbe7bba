#!/usr/bin/env bash
# hack/collection.sh — build the dklesev.kpssh collection tarball
# (dklesev-kpssh-<version>.tar.gz) with ansible-galaxy.
#
#   hack/collection.sh [OUTDIR]   default OUTDIR: <repo>/bin/collection;
#                                 the last stdout line is the tarball's path
#
# The collection's roles/ is a symlink to the top-level roles/ (their
# source). Ansible follows it at run time, but `ansible-galaxy collection
# build` skips a symlinked directory that points outside the collection
# (a warning, and a tarball without roles), so the build runs on a staged
# copy with symlinks resolved. ansible-galaxy is the one on PATH: put the
# runner image's first (make collection does, hack/runner-image.sh --bin).
set -euo pipefail
export KPSSH_PROG=collection.sh
HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

REPO=$(repo_root)
SRC=$REPO/playbooks/collections/ansible_collections/dklesev/kpssh
OUT=${1:-$REPO/bin/collection}
[[ $# -le 1 ]] || die "usage: hack/collection.sh [OUTDIR]"
command -v ansible-galaxy >/dev/null 2>&1 ||
	die "ansible-galaxy not found: put the runner image's bin first on PATH (PATH=\$(hack/runner-image.sh --bin | tail -1):\$PATH)"
[[ -f $SRC/galaxy.yml ]] || die "$SRC/galaxy.yml missing"
[[ -d $SRC/roles/ ]] || die "$SRC/roles does not resolve (it links to the top-level roles/)"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
stage=$(mktemp -d "${TMPDIR:-/tmp}/kpssh-collection.XXXXXX")
trap 'rm -rf "$stage"' EXIT
# -L: copy what the symlinks point at; caches never ship.
tar -C "$SRC" -chf - --exclude=__pycache__ --exclude='*.pyc' . | tar -C "$stage" -xf - ||
	die "staging the collection failed"
ansible-galaxy collection build --force --output-path "$OUT" "$stage" >&2 ||
	die "ansible-galaxy collection build failed"
version=$(sed -n 's/^version: *//p' "$SRC/galaxy.yml")
tarball=$OUT/dklesev-kpssh-$version.tar.gz
[[ -f $tarball ]] || die "ansible-galaxy built no $tarball"
echo "$tarball"
