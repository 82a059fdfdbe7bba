#!/usr/bin/env bash
# hack/demo.sh — the one-command demo (make demo): a real control plane
# (hack/controlplane.sh), 3 nspawn hosts (hack/hosts.sh) that install
# containerd + kubelet from a local mirror (hack/node-assets.sh), the kpssh
# controller built from this checkout, the examples; then a Deployment scales
# 0 → 2 → 0 and a timeline of what happened on each host is printed. Everything
# stays running afterwards, to explore with kubectl.
#
#   hack/demo.sh [up]           build what is missing, (re)start, run the scale
#                               cycle; hosts join with the role profile
#                               `tls-bootstrap` (roles/tls_bootstrap)
#   hack/demo.sh up --script    the same with the bash-script twin
#                               `tls-bootstrap-script` (KPSSH_DEMO_PROFILE=script)
#   hack/demo.sh down           stop the controller, the control plane and the hosts
#
# Re-runnable: a second `up` reuses the running world and runs the cycle again
# (then the hosts rejoin warm: no install phase).
set -euo pipefail
export KPSSH_PROG=demo
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
export GOTOOLCHAIN=go1.27.3

REPO=$(repo_root)
export KPSSH_WORLD=demo KPSSH_CP=demo
RUN=/run/kpssh-demo
NS=kpssh-system
KCFG=/run/kpssh-cp/demo/admin.kubeconfig

kc() { kubectl --kubeconfig="$KCFG" --request-timeout=30s "$@"; }

# chart_gates prints FEATURE_GATES as the chart sets it by default
# (charts/kpssh/values.yaml settings.featureGates): the demo runs the gates
# that ship.
chart_gates() {
	awk '/^  featureGates:/ { on = 1; next }
		on && /^    [A-Za-z]+: (true|false) *$/ { sub(/^ +/, ""); sub(/: /, "="); g = g (g ? "," : "") $0; next }
		on { on = 0 }
		END { print g }' "$REPO/charts/kpssh/values.yaml"
}

ctl_pid() { # the running demo controller's pid, or nothing
	local p st now
	[[ -f $RUN/controller.pid ]] || return 0
	read -r p st <"$RUN/controller.pid" || return 0
	now=$(awk '{print $22}' "/proc/$p/stat" 2>/dev/null || true)
	[[ -n $now && $now == "$st" ]] && echo "$p"
	return 0
}

stop_controller() {
	local p i
	p=$(ctl_pid)
	[[ -n $p ]] || return 0
	kill -TERM -- "-$p" 2>/dev/null || true
	for ((i = 0; i < 150; i++)); do
		[[ -n $(ctl_pid) ]] || break
		sleep 0.2
	done
	kill -KILL -- "-$p" 2>/dev/null || true
	rm -f "$RUN/controller.pid"
}

cmd_down() {
	need_root
	stop_controller
	"$REPO/hack/controlplane.sh" down
	"$REPO/hack/hosts.sh" down
	rm -rf "$RUN"
	log "demo torn down"
}

# wait_until SECONDS WHAT CMD...
wait_until() {
	local limit=$1 what=$2 deadline
	shift 2
	deadline=$((SECONDS + limit))
	until "$@"; do
		((SECONDS < deadline)) || die "timed out after ${limit}s waiting for $what (controller log: $RUN/controller.log)"
		sleep 1
	done
}

hosts_available() {
	local n
	n=$(kc -n "$NS" get sshhosts -o json | jq '[.items[] | select(.status.state == "Available")] | length')
	[[ $n == 3 ]]
}
nothing_joined() {
	[[ $(kc get nodeclaims -o name | wc -l) == 0 && $(kc get nodes -o name | wc -l) == 0 ]] && hosts_available
}

