"""Build Horovod 0.28.1 (its last release) against the installed torch, install it, and check the build.

    python -m airflow_provider_horovod.build_horovod [--gpu] [--cache DIR] [--python PY]
                                                     [--check-only | --if-cached | --wheel-only]

Horovod 0.28.1 as released does not compile against torch >= 2.1; a few edits of its sdist fix that
(``horovod_source_edits``). The wheel is cached outside the environment, keyed by the versions it was
built against, so a second set-up installs it without rebuilding. Afterwards `horovodrun --check-build`
must show PyTorch and Gloo (and the GPU operations, for a GPU build). The wheel carries no debug
information (a good part of the compile time, and most of the size).

A set-up can compile in an environment of its own while it installs the rest into the target one
(pip is not safe against two installs into one environment at once): --if-cached there first (exit
status 3: nothing cached), --wheel-only in the build environment (the same torch), then a plain run.

Standard library only: it runs from an installed wheel of the provider or from a checkout, with the
interpreter of the environment to build into (or names that interpreter with --python).

Environment (as scripts/build_horovod.sh always read it):
  HOROVOD_WHEEL_CACHE         where wheels are kept (default: ${XDG_CACHE_HOME:-~/.cache}/airflow-provider-horovod)
  HOROVOD_GPU_OPERATIONS=NCCL build the GPU variant, as --gpu does (needs CUDA's nvcc). Without
                              HOROVOD_NCCL_HOME/_INCLUDE/_LIB it links the NCCL that PyPI's torch brings.
  HOROVOD_BUILD_CUDA_CC_LIST  e.g. 90: compile the GPU kernels for these architectures only
  HOROVOD_CUDA_HOME           the CUDA toolkit (default: $CUDA_HOME, $CUDA_PATH, else /usr/local/cuda where it
                              has bin/nvcc). Against a CUDA torch (PyPI's), where a toolkit is found, Horovod
                              compiles its CUDA parts even for a CPU build.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from airflow_provider_horovod.exceptions import BuildError
from airflow_provider_horovod.horovod_source_edits import (
    EDITS_VERSION,
    PROCESS_SET_IFACE_MARKER,
    READ_TORCH_BUILD,
    patch_sources,
    torch_cxx_standard,
    wants_unity_build,
)

HOROVOD_VERSION = "0.28.1"
# Horovod's runtime dependencies: its wheel is installed with --no-deps (pip would otherwise try
# to resolve, and possibly rebuild, horovod's own requirements).
RUNTIME_DEPS = ("cffi", "cloudpickle", "psutil", "pyyaml", "packaging")
BUILD_DEPS = ("cmake", "wheel", "setuptools")
# main's exit status for --if-cached when it would have to compile.
NOT_CACHED = 3
TORCH_FIX = "pip install 'airflow-provider-horovod[cluster]' (or pip install torch)"

# Finds the NCCL that PyPI's torch brings (the nvidia-nccl-* package), run in the target interpreter.
FIND_TORCH_NCCL = """\
import glob, site
print(next(iter(sorted(h for r in site.getsitepackages()
                       for h in glob.glob(r + "/nvidia/**/include/nccl.h", recursive=True))), ""))
"""


# Where NVIDIA's installers and CUDA images put the toolkit.
CUDA_DEFAULT_HOME = Path("/usr/local/cuda")


def default_cache_root(env: Mapping[str, str]) -> Path:
    """Where wheels are kept: $HOROVOD_WHEEL_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/airflow-provider-horovod."""
    # Empty counts as unset, as the script's ${VAR:-default} did.
    if env.get("HOROVOD_WHEEL_CACHE"):
        return Path(env["HOROVOD_WHEEL_CACHE"])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "airflow-provider-horovod"


def cache_key(torch_version: str, py_tag: str, gpu_operations: str = "") -> str:
    """The wheel's cache key, the same as scripts/build_horovod.sh used, so its wheels are reused."""
    variant = f"gpu-{gpu_operations}" if gpu_operations else "cpu"
    return f"horovod-{HOROVOD_VERSION}-{EDITS_VERSION}-torch-{torch_version}-{py_tag}-{variant}"


def wheel_dir(cache_root: Path, torch_version: str, py_tag: str, gpu_operations: str = "") -> Path:
    return Path(cache_root) / cache_key(torch_version, py_tag, gpu_operations)


