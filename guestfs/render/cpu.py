"""/proc/cpuinfo and /sys/devices/system/cpu/{online,possible,present}.

glibc's get_nprocs() (os.cpu_count(), getconf _NPROCESSORS_ONLN, Node's os.cpus()) reads
``online``; _NPROCESSORS_CONF and lscpu read ``possible``/``present``. All three say
``0-(N-1)`` so every tool agrees with cpuinfo's renumbered blocks.
"""

from __future__ import annotations

from guestfs.engine.limits import EffectiveLimits


def render_cpu_list(host_text: str, lim: EffectiveLimits) -> str:
    if not lim.cpus_limited:
        return host_text
    n = lim.cpu_count.value
    return "0\n" if n <= 1 else f"0-{n - 1}\n"


def render_cpuinfo(host_text: str, lim: EffectiveLimits) -> str:
    """Only the visible CPUs' blocks, ``processor`` renumbered 0..N-1, other fields kept
    (x86 and arm64 both print one blank-line-separated block per processor)."""
    if not lim.cpus_limited:
        return host_text
    visible = set(lim.visible_cpus)
    blocks = host_text.split("\n\n")
    out: list[str] = []
    k = 0
    for block in blocks:
        if not block.strip():
            continue
        first, _, rest = block.partition("\n")
        if first.startswith("processor"):
            try:
                n = int(first.split(":", 1)[1])
            except (IndexError, ValueError):
                out.append(block)
                continue
            if n not in visible:
                continue
            label = first.split(":", 1)[0]
            out.append(f"{label}: {k}" + ("\n" + rest if rest else ""))
            k += 1
        else:
            out.append(block)  # arm32-style trailers (Hardware, Revision, Serial)
    return "\n\n".join(out) + "\n\n"
