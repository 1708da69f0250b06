"""Names for the jitted kernels in `perf` samples: a perf map of numba's code.

`bench.profile --step --perf` records its own process with Linux `perf` while it runs forward
steps. perf names samples in jitted code from /tmp/perf-<pid>.map, which `write_map` writes:
numba loads its cached kernels as object code, `capture()` (called before any kernel runs)
keeps each object as it is loaded, and every function symbol of every object (`nm`) goes in
at its loaded address (an exported function's address from numba, minus its offset in the
object). A parallel region's body is named after the function that starts it (the function
whose code holds the relocation to the body's wrapper, `objdump -dr`) and the kernel whose
compiled code holds it (a matmul's region inside a fused layer, or the output head's own). Kernels compiled in
the process, not loaded from numba's cache, are not in the map: run twice.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from numba.core import codegen

_LOADED: list[Any] = []  # numba code libraries, each with its object code in _tl_object


def capture() -> None:
    """Keep every object numba loads from now on (for write_map)."""
    original = codegen.CPUCodeLibrary._set_compiled_object
    if getattr(original, "_tl_capture", False):
        return

    def keep(self: Any, value: bytes) -> Any:
        self._tl_object = value
        _LOADED.append(self)
        return original(self, value)

    keep._tl_capture = True  # type: ignore[attr-defined]
    codegen.CPUCodeLibrary._set_compiled_object = keep  # type: ignore[method-assign]


def short_name(symbol: str) -> str:
    """module.function of a numba symbol (its length-prefixed _ZN names, the package dropped)."""
    at = symbol.find("_ZN")
    if at < 0:
        return symbol
    names, i = [], at + 3
    while i < len(symbol) and symbol[i].isdigit():
        j = i
        while symbol[j].isdigit():
            j += 1
        n = int(symbol[i:j])
        names.append(symbol[j : j + n])
        i = j + n
    keep = [n for n in names if n not in ("enginecore", "kernels", "cpython")]
    prefix = ""
    if symbol.startswith("_ZN7cpython"):
        prefix = "python wrapper of "
    elif symbol.startswith("cfunc."):
        prefix = "C wrapper of "
    return prefix + ".".join(keep)


def _functions(obj: Path) -> list[tuple[int, int, str, bool]]:
    """(offset, size, symbol, global) of the object's defined functions (global: a strong
    symbol numba can resolve to this object's copy; a weak one may resolve to another's)."""
    out = subprocess.run(["nm", "-S", "--defined-only", str(obj)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            found.append((int(parts[0], 16), int(parts[1], 16), parts[3], parts[2] == "T"))
    return found


def _region_parents(obj: Path) -> dict[str, str]:
    """The function that starts each parallel region's body, by body symbol."""
    out = subprocess.run(["objdump", "-dr", "--no-show-raw-insn", str(obj)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    parents: dict[str, str] = {}
    current = ""
    for line in out.splitlines():
        if m := re.match(r"^[0-9a-f]+ <(.+)>:$", line):
            current = m.group(1)
        elif "R_X86_64" in line and "__gufunc__." in line and "parfor_gufunc" not in current:
            wrapper = line.split()[-1].split("+")[0]
            parents.setdefault(wrapper.removeprefix("__gufunc__."), current)
    return parents


def write_map(pid: int | None = None) -> int:
    """Write /tmp/perf-<pid>.map for the objects captured so far; how many functions it names."""
    entries: dict[int, tuple[int, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, lib in enumerate(_LOADED):
            obj = Path(tmp) / f"{k}.o"
            obj.write_bytes(lib._tl_object)
            functions = _functions(obj)
            base = None
            for off, _, sym, strong in functions:
                if not strong:
                    continue
                try:
                    addr = lib.get_pointer_to_function(sym)
                except Exception:  # not one numba exported
                    continue
                if addr:
                    base = addr - off
                    break
            if base is None:
                continue
            parents = _region_parents(obj)
            for off, size, sym, _ in functions:
                body = sym.removeprefix("__gufunc__.")
                if "parfor_gufunc" in body:
                    # its body and the wrapper that calls it (which may hold the body
                    # inlined): one name, so that their samples add up
                    parent = short_name(parents.get(body, "?"))
                    name = f"{parent} (parallel region, in {lib.name})"
                else:
                    name = short_name(sym)
                entries[base + off] = (size, name)
    path = Path(f"/tmp/perf-{pid or os.getpid()}.map")
    path.write_text("".join(f"{a:x} {s:x} {n}\n" for a, (s, n) in sorted(entries.items())))
    return len(entries)


def shares(data: Path) -> Counter[str]:
    """Percent of perf's samples per named function (`perf report`), the same names summed."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,sym"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    total: Counter[str] = Counter()
    for line in out.splitlines():
        if m := re.match(r"^\s+([\d.]+)%\s+(.+?)\s+\[[.k]\]\s+(.+?)\s*$", line):
            dso, name = m.group(2), m.group(3)
            if re.fullmatch(r"0x[0-9a-f]+", name):  # no symbol: the library, or unmapped code
                name = "jitted code not in the map" if dso.startswith("[JIT]") else dso
            total[name] += float(m.group(1))
    return total
