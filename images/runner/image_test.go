// Package runner_test checks the runner image (images/runner/Dockerfile) as
// hack/runner-image.sh builds it here: what is inside, and a real phase run
// through the engine with ansible-playbook inside the image (podman) against
// an nspawn test host.
package runner_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testexec"
)

// buildTimeout bounds hack/runner-image.sh: a cold build on a loaded 2-core
// machine (debootstrap + apt in buildah) takes several minutes.
const buildTimeout = 40 * time.Minute

// podmanTimeout bounds every podman command of the checks.
const podmanTimeout = 3 * time.Minute

type image struct {
	ref  string   // localhost/kpssh-runner:<key>
	env  []string // CONTAINERS_*=… lines from `hack/runner-image.sh --print-env`
	root string   // repository root
}

var (
	buildOnce sync.Once
	built     image
	buildErr  error
)

// runnerImage builds the image through hack/runner-image.sh (instant when it
// is cached) once per test process. Heavy: skipped under -short, saying so;
// otherwise a missing component (root, buildah, podman) is a failure.
func runnerImage(t *testing.T) image {
	t.Helper()
	if testing.Short() {
		t.Skip("heavy: builds the runner image with buildah (minutes when cold) and runs it with podman; not in -short")
	}
	buildOnce.Do(func() { built, buildErr = buildImage() })
	if buildErr != nil {
		t.Fatalf("runner image: %v", buildErr)
	}
	return built
}

func buildImage() (image, error) {
	if os.Geteuid() != 0 {
		return image{}, errors.New("must run as root (rootful buildah/podman, nspawn hosts)")
	}
	for _, c := range []struct{ cmd, pkg string }{{"buildah", "buildah"}, {"podman", "podman"}, {"debootstrap", "debootstrap"}} {
		if _, err := lookPath(c.cmd); err != nil {
			return image{}, fmt.Errorf("%s not found: install the Debian package %s (hack/deps.sh does)", c.cmd, c.pkg)
		}
	}
	root, err := hostenv.RepoRoot()
	if err != nil {
		return image{}, err
	}
	script := filepath.Join(root, "hack", "runner-image.sh")
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	start := time.Now()
	out, stderr, err := run(ctx, nil, script)
	if err != nil {
		return image{}, fmt.Errorf("hack/runner-image.sh: %v\n%s", err, tail(stderr, 4000))
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	ref := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(ref, "localhost/kpssh-runner:") {
		return image{}, fmt.Errorf("hack/runner-image.sh printed %q, want localhost/kpssh-runner:<key> on its last line", ref)
	}
	envOut, stderr, err := run(ctx, nil, script, "--print-env")
	if err != nil {
		return image{}, fmt.Errorf("hack/runner-image.sh --print-env: %v\n%s", err, stderr)
	}
	img := image{ref: ref, root: root}
	for _, l := range strings.Split(strings.TrimSpace(envOut), "\n") {
		if !strings.HasPrefix(l, "CONTAINERS_") || !strings.Contains(l, "=") {
			return image{}, fmt.Errorf("--print-env printed %q", l)
		}
		img.env = append(img.env, l)
	}
	fmt.Fprintf(os.Stderr, "runner image %s ready in %v\n", ref, time.Since(start).Round(time.Millisecond))
	return img, nil
}

// podman runs podman with the script's private configuration.
func (img image) podman(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podmanTimeout)
	defer cancel()
	return run(ctx, img.env, "podman", args...)
}

func (img image) mustPodman(t *testing.T, args ...string) string {
	t.Helper()
	out, stderr, err := img.podman(t, args...)
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, tail(stderr, 2000))
	}
	return out
}