cmd_up() {
	need_root
	need_cmd jq jq
	need_cmd kubectl kubectl
	"$REPO/hack/deps.sh"
	mkdir -p "$RUN"
	chmod 0700 "$RUN"
	local t0=$SECONDS mirror
	log "building what is missing (cached after the first run: k8s binaries, host image, node assets, controller) …"
	mirror=$("$REPO/hack/node-assets.sh")
	# the runner image's ansible-playbook (Debian 13's ansible-core), as the
	# controller image would run it
	local runner_bin
	runner_bin=$("$REPO/hack/runner-image.sh" --bin | tail -n 1)
	[[ -x $runner_bin/ansible-playbook ]] || die "hack/runner-image.sh --bin gave no ansible-playbook"
	(cd "$REPO" && go build -o bin/controller ./cmd/controller)
	KPSSH_MIRROR=$mirror "$REPO/hack/hosts.sh" up 3
	local bridge
	bridge=$("$REPO/hack/hosts.sh" inventory | jq -r .bridgeAddress)
	"$REPO/hack/controlplane.sh" up "$bridge"

	log "applying the examples (join profile: $PROFILE)"
	kc apply -f "$REPO/examples/profile-tls-bootstrap.yaml" -f "$REPO/examples/scripts/profile-tls-bootstrap.yaml" >/dev/null
	local f
	for f in cni nodepool; do kc apply -f "$REPO/test/e2e/testdata/$f.yaml" >/dev/null; done
	# the e2e node class (the world's mirror, nspawn settings) with the chosen profile
	sed "s/^    name: tls-bootstrap-script\$/    name: $PROFILE/" "$REPO/test/e2e/testdata/nodeclass.yaml" | kc apply -f - >/dev/null
	[[ $(kc get sshnodeclass pool -o jsonpath='{.spec.joinProfileRef.name}') == "$PROFILE" ]] ||
		die "node class pool does not name profile $PROFILE (test/e2e/testdata/nodeclass.yaml changed?)"
	kc get deployment -n default pause >/dev/null 2>&1 || kc apply -f "$REPO/test/e2e/testdata/workload.yaml" >/dev/null
	kc create namespace "$NS" --dry-run=client -o yaml | kc apply -f - >/dev/null
	kc -n "$NS" create secret generic world-key --from-file=privateKey="$("$REPO/hack/hosts.sh" inventory | jq -r .clientKey)" \
		--dry-run=client -o yaml | kc apply -f - >/dev/null
	"$REPO/hack/hosts.sh" inventory | jq -r --arg ns "$NS" '.hosts[] |
		"---\napiVersion: karpenter.dklesev.github.io/v1beta1\nkind: SSHHost\nmetadata:\n  name: \(.name)\n  namespace: \($ns)\n  labels: {karpenter.dklesev.github.io/host-class: small}\nspec:\n  address: \(.address)\n  port: \(.port)\n  user: \(.user)\n  sshKeySecretRef: {name: world-key}\n  capacity: {cpu: \"2\", memory: 2Gi}"' |
		kc apply -f - >/dev/null

	if [[ -z $(ctl_pid) ]]; then
		log "starting the controller (log: $RUN/controller.log)"
		local gates
		gates=$(chart_gates)
		[[ -n $gates ]] || die "no settings.featureGates in charts/kpssh/values.yaml"
		(
			cd "$REPO"
			FEATURE_GATES=$gates KUBECONFIG=$KCFG ANSIBLE_PLAYBOOK=$runner_bin/ansible-playbook DISABLE_LEADER_ELECTION=true POOL_NAMESPACE=$NS PROBE_INTERVAL=5s \
				BATCH_IDLE_DURATION=1s BATCH_MAX_DURATION=3s METRICS_PORT=18080 HEALTH_PROBE_PORT=18081 \
				exec setsid bin/controller </dev/null >>"$RUN/controller.log" 2>&1 9>&-
		) &
		echo "$! $(awk '{print $22}' "/proc/$!/stat")" >"$RUN/controller.pid"
	fi
	kc -n default scale deployment/pause --replicas=0 >/dev/null
	wait_until 300 "3 hosts Available and nothing joined" nothing_joined
	log "world ready after $((SECONDS - t0))s"

	cycle
	explore
}

# cycle scales the workload 0 → 2 → 0, polling hosts and nodes twice a second,
# and prints each host's timeline relative to the scale command.
declare -A SEEN=() # (scale target/host/event) already printed

