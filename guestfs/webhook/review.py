"""The AdmissionReview v1 envelope: the request the API server posts, parsed strictly
enough to answer it, and the response (a JSONPatch, base64 as the API requires)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class ReviewError(ValueError):
    """A body that is no AdmissionReview v1 request; answered with HTTP 400."""


@dataclass(frozen=True)
class Request:
    uid: str
    kind: str                   # request.kind.kind: "Pod" for the pods we mutate
    group: str
    subresource: str
    operation: str
    namespace: str
    obj: dict[str, Any]

    @property
    def is_pod_create(self) -> bool:
        return (self.group, self.kind, self.subresource, self.operation) == \
            ("", "Pod", "", "CREATE")

    def pod_name(self) -> str:
        """The pod's name, or its generateName followed by "*" (a Deployment's or a Job's
        pod has no name yet when it is admitted)."""
        meta = self.obj.get("metadata") or {}
        return str(meta.get("name") or (meta.get("generateName") or "") + "*")


def parse(body: bytes) -> Request:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ReviewError(f"the body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ReviewError("the body is not a JSON object")
    if (doc.get("apiVersion"), doc.get("kind")) != (API_VERSION, KIND):
        raise ReviewError(f"expected apiVersion {API_VERSION} kind {KIND}, got "
                          f"{str(doc.get('apiVersion'))[:60]} {str(doc.get('kind'))[:60]}")
    req = doc.get("request")
    if not isinstance(req, dict):
        raise ReviewError("the AdmissionReview has no request")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("the request has no uid")
    kind = req.get("kind") if isinstance(req.get("kind"), dict) else {}
    obj = req.get("object")
    return Request(uid=uid, kind=str(kind.get("kind", "")), group=str(kind.get("group", "")),
                   subresource=str(req.get("subResource") or ""),
                   operation=str(req.get("operation", "")),
                   namespace=str(req.get("namespace") or ""),
                   obj=obj if isinstance(obj, dict) else {})


def response(uid: str, ops: tuple[dict[str, Any], ...] | list[dict[str, Any]],
             warnings: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """Allowed, with the patch when there is one: the webhook never denies a pod."""
    out: dict[str, Any] = {"uid": uid, "allowed": True}
    if ops:
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(json.dumps(list(ops)).encode()).decode()
    if warnings:
        out["warnings"] = list(warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": out}


def error(message: str, code: int) -> dict[str, Any]:
    """The answer to a body that could not be read as a request (no uid to answer)."""
    return {"apiVersion": API_VERSION, "kind": KIND,
            "response": {"uid": "", "allowed": False,
                         "status": {"code": code, "message": message[:500]}}}
