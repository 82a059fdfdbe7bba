# shellcheck shell=bash
# Debian apt sources of this machine, for images built here. Source it.

# debian_source_lines SUITE: print one-line "deb URI SUITE* main" entries for
# SUITE and its -updates / -security suites, from the machine's apt config
# (deb822 *.sources first, then sources.list and *.list), in that order and
# without duplicates. Other archives (third-party repos) are ignored: only
# suites named SUITE or SUITE-* are taken.
debian_source_lines() {
	local suite=$1 f
	shopt -s nullglob
	{
		for f in /etc/apt/sources.list.d/*.sources; do
			awk -v want="$suite" '
				BEGIN { RS=""; FS="\n" }
				{
					u=""; s=""; t=""
					for (i = 1; i <= NF; i++) {
						if ($i ~ /^[Uu][Rr][Ii][Ss]:/) { u=$i; sub(/^[^:]*:[ \t]*/, "", u) }
						if ($i ~ /^[Ss]uites:/)        { s=$i; sub(/^[^:]*:[ \t]*/, "", s) }
						if ($i ~ /^[Tt]ypes:/)         { t=$i }
					}
					if (t !~ /deb([ \t]|$)/ || u == "") next
					split(u, us, /[ \t]+/); n = split(s, ss, /[ \t]+/)
					for (j = 1; j <= n; j++)
						if (ss[j] == want || index(ss[j], want "-") == 1) print "deb " us[1] " " ss[j] " main"
				}' "$f"
		done
		for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
			[[ -f $f ]] || continue
			awk -v want="$suite" '
				$1 == "deb" {
					i = 2
					if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
					s = $(i+1)
					if (s == want || index(s, want "-") == 1) print "deb " $i " " s " main"
				}' "$f"
		done
	} | awk '!seen[$0]++'
	shopt -u nullglob
}

# debian_source_lines_as SUITE: debian_source_lines SUITE, or — when the
# machine's apt knows no SUITE (a Debian 12 machine building a Debian 13
# image) — the machine's own release's lines with its codename replaced by
# SUITE: the same mirrors, for SUITE, SUITE-updates and SUITE-security.
debian_source_lines_as() {
	local suite=$1 lines own
	lines=$(debian_source_lines "$suite")
	if [[ -z $lines ]]; then
		own=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
		[[ -n $own && $own != "$suite" ]] &&
			lines=$(debian_source_lines "$own" | awk -v from="$own" -v to="$suite" '{ sub("^" from, to, $3); print }')
	fi
	printf '%s\n' "$lines" | sed '/^$/d'
}
