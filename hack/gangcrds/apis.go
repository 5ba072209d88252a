// Package gangcrds pins the API packages that hack/build-gang-crds.sh generates CRDs from (nothing is built
// from it: controller-gen reads the packages' types and markers).
package gangcrds

import _ "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
