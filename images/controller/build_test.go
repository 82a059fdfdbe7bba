package controller_test

import (
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/test/hostenv"
)

// TestImageBuild checks what images/controller/Dockerfile's two stages make
// here (hack/runner-image.sh: the build stage in the local Go builder, the
// runner as the base): the controller binary runs in the image, for this
// platform, built by go.mod's toolchain, static and path-free. The arm64
// cross-compile is TestImageCrossBuild (make test-cross): cold, it compiles
// every package again for arm64, more than make test's budget allows.
func TestImageBuild(t *testing.T) {
	img := controllerImage(t)
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	toolchain := goModToolchain(t, root)

	t.Run("default builder is go.mod's toolchain", func(t *testing.T) {
		df, err := os.ReadFile(filepath.Join(root, "images", "controller", "Dockerfile"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^ARG GOLANG=golang:(\S+)$`).FindSubmatch(df)
		if m == nil || "go"+string(m[1]) != toolchain {
			t.Errorf("Dockerfile's default GOLANG %q, go.mod's toolchain %s", m, toolchain)
		}
	})

	t.Run("image", func(t *testing.T) {
		var cfg struct {
			User       string
			Entrypoint []string
		}
		raw, err := run(t, time.Minute, img.env, "podman", "image", "inspect", "--format", "{{json .Config}}", img.ref)
		if err != nil {
			t.Fatalf("podman image inspect: %v\n%s", err, raw)
		}
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			t.Fatalf("image config %q: %v", raw, err)
		}
		if want := []string{"/usr/bin/tini", "--", "/usr/local/bin/controller"}; cfg.User != "65532:65532" || !slices.Equal(cfg.Entrypoint, want) {
			t.Errorf("user %q entrypoint %q, want 65532:65532 and %q", cfg.User, cfg.Entrypoint, want)
		}
		// Through the entrypoint, as a pod would start it.
		out, err := run(t, 2*time.Minute, img.env, "podman", "run", "--rm", "--pull=never", "--network=none", img.ref, "--version")
		if err != nil {
			t.Fatalf("controller --version in the image: %v\n%s", err, out)
		}
		want := regexp.MustCompile(`^kpssh-controller \S+ ` + regexp.QuoteMeta(toolchain) + ` linux/` + runtime.GOARCH + `\n$`)
		if !want.MatchString(out) {
			t.Errorf("controller --version = %q, want %s", out, want)
		}
		bin := filepath.Join(t.TempDir(), "controller")
		copyOut(t, img, "/usr/local/bin/controller", bin)
		checkBinary(t, bin, runtime.GOARCH, toolchain)
	})

}

// checkBinary: an ELF for linux/arch, statically linked (no interpreter),
// and built as the Dockerfile says (go.mod's toolchain, CGO_ENABLED=0,
// -trimpath, ./cmd/controller of this module).
func checkBinary(t *testing.T, path, arch, toolchain string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != machine || f.Class != elf.ELFCLASS64 {
		t.Errorf("%s: ELF machine %v class %v, want %v (%s)", path, f.Machine, f.Class, machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: has an ELF interpreter (dynamically linked)", path)
		}
	}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: build info: %v", path, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if bi.GoVersion != toolchain || bi.Path != "github.com/dklesev/kpssh/cmd/controller" ||
		settings["GOOS"] != "linux" || settings["GOARCH"] != arch || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("%s: built by %s as %s with %v; want %s, linux/%s, CGO_ENABLED=0, -trimpath", path, bi.GoVersion, bi.Path, settings, toolchain, arch)
	}
}

// copyOut copies a file out of the image (podman create, cp, rm).
func copyOut(t *testing.T, img image, src, dst string) {
	t.Helper()
	out, err := run(t, time.Minute, img.env, "podman", "create", "--pull=never", img.ref)
	if err != nil {
		t.Fatalf("podman create: %v\n%s", err, out)
	}
	id := strings.TrimSpace(out)
	defer func() { _, _ = run(t, time.Minute, img.env, "podman", "rm", "-f", id) }()
	if out, err := run(t, 2*time.Minute, img.env, "podman", "cp", id+":"+src, dst); err != nil {
		t.Fatalf("podman cp %s: %v\n%s", src, err, out)
	}
}

// goModToolchain is go.mod's `toolchain` line (the Go release the images
// are built with).
func goModToolchain(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^toolchain (go\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no toolchain line")
	}
	return string(m[1])
}
