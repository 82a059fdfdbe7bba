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
#   hack/demo.sh gc             down every demo whose owner process
#                               (KPSSH_OWNER_PID at up) is gone
#
# Re-runnable: a second `up` reuses the running world and runs the cycle again
# (then the hosts rejoin warm: no install phase).
#
# Environment:
#   KPSSH_DEMO_NAME  the demo's name (default "demo"): its hosts.sh world and
#                    control plane carry it, its state is /run/kpssh-demo
#                    (another name: /run/kpssh-demo-<name>). A second name is
#                    a second demo beside the first (test/demo runs one)
#   KPSSH_DEMO_PROFILE  script: join with tls-bootstrap-script
#   KPSSH_OWNER_PID  optional, at up: the pid owning the demo (used by "gc";
#                    hosts.sh and controlplane.sh record it too)
set -euo pipefail
export KPSSH_PROG=demo
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
export GOTOOLCHAIN=go1.27.3

REPO=$(repo_root)
NAME=${KPSSH_DEMO_NAME:-demo}
[[ $NAME =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$ ]] ||
	die "invalid KPSSH_DEMO_NAME '$NAME' (use [A-Za-z0-9_.-], at most 100 chars)"
export KPSSH_WORLD=$NAME KPSSH_CP=$NAME
RUN=/run/kpssh-demo
[[ $NAME == demo ]] || RUN=/run/kpssh-demo-$NAME
NS=kpssh-system
KCFG=/run/kpssh-cp/$NAME/admin.kubeconfig

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

start_of() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null || true; } # a pid's start time, empty if gone

ctl_pid() { # the running demo controller's pid, or nothing
	local p st now
	[[ -f $RUN/controller.pid ]] || return 0
	read -r p st <"$RUN/controller.pid" || return 0
	now=$(start_of "$p")
	[[ -n $now && $now == "$st" ]] && echo "$p"
	return 0
}

