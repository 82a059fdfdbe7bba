#!/usr/bin/env bash
# hack/controlplane.sh — a real Kubernetes control plane for kpssh's end-to-end
# tests and the demo: etcd, kube-apiserver (bootstrap-token auth, Node+RBAC),
# kube-controller-manager (CSR signer + approver, bootstrapsigner,
# tokencleaner), kube-scheduler, all built by hack/k8s-bins.sh.
#
#   controlplane.sh up [ADDRESS]   start (idempotent). The apiserver listens on
#                                  ADDRESS:6443 — the test hosts' bridge address,
#                                  a SAN of its certificate. Default: the bridge
#                                  of the hosts.sh world named like this plane.
#   controlplane.sh down           stop every process, remove the state (idempotent)
#   controlplane.sh kubeconfig     print the admin kubeconfig's path
#   controlplane.sh status         one line per component
#   controlplane.sh gc             down every plane whose owner process
#                                  (KPSSH_OWNER_PID at up) is gone, or whose
#                                  address is on no interface any more
#
# After up: kube-public/cluster-info published, the bootstrap RBAC
# (examples/bootstrap-rbac.yaml) and the CRDs (Karpenter's and apis/crds)
# applied, and the kube-root-ca.crt ConfigMap present (the controller-manager
# serves CSRs only from then on).
#
# Environment:
#   KPSSH_CP     plane name (default: $KPSSH_WORLD, else "default"); state in
#                /run/kpssh-cp/<name>/ (certs, kubeconfigs, etcd data, logs)
#   KPSSH_CP_WAIT  seconds to wait for each component (default 180)
#   KPSSH_OWNER_PID  optional, at up: the pid owning the plane (used by "gc":
#                a killed test leaves its plane, whose apiserver would keep
#                the next world's bridge address:6443)
set -euo pipefail
export KPSSH_PROG=controlplane.sh
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
export GOTOOLCHAIN=go1.27.3

REPO=$(repo_root)
NAME=${KPSSH_CP:-${KPSSH_WORLD:-default}}
[[ $NAME =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$ ]] || die "invalid plane name '$NAME'"
S=/run/kpssh-cp/$NAME
WAIT=${KPSSH_CP_WAIT:-180}
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
SERVICE_CIDR=10.96.0.0/16

# ------------------------------------------------------------ processes --

