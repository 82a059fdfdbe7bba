#!/usr/bin/env bash
# Installs the Debian packages the tests and the test world need. Idempotent:
# does nothing when every package is present. Needs root and Debian's apt.
set -euo pipefail

# No ansible here: every test and the demo run the runner image's own
# ansible-playbook and ansible-lint (Debian 13's), through the bubblewrap
# wrappers of hack/runner-image.sh --bin.
pkgs=(debootstrap systemd-container iproute2 openssh-client kmod iptables bubblewrap
  # hack/controlplane.sh picks free ports with it
  python3
  # The runner image (hack/runner-image.sh): built with buildah, run with
  # podman; runc because crun refuses this machine's hybrid cgroup layout.
  buildah podman runc
  # test/e2e runs its own prometheus process (own config, temp TSDB, loopback port)
  prometheus
  # cmd/kpssh: `kpssh completion bash` run by bash (cobra's script needs
  # bash-completion, as kubectl's does) and `kubectl kpssh hosts -o json | jq`
  bash-completion jq)

missing=()
for p in "${pkgs[@]}"; do
  [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing packages (${missing[*]}) and not root: run 'sudo apt-get install ${missing[*]}'" >&2
  exit 1
fi
command -v apt-get >/dev/null || { echo "deps: apt-get not found; install ${missing[*]} by hand" >&2; exit 1; }

# This machine's PID 1 is not systemd: package postinsts must not start services.
guard=/usr/sbin/policy-rc.d
made_guard=0
if [ ! -e "$guard" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$guard"; chmod 0755 "$guard"; made_guard=1
fi
trap '[ "$made_guard" = 1 ] && rm -f "$guard"' EXIT

echo "deps: installing ${missing[*]}" >&2
apt-get update -qq >&2 || { echo "deps: apt-get update failed" >&2; exit 1; }
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
  || { echo "deps: apt-get install ${missing[*]} failed" >&2; exit 1; }
