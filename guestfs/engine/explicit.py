"""Limits given explicitly: command-line options, environment, Kubernetes downward API.

Inside a cgroup namespace (Kubernetes, Docker and Podman on v2) the pod slice and every
other ancestor are invisible, and inside gVisor the cgroup files are the sandbox's own.
These sources carry the limit in from outside.

Downward API values are ``ceil(value / divisor)`` as a bare integer (the kubelet's
``resourceFieldRef``); the default divisor is 1, so ``limits.cpu`` is whole cores rounded
up unless the pod spec says ``divisor: 1m``. Tell guestfs the divisor with
``--cpu-divisor``/``GUESTFS_CPU_DIVISOR`` (and ``--memory-divisor``). A divisor applies to
bare numbers from the environment and the limits directory; a value written with a unit
(``1500m``, ``512Mi``) means what it says.

The directory's files are read by guestfs.sources.limits_dir; this module only parses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from guestfs.engine.provenance import Candidate
from guestfs.engine.quantity import (
    in_range,
    parse_cpu_quantity,
    parse_memory_quantity,
    parse_quantity,
)
from guestfs.sources.limits_dir import (
    DOWNWARD_CPU_FILE,
    DOWNWARD_MEMORY_FILE,
    LimitFileError,
    read_limits_dir,
)
from guestfs.sources.provenance import DOWNWARD_API, ENV, OPTION, Source

ENV_MEMORY = "GUESTFS_MEMORY_LIMIT"
ENV_CPU = "GUESTFS_CPU_LIMIT"
ENV_MEMORY_DIVISOR = "GUESTFS_MEMORY_DIVISOR"
ENV_CPU_DIVISOR = "GUESTFS_CPU_DIVISOR"
ENV_LIMITS_DIR = "GUESTFS_LIMITS_DIR"


class ExplicitLimitError(ValueError):
    """An explicit setting the user gave cannot be parsed: a usage error, not a fallback."""


@dataclass(frozen=True)
class ExplicitSettings:
    """What the user asked for, before anything is read or parsed."""

    memory_limit: str | None = None
    cpu_limit: str | None = None
    limits_dir: str | None = None
    memory_divisor: str | None = None
    cpu_divisor: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExplicitLimits:
    memory: tuple[Candidate[int], ...] = ()
    cpu: tuple[Candidate[Fraction], ...] = ()
    warnings: tuple[str, ...] = ()


def _is_bare_number(text: str) -> bool:
    digits = text.strip().replace(".", "", 1)
    return digits.isascii() and digits.isdigit()


def _divisor(text: str | None, what: str) -> Fraction:
    if text is None or not text.strip():
        return Fraction(1)
    try:
        value = parse_quantity(text)
    except ValueError as e:
        raise ExplicitLimitError(f"{what}: {e}") from e
    if value <= 0:
        raise ExplicitLimitError(f"{what} must be positive: {text!r}")
    return value


def _memory(text: str, divisor: Fraction, apply_divisor: bool) -> int:
    if apply_divisor and _is_bare_number(text):
        return parse_memory_quantity(str(int(Fraction(text.strip()) * divisor)))
    return parse_memory_quantity(text)


def _cpu(text: str, divisor: Fraction, apply_divisor: bool) -> Fraction:
    if apply_divisor and _is_bare_number(text):
        return in_range(parse_cpu_quantity(text) * divisor, f"{text.strip()} x {divisor}")
    return parse_cpu_quantity(text)


def collect_explicit(settings: ExplicitSettings,
                     read_dir: Callable[[str], Mapping[str, str] | None] = read_limits_dir
                     ) -> ExplicitLimits:
    """Parse every explicit source. A bad option, env value or limits-directory file is an
    error; a missing limits directory or file is not (the pod may set no limit).
    ``read_dir`` gives a limits directory's files by name (None: no such directory)."""
    env = settings.env
    mem_div = _divisor(settings.memory_divisor or env.get(ENV_MEMORY_DIVISOR), "memory divisor")
    cpu_div = _divisor(settings.cpu_divisor or env.get(ENV_CPU_DIVISOR), "cpu divisor")
    memory: list[Candidate[int]] = []
    cpu: list[Candidate[Fraction]] = []
    warnings: list[str] = []

    def add(resource: str, kind: str, name: str, text: str, from_outside: bool) -> None:
        try:
            if resource == "memory":
                memory.append(Candidate(_memory(text, mem_div, from_outside),
                                        Source(kind, name, note=text.strip())))
            else:
                cpu.append(Candidate(_cpu(text, cpu_div, from_outside),
                                     Source(kind, name, note=text.strip())))
        except ValueError as e:
            raise ExplicitLimitError(f"{name}: {e}") from e

    if settings.memory_limit is not None:
        add("memory", OPTION, "--memory-limit", settings.memory_limit, False)
    if settings.cpu_limit is not None:
        add("cpu", OPTION, "--cpu-limit", settings.cpu_limit, False)
    for resource, var in (("memory", ENV_MEMORY), ("cpu", ENV_CPU)):
        if env.get(var, "").strip():
            add(resource, ENV, var, env[var], True)
    limits_dir = settings.limits_dir or env.get(ENV_LIMITS_DIR)
    if limits_dir:
        try:
            files = read_dir(limits_dir)
        except LimitFileError as e:
            raise ExplicitLimitError(str(e)) from None
        if files is None:
            warnings.append(f"limits directory {limits_dir} does not exist; ignored")
        else:
            for resource, name in (("memory", DOWNWARD_MEMORY_FILE), ("cpu", DOWNWARD_CPU_FILE)):
                if name in files:
                    add(resource, DOWNWARD_API, f"{limits_dir.rstrip('/')}/{name}",
                        files[name], True)
    return ExplicitLimits(tuple(memory), tuple(cpu), tuple(warnings))
