# shellcheck shell=bash
# Shared helpers of the hack/ scripts. Source it; do not run it.

# die prints one line to stderr and exits non-zero.
die() {
	echo "${KPSSH_PROG:-kpssh}: error: $*" >&2
	exit 1
}

# log prints a progress line to stderr (stdout is reserved for results).
log() {
	echo "${KPSSH_PROG:-kpssh}: $*" >&2
}

# need_root exits with a one-line reason when not running as root.
need_root() {
	[[ ${EUID} -eq 0 ]] || die "must run as root (needs netns, mounts, cgroups and systemd-nspawn); re-run with sudo"
}

# need_cmd CMD PACKAGE: exit with a one-line reason naming the Debian package
# that provides CMD when it is not installed.
need_cmd() {
	local cmd=$1 pkg=$2
	command -v "$cmd" >/dev/null 2>&1 && return 0
	# sbin dirs are not always on PATH for non-login root shells.
	local d
	for d in /usr/local/sbin /usr/sbin /sbin; do
		if [[ -x $d/$cmd ]]; then
			PATH=$PATH:$d
			return 0
		fi
	done
	die "'$cmd' not found: install the Debian package '$pkg' (apt-get install -y $pkg)"
}

# free_port prints a TCP port of 127.0.0.1 free right now.
free_port() {
	/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# repo_root prints the repository root (the directory holding go.mod).
repo_root() {
	local d
	d=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
	[[ -f $d/go.mod ]] || die "cannot locate repo root from ${BASH_SOURCE[0]}"
	echo "$d"
}

# debian_mirror prints the Debian archive URI of the machine's apt config
# (the one serving the plain "bookworm" suite, not -security / -updates).
debian_mirror() {
	local f uri=""
	shopt -s nullglob
	for f in /etc/apt/sources.list.d/*.sources; do
		uri=$(awk '
			BEGIN { RS=""; FS="\n" }
			{
				u=""; s=""; t=""
				for (i = 1; i <= NF; i++) {
					if ($i ~ /^[Uu][Rr][Ii][Ss]:/)   { u=$i; sub(/^[^:]*:[ \t]*/, "", u) }
					if ($i ~ /^[Ss]uites:/)          { s=" " $i " "; sub(/^[^:]*:/, "", s); s=" " s " " }
					if ($i ~ /^[Tt]ypes:/)           { t=$i }
				}
				if (t ~ /deb([ \t]|$)/ && s ~ /[ \t]bookworm[ \t]/ && u != "") { split(u, a, /[ \t]+/); print a[1]; exit }
			}' "$f")
		[[ -n $uri ]] && break
	done
	if [[ -z $uri ]]; then
		for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
			[[ -f $f ]] || continue
			uri=$(awk '
				$1 == "deb" {
					i = 2
					if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
					if ($(i+1) == "bookworm") { print $i; exit }
				}' "$f")
			[[ -n $uri ]] && break
		done
	fi
	shopt -u nullglob
	[[ -n $uri ]] || die "no Debian 'bookworm' archive URI found in /etc/apt/sources.list{,.d/*}"
	echo "$uri"
}

# mounts_under DIR prints the mount points at or below DIR (deepest first),
# as seen in this process's mount namespace.
mounts_under() {
	local dir=${1%/}
	awk -v d="$dir" '
		function unoct(s,   r, i, c) {
			r = ""
			for (i = 1; i <= length(s); i++) {
				c = substr(s, i, 1)
				if (c == "\\" && substr(s, i + 1, 3) ~ /^[0-7][0-7][0-7]$/) {
					r = r sprintf("%c", (substr(s, i + 1, 1) * 64) + (substr(s, i + 2, 1) * 8) + substr(s, i + 3, 1)); i += 3
				} else r = r c
			}
			return r
		}
		{ m = unoct($5); if (m == d || index(m, d "/") == 1) print length(m) "\t" m }' /proc/self/mountinfo |
		sort -rn | cut -f2-
}

# umount_under DIR unmounts everything at or below DIR (lazily as a fallback).
umount_under() {
	local m
	while IFS= read -r m; do
		[[ -n $m ]] || continue
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
	done < <(mounts_under "$1")
}
