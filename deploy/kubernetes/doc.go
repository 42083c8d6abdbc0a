// Package kubernetes holds the manifests that run warden as the endpoint
// picker (EPP) of a Gateway API Inference Extension InferencePool
// (kubectl apply -k deploy/kubernetes/): kustomization.yaml lists them
// and says what each is for; config/epp.yaml is the picker's
// configuration. There is no Go code here beside manifests_test.go,
// which parses every manifest with the Kubernetes API types and checks
// that their names and ports agree with each other and with the
// configuration.
package kubernetes
