"""The edits that make Horovod 0.28.1's sdist build against today's torch and compilers, applied by
``build_horovod`` before it compiles.

torch's headers need C++17 (C++20 from torch 2.15's, read from its ATen.h) where Horovod asks for C++14
(and C++11 for its bundled Gloo); GCC 13 no longer pulls in <string> and <stdexcept> through other headers;
0.28.1's process sets ignore HOROVOD_GLOO_IFACE. Against a CPU torch, the torch extension and Gloo also
compile as CMake unity builds. Standard library only, as ``build_horovod``.
"""

from __future__ import annotations

import re
from pathlib import Path

from airflow_provider_horovod.exceptions import SourceChanged

# The CMake file of Horovod's torch extension.
TORCH_CMAKE = "horovod/torch/CMakeLists.txt"
# Where Horovod 0.28.1 sets up the Gloo device of a process set (every hvd.init() makes process set 0).
PROCESS_SET_DEVICE = (
    "  device_attr.iface = gloo_iface_;\n  device_attr.ai_family = AF_UNSPEC;\n"
    "  auto dev = CreateDevice(device_attr);\n\n  global_ctx = global_context.ctx;"
)
# The text the fix below puts into the built library; the runtime (runtime/horovod_network.py) looks for it
# to know whether the installed Horovod has the fix.
PROCESS_SET_IFACE_MARKER = "Gloo process set device on interface"
# (file, what 0.28.1 has, what it must have): C++17 for Horovod and its bundled Gloo (its torch
# extension: torch_cxx_edit); and process sets bound to HOROVOD_GLOO_IFACE like the global context: 0.28.1
# reads the process set's own gloo_iface_, never set, so Gloo falls back to the host name's address
# (127.0.1.1 on Debian hosts).
REPLACEMENTS = (
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    ("third_party/gloo/CMakeLists.txt", "-std=c++11", "-std=c++17"),
    # No debug information: it is a good part of the compile time on small machines and most of the wheel.
    (
        "CMakeLists.txt",
        'string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO',
        'string(REPLACE "-O2 -g" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO',
    ),
    (
        "horovod/common/gloo/gloo_context.cc",
        PROCESS_SET_DEVICE,
        "  // Process sets on HOROVOD_GLOO_IFACE too: 0.28.1 read this set's own gloo_iface_, never set.\n"
        "  gloo_iface_ = global_context.gloo_iface_;\n"
        f'  LOG(DEBUG) << "{PROCESS_SET_IFACE_MARKER} \'" << gloo_iface_ << "\'";\n' + PROCESS_SET_DEVICE,
    ),
)
# Horovod's torch extension and its bundled Gloo as unity builds (CMake 3.16+): a few compiler runs of many
# sources each instead of one each, so that the headers (torch's the costliest) are read once per run, the
# torch sources' run first, while make's other job compiles the rest; the library is the same code. Against
# a CPU torch only: with a CUDA or ROCm torch Horovod compiles GPU sources too, which were not tried so.
UNITY_EDITS = (
    (
        TORCH_CMAKE,
        "add_library(${PYTORCH_TARGET_LIB} SHARED ${SOURCES} ${PYTORCH_SOURCES})",
        "add_library(${PYTORCH_TARGET_LIB} SHARED ${PYTORCH_SOURCES} ${SOURCES})\n"
        "set_target_properties(${PYTORCH_TARGET_LIB} PROPERTIES UNITY_BUILD ON)",
    ),
    (
        "third_party/gloo/gloo/CMakeLists.txt",
        "add_library(gloo ${GLOO_STATIC_OR_SHARED} ${GLOO_SRCS})",
        "add_library(gloo ${GLOO_STATIC_OR_SHARED} ${GLOO_SRCS})\n"
        "set_target_properties(gloo PROPERTIES UNITY_BUILD ON)\n"
        # Its ReductionFunction is ambiguous beside the other sources' in one unit.
        "set_source_files_properties(allreduce_local.cc PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)",
    ),
)
# Horovod's torch extension: the C++ standard of torch's headers (``torch_cxx_edit``).
TORCH_CMAKE_STANDARD = "set(CMAKE_CXX_STANDARD 14)"
# Run in the target interpreter: a line that says whether torch is built for the CPU only (no CUDA, no ROCm),
# then the text of torch's ATen.h, whose #error names the C++ standard it needs.
CPU_ONLY_TORCH = "torch for the CPU only"
READ_TORCH_BUILD = f"""\
import os, sys, torch
print("{CPU_ONLY_TORCH}" if not (torch.version.cuda or torch.version.hip) else "torch with a GPU backend")
sys.stdout.write(open(os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "ATen.h")).read())
"""
# Changes whenever the edits do, so a wheel built with older edits is never taken from the cache
# (not for the debug information: a wheel with it works the same).
EDITS_VERSION = "iface1"
# (file, include added before its first #include): GCC 13 no longer includes these through other headers.
INCLUDES = (
    ("horovod/common/group_table.h", "#include <string>"),
    ("horovod/common/common.h", "#include <stdexcept>"),
)
UPDATE = "the edits in airflow_provider_horovod/horovod_source_edits.py need updating"


