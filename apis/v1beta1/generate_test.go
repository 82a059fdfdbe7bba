package v1beta1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dklesev/kpssh/test/testenv"
)

const controllerGenVersion = "v0.21.0"

// controllerGen returns the pinned controller-gen, installing it into
// bin/tools from the module proxy when absent (never a skip).
func controllerGen(t *testing.T, root string) string {
	t.Helper()
	if p := os.Getenv("CONTROLLER_GEN"); p != "" {
		return p
	}
	dir := filepath.Join(root, "bin", "tools", "controller-gen-"+controllerGenVersion)
	bin := filepath.Join(dir, "controller-gen")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", "sigs.k8s.io/controller-tools/cmd/controller-gen@"+controllerGenVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install controller-gen: %v\n%s", err, out)
	}
	return bin
}

// The checked-in CRDs and deepcopy code must be exactly what `make generate`
// produces from apis/: a hand edit or a forgotten regeneration fails here.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	gen := controllerGen(t, root)

	// Generate into a copy of the module so the work tree is never touched.
	tmp := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum", "hack/boilerplate.go.txt"} {
		copyFile(t, filepath.Join(root, f), filepath.Join(tmp, f))
	}
	copyTree(t, filepath.Join(root, "apis"), filepath.Join(tmp, "apis"), func(p string) bool {
		return !strings.HasSuffix(p, "_test.go") && !strings.HasSuffix(p, ".yaml") && filepath.Base(p) != "embed.go" && filepath.Base(p) != "zz_generated.deepcopy.go"
	})
	cmd := exec.Command(gen, "object:headerFile=hack/boilerplate.go.txt", "paths=./apis/...", "crd", "output:crd:artifacts:config=apis/crds")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, out)
	}

	want, _ := filepath.Glob(filepath.Join(tmp, "apis", "crds", "*.yaml"))
	have, _ := filepath.Glob(filepath.Join(root, "apis", "crds", "*.yaml"))
	if len(want) != 3 || len(have) != len(want) {
		t.Fatalf("generated %d CRDs, %d checked in; want 3 each (run make generate)", len(want), len(have))
	}
	for _, rel := range append(relAll(t, tmp, want), "apis/v1beta1/zz_generated.deepcopy.go") {
		g, err := os.ReadFile(filepath.Join(tmp, rel))
		if err != nil {
			t.Fatal(err)
		}
		c, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatalf("%s is not checked in (run make generate): %v", rel, err)
		}
		if !bytes.Equal(g, c) {
			t.Errorf("%s differs from what controller-gen produces; run make generate", rel)
		}
	}
}

func relAll(t *testing.T, base string, paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		r, err := filepath.Rel(base, p)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = r
	}
	return out
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyTree(t *testing.T, src, dst string, keep func(string) bool) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !keep(p) {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		copyFile(t, p, filepath.Join(dst, rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