stop_controller() {
	local p st i dirs=()
	p=$(ctl_pid)
	[[ -n $p ]] || return 0
	read -r _ st <"$RUN/controller.pid"
	kill -TERM -- "-$p" 2>/dev/null || true
	for ((i = 0; i < 150; i++)); do
		[[ -n $(ctl_pid) ]] || break
		sleep 0.2
	done
	if [[ -n $(ctl_pid) ]]; then
		log "the controller did not stop within 30s of SIGTERM; killing it"
	else
		log "the controller stopped $((i / 5)).$((i % 5 * 2))s after SIGTERM"
	fi
	kill -KILL -- "-$p" 2>/dev/null || true
	# Its phase runs' directories (tmpfs; secrets, named after the
	# controller's pid and start): a run killed with the controller has its
	# own cleanup remove its directory; wait for that, then remove the rest.
	shopt -s nullglob
	for ((i = 0; i < 100; i++)); do
		dirs=(/dev/shm/kpssh-"$p.$st"-* /run/kpssh/kpssh-"$p.$st"-*)
		((${#dirs[@]})) || break
		sleep 0.2
	done
	shopt -u nullglob
	if ((${#dirs[@]})); then
		log "removing run directories the controller left: ${dirs[*]}"
		rm -rf --one-file-system "${dirs[@]}"
	fi
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

# cmd_gc downs every demo whose owner (KPSSH_OWNER_PID at up) is gone: a
# killed test leaves its controller running (its own session), which
# hosts.sh gc and controlplane.sh gc do not know of.
cmd_gc() {
	need_root
	local d OWNER_NAME OWNER_PID OWNER_START
	for d in /run/kpssh-demo /run/kpssh-demo-*; do
		[[ -f $d/owner ]] || continue
		OWNER_NAME='' OWNER_PID='' OWNER_START=''
		eval "$(<"$d/owner")"
		[[ $OWNER_NAME =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$ ]] || continue
		[[ -n $OWNER_PID && $(start_of "$OWNER_PID") == "$OWNER_START" ]] && continue
		log "demo '$OWNER_NAME': owner ${OWNER_PID:-?} is gone; tearing it down"
		KPSSH_DEMO_NAME=$OWNER_NAME bash "${BASH_SOURCE[0]}" down || true
	done
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
	if [[ -n ${KPSSH_OWNER_PID:-} ]]; then
		[[ $KPSSH_OWNER_PID =~ ^[0-9]+$ ]] || die "KPSSH_OWNER_PID must be a pid"
		echo "OWNER_NAME=$NAME OWNER_PID=$KPSSH_OWNER_PID OWNER_START=$(start_of "$KPSSH_OWNER_PID")" >"$RUN/owner"
	fi
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
		local gates metrics_port health_port
		gates=$(chart_gates)
		[[ -n $gates ]] || die "no settings.featureGates in charts/kpssh/values.yaml"
		# free ports, not fixed ones: a second demo (another KPSSH_DEMO_NAME) runs beside
		metrics_port=$(free_port) health_port=$(free_port)
		echo "$metrics_port" >"$RUN/metrics.port"
		(
			cd "$REPO"
			FEATURE_GATES=$gates KUBECONFIG=$KCFG ANSIBLE_PLAYBOOK=$runner_bin/ansible-playbook DISABLE_LEADER_ELECTION=true POOL_NAMESPACE=$NS PROBE_INTERVAL=5s \
				BATCH_IDLE_DURATION=1s BATCH_MAX_DURATION=3s METRICS_PORT=$metrics_port HEALTH_PROBE_PORT=$health_port \
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

# cycle scales the workload 0 → 2 → 0 and prints each host's timeline
# relative to the scale command. The events come from watches of the
# SSHHosts and Nodes, stamped by jq as each object version arrives: every
# status write is seen, also one that a poll would miss between two looks
# (a loaded machine polls slowly).
declare -A SEEN=() # host/event already printed
EVENTS= HW= NW= HDONE=0 NDONE=0 START_US=0 DOWN_US=-1 WATCHES=()
WAIT=900 # seconds for each half of the cycle

cycle() {
	SEEN=() HDONE=0 NDONE=0 DOWN_US=-1 WATCHES=()
	EVENTS=$RUN/timeline.tsv HW=$RUN/watch-hosts.txt NW=$RUN/watch-nodes.txt
	: >"$EVENTS"
	START_US=${EPOCHREALTIME/./}
	trap watch_stop EXIT
	watch_start sshhosts '.metadata.name, .status.state, .status.lastPhase.phase, .status.lastPhase.result, .status.lastPhase.duration' "$HW"
	watch_start nodes '.metadata.name, (if any(.status.conditions[]?; .type == "Ready" and .status == "True") then "ready" else "" end)' "$NW"
	echo
	echo "=== scaling deployment/pause 0 → 2 ($(date -u +%T) UTC)"
	kc -n default scale deployment/pause --replicas=2 >/dev/null
	poll 2 || { die "scale-up did not finish in $((WAIT / 60)) min (controller log: $RUN/controller.log)"; }
	kc -n default get pods -o wide
	echo
	echo "=== scaling deployment/pause 2 → 0 ($(date -u +%T) UTC)"
	DOWN_US=${EPOCHREALTIME/./}
	kc -n default scale deployment/pause --replicas=0 >/dev/null
	poll 0 || { die "scale-down did not finish in $((WAIT / 60)) min (controller log: $RUN/controller.log)"; }
	watch_stop
	echo
	echo "=== timeline (seconds after the first scale command)"
	sort -s -t$'\t' -k1,1 -k2,2n "$EVENTS" | awk -F'\t' '
		{ if ($1 != h) { if (h != "") print ""; h = $1; printf "  %-4s", h }; printf "  %s +%ss%s", $3, $2, $4 }
		END { print "" }'
}

# watch_start RESOURCE FIELDS OUT: a watch (bounded) writing one line per
# object version to OUT: the arrival time in µs, then FIELDS (jq), "|"-separated.
watch_start() {
	: >"$3"
	timeout $((2 * WAIT + 120)) kubectl --kubeconfig="$KCFG" -n "$NS" get "$1" --watch -o json 2>>"$RUN/watch.log" \
		> >(exec jq --unbuffered -r "[(now * 1e6 | floor), $2] | map(. // \"\" | tostring) | join(\"|\")" >"$3" 2>>"$RUN/watch.log") &
	WATCHES+=("$!")
}

watch_stop() {
	((${#WATCHES[@]})) || return 0
	kill "${WATCHES[@]}" 2>/dev/null || true
	wait "${WATCHES[@]}" 2>/dev/null || true
	WATCHES=()
}

# event US HOST WHAT NOTE prints and records a first sighting.
event() {
	local t
	[[ -z ${SEEN[$2/$3]:-} ]] || return 0
	SEEN[$2/$3]=1
	t=$((($1 - START_US) / 100000))
	t=$((t / 10)).$((t % 10))
	printf '%s\t%s\t%s\t%s\n' "$2" "$t" "$3" "$4" >>"$EVENTS"
	printf '  %-4s %-10s +%ss%s\n' "$2" "$3" "$t" "$4"
}

# drain reads the watches' new lines into events: claimed; install and join
# when they ended (not their Running records, whose duration is how long
# they had run then), with their durations; registered, ready; after the
# scale-down leave and available. Hosts count from their claim in this cycle.
drain() {
	local line n us h st ph res dur
	n=0
	while IFS= read -r line; do
		n=$((n + 1))
		IFS='|' read -r us h st ph res dur <<<"$line"
		[[ $us =~ ^[0-9]+$ ]] && ((us >= START_US)) || continue
		[[ $st != Claimed ]] || event "$us" "$h" claimed ""
		[[ -n ${SEEN[$h/claimed]:-} ]] || continue
		if ((DOWN_US < 0 || us < DOWN_US)); then
			[[ ($ph == install || $ph == join) && -n $res && $res != Running ]] || continue
			if [[ $res == Succeeded ]]; then
				event "$us" "$h" "$ph" " ($ph took ${dur:-?})"
			else
				event "$us" "$h" "$ph" " ($ph $res after ${dur:-?})"
			fi
		else
			[[ $st != Leaving && $ph != leave ]] || event "$us" "$h" leave ""
			[[ $st != Available || $ph != leave ]] || event "$us" "$h" available " (leave took ${dur:-?})"
		fi
	done < <(tail -n +$((HDONE + 1)) "$HW")
	HDONE=$((HDONE + n)) # (read skips an unfinished last line: it comes again)
	n=0
	while IFS= read -r line; do
		n=$((n + 1))
		IFS='|' read -r us h st <<<"$line"
		[[ $us =~ ^[0-9]+$ ]] && ((us >= START_US)) || continue
		event "$us" "$h" registered ""
		[[ $st != ready ]] || event "$us" "$h" ready ""
	done < <(tail -n +$((NDONE + 1)) "$NW")
	NDONE=$((NDONE + n))
}

# seen_all WHAT: every host claimed in this cycle has event WHAT.
seen_all() {
	local k
	for k in "${!SEEN[@]}"; do
		[[ $k != */claimed || -n ${SEEN[${k%/claimed}/$1]:-} ]] || return 1
	done
}

# poll WANT: until WANT nodes are Ready with the pods Running (WANT=2) or
# nothing is joined (WANT=0), then until the watches have shown it.
poll() {
	local want=$1 deadline=$((SECONDS + WAIT)) ok=0 i
	while ((!ok && SECONDS < deadline)); do
		drain
		if [[ $want == 2 ]]; then
			[[ $(kc get nodes -o json | jq '[.items[] | select(any(.status.conditions[]?; .type == "Ready" and .status == "True"))] | length') == 2 &&
				$(kc -n default get pods -l app=pause --field-selector=status.phase=Running -o name | wc -l) == 2 ]] && ok=1
		else
			nothing_joined && ok=1
		fi
		((ok)) || sleep 0.5
	done
	((ok)) || return 1
	for ((i = 0; i < 40; i++)); do
		drain
		if [[ $want == 2 ]]; then seen_all ready && return 0; else seen_all available && return 0; fi
		sleep 0.5
	done
	log "warning: the watches did not show every host $([[ $want == 2 ]] && echo ready || echo available) (log: $RUN/watch.log)"
}

explore() {
	cat <<-EOF

		=== the demo stays up. Explore:
		  export KUBECONFIG=$KCFG
		  kubectl -n $NS get sshhosts            # the pool: state, claim, installed profile
		  kubectl get nodepools,nodeclaims,nodes
		  kubectl -n default scale deployment/pause --replicas=3
		  kubectl get events -A --sort-by=.lastTimestamp | tail
		  sudo KPSSH_WORLD=$NAME hack/hosts.sh status   # the nspawn hosts
		  curl -s http://127.0.0.1:$(cat "$RUN/metrics.port" 2>/dev/null)/metrics | grep ^kpssh_
		  controller log: $RUN/controller.log
		Run the cycle again (warm rejoin): ${AGAIN}make demo
		Tear everything down:              ${AGAIN}make demo-down   (or ${AGAIN}hack/demo.sh down)
	EOF
}

PROFILE=tls-bootstrap
[[ ${KPSSH_DEMO_PROFILE:-} == script || ${2:-} == --script ]] && PROFILE=tls-bootstrap-script
AGAIN=
[[ $NAME == demo ]] || AGAIN="KPSSH_DEMO_NAME=$NAME "
case ${1:-up} in
up) cmd_up ;;
down) cmd_down ;;
gc) cmd_gc ;;
*)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
