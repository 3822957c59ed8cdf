"""A copy of tensorrt-stubs that mypy can read.

tensorrt-stubs (10.13.0.35.1) installs `tensorrt/__init__.pyi` and `tensorrt_bindings/*.pyi`
into site-packages, where mypy does not look (no py.typed marker, not a `-stubs` package),
and five of its signatures are not valid Python: parameters named `in` (a keyword) and one
parameter without a default after parameters with defaults (`add_scale_nd`). This module
copies the .pyi files into a directory for MYPYPATH and repairs exactly those two things:
`in` becomes `in_`, and a parameter without a default after one with a default gets `= ...`.
Every other line is TensorRT's API as the stubs describe it.

    python tests/engine/repaired_tensorrt_stubs.py .mypy_cache/tensorrt-stubs
    MYPYPATH=.mypy_cache/tensorrt-stubs mypy --config-file tests/engine/mypy-tensorrt.ini trainer_image/dtrain_engine/tensorrt_runtime.py
"""

from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path

STUB_PACKAGES = ("tensorrt", "tensorrt_bindings")
_KEYWORD_PARAMETER = re.compile(r"(?<=[(,])(\s*)in(\s*:)")
_DEF_LINE = re.compile(r"^(\s*def \w+\()(.*)(\)\s*(->.*)?:\s*)$")


def installed_stub_root() -> Path | None:
    """The site-packages directory holding tensorrt/__init__.pyi, or None when tensorrt-stubs is absent."""
    candidates = [Path(p) for p in sys.path if p] + [Path(sysconfig.get_paths()["purelib"])]
    for directory in candidates:
        if (directory / "tensorrt" / "__init__.pyi").is_file() and (directory / "tensorrt_bindings").is_dir():
            return directory
    return None


def _split_parameters(parameters: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in parameters:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return parts


def _repair_defaults(line: str) -> str:
    match = _DEF_LINE.match(line)
    if not match:
        return line
    parameters = _split_parameters(match.group(2))
    seen_default = False
    repaired = []
    for parameter in parameters:
        bare = parameter.strip()
        if bare.startswith("*") or bare == "/":
            seen_default = False if bare.startswith("*") else seen_default
        elif "=" in bare:
            seen_default = True
        elif seen_default:
            parameter = f"{parameter} = ..."
        repaired.append(parameter)
    return f"{match.group(1)}{','.join(repaired)}{match.group(3)}"


def repair(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("def "):
            line = _repair_defaults(_KEYWORD_PARAMETER.sub(r"\1in_\2", line))
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_repaired_stubs(destination: Path) -> Path:
    """Copy the installed stubs, repaired, under `destination`; returns it (for MYPYPATH)."""
    root = installed_stub_root()
    if root is None:
        raise FileNotFoundError("tensorrt-stubs is not installed: pip install --no-deps tensorrt-stubs")
    for package in STUB_PACKAGES:
        for stub in sorted((root / package).glob("*.pyi")):
            target = destination / package / stub.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(repair(stub.read_text()))
    return destination


if __name__ == "__main__":
    print(write_repaired_stubs(Path(sys.argv[1] if len(sys.argv) > 1 else ".mypy_cache/tensorrt-stubs")))
