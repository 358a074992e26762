"""What the webhook does to the pods people run, in process: each pod shape is routed
through the shipped MutatingWebhookConfiguration's selectors as the API server routes it,
admitted (review in, AdmissionReview out), its patch applied (RFC 6902) and the result
validated against the Kubernetes schema; then the same checks for each option."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from guestfs.webhook import files as wfiles
from guestfs.webhook.admit import admit
from guestfs.webhook.inject import ENABLE, INJECTED, Options, decide
from guestfs.webhook.server import ROUTES
from tests.support import admission, jsonpatch
from tests.support.webhook_pods import SHAPES
from tests.unit.test_manifests import K8S, KUBERNETES, documents

CONFIG = documents(K8S / "webhook" / "base" / "webhook.yaml")[0]
SNIPPET = documents(K8S / "daemonset" / "pod-snippet.yaml")[0]
PROFILE = {"type": "Localhost", "localhostProfile": "guestfs-notify.json"}
SHIPPED = Options(seccomp_profile=wfiles.DEFAULT_SECCOMP_PROFILE)   # the Deployment's --seccomp


def submit(pod: dict, namespace: str, namespace_labels: dict, options: Options
           ) -> tuple[dict, list[dict], list[str]]:
    """(the pod as created, the patch, the warnings): unchanged where no webhook of the
    configuration is called."""
    hooks = admission.calls(CONFIG, namespace, namespace_labels, pod)
    assert len(hooks) <= 1, [h["name"] for h in hooks]     # never two calls for one pod
    if not hooks:
        return pod, [], []
    request = admission.review(pod, namespace)
    path = hooks[0]["clientConfig"]["service"]["path"]
    outcome = admit(json.dumps(request).encode(), ROUTES[path], options)
    assert outcome.status == 200
    ops = admission.patch_of(outcome.body, request)
    return jsonpatch.apply(pod, ops), ops, outcome.body["response"].get("warnings", [])


def containers(pod: dict) -> list[dict]:
    return pod["spec"].get("initContainers", []) + pod["spec"]["containers"]


def served_mounts(pod: dict, c: dict) -> dict[str, str]:
    """mountPath -> node path of the container's hostPath mounts of guestfs files."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    out = {}
    for m in c.get("volumeMounts", []):
        hp = volumes[m["name"]].get("hostPath")
        if hp and hp["path"].startswith(wfiles.DEFAULT_SOURCE + "/"):
            assert m["readOnly"] is True and hp["type"] == "File", m
            out[m["mountPath"]] = hp["path"]
    return out


def snippet_mounts() -> dict[str, str]:
    spec = SNIPPET["spec"]
    return served_mounts(SNIPPET, spec["containers"][0])


def validated(pod: dict) -> dict:
    doc = dict(pod, metadata={k: v for k, v in pod["metadata"].items()})
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    return pod


MUTATED = ["deployment", "job", "existing-proc-mount", "init-containers",
           "unlabelled-namespace-annotated-pod"]
LEFT_ALONE = ["userns", "unlabelled-namespace", "annotated-opt-out", "labelled-opt-out",
              "kube-system"]


@pytest.mark.parametrize("admitted", [False, True], ids=["as-written", "api-defaulted"])
@pytest.mark.parametrize("shape", MUTATED)
def test_selected_pods_get_the_snippets_files_in_every_container(shape, admitted):
    s = SHAPES[shape]
    pod = s.pod()
    pod = admission.as_admitted(pod) if admitted else pod
    out, ops, warnings = submit(pod, s.namespace, s.namespace_labels, SHIPPED)
    validated(out)
    print(f"{shape} ({'api-defaulted' if admitted else 'as written'}): {len(ops)} ops, "
          f"warnings {warnings}")
    want = snippet_mounts()
    for before, after in zip(containers(pod), containers(out), strict=True):
        own = {m["mountPath"]: m for m in before.get("volumeMounts", [])}
        got = served_mounts(out, after)
        # Every snippet file the container did not mount itself, from the snippet's node
        # path; its own mounts kept as they were, in their order, first.
        assert got == {p: n for p, n in want.items() if p not in own}, (after["name"], got)
        assert after.get("volumeMounts", [])[:len(own)] == before.get("volumeMounts", [])
        assert [m["mountPath"] for m in after["volumeMounts"]].count("/proc/meminfo") == 1
    assert out["spec"]["securityContext"]["seccompProfile"] == PROFILE
    given = {p for c in containers(out) for p in served_mounts(out, c)}
    assert out["metadata"]["annotations"][INJECTED] == ",".join(
        f.name for f in wfiles.choose(wfiles.DEFAULT_FILES) if f.container_path in given)
    # Nothing else of the pod changed.
    strip = jsonpatch.apply(out, [])
    for c in containers(strip):
        c["volumeMounts"] = [m for m in c["volumeMounts"] if not m["name"].startswith("guestfs-")]
        if not c["volumeMounts"] and not any(x["name"] == c["name"] and "volumeMounts" in x
                                             for x in containers(pod)):
            del c["volumeMounts"]
    strip["spec"]["volumes"] = [v for v in strip["spec"]["volumes"]
                                if not v["name"].startswith("guestfs-")]
    if "volumes" not in pod["spec"] and not strip["spec"]["volumes"]:
        del strip["spec"]["volumes"]
    strip["spec"]["securityContext"].pop("seccompProfile")
    if "securityContext" not in pod["spec"]:
        del strip["spec"]["securityContext"]
    strip["metadata"]["annotations"].pop(INJECTED)
    if "annotations" not in pod["metadata"]:
        del strip["metadata"]["annotations"]
    assert strip == pod
    # Admitted again (reinvocation, or a second webhook replica): nothing more.
    again, ops2, _ = submit(out, s.namespace, s.namespace_labels, SHIPPED)
    assert ops2 == [] and again == out


