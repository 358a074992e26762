"""CRI v1 protobuf and gRPC stubs, generated from tests/support/cri/api.proto at test time.

grpc_tools.protoc writes api_pb2.py and api_pb2_grpc.py into a fresh private directory
(mkdtemp, mode 0700) once per process; nothing generated is committed or read from the
working directory.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parent / "api.proto"


@cache
def load() -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc): the messages and the RuntimeService/ImageService stubs."""
    from grpc_tools import protoc  # a test dependency: imported only by CRI tests

    out = Path(tempfile.mkdtemp(prefix="guestfs-cri-stubs-"))
    try:
        shutil.copy(PROTO, out / "api.proto")
        include = Path(protoc.__file__).parent / "_proto"
        rc = protoc.main(["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}",
                          f"--grpc_python_out={out}", str(out / "api.proto")])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {PROTO} (exit {rc})")
        pb2 = _import("api_pb2", out / "api_pb2.py")
        # api_pb2_grpc says `import api_pb2`: the module registered above answers it.
        grpc_mod = _import("api_pb2_grpc", out / "api_pb2_grpc.py")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return pb2, grpc_mod


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
