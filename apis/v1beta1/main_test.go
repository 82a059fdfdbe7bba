package v1beta1_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/dklesev/kpssh/test/testenv"
)

// env is the one real kube-apiserver shared by this package's tests.
var env *testenv.Env

func TestMain(m *testing.M) {
	var err error
	if env, err = testenv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop control plane:", err)
	}
	os.Exit(code)
}
