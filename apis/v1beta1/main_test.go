package v1beta1_test

import (
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/test/testenv"
)

// env is the one real kube-apiserver shared by this package's tests.
var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.RunMain(m, &env, func(e *testenv.Env) error {
		return e.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: poolNS}})
	}))
}

// needEnv skips, saying why, under -short (make test-unit); make test and
// CI never pass -short, so there a missing control plane fails in TestMain.
func needEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("-short: needs the real kube-apiserver")
	}
}
