"""What the webhook adds to one pod: pure, from the pod as the API server sent it, whether
its namespace was selected, and the options, to JSONPatch operations and the warnings the
API server shows the pod's creator. It never replaces what the pod already has."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from guestfs.webhook import patch
from guestfs.webhook.files import DEFAULT_FILES, DEFAULT_SOURCE, InjectedFile, choose

# The opt-in and opt-out annotation (the OCI hook's too, whose hooks.d file also takes
# "1"): true selects a pod in any namespace the webhook is called for, false skips it
# even in a selected namespace.
ENABLE = "io.guestfs.enable"
WISHES = {"true": "true", "1": "true", "false": "false", "0": "false"}
# Set on a mutated pod: the files it was given, so that a rollback can find such pods.
INJECTED = "io.guestfs.injected"


@dataclass(frozen=True)
class Options:
    """How the webhook mutates. userns_pods: the nodes' daemons serve files that an
    idmapped bind can show (kubelet idmaps every volume of a hostUsers: false pod), so
    such pods may be given them. seccomp_profile: the Localhost profile to set on pods
    that have none ("" sets none)."""

    files: tuple[InjectedFile, ...] = field(default_factory=lambda: choose(DEFAULT_FILES))
    source: str = DEFAULT_SOURCE
    userns_pods: bool = False
    seccomp_profile: str = ""


@dataclass(frozen=True)
class Decision:
    """The operations for one pod (empty: left as it is), the warnings for its creator,
    and the reason, for the webhook's log."""

    ops: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    reason: str


def decide(pod: dict[str, Any], namespace_selected: bool, options: Options) -> Decision:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    given = annotations.get(ENABLE)
    wish = WISHES.get(given) if isinstance(given, str) else None
    warnings: list[str] = []
    if given is not None and wish is None:
        warnings.append(f"guestfs: annotation {ENABLE}={given!r} is neither \"true\" nor "
                        "\"false\"; ignored")
    if wish == "false":
        return Decision((), tuple(warnings), f"{ENABLE}=false")
    if not namespace_selected and wish != "true":
        return Decision((), tuple(warnings), "not selected")
    if (spec.get("os") or {}).get("name") == "windows":
        return Decision((), tuple(warnings), "a Windows pod")
    if spec.get("hostUsers") is False and not options.userns_pods:
        warnings.append("guestfs: not injected: a hostUsers: false pod gets its volumes "
                        "idmapped, which this cluster's guestfs files are not declared to "
                        "allow (the webhook's --userns-pods)")
        return Decision((), tuple(warnings), "hostUsers: false")
    files, new = _volumes(spec, options, warnings)
    mount_ops, used = _mounts(spec, files, warnings)
    ops = patch.append(spec, "volumes", ("spec", "volumes"),
                       [v for f, v in new if f in used]) + mount_ops
    if used:
        ops += _seccomp(spec, options, warnings)
        names = ",".join(f.name for f in options.files if f in used)
        ops += _annotate(meta, names)
    reason = f"injected {len(used)} file(s)" if ops else "nothing to add"
    return Decision(tuple(ops), tuple(warnings), reason)


def _volumes(spec: dict, options: Options, warnings: list[str]
             ) -> tuple[list[InjectedFile], list[tuple[InjectedFile, dict]]]:
    """The files whose volume the pod has or may be given, and the volumes to add. A
    volume of the pod that has the name of one of ours but another source is the pod's
    own: that file is left out."""
    have = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    files: list[InjectedFile] = []
    new: list[tuple[InjectedFile, dict]] = []
    for f in options.files:
        path = f.host_path(options.source)
        if f.volume in have:
            if (have[f.volume].get("hostPath") or {}).get("path") == path:
                files.append(f)
            else:
                warnings.append(f"guestfs: {f.container_path} not injected: the pod's own "
                                f"volume is named {f.volume}")
            continue
        files.append(f)
        new.append((f, {"name": f.volume, "hostPath": {"path": path, "type": "File"}}))
    return files, new


def _mounts(spec: dict, files: list[InjectedFile], warnings: list[str]
            ) -> tuple[list[dict], set[InjectedFile]]:
    """Read-only mounts of the files in every init and regular container that has no mount
    of its own at that path; the files some container was given."""
    ops: list[dict] = []
    used: set[InjectedFile] = set()
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            mounts = c.get("volumeMounts") or []
            taken = {posixpath.normpath(m.get("mountPath", "")): m.get("name")
                     for m in mounts if isinstance(m, dict)}
            adding = []
            for f in files:
                owner = taken.get(f.container_path)
                if owner is None:
                    adding.append({"name": f.volume, "mountPath": f.container_path,
                                   "readOnly": True})
                    used.add(f)
                elif owner != f.volume:
                    warnings.append(f"guestfs: container {c.get('name')} keeps its own "
                                    f"mount at {f.container_path}")
            ops += patch.append(c, "volumeMounts", ("spec", kind, i, "volumeMounts"), adding)
    return ops, used


def _seccomp(spec: dict, options: Options, warnings: list[str]) -> list[dict]:
    """The pod-level Localhost profile that routes sysinfo(2) and sched_getaffinity(2) to
    the node's seccomp agent, unless the pod or a container chose a profile of its own
    (a container's overrides the pod's: those keep the node's answers)."""
    name = options.seccomp_profile
    if not name:
        return []
    wanted = {"type": "Localhost", "localhostProfile": name}
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            own = (c.get("securityContext") or {}).get("seccompProfile")
            if own and own != wanted:
                warnings.append(f"guestfs: container {c.get('name')} keeps its own seccomp "
                                "profile: sysinfo(2) and the CPU count stay the node's there")
    sc = spec.get("securityContext")
    if not isinstance(sc, dict):
        return [patch.add("/spec/securityContext", {"seccompProfile": wanted})]
    own = sc.get("seccompProfile")
    if own is None:
        return [patch.add("/spec/securityContext/seccompProfile", wanted)]
    if own != wanted:
        warnings.append("guestfs: the pod keeps its own seccomp profile: sysinfo(2) and the "
                        "CPU count stay the node's")
    return []


def _annotate(meta: dict, names: str) -> list[dict]:
    if not isinstance(meta.get("annotations"), dict):
        return [patch.add("/metadata/annotations", {INJECTED: names})]
    if meta["annotations"].get(INJECTED) == names:
        return []
    return [patch.add(patch.pointer("metadata", "annotations", INJECTED), names)]
