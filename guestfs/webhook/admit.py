"""One admission: a request body in, the HTTP status, the AdmissionReview answer and the
fields of its log line out. Whatever goes wrong with a readable request, the pod is
allowed unchanged: the webhook must never be the reason a pod cannot be created."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Any

from guestfs.webhook import review
from guestfs.webhook.events import event
from guestfs.webhook.inject import Options, decide


@dataclass(frozen=True)
class Outcome:
    status: int
    body: dict[str, Any]
    fields: dict[str, Any]


def admit(body: bytes, namespace_selected: bool, options: Options) -> Outcome:
    try:
        req = review.parse(body)
    except review.ReviewError as e:
        return Outcome(400, review.error(str(e), 400), {"error": str(e)[:200]})
    fields: dict[str, Any] = {"uid": req.uid, "namespace": req.namespace,
                              "kind": req.kind, "operation": req.operation}
    if not req.is_pod_create:
        return Outcome(200, review.response(req.uid, ()), {**fields, "reason": "not a pod "
                                                           "creation"})
    fields["pod"] = req.pod_name()
    try:
        decision = decide(req.obj, namespace_selected, options)
    except Exception as e:   # a pod shape inject.py did not foresee: admit it as it is
        where = traceback.extract_tb(e.__traceback__)[-1]
        event(logging.ERROR, "inject-failed", **fields, error=repr(e)[:200],
              at=f"{where.filename}:{where.lineno}")
        return Outcome(200, review.response(req.uid, (), [f"guestfs: not injected: "
                                                          f"{type(e).__name__}"]),
                       {**fields, "reason": "internal error", "error": repr(e)[:200]})
    return Outcome(200, review.response(req.uid, decision.ops, decision.warnings),
                   {**fields, "reason": decision.reason, "ops": len(decision.ops),
                    "warnings": list(decision.warnings)})
