// Package wrapper holds no code: its go.mod pins k8s.io/kubernetes and maps
// every staging module to its published version, so the control-plane commands
// can be built with `go build` from the module proxy. See tests/k8s/build.sh.
package wrapper
