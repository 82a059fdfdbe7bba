package v1beta1_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: poolNS}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		fmt.Fprintln(os.Stderr, "create pool namespace:", err)
		_ = env.Stop()
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop control plane:", err)
	}
	os.Exit(code)
}
