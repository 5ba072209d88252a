// Package versioned is a NodeFeature client that refuses every call (see the module's go.mod).
package versioned

import (
	"context"
	"errors"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"sigs.k8s.io/node-feature-discovery/pkg/apis/nfd/v1alpha1"
)

var errShim = errors.New("the NodeFeature API is not built into this test build of GFD (hack/nvidia-device-plugin)")

type NodeFeatureInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1alpha1.NodeFeature, error)
	Create(ctx context.Context, nf *v1alpha1.NodeFeature, opts metav1.CreateOptions) (*v1alpha1.NodeFeature, error)
	Update(ctx context.Context, nf *v1alpha1.NodeFeature, opts metav1.UpdateOptions) (*v1alpha1.NodeFeature, error)
}

type NfdV1alpha1Interface interface {
	NodeFeatures(namespace string) NodeFeatureInterface
}

type Interface interface {
	NfdV1alpha1() NfdV1alpha1Interface
}

type refusing struct{}

func (refusing) NfdV1alpha1() NfdV1alpha1Interface         { return refusing{} }
func (refusing) NodeFeatures(string) NodeFeatureInterface { return refusing{} }
func (refusing) Get(context.Context, string, metav1.GetOptions) (*v1alpha1.NodeFeature, error) {
	return nil, errShim
}
func (refusing) Create(context.Context, *v1alpha1.NodeFeature, metav1.CreateOptions) (*v1alpha1.NodeFeature, error) {
	return nil, errShim
}
func (refusing) Update(context.Context, *v1alpha1.NodeFeature, metav1.UpdateOptions) (*v1alpha1.NodeFeature, error) {
	return nil, errShim
}

// NewForConfig returns the refusing client.
func NewForConfig(*rest.Config) (Interface, error) { return refusing{}, nil }