def test_a_pod_without_lists_gets_one_op_per_list_and_a_defaulted_one_one_per_item():
    """RFC 6902 "add .../-" into a missing list fails: an absent list is added whole, an
    existing one (the API server's token volume and mount) is appended to item by item."""
    s = SHAPES["deployment"]
    _, ops, _ = submit(s.pod(), s.namespace, s.namespace_labels, SHIPPED)
    assert [op["path"] for op in ops] == ["/spec/volumes", "/spec/containers/0/volumeMounts",
                                          "/spec/securityContext", "/metadata/annotations"]
    _, ops, _ = submit(admission.as_admitted(s.pod()), s.namespace, s.namespace_labels,
                       SHIPPED)
    n = len(wfiles.DEFAULT_FILES)
    assert [op["path"] for op in ops] == ["/spec/volumes/-"] * n + \
        ["/spec/containers/0/volumeMounts/-"] * n + \
        ["/spec/securityContext/seccompProfile", "/metadata/annotations"]


def test_an_existing_proc_mount_is_kept_and_said():
    s = SHAPES["existing-proc-mount"]
    out, _, warnings = submit(s.pod(), s.namespace, s.namespace_labels, SHIPPED)
    (app,) = out["spec"]["containers"]
    (meminfo,) = [m for m in app["volumeMounts"] if m["mountPath"] == "/proc/meminfo"]
    assert meminfo["name"] == "lxcfs-meminfo"
    assert warnings == ["guestfs: container app keeps its own mount at /proc/meminfo"]
    assert "guestfs-meminfo" not in {v["name"] for v in out["spec"]["volumes"]}
    assert out["metadata"]["annotations"] == {"team": "payments/core",
                                              INJECTED: "cpuinfo,stat,uptime,loadavg,swaps,"
                                                        "diskstats,online"}


@pytest.mark.parametrize("shape", LEFT_ALONE)
def test_pods_not_selected_or_opted_out_are_left_unchanged(shape):
    s = SHAPES[shape]
    pod = s.pod()
    out, ops, warnings = submit(pod, s.namespace, s.namespace_labels, SHIPPED)
    assert ops == [] and out == pod
    if shape == "userns":
        (w,) = warnings
        assert "hostUsers: false" in w and "--userns-pods" in w


def test_which_webhook_each_shape_is_sent_to():
    """The configuration's selectors as the API server evaluates them: labelled namespaces
    to /mutate, the others to /mutate/annotated, kube-system and pods labelled
    io.guestfs.enable=false to neither."""
    sent = {}
    for name, s in SHAPES.items():
        hooks = admission.calls(CONFIG, s.namespace, s.namespace_labels, s.pod())
        sent[name] = [h["clientConfig"]["service"]["path"] for h in hooks]
    assert sent["deployment"] == sent["userns"] == sent["annotated-opt-out"] == ["/mutate"]
    assert sent["unlabelled-namespace"] == ["/mutate/annotated"]
    assert sent["unlabelled-namespace-annotated-pod"] == ["/mutate/annotated"]
    assert sent["labelled-opt-out"] == sent["kube-system"] == []


def test_userns_pods_are_injected_where_the_option_says_the_files_allow_it():
    s = SHAPES["userns"]
    out, ops, warnings = submit(s.pod(), s.namespace, s.namespace_labels,
                                Options(userns_pods=True))
    assert ops and warnings == []
    assert served_mounts(validated(out), out["spec"]["containers"][0]) == snippet_mounts()