// TestImageContents checks the image's configuration and what it holds.
func TestImageContents(t *testing.T) {
	img := runnerImage(t)

	var cfg struct {
		User       string
		Entrypoint []string
		Cmd        []string
		Env        []string
		WorkingDir string
	}
	raw := img.mustPodman(t, "image", "inspect", "--format", "{{json .Config}}", img.ref)
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("image config %q: %v", raw, err)
	}
	if cfg.User != "65532:65532" {
		t.Errorf("User = %q, want 65532:65532 (non-root)", cfg.User)
	}
	if want := []string{"/usr/bin/tini", "--"}; !slices.Equal(cfg.Entrypoint, want) {
		t.Errorf("Entrypoint = %q, want %q", cfg.Entrypoint, want)
	}
	if want := []string{"ansible-playbook", "--version"}; !slices.Equal(cfg.Cmd, want) {
		t.Errorf("Cmd = %q, want %q", cfg.Cmd, want)
	}
	if !slices.Contains(cfg.Env, "HOME=/home/kpssh") {
		t.Errorf("Env %q lacks HOME=/home/kpssh", cfg.Env)
	}

	// The default command, through the entrypoint.
	if out := img.mustPodman(t, "run", "--rm", "--pull=never", "--network=none", img.ref); !strings.Contains(out, "ansible-playbook [core 2.") {
		t.Errorf("default command printed %q, want ansible-playbook's version", out)
	}

	// One container for the rest (each start costs seconds on a busy
	// machine). Who and what runs: PID 1 is tini; the process is the
	// non-root user with a passwd entry (ssh refuses a uid without one) and
	// a writable HOME; the shipped files are not writable by it. ansible
	// resolves both collections: ours (the engine's stdout callback and
	// action plugin) and ansible.posix (extracted from Debian's ansible).
	// Last, the shipped files' hashes.
	probe := `echo "pid1=$(cat /proc/1/comm)"
echo "id=$(id -u):$(id -g) name=$(id -un) home=$HOME"
test -w "$HOME" && echo home-writable
test ! -w /usr/share/kpssh/collections/ansible_collections/dklesev/kpssh/plugins/action/stdin_exec.py && echo collection-readonly
for c in ansible-playbook ssh tini python3; do command -v "$c"; done | tr '\n' ' '; echo
ssh -V 2>&1
test -d /usr/share/kpssh/roles && echo roles-dir
for spec in "callback dklesev.kpssh.kpssh_events" "module dklesev.kpssh.stdin_exec" "role dklesev.kpssh.tls_bootstrap" "role tls_bootstrap" "callback ansible.posix.jsonl" "callback ansible.posix.json"; do
	set -- $spec
	if ansible-doc -t "$1" "$2" >/dev/null 2>/tmp/err; then echo "doc-ok $2"; else echo "doc-FAILED $2: $(tail -c 600 /tmp/err)"; fi
done
echo "--- sums"
cd /usr/share/kpssh && find collections roles -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -exec sha256sum {} + | sort -k2
`
	out := img.mustPodman(t, "run", "--rm", "--pull=never", "--network=none", img.ref, "sh", "-c", probe)
	out, sums, _ := strings.Cut(out, "--- sums\n")
	for _, want := range []string{
		"pid1=tini", "id=65532:65532 name=kpssh home=/home/kpssh", "home-writable", "collection-readonly",
		"/usr/bin/ansible-playbook /usr/bin/ssh /usr/bin/tini /usr/bin/python3", "OpenSSH_", "roles-dir",
		"doc-ok dklesev.kpssh.kpssh_events", "doc-ok dklesev.kpssh.stdin_exec", "doc-ok dklesev.kpssh.tls_bootstrap", "doc-ok tls_bootstrap", "doc-ok ansible.posix.jsonl", "doc-ok ansible.posix.json\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("in the image: missing %q in\n%s", want, out)
		}
	}
	// The image's collection and roles are the checkout's (same files, same
	// content): the build context is not stale.
	if want := repoSums(t, img.root); strings.TrimSpace(sums) != strings.TrimSpace(want) {
		t.Errorf("image's /usr/share/kpssh differs from the checkout:\nimage:\n%s\ncheckout:\n%s", sums, want)
	}
}

