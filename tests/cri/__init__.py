"""Kubernetes' runtime path in tests: a private containerd driven over CRI v1 as kubelet
drives it, fed by a translator of the shipped manifests (container/k8s)."""