def cached_wheel(directory: Path) -> Path | None:
    """The newest horovod wheel in directory, or None."""
    wheels = sorted(Path(directory).glob("horovod-*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


def wants_torch_nccl(env: Mapping[str, str], gpu_operations: str) -> bool:
    """Whether to link the NCCL torch brings: an NCCL build with no NCCL named by the HOROVOD_NCCL_* variables."""
    named = any(env.get(v) for v in ("HOROVOD_NCCL_HOME", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB"))
    return gpu_operations == "NCCL" and not named


def cuda_home(env: Mapping[str, str], default: Path = CUDA_DEFAULT_HOME) -> str | None:
    """The CUDA toolkit for Horovod's CMake: HOROVOD_CUDA_HOME, CUDA_HOME or CUDA_PATH as set, else ``default``
    where it has bin/nvcc, else None (CMake looks on PATH).

    CMake and torch otherwise take the toolkit's root from the nvcc on PATH; an nvcc that is a wrapper or a link
    in /usr/local/bin gives /usr/local, with no cuda_runtime.h nor libcudart, and a CUDA torch's build fails
    ("Could NOT find CUDAToolkit", "FOUND_LIB_cudart NOTFOUND")."""
    for name in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        if env.get(name):
            return env[name]
    return str(default) if (default / "bin" / "nvcc").exists() else None


def build_env(
    base: Mapping[str, str],
    gpu_operations: str = "",
    nccl_include: str | None = None,
    nccl_lib: str | None = None,
    jobs: int | None = None,
    cuda: str | None = None,
) -> dict[str, str]:
    """The environment for `pip wheel` of Horovod: base plus what selects PyTorch, Gloo and (for a GPU build) NCCL;
    ``cuda``: the CUDA toolkit's folder (``cuda_home``), for Horovod's CMake and torch's cpp_extension."""
    env = dict(base)
    if cuda:
        # The same toolkit for Horovod's CMake and for torch's cpp_extension, which Horovod asks for the
        # libraries to link (CUDA_HOME; without it, the folder above the nvcc on PATH).
        env["HOROVOD_CUDA_HOME"] = env["CUDA_HOME"] = cuda
    env.update(
        HOROVOD_WITH_PYTORCH="1",
        HOROVOD_WITHOUT_MPI="1",
        HOROVOD_WITHOUT_TENSORFLOW="1",
        HOROVOD_WITHOUT_MXNET="1",
        HOROVOD_CPU_OPERATIONS="GLOO",
    )
    if gpu_operations:
        env["HOROVOD_GPU_OPERATIONS"] = gpu_operations
    else:
        env.pop("HOROVOD_GPU_OPERATIONS", None)
    if nccl_include and nccl_lib:
        env.update(HOROVOD_NCCL_INCLUDE=nccl_include, HOROVOD_NCCL_LIB=nccl_lib, HOROVOD_NCCL_LINK="SHARED")
    if not env.get("MAKEFLAGS"):
        env["MAKEFLAGS"] = f"-j{jobs or _cpus()}"
    # CMake 4 (what `pip install cmake` gives) refuses the bundled Gloo's cmake_minimum_required(<3.5).
    env["CMAKE_POLICY_VERSION_MINIMUM"] = "3.5"
    return env


def _cpus() -> int:
    # The CPUs this process may use, as nproc counts them (not all the machine's).
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def parse_check_build(output: str) -> set[str]:
    """What `horovodrun --check-build` marks available ([X]): frameworks, controllers and tensor operations."""
    return set(re.findall(r"^\s*\[X\]\s+(\S+)", output, re.M))


def required_features(gpu_operations: str = "") -> tuple[str, ...]:
    return ("PyTorch", "Gloo") + ((gpu_operations,) if gpu_operations else ())


# Side effects from here on.


def _run(cmd: Sequence[str | os.PathLike], what: str, **kwargs) -> subprocess.CompletedProcess:
    """Run cmd with its output captured; on failure show that output and raise BuildError."""
    try:
        return subprocess.run(
            list(map(str, cmd)), check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
        )
    except subprocess.CalledProcessError as e:
        sys.stdout.write(e.stdout or "")
        sys.stdout.flush()
        raise BuildError(f"{what} failed (exit {e.returncode}): {' '.join(map(str, cmd))}") from None
    except FileNotFoundError as e:
        raise BuildError(f"{what} failed: {e.filename} not found") from None


def _say(line: str) -> None:
    print(line, flush=True)


def target_python(name: str) -> str:
    """The interpreter as given (a venv's python is a symlink; its folder, not the link's target, holds its scripts)."""
    if os.sep in name:
        return str(Path(name).absolute())
    found = shutil.which(name)
    if not found:
        raise BuildError(f"python interpreter {name!r} not found")
    return found


def torch_and_py_tag(py: str) -> tuple[str, str]:
    """torch's version and the interpreter's cpXY tag, from the target interpreter."""
    code = 'import sys, torch; print(torch.__version__); print(f"cp{sys.version_info[0]}{sys.version_info[1]}")'
    try:
        proc = subprocess.run([py, "-c", code], capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"cannot run {py}: {e}") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(
            f"torch is not importable by {py} ({detail}); Horovod compiles against it. "
            f"Install it first: {py} -m {TORCH_FIX}"
        )
    torch_version, py_tag = proc.stdout.split()[-2:]
    return torch_version, py_tag


# Run in the target interpreter: exit 0 when its Horovod imports and its library holds the marker.
HAS_EDITS = """\
import glob, os, sys, horovod.torch
libs = glob.glob(os.path.join(os.path.dirname(horovod.torch.__file__), "mpi_lib_v2*.so"))
sys.exit(0 if libs and open(libs[0], "rb").read().find(sys.argv[1].encode()) != -1 else 3)
"""


def horovod_installed(py: str) -> bool:
    """Whether py's Horovod imports and was built with this module's edits (one built before the
    process-set fix is rebuilt)."""
    proc = subprocess.run([py, "-c", HAS_EDITS, PROCESS_SET_IFACE_MARKER], capture_output=True)
    if proc.returncode == 3:
        _say(f"the installed horovod lacks the edits of {EDITS_VERSION}; installing the one built with them")
    return proc.returncode == 0


def build_wheel(py: str, torch_version: str, gpu_operations: str, out_dir: Path) -> Path:
    """Download Horovod's sdist, edit it, build its wheel with the target interpreter, move it to out_dir."""
    _say(f"building horovod {HOROVOD_VERSION} against torch {torch_version} (a few minutes, once)")
    with tempfile.TemporaryDirectory(prefix="build-horovod-") as tmp:
        work = Path(tmp)
        # First: without build isolation, reading the sdist's metadata already needs them (an older
        # setuptools asks for `wheel`'s bdist_wheel), as a fresh environment with only torch lacks.
        _say("  installing the build tools: " + " ".join(BUILD_DEPS))
        _run([py, "-m", "pip", "install", "-q", *BUILD_DEPS], "installing the build tools")
        _say("  downloading the sdist")
        _run(
            [
                py,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--no-build-isolation",
                "-d",
                work,
                f"horovod=={HOROVOD_VERSION}",
            ],
            "downloading Horovod's sdist",
        )
        sdist = work / f"horovod-{HOROVOD_VERSION}.tar.gz"
        if not sdist.is_file():
            raise BuildError(f"pip download gave no {sdist.name} in {work}")
        with tarfile.open(sdist) as tar:
            # The data filter (where this Python has it) refuses links and paths out of work.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(work, filter="data")
            else:
                tar.extractall(work)  # Pythons before 3.10.12 have no filter
        src = work / f"horovod-{HOROVOD_VERSION}"
        torch_build = _run([py, "-c", READ_TORCH_BUILD], "reading torch's ATen.h").stdout
        standard = torch_cxx_standard(torch_build)
        unity = wants_unity_build(torch_build, gpu_operations)
        _say(
            f"  applying the C++17 (C++{standard} for torch's headers), GCC 13 and process-set edits"
            + (", as unity builds" if unity else "")
        )
        patch_sources(src, standard, unity)

        nccl_include = nccl_lib = None
        if wants_torch_nccl(os.environ, gpu_operations):
            # The NCCL that torch loads: one NCCL in the process, not two.
            nccl_h = _run([py, "-c", FIND_TORCH_NCCL], "looking for torch's NCCL").stdout.strip()
            if nccl_h:
                nccl_dir = Path(nccl_h).parent.parent
                # CMake looks for libnccl.so; the package has only libnccl.so.2.
                lib = work / "nccl-lib"
                lib.mkdir()
                (lib / "libnccl.so").symlink_to(nccl_dir / "lib" / "libnccl.so.2")
                nccl_include, nccl_lib = str(nccl_dir / "include"), str(lib)
                _say(f"  using torch's NCCL: {nccl_dir}")

        env = build_env(os.environ, gpu_operations, nccl_include, nccl_lib, cuda=cuda_home(os.environ))
        dist = work / "dist"
        dist.mkdir()
        _say(f"  compiling ({env['MAKEFLAGS']})")
        # No build isolation: Horovod must compile against the torch installed in the target environment.
        _run(
            [py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, src],
            "building Horovod's wheel",
            env=env,
        )
        built = cached_wheel(dist)
        if built is None:
            raise BuildError(f"pip wheel left no horovod wheel in {dist}")
        out_dir.mkdir(parents=True, exist_ok=True)
        # Copy under a name the cache does not match, then rename: an interrupted copy is never taken for a wheel.
        partial = out_dir / f".{built.name}.partial"
        shutil.copyfile(built, partial)
        os.replace(partial, out_dir / built.name)
        _say(f"  cached {out_dir / built.name}")
        return out_dir / built.name


def install(py: str, wheel: Path) -> None:
    _say(f"installing {wheel.name}")
    # --force-reinstall: the same version may be installed, built without the edits.
    _run([py, "-m", "pip", "install", "--no-deps", "--force-reinstall", wheel], "installing Horovod's wheel")
    # Horovod's own runtime dependencies (the wheel was installed without them).
    _run([py, "-m", "pip", "install", "-q", *RUNTIME_DEPS], "installing Horovod's runtime dependencies")


def check_build(py: str, gpu_operations: str) -> None:
    """`horovodrun --check-build` next to py must show PyTorch, Gloo (and the GPU operations); else BuildError."""
    horovodrun = Path(py).parent / "horovodrun"
    if not horovodrun.exists():
        raise BuildError(f"{horovodrun} not found: Horovod is not installed for {py}")
    output = _run([horovodrun, "--check-build"], "horovodrun --check-build").stdout
    missing = [f for f in required_features(gpu_operations) if f not in parse_check_build(output)]
    if missing:
        sys.stdout.write(output)
        raise BuildError(f"Horovod was built without {', '.join(missing)} (horovodrun --check-build above)")
    _say("horovodrun --check-build: " + ", ".join(f"[X] {f}" for f in required_features(gpu_operations)))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_horovod.build_horovod",
        description=f"Build Horovod {HOROVOD_VERSION} against the installed torch (with the edits it needs for "
        "torch >= 2.1), install it and check it.",
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="build with NCCL (HOROVOD_GPU_OPERATIONS=NCCL does the same); needs CUDA's nvcc",
    )
    parser.add_argument(
        "--cache",
        metavar="DIR",
        type=Path,
        help="where wheels are kept (default: $HOROVOD_WHEEL_CACHE, else "
        "${XDG_CACHE_HOME:-~/.cache}/airflow-provider-horovod)",
    )
    parser.add_argument(
        "--python",
        metavar="PY",
        default=sys.executable,
        help="the interpreter to build and install into (default: this one)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check-only", action="store_true", help="only run horovodrun --check-build")
    mode.add_argument(
        "--if-cached",
        action="store_true",
        help=f"never compile: exit {NOT_CACHED} when no installed Horovod nor cached wheel fits",
    )
    mode.add_argument(
        "--wheel-only",
        action="store_true",
        help="only make sure the cache holds the wheel for this torch and Python (compile it if not)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    gpu_operations = os.environ.get("HOROVOD_GPU_OPERATIONS") or ("NCCL" if args.gpu else "")
    try:
        py = target_python(args.python)
        if not args.check_only:
            torch_version, py_tag = torch_and_py_tag(py)
            if not args.wheel_only and horovod_installed(py):
                _say(f"horovod {HOROVOD_VERSION} already installed for {py}")
            else:
                directory = wheel_dir(
                    args.cache or default_cache_root(os.environ), torch_version, py_tag, gpu_operations
                )
                wheel = cached_wheel(directory)
                if wheel is None and args.if_cached:
                    _say(f"no cached horovod wheel in {directory}")
                    return NOT_CACHED
                if wheel is None:
                    wheel = build_wheel(py, torch_version, gpu_operations, directory)
                else:
                    _say(f"using the cached wheel {wheel}")
                if args.wheel_only:
                    return 0
                install(py, wheel)
        check_build(py, gpu_operations)
    except BuildError as e:
        print(f"build_horovod: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
