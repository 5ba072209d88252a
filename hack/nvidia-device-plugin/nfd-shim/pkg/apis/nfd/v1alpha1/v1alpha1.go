// Package v1alpha1 re-exports the NodeFeature types from sigs.k8s.io/node-feature-discovery/api/nfd.
package v1alpha1

import api "sigs.k8s.io/node-feature-discovery/api/nfd/v1alpha1"

type (
	NodeFeature     = api.NodeFeature
	NodeFeatureSpec = api.NodeFeatureSpec
	Features        = api.Features
)

const NodeFeatureObjNodeNameLabel = api.NodeFeatureObjNodeNameLabel

func NewFeatures() *Features { return api.NewFeatures() }