// repoSums is `sha256sum` of the checkout's collection and roles, with the
// paths the image uses.
func repoSums(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	// The roles ship inside the collection (in the checkout its roles/ is a
	// symlink to the top-level roles/, which WalkDir does not follow).
	for _, m := range []struct{ src, dst string }{{"playbooks/collections", "collections"}, {"roles", "collections/ansible_collections/dklesev/kpssh/roles"}} {
		base := filepath.Join(root, m.src)
		err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "__pycache__" {
				return filepath.SkipDir
			}
			if !d.Type().IsRegular() || strings.HasSuffix(p, ".pyc") {
				return nil
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(base, p)
			sum := sha256.Sum256(data)
			lines = append(lines, hex.EncodeToString(sum[:])+"  "+filepath.Join(m.dst, rel))
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	sort.Slice(lines, func(i, j int) bool {
		return strings.SplitN(lines[i], "  ", 2)[1] < strings.SplitN(lines[j], "  ", 2)[1]
	})
	return strings.Join(lines, "\n")
}

// wrapperScript is the engine's "ansible-playbook" for TestPhaseInImage: it
// runs ansible-playbook inside the runner image. The engine starts it with
// its minimal environment (no CONTAINERS_*, HOME = the run dir), so the
// podman settings are written in. Why each flag:
//   - the run directory is bind-mounted at the same path: ansible.cfg,
//     inventory, key, known_hosts, the ControlPath socket and result.json are
//     all addressed by absolute path, inside and outside;
//   - --user = the run directory's owner: the directory is 0700 on purpose
//     (it holds the key and secrets). Here the engine (the test) runs as
//     root, so the container does too; in the controller image the
//     controller and ansible both run as 65532, the image's user;
//   - the engine's environment is forwarded (HOME, TMPDIR, ANSIBLE_*,
//     PYTHON*, locale) — not PATH, the image has its own;
//   - ANSIBLE_COLLECTIONS_PATH / ANSIBLE_ROLES_PATH override the run's
//     ansible.cfg, which names the checkout's paths (engine.New insists they
//     exist on this machine): the phase must use the image's collection —
//     the checkout is not mounted;
//   - --network=host: the nspawn hosts are reached through the machine's
//     bridge; --cidfile and --label let the test prove a container ran and
//     that none is left.
const wrapperScript = `#!/bin/bash
set -euo pipefail
dir=$(dirname "$ANSIBLE_CONFIG")
cids=@CIDS@
printf '%s\n' "$dir" >>@RUNDIRS@
fwd=()
for v in $(compgen -e); do
	case $v in
	HOME | TMPDIR | LANG | LC_ALL | ANSIBLE_* | PYTHON*) fwd+=(-e "$v=${!v}") ;;
	esac
done
@ENV@
HOME=@PODMAN_HOME@ exec podman run --rm --pull=never --network=host \
	--user "$(stat -c %u:%g "$dir")" --label kpssh.test=@LABEL@ --cidfile "$cids/$$.cid" \
	-v "$dir:$dir" -w "$dir" "${fwd[@]}" \
	-e ANSIBLE_COLLECTIONS_PATH=/usr/share/kpssh/collections -e ANSIBLE_ROLES_PATH=/usr/share/kpssh/roles \
	@IMAGE@ ansible-playbook "$@"
`

// TestPhaseInImage runs a real script phase through the real engine, with
// ansible-playbook inside the runner image (podman), against an nspawn host.
func TestPhaseInImage(t *testing.T) {
	img := runnerImage(t)
	w := hostenv.Up(t, 1)
	h := w.Host(0)
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}

	tmp := t.TempDir()
	rundirs := filepath.Join(tmp, "rundirs")
	cids := filepath.Join(tmp, "cids")
	podmanHome := filepath.Join(tmp, "podman-home")
	for _, d := range []string{cids, podmanHome} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	label := fmt.Sprintf("image-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	var envLines []string
	for _, e := range img.env {
		name, value, _ := strings.Cut(e, "=")
		envLines = append(envLines, "export "+name+"="+shellQuote(value))
	}
	wrapper := strings.NewReplacer(
		"@RUNDIRS@", shellQuote(rundirs), "@ENV@", strings.Join(envLines, "\n"),
		"@PODMAN_HOME@", shellQuote(podmanHome), "@LABEL@", label, "@CIDS@", shellQuote(cids), "@IMAGE@", img.ref,
	).Replace(wrapperScript)
	wrapperPath := filepath.Join(tmp, "ansible-playbook")
	if err := os.WriteFile(wrapperPath, []byte(wrapper), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever happened, leave no container behind.
		ids := strings.Fields(img.mustPodman(t, "ps", "-a", "-q", "--filter", "label=kpssh.test="+label))
		if len(ids) > 0 {
			img.mustPodman(t, append([]string{"rm", "-f"}, ids...)...)
		}
	})

	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{AnsiblePlaybook: wrapperPath, CollectionsPath: coll})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() }) // stops the engine's idle pre-warmed runner

	script := `install -d -m 0755 /opt/kpssh-runner-test
printf '%s|%s|%s\n' "$KPSSH_NODE_NAME" "$KPSSH_VAR_greeting" "$(id -u)" > /opt/kpssh-runner-test/install.txt
`
	conn := engine.Connection{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: key, HostKey: h.HostKey}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.Run(ctx, engine.Request{
		Phase:   engine.PhaseInstall,
		Conn:    conn,
		Source:  engine.Source{Script: script},
		Context: engine.Context{NodeName: "node-" + h.Name, HostAddress: h.Address, NodeAddress: h.Address, Vars: map[string]string{"greeting": "hello from the image"}},
		Timeout: 3 * time.Minute,
	})
	t.Logf("phase: %s in %v (exit %d, touched %v)", r.Outcome, r.Duration.Round(time.Millisecond), r.ExitCode, r.Touched)
	if r.Outcome != engine.Succeeded || !r.Touched || r.ExitCode != 0 {
		t.Fatalf("phase in the image: %+v", r)
	}

	// Its effect on the host.
	if got, want := strings.TrimSpace(w.MustRun(0, "cat /opt/kpssh-runner-test/install.txt")), "node-"+h.Name+"|hello from the image|0"; got != want {
		t.Errorf("host file = %q, want %q", got, want)
	}
	// It ran in a container (the wrapper reached podman, which created
	// one), and nothing of the run is left.
	dirs := readLines(t, rundirs)
	if len(dirs) != 1 {
		t.Fatalf("run dirs seen by the wrapper: %q, want one", dirs)
	}
	checkRunGone(t, img, label, cids, dirs[0], 1)

	// Interrupted: the engine signals its child's process group — podman,
	// which relays SIGTERM to tini and so to ansible-playbook. The container
	// must go away all the same (--rm; on SIGKILL, conmon's cleanup).
	r = e.Run(ctx, engine.Request{
		Phase: engine.PhaseInstall, Conn: conn, Source: engine.Source{Script: "sleep 600\n"},
		Context: engine.Context{HostAddress: h.Address, NodeAddress: h.Address}, Timeout: 30 * time.Second,
	})
	t.Logf("interrupted phase: %s in %v (task %q)", r.Outcome, r.Duration.Round(time.Millisecond), r.FailedTask)
	if out, _, err := w.Run(0, "pgrep -f '^sleep 600' || true"); err == nil {
		t.Logf("script processes on the host right after the run: %q", strings.TrimSpace(out))
	}
	if r.Outcome != engine.TimedOut {
		t.Fatalf("sleep 600 with a 30 s timeout: %+v", r)
	}
	// The script must not outlive the phase on the host: the engine's active
	// stop (through the ssh master — gone with the container when the run
	// is interrupted this way) or else the host-side timeout(1), which fires
	// when the phase timeout runs out there.
	stopped := false
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if out, _, err := w.Run(0, "pgrep -f '^sleep 600' || true"); err == nil && strings.TrimSpace(out) == "" {
			stopped = true
			break
		}
	}
	if !stopped {
		t.Errorf("the interrupted script still runs on the host a minute after the phase ended")
	}
	dirs = readLines(t, rundirs)
	if len(dirs) != 2 {
		t.Fatalf("run dirs seen by the wrapper: %q, want two", dirs)
	}
	checkRunGone(t, img, label, cids, dirs[1], 2)
}