def torch_cxx_standard(aten_header: str) -> int:
    """The C++ standard torch's headers need, from its ATen.h's #error ("C++20 or later compatible compiler is
    required" in torch 2.15, C++17 in 2.1 to 2.13), and at least 17."""
    found = re.search(r"C\+\+(\d+) or later compatible compiler is required", aten_header)
    return max(17, int(found.group(1))) if found else 17


def torch_cxx_edit(standard: int) -> tuple[str, str, str]:
    """The edit that compiles Horovod's torch extension in ``standard`` (C++17 for the rest of Horovod)."""
    return (TORCH_CMAKE, TORCH_CMAKE_STANDARD, f"set(CMAKE_CXX_STANDARD {standard})")


def wants_unity_build(torch_build: str, gpu_operations: str = "") -> bool:
    """The unity builds (``UNITY_EDITS``): for a CPU build against a torch for the CPU only, as READ_TORCH_BUILD's
    output (``torch_build``) says."""
    return not gpu_operations and re.search(f"^{CPU_ONLY_TORCH}$", torch_build, re.M) is not None


def patch_sources(src_dir: Path, torch_standard: int = 17, unity: bool = True) -> None:
    """Apply the C++17 (``torch_standard`` for the torch extension), GCC 13 and process-set edits to Horovod's
    unpacked sdist, and the unity builds where ``unity``; verify each one landed.

    Raises SourceChanged if a file or the line an edit replaces is not there (Horovod's source is not
    0.28.1's). Applying it twice changes nothing.
    """
    src_dir = Path(src_dir)
    for rel, old, new in (*REPLACEMENTS, torch_cxx_edit(torch_standard), *(UNITY_EDITS if unity else ())):
        path = _source_file(src_dir, rel)
        text = path.read_text()
        # Applied already: the new text is there and holds the old (an edit that adds lines before it).
        if old in new and new in text:
            continue
        if old in text:
            path.write_text(text.replace(old, new))
        elif new not in text:
            raise SourceChanged(f"Horovod's source changed: {rel} has no {old!r} to turn into {new!r}; {UPDATE}")
        if new not in path.read_text():
            raise SourceChanged(f"the edit of {rel} did not land: no {new!r}")
    for rel, include in INCLUDES:
        path = _source_file(src_dir, rel)
        text = path.read_text()
        if not re.search(rf"^{re.escape(include)}", text, re.M):
            if not re.search(r"^#include", text, re.M):
                raise SourceChanged(
                    f"Horovod's source changed: {rel} has no #include line to put {include!r} before; {UPDATE}"
                )
            path.write_text(re.sub(r"^#include", f"{include}\n#include", text, count=1, flags=re.M))
        if not re.search(rf"^{re.escape(include)}", path.read_text(), re.M):
            raise SourceChanged(f"the edit of {rel} did not land: no {include!r}")


def _source_file(src_dir: Path, rel: str) -> Path:
    path = src_dir / rel
    if not path.is_file():
        raise SourceChanged(f"Horovod's source changed: {rel} is missing from {src_dir}; {UPDATE}")
    return path
