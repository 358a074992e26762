"""A `guestfs` package planted where a careless self-exec would import it from (the
working directory, PYTHONPATH): its code only creates a marker file."""

from __future__ import annotations

from pathlib import Path


def plant_package(d: Path, body: str) -> None:
    (d / "guestfs").mkdir()
    (d / "guestfs" / "__init__.py").write_text(body)
    (d / "guestfs" / "__main__.py").write_text(body)
    (d / "guestfs" / "cli").mkdir()
    (d / "guestfs" / "cli" / "__init__.py").write_text(body)
    (d / "guestfs" / "cli" / "main.py").write_text(body)


def pwn(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').close()\n"