cycle() {
	SEEN=()
	local events=$RUN/timeline.tsv
	: >"$events"
	local start
	start=$(date +%s.%N)
	echo
	echo "=== scaling deployment/pause 0 → 2 ($(date -u +%T) UTC)"
	kc -n default scale deployment/pause --replicas=2 >/dev/null
	poll "$start" "$events" 2 || die "scale-up did not finish in 6 min (controller log: $RUN/controller.log)"
	kc -n default get pods -o wide
	echo
	echo "=== scaling deployment/pause 2 → 0 ($(date -u +%T) UTC)"
	kc -n default scale deployment/pause --replicas=0 >/dev/null
	poll "$start" "$events" 0 || die "scale-down did not finish in 6 min (controller log: $RUN/controller.log)"
	echo
	echo "=== timeline (seconds after the first scale command)"
	sort -s -t$'\t' -k1,1 -k2,2n "$events" | awk -F'\t' '
		{ if ($1 != h) { if (h != "") print ""; h = $1; printf "  %-4s", h }; printf "  %s +%.1fs%s", $3, $2, $4 }
		END { print "" }'
}

# poll START EVENTS WANT: record first sightings (claimed, install, join,
# registered, ready, leave, available) until WANT nodes are Ready with the
# pods Running (WANT=2) or nothing is joined (WANT=0).
poll() {
	local start=$1 events=$2 want=$3 deadline=$((SECONDS + 360)) now hj nj
	while ((SECONDS < deadline)); do
		now=$(date +%s.%N)
		hj=$(kc -n "$NS" get sshhosts -o json) || continue
		nj=$(kc get nodes -o json) || continue
		while IFS=$'\t' read -r host what extra; do
			[[ -n $host && -z ${SEEN[$want/$host/$what]:-} ]] || continue
			SEEN[$want/$host/$what]=1
			printf '%s\t%s\t%s\t%s\n' "$host" "$(awk -v a="$start" -v b="$now" 'BEGIN { printf "%.1f", b - a }')" "$what" "$extra" >>"$events"
			printf '  %-4s %-10s +%ss%s\n' "$host" "$what" "$(awk -v a="$start" -v b="$now" 'BEGIN { printf "%.1f", b - a }')" "$extra"
		done < <(
			jq -r --arg want "$want" '.items[] | .metadata.name as $h | .status as $s |
				(if $s.state == "Claimed" then [$h, "claimed", ""] else empty end),
				(if $want != "0" and ($s.lastPhase.phase == "install" or $s.lastPhase.phase == "join") then
					[$h, $s.lastPhase.phase, (if $s.lastPhase.duration then " (" + $s.lastPhase.phase + " took " + $s.lastPhase.duration + ")" else "" end)] else empty end),
				(if $want == "0" and ($s.state == "Leaving" or $s.lastPhase.phase == "leave") then [$h, "leave", ""] else empty end),
				(if $want == "0" and $s.state == "Available" and $s.lastPhase.phase == "leave" then [$h, "available", " (leave took " + ($s.lastPhase.duration // "?") + ")"] else empty end)
				| @tsv' <<<"$hj"
			[[ $want == 0 ]] || jq -r '.items[] | .metadata.name as $h |
				[$h, "registered", ""],
				(if any(.status.conditions[]?; .type == "Ready" and .status == "True") then [$h, "ready", ""] else empty end)
				| @tsv' <<<"$nj"
		)
		if [[ $want == 2 ]]; then
			[[ $(jq '[.items[] | select(any(.status.conditions[]?; .type == "Ready" and .status == "True"))] | length' <<<"$nj") == 2 &&
				$(kc -n default get pods -l app=pause --field-selector=status.phase=Running -o name | wc -l) == 2 ]] && return 0
		else
			[[ $(jq '.items | length' <<<"$nj") == 0 && $(kc get nodeclaims -o name | wc -l) == 0 ]] && hosts_available && return 0
		fi
		sleep 0.5
	done
	return 1
}

explore() {
	cat <<-EOF

		=== the demo stays up. Explore:
		  export KUBECONFIG=$KCFG
		  kubectl -n $NS get sshhosts            # the pool: state, claim, installed profile
		  kubectl get nodepools,nodeclaims,nodes
		  kubectl -n default scale deployment/pause --replicas=3
		  kubectl get events -A --sort-by=.lastTimestamp | tail
		  sudo KPSSH_WORLD=demo hack/hosts.sh status   # the nspawn hosts
		  controller log: $RUN/controller.log
		Run the cycle again (warm rejoin): make demo
		Tear everything down:              make demo-down   (or hack/demo.sh down)
	EOF
}

PROFILE=tls-bootstrap
[[ ${KPSSH_DEMO_PROFILE:-} == script || ${2:-} == --script ]] && PROFILE=tls-bootstrap-script
case ${1:-up} in
up) cmd_up ;;
down) cmd_down ;;
*)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