def test_without_seccomp_no_profile_and_a_pods_own_profile_is_kept():
    s = SHAPES["deployment"]
    out, _, warnings = submit(s.pod(), s.namespace, s.namespace_labels, Options())
    assert "securityContext" not in out["spec"] and warnings == []
    pod = s.pod()
    pod["spec"]["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    pod["spec"]["containers"][0]["securityContext"] = {
        "seccompProfile": {"type": "Unconfined"}}
    out, _, warnings = submit(pod, s.namespace, s.namespace_labels, SHIPPED)
    assert out["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert len(warnings) == 2 and all("sysinfo(2)" in w for w in warnings)
    assert served_mounts(out, out["spec"]["containers"][0]) == snippet_mounts()


def test_the_file_set_is_configurable_and_refuses_what_runc_refuses():
    chosen = wfiles.choose(["meminfo", "online", "possible"])
    s = SHAPES["deployment"]
    out, _, _ = submit(s.pod(), s.namespace, s.namespace_labels, Options(files=chosen))
    assert set(served_mounts(validated(out), out["spec"]["containers"][0])) == {
        "/proc/meminfo", "/sys/devices/system/cpu/online", "/sys/devices/system/cpu/possible"}
    for word in ("pressure/cpu", "pressure/memory", "pressure/io"):
        with pytest.raises(ValueError, match="runc refuses"):
            wfiles.choose(["meminfo", word])
    with pytest.raises(ValueError, match="not a served file"):
        wfiles.choose(["meminfo", "vmstat"])
    # Every injectable /proc target is on runc's list; the snippet's set is the default.
    for f in wfiles.INJECTABLE.values():
        assert not f.container_path.startswith("/proc/") or \
            f.container_path[len("/proc/"):] in wfiles.RUNC_PROC_ALLOWED
    assert {f.container_path for f in wfiles.choose(wfiles.DEFAULT_FILES)} == \
        set(snippet_mounts())


def test_a_volume_of_the_pods_own_with_one_of_our_names_is_not_taken_over():
    s = SHAPES["deployment"]
    pod = s.pod()
    pod["spec"]["volumes"] = [{"name": "guestfs-meminfo", "emptyDir": {}}]
    out, _, warnings = submit(pod, s.namespace, s.namespace_labels, Options())
    assert out["spec"]["volumes"][0] == {"name": "guestfs-meminfo", "emptyDir": {}}
    assert "/proc/meminfo" not in served_mounts(out, out["spec"]["containers"][0])
    assert warnings == ["guestfs: /proc/meminfo not injected: the pod's own volume is named "
                        "guestfs-meminfo"]


def test_an_odd_annotation_value_is_ignored_with_a_warning():
    s = SHAPES["deployment"]
    pod = s.pod()
    pod["metadata"]["annotations"] = {ENABLE: "yes"}
    d = decide(pod, namespace_selected=False, options=Options())
    assert d.ops == () and "neither" in d.warnings[0]
    d = decide(pod, namespace_selected=True, options=Options())
    assert d.ops and "neither" in d.warnings[0]
    # The OCI hook's hooks.d file takes "1" for true: so does the webhook, and "0" for false.
    for value, selected, injected in (("1", False, True), ("0", True, False),
                                      ("true", False, True), ("false", True, False)):
        pod["metadata"]["annotations"] = {ENABLE: value}
        d = decide(pod, namespace_selected=selected, options=Options())
        assert bool(d.ops) is injected and d.warnings == (), value


@pytest.mark.parametrize("body,message", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "expected"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "no request"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
     "no uid"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100000 + b"]" * 100000, "not JSON"),
])
def test_an_unreadable_review_is_a_400_review_error(body, message):
    outcome = admit(body, True, Options())
    assert outcome.status == 400
    assert outcome.body["kind"] == "AdmissionReview"
    resp = outcome.body["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 400
    assert message in resp["status"]["message"]


def test_other_objects_and_operations_are_allowed_unchanged():
    s = SHAPES["deployment"]
    for change in ({"operation": "UPDATE"}, {"kind": {"group": "apps", "version": "v1",
                                                      "kind": "Deployment"}},
                   {"subResource": "ephemeralcontainers"}):
        request = admission.review(s.pod(), s.namespace)
        request["request"].update(change)
        outcome = admit(json.dumps(request).encode(), True, Options())
        assert outcome.status == 200 and admission.patch_of(outcome.body, request) == []


def test_a_pod_shape_inject_cannot_read_is_admitted_unchanged_with_a_warning():
    request = admission.review({"metadata": {}, "spec": {"containers": "not a list"}}, "x")
    outcome = admit(json.dumps(request).encode(), True, Options())
    assert outcome.status == 200 and admission.patch_of(outcome.body, request) == []
    assert outcome.body["response"]["warnings"] == ["guestfs: not injected: AttributeError"]
