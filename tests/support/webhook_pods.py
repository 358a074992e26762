"""The workloads people run, as the webhook tests submit them: each a controller's
manifest (or a bare pod), the namespace it is created in and that namespace's labels.
pod() gives the pod its controller creates, as the API server admits it."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from tests.support.admission import pod_of

LABELLED = {"io.guestfs.enable": "true"}
APP = "registry.example/app:1.0"


@dataclass(frozen=True)
class Shape:
    name: str
    namespace: str
    namespace_labels: dict
    manifest: str

    def workload(self) -> dict:
        return yaml.safe_load(self.manifest)

    def pod(self) -> dict:
        doc = self.workload()
        if doc["kind"] == "Pod":
            return {**doc, "metadata": {**doc["metadata"], "namespace": self.namespace}}
        return pod_of({**doc, "metadata": {**doc["metadata"], "namespace": self.namespace}})


DEPLOYMENT = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: shop}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: shop}}}}
  template:
    metadata: {{labels: {{app: shop}}}}
    spec:
      containers:
        - name: app
          image: {APP}
          resources:
            limits: {{cpu: "1", memory: 512Mi}}
"""

JOB = f"""
apiVersion: batch/v1
kind: Job
metadata: {{name: report}}
spec:
  backoffLimit: 2
  template:
    metadata:
      labels: {{batch.kubernetes.io/job-name: report, job-name: report}}
    spec:
      restartPolicy: Never
      containers:
        - name: app
          image: {APP}
          resources:
            limits: {{cpu: "1", memory: 512Mi}}
          volumeMounts:
            - {{name: scratch, mountPath: /scratch}}
      volumes:
        - name: scratch
          emptyDir: {{}}
"""

# An LXCFS recipe's hostPath over /proc/meminfo already in the pod: it is kept, the other
# files are added.
EXISTING_PROC_MOUNT = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: legacy}}
spec:
  selector: {{matchLabels: {{app: legacy}}}}
  template:
    metadata:
      labels: {{app: legacy}}
      annotations: {{team: "payments/core"}}
    spec:
      containers:
        - name: app
          image: {APP}
          resources:
            limits: {{cpu: "1", memory: 512Mi}}
          volumeMounts:
            - {{name: lxcfs-meminfo, mountPath: /proc/meminfo, readOnly: true}}
      volumes:
        - name: lxcfs-meminfo
          hostPath: {{path: /var/lib/lxcfs/proc/meminfo, type: File}}
"""

# An init container that runs to completion, a native sidecar and the app.
INIT_CONTAINERS = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: api}}
spec:
  selector: {{matchLabels: {{app: api}}}}
  template:
    metadata: {{labels: {{app: api}}}}
    spec:
      initContainers:
        - name: migrate
          image: {APP}
          command: [sh, -c, "cat /proc/meminfo > /dev/null"]
        - name: proxy
          image: {APP}
          restartPolicy: Always
          command: [sleep, "3600"]
      containers:
        - name: app
          image: {APP}
          resources:
            limits: {{cpu: "1", memory: 512Mi}}
"""

USERNS = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: sandboxed}}
spec:
  selector: {{matchLabels: {{app: sandboxed}}}}
  template:
    metadata: {{labels: {{app: sandboxed}}}}
    spec:
      hostUsers: false
      containers:
        - name: app
          image: {APP}
          resources:
            limits: {{cpu: "1", memory: 512Mi}}
"""

ANNOTATED_POD = f"""
apiVersion: v1
kind: Pod
metadata:
  name: debug
  annotations: {{io.guestfs.enable: "true"}}
spec:
  containers:
    - name: app
      image: {APP}
      resources:
        limits: {{cpu: "1", memory: 512Mi}}
"""

OPTED_OUT = DEPLOYMENT.replace("metadata: {labels: {app: shop}}",
                               'metadata: {labels: {app: shop}, annotations: '
                               '{io.guestfs.enable: "false"}}')
LABELLED_OUT = DEPLOYMENT.replace("metadata: {labels: {app: shop}}",
                                  'metadata: {labels: {app: shop, io.guestfs.enable: '
                                  '"false"}}')

SHAPES = {s.name: s for s in (
    Shape("deployment", "team-a", LABELLED, DEPLOYMENT),
    Shape("job", "team-a", LABELLED, JOB),
    Shape("existing-proc-mount", "team-a", LABELLED, EXISTING_PROC_MOUNT),
    Shape("init-containers", "team-a", LABELLED, INIT_CONTAINERS),
    Shape("userns", "team-a", LABELLED, USERNS),
    Shape("unlabelled-namespace", "team-b", {}, DEPLOYMENT),
    Shape("unlabelled-namespace-annotated-pod", "team-b", {}, ANNOTATED_POD),
    Shape("annotated-opt-out", "team-a", LABELLED, OPTED_OUT),
    Shape("labelled-opt-out", "team-a", LABELLED, LABELLED_OUT),
    Shape("kube-system", "kube-system", LABELLED, DEPLOYMENT),
)}
