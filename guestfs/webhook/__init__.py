"""`guestfs webhook`: a Kubernetes mutating admission webhook that adds the node
DaemonSet's per-caller files to the pods it selects, so that no team pastes the pod
snippet into its workloads. Which files (files.py), the JSONPatch operations (patch.py),
the pure decision over one pod (inject.py), the AdmissionReview envelope (review.py) and
the HTTPS server (server.py). It reads no host file and mounts nothing: it never imports
the daemon's or the FUSE code."""
