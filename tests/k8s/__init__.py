"""Test-only local Kubernetes control plane (etcd, kube-apiserver, controller-manager,
scheduler) with a process kubelet; see tests/k8s/README.md."""