// checkRunGone asserts that nCids containers were created (cidfiles) and
// that none is left, and that the run directory and every process
// mentioning it are gone. Container removal after an interrupted run is
// asynchronous (conmon's exit command): poll for a while.
func checkRunGone(t *testing.T, img image, label, cids, dir string, nCids int) {
	t.Helper()
	if !strings.HasPrefix(filepath.Base(dir), "kpssh-") {
		t.Errorf("run dir %q is not an engine run directory", dir)
	}
	ents, err := os.ReadDir(cids)
	if err != nil || len(ents) != nCids {
		t.Fatalf("cidfiles: %v %v, want %d (one container per run)", ents, err, nCids)
	}
	for _, e := range ents {
		if cid, err := os.ReadFile(filepath.Join(cids, e.Name())); err != nil || len(bytes.TrimSpace(cid)) < 12 {
			t.Fatalf("cidfile %s = %q: %v", e.Name(), cid, err)
		}
	}
	var left string
	var procs []string
	var statErr error
	for end := time.Now().Add(90 * time.Second); ; {
		left = strings.TrimSpace(img.mustPodman(t, "ps", "-a", "-q", "--filter", "label=kpssh.test="+label))
		procs = processesMentioning(dir)
		_, statErr = os.Stat(dir)
		if left == "" && len(procs) == 0 && errors.Is(statErr, fs.ErrNotExist) || time.Now().After(end) {
			break
		}
		time.Sleep(time.Second)
	}
	if left != "" {
		t.Errorf("containers left: %s", left)
	}
	if !errors.Is(statErr, fs.ErrNotExist) {
		t.Errorf("run directory %s still exists (%v)", dir, statErr)
	}
	if len(procs) > 0 {
		t.Errorf("processes mention run dir %s: %v", dir, procs)
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if l := strings.TrimSpace(s.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// processesMentioning lists "pid cmdline" of processes whose command line
// contains s.
func processesMentioning(s string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if strings.Contains(string(cl), s) {
			out = append(out, e.Name()+" "+strings.ReplaceAll(string(cl), "\x00", " "))
		}
	}
	return out
}

// run runs a command in its own process group, killed as a group when ctx
// ends; extraEnv is added to this process's environment.
func run(ctx context.Context, extraEnv []string, name string, args ...string) (stdout, stderr string, err error) {
	cmd := testexec.Command(ctx, name, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	return testexec.Output(ctx, cmd)
}

// lookPath also searches the sbin dirs, which are not always on root's PATH.
func lookPath(cmd string) (string, error) {
	if p, err := exec.LookPath(cmd); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin"} {
		if p := filepath.Join(d, cmd); isExec(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found", cmd)
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
