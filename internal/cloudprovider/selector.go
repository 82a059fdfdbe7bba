package cloudprovider

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

func metav1LabelSelector(nc *v1beta1.SSHNodeClass) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(nc.Spec.HostSelector)
}