proc_start() { # start time of a pid, empty if gone
	local s a
	{ read -r s <"/proc/$1/stat"; } 2>/dev/null || return 0
	s=${s##*) }
	read -ra a <<<"$s"
	[[ ${a[0]} != Z ]] || return 0
	echo "${a[19]}"
}

# pid_of C: the recorded pid of component C if that process still runs.
pid_of() {
	local f=$S/$1.pid p st
	[[ -f $f ]] || return 0
	read -r p st <"$f" || return 0
	[[ $p =~ ^[0-9]+$ && -n $st && $(proc_start "$p") == "$st" ]] && echo "$p"
	return 0
}

# launch C ARGS...: start C detached (own session and process group), log to
# $S/C.log, record pid + start time.
launch() {
	local c=$1 p
	shift
	[[ -z $(pid_of "$c") ]] || return 0
	setsid "$BINS/$c" "$@" </dev/null >>"$S/$c.log" 2>&1 9>&- &
	p=$!
	echo "$p $(proc_start "$p")" >"$S/$c.pid"
}

stop_component() {
	local c=$1 p i
	p=$(pid_of "$c")
	[[ -n $p ]] || { rm -f "$S/$c.pid"; return 0; }
	kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		[[ -n $(pid_of "$c") ]] || break
		sleep 0.1
	done
	if [[ -n $(pid_of "$c") ]]; then
		kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do
			[[ -n $(pid_of "$c") ]] || break
			sleep 0.1
		done
	fi
	rm -f "$S/$c.pid"
}

# wait_for WHAT CMD...: retry CMD until it succeeds or WAIT seconds pass.
wait_for() {
	local what=$1 deadline=$((SECONDS + WAIT))
	shift
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "$what not ready after ${WAIT}s (logs in $S/*.log)"
		sleep 0.3
	done
}

kc() { kubectl --kubeconfig="$S/admin.kubeconfig" --request-timeout=30s "$@"; }

# ---------------------------------------------------------------- certs --

# cert NAME CN O EXT: key + certificate signed by the plane's CA.
cert() {
	local name=$1 cn=$2 o=$3 ext=$4 subj="/CN=$2"
	[[ -f $S/pki/$name.crt ]] && return 0
	[[ -z $o ]] || subj="/O=$o/CN=$cn"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subj" \
		-keyout "$S/pki/$name.key" -out "$S/pki/$name.csr" 2>/dev/null
	openssl x509 -req -in "$S/pki/$name.csr" -CA "$S/pki/ca.crt" -CAkey "$S/pki/ca.key" -CAcreateserial \
		-days 3650 -extfile <(printf '%s\n' "$ext") -out "$S/pki/$name.crt" 2>/dev/null
	rm -f "$S/pki/$name.csr"
	chmod 0600 "$S/pki/$name.key"
}

kubeconfig() { # FILE CERTNAME
	cat >"$1" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: kpssh
		  cluster:
		    server: https://$ADDRESS:6443
		    certificate-authority: $S/pki/ca.crt
		users:
		- name: $2
		  user:
		    client-certificate: $S/pki/$2.crt
		    client-key: $S/pki/$2.key
		contexts:
		- name: kpssh
		  context: {cluster: kpssh, user: $2}
		current-context: kpssh
	EOF
	chmod 0600 "$1"
}

make_pki() {
	mkdir -p "$S/pki"
	chmod 0700 "$S/pki"
	if [[ ! -f $S/pki/ca.crt ]]; then
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
			-subj "/CN=kpssh-test-ca-$NAME" -addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
			-keyout "$S/pki/ca.key" -out "$S/pki/ca.crt" 2>/dev/null
		chmod 0600 "$S/pki/ca.key"
	fi
	[[ -f $S/pki/sa.key ]] || {
		openssl genrsa -out "$S/pki/sa.key" 2048 2>/dev/null
		openssl rsa -in "$S/pki/sa.key" -pubout -out "$S/pki/sa.pub" 2>/dev/null
		chmod 0600 "$S/pki/sa.key"
	}
	local client="keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
	cert apiserver kube-apiserver "" "keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$ADDRESS,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
	cert admin kpssh-admin system:masters "$client"
	cert controller-manager system:kube-controller-manager "" "$client"
	cert scheduler system:kube-scheduler "" "$client"
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "$client"
	kubeconfig "$S/admin.kubeconfig" admin
	kubeconfig "$S/controller-manager.kubeconfig" controller-manager
	kubeconfig "$S/scheduler.kubeconfig" scheduler
}

# ------------------------------------------------------------- commands --

world_address() {
	local w=/run/kpssh-world/$NAME/world.env k
	[[ -f $w ]] || return 1
	k=$(sed -n 's/^SUBNET_K=//p' "$w")
	[[ $k =~ ^[0-9]+$ ]] && echo "10.231.$k.1"
}

cmd_up() {
	need_root
	need_cmd openssl openssl
	need_cmd kubectl kubectl
	need_cmd setsid util-linux
	need_cmd curl curl
	[[ -x /usr/bin/python3 ]] || die "/usr/bin/python3 missing (install python3)"
	ADDRESS=${1:-}
	if [[ -z $ADDRESS && -f $S/address ]]; then ADDRESS=$(<"$S/address"); fi
	[[ -n $ADDRESS ]] || ADDRESS=$(world_address) ||
		die "usage: controlplane.sh up ADDRESS (no hosts.sh world named '$NAME' to take the bridge address from)"
	[[ $ADDRESS =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "ADDRESS must be an IPv4 address, got '$ADDRESS'"
	# Not `ip … | grep -q`: grep exits at the first match and, under pipefail,
	# ip's SIGPIPE on its next line fails the check (issue 19).
	grep -qF " $ADDRESS/" <<<"$(ip -4 -o addr show)" || die "no interface of this machine has address $ADDRESS"
	mkdir -p "$S"
	chmod 0700 "$S"
	exec 9>"$S/.lock"
	flock 9
	if [[ -f $S/address && $(<"$S/address") != "$ADDRESS" ]]; then
		die "plane '$NAME' already runs for $(<"$S/address"); run: KPSSH_CP=$NAME $0 down"
	fi
	BINS=$("$REPO/hack/k8s-bins.sh") || die "hack/k8s-bins.sh failed"
	echo "$ADDRESS" >"$S/address"
	if [[ -n ${KPSSH_OWNER_PID:-} ]]; then
		echo "OWNER_PID=$KPSSH_OWNER_PID OWNER_START=$(proc_start "$KPSSH_OWNER_PID")" >"$S/owner"
	fi
	make_pki
	[[ -f $S/ports ]] || echo "ETCD_CLIENT=$(free_port) ETCD_PEER=$(free_port) KCM=$(free_port) SCHED=$(free_port)" >"$S/ports"
	local ETCD_CLIENT ETCD_PEER KCM SCHED
	eval "$(<"$S/ports")"
	local t0=$SECONDS

	launch etcd --name=kpssh --data-dir="$S/etcd" \
		--listen-client-urls="http://127.0.0.1:$ETCD_CLIENT" --advertise-client-urls="http://127.0.0.1:$ETCD_CLIENT" \
		--listen-peer-urls="http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER" \
		--initial-cluster="kpssh=http://127.0.0.1:$ETCD_PEER" --listen-metrics-urls= \
		--unsafe-no-fsync --quota-backend-bytes=2147483648

	launch kube-apiserver --etcd-servers="http://127.0.0.1:$ETCD_CLIENT" \
		--bind-address="$ADDRESS" --advertise-address="$ADDRESS" --secure-port=6443 \
		--service-cluster-ip-range="$SERVICE_CIDR" \
		--client-ca-file="$S/pki/ca.crt" --tls-cert-file="$S/pki/apiserver.crt" --tls-private-key-file="$S/pki/apiserver.key" \
		--kubelet-client-certificate="$S/pki/apiserver-kubelet-client.crt" --kubelet-client-key="$S/pki/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP,Hostname \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$S/pki/sa.pub" --service-account-signing-key-file="$S/pki/sa.key" \
		--enable-bootstrap-token-auth --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--allow-privileged --profiling=false
	wait_for kube-apiserver kc get --raw /readyz

	launch kube-controller-manager --kubeconfig="$S/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$S/controller-manager.kubeconfig" --authorization-kubeconfig="$S/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port="$KCM" --leader-elect=false \
		--controllers='*,bootstrapsigner,tokencleaner' --use-service-account-credentials \
		--cluster-signing-cert-file="$S/pki/ca.crt" --cluster-signing-key-file="$S/pki/ca.key" \
		--root-ca-file="$S/pki/ca.crt" --service-account-private-key-file="$S/pki/sa.key" \
		--service-cluster-ip-range="$SERVICE_CIDR" --profiling=false
	launch kube-scheduler --kubeconfig="$S/scheduler.kubeconfig" \
		--authentication-kubeconfig="$S/scheduler.kubeconfig" --authorization-kubeconfig="$S/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port="$SCHED" --leader-elect=false --profiling=false

	# cluster-info: what the controller hands to joins (endpoint + CA); the
	# bootstrapsigner signs it for each token.
	local ca_b64 rbac
	ca_b64=$(base64 -w0 "$S/pki/ca.crt")
	kc apply -f - >/dev/null <<-EOF
		apiVersion: v1
		kind: ConfigMap
		metadata: {name: cluster-info, namespace: kube-public}
		data:
		  kubeconfig: |
		    apiVersion: v1
		    kind: Config
		    clusters:
		    - name: ""
		      cluster:
		        server: https://$ADDRESS:6443
		        certificate-authority-data: $ca_b64
		    contexts: []
		    users: []
	EOF
	rbac=$REPO/examples/bootstrap-rbac.yaml
	[[ -f $rbac ]] || die "$rbac is missing"
	kc apply -f "$rbac" >/dev/null
	local kdir
	kdir=$(cd "$REPO" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter) || die "cannot locate the karpenter module (go list -m)"
	kc apply --server-side --force-conflicts -f "$kdir/pkg/apis/crds/" >/dev/null
	kc apply --server-side --force-conflicts -f "$REPO/apis/crds/" >/dev/null
	wait_for "CRDs" kc wait --for=condition=Established --timeout=5s crd --all
	# The controller-manager signs CSRs only once it is fully up; its root CA
	# ConfigMap is the visible sign.
	wait_for "kube-controller-manager (kube-root-ca.crt)" kc -n default get configmap kube-root-ca.crt
	wait_for "kube-scheduler" curl -fsk --max-time 5 "https://127.0.0.1:$SCHED/healthz"
	log "up in $((SECONDS - t0))s: https://$ADDRESS:6443 (kubeconfig $S/admin.kubeconfig)"
}

cmd_down() {
	need_root
	local c i
	[[ -d $S ]] || return 0
	for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_component "${COMPONENTS[i]}"; done
	rm -rf --one-file-system "$S"
}

cmd_gc() {
	need_root
	local d n a OWNER_PID OWNER_START
	for d in /run/kpssh-cp/*/; do
		[[ -d $d ]] || continue
		n=$(basename "$d")
		if [[ -f $d/owner ]]; then
			OWNER_PID='' OWNER_START=''
			eval "$(<"$d/owner")"
			if [[ -n $OWNER_PID && $(proc_start "$OWNER_PID") == "$OWNER_START" ]]; then continue; fi
			log "plane '$n': owner ${OWNER_PID:-?} is gone; tearing it down"
		else
			a=$(cat "$d/address" 2>/dev/null || true)
			if [[ -n $a ]] && grep -qF " $a/" <<<"$(ip -4 -o addr show)"; then continue; fi
			log "plane '$n': its address ${a:-?} is on no interface; tearing it down"
		fi
		KPSSH_CP=$n bash "${BASH_SOURCE[0]}" down || true
	done
}

cmd_status() {
	local c p st
	[[ -d $S ]] || { echo "plane '$NAME': down"; return 0; }
	echo "plane '$NAME': https://$(cat "$S/address" 2>/dev/null):6443 kubeconfig $S/admin.kubeconfig"
	for c in "${COMPONENTS[@]}"; do
		p=$(pid_of "$c")
		st=stopped
		[[ -z $p ]] || st="running (pid $p)"
		printf '  %-24s %s\n' "$c" "$st"
	done
}

CMD=${1:-}
shift || true
case $CMD in
up) cmd_up "$@" ;;
down) cmd_down ;;
gc) cmd_gc ;;
kubeconfig)
	[[ -f $S/admin.kubeconfig ]] || die "plane '$NAME' is not up"
	echo "$S/admin.kubeconfig"
	;;
status) cmd_status ;;
*)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
