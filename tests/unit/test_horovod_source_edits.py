"""The edits of Horovod 0.28.1's sdist, on a fake sdist of the lines they change: each lands, twice changes
nothing, and a source that is not 0.28.1's is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_horovod import horovod_source_edits as edits
from airflow_provider_horovod.exceptions import SourceChanged

# The lines of Horovod 0.28.1's sdist that the edits change, around lines that must stay.
FAKE_SDIST = {
    # (0.28.1 already sets 17 for a Gloo of its own, further down: the edit must still happen.)
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.13)\nset(CMAKE_CXX_STANDARD 14)\nproject(horovod)\n"
    'string(PREPEND GLOO_CMAKE "set(CMAKE_CXX_STANDARD 17)\\n")\n'
    'string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${FLAGS}")\n',
    "horovod/torch/CMakeLists.txt": "set(CMAKE_CXX_STANDARD 14)\n"
    "add_library(${PYTORCH_TARGET_LIB} SHARED ${SOURCES} ${PYTORCH_SOURCES})\n",
    "third_party/gloo/CMakeLists.txt": 'set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} -std=c++11")\n',
    "third_party/gloo/gloo/CMakeLists.txt": "add_library(gloo ${GLOO_STATIC_OR_SHARED} ${GLOO_SRCS})\n",
    "horovod/common/group_table.h": "// Copyright\n#ifndef GROUP_TABLE_H\n#include <mutex>\n#include <vector>\n",
    "horovod/common/common.h": "// Copyright\n#include <functional>\n#include <memory>\n",
    # GlooContext::InitializeForProcessSet, as 0.28.1 has it.
    "horovod/common/gloo/gloo_context.cc": (
        "  }\n\n  attr device_attr;\n  device_attr.iface = gloo_iface_;\n  device_attr.ai_family = AF_UNSPEC;\n"
        "  auto dev = CreateDevice(device_attr);\n\n  global_ctx = global_context.ctx;\n"
        "  timeout_ = global_context.timeout_;\n"
    ),
}


def fake_sdist(root: Path, files: dict[str, str] = FAKE_SDIST) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_patch_sources_makes_the_nine_edits(tmp_path):
    src = fake_sdist(tmp_path)
    edits.patch_sources(src)
    read = lambda rel: (src / rel).read_text()  # noqa: E731
    # C++17, and RelWithDebInfo's flags without -g (CMake's are "-O2 -g -DNDEBUG": "-O3 -DNDEBUG").
    assert read("CMakeLists.txt") == (
        "cmake_minimum_required(VERSION 3.13)\nset(CMAKE_CXX_STANDARD 17)\n"
        'project(horovod)\nstring(PREPEND GLOO_CMAKE "set(CMAKE_CXX_STANDARD 17)\\n")\n'
        'string(REPLACE "-O2 -g" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${FLAGS}")\n'
    )
    # The torch extension as a unity build, torch's own sources (the batch that reads torch's headers) first.
    assert read("horovod/torch/CMakeLists.txt") == (
        "set(CMAKE_CXX_STANDARD 17)\nadd_library(${PYTORCH_TARGET_LIB} SHARED ${PYTORCH_SOURCES} ${SOURCES})\n"
        "set_target_properties(${PYTORCH_TARGET_LIB} PROPERTIES UNITY_BUILD ON)\n"
    )
    assert read("third_party/gloo/CMakeLists.txt") == 'set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} -std=c++17")\n'
    # Gloo as a unity build too, but for the one source that does not compile so.
    assert read("third_party/gloo/gloo/CMakeLists.txt") == (
        "add_library(gloo ${GLOO_STATIC_OR_SHARED} ${GLOO_SRCS})\n"
        "set_target_properties(gloo PROPERTIES UNITY_BUILD ON)\n"
        "set_source_files_properties(allreduce_local.cc PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)\n"
    )
    # The include goes right before the first #include, not before the comment or the guard.
    assert read("horovod/common/group_table.h") == (
        "// Copyright\n#ifndef GROUP_TABLE_H\n#include <string>\n#include <mutex>\n#include <vector>\n"
    )
    assert read("horovod/common/common.h") == (
        "// Copyright\n#include <stdexcept>\n#include <functional>\n#include <memory>\n"
    )
    # The process set's Gloo device takes the global context's interface, and says so (the marker).
    assert read("horovod/common/gloo/gloo_context.cc") == (
        "  }\n\n  attr device_attr;\n"
        "  // Process sets on HOROVOD_GLOO_IFACE too: 0.28.1 read this set's own gloo_iface_, never set.\n"
        "  gloo_iface_ = global_context.gloo_iface_;\n"
        '  LOG(DEBUG) << "Gloo process set device on interface \'" << gloo_iface_ << "\'";\n'
        "  device_attr.iface = gloo_iface_;\n  device_attr.ai_family = AF_UNSPEC;\n"
        "  auto dev = CreateDevice(device_attr);\n\n  global_ctx = global_context.ctx;\n"
        "  timeout_ = global_context.timeout_;\n"
    )


def test_the_torch_extension_takes_the_standard_torchs_headers_need(tmp_path):
    assert (
        edits.torch_cxx_standard(
            "#if !defined(_MSC_VER) && __cplusplus < 201703L\n"
            "#error C++17 or later compatible compiler is required to use ATen.\n"
        )
        == 17
    )
    assert edits.torch_cxx_standard("#error C++20 or later compatible compiler is required to use ATen.") == 20
    assert edits.torch_cxx_standard("#pragma once\n") == 17  # no such guard: what Horovod needs anyway
    src = fake_sdist(tmp_path)
    edits.patch_sources(src, torch_standard=20)
    assert (src / "horovod/torch/CMakeLists.txt").read_text().startswith("set(CMAKE_CXX_STANDARD 20)\n")
    assert "set(CMAKE_CXX_STANDARD 17)" in (src / "CMakeLists.txt").read_text()  # the rest of Horovod stays on 17


def test_without_the_unity_builds_the_libraries_keep_their_sources_as_they_are(tmp_path):
    src = fake_sdist(tmp_path)
    edits.patch_sources(src, unity=False)
    assert (src / "horovod/torch/CMakeLists.txt").read_text() == (
        "set(CMAKE_CXX_STANDARD 17)\nadd_library(${PYTORCH_TARGET_LIB} SHARED ${SOURCES} ${PYTORCH_SOURCES})\n"
    )
    assert (src / "third_party/gloo/gloo/CMakeLists.txt").read_text() == FAKE_SDIST[
        "third_party/gloo/gloo/CMakeLists.txt"
    ]


def test_the_unity_build_is_for_a_cpu_build_against_a_cpu_torch():
    # What the torch import may print first (a warning on stderr) does not hide the line.
    cpu = "functional_tensor.py:368: UserWarning: Failed to initialize NumPy\ntorch for the CPU only\n#pragma once\n"
    assert edits.wants_unity_build(cpu)
    assert not edits.wants_unity_build(cpu, gpu_operations="NCCL")
    assert not edits.wants_unity_build("torch with a GPU backend\n#pragma once\n")


def test_patch_sources_twice_changes_nothing(tmp_path):
    src = fake_sdist(tmp_path)
    edits.patch_sources(src)
    once = {rel: (src / rel).read_text() for rel in FAKE_SDIST}
    edits.patch_sources(src)
    assert {rel: (src / rel).read_text() for rel in FAKE_SDIST} == once


@pytest.mark.parametrize(
    "rel, text, says",
    [
        (
            "horovod/torch/CMakeLists.txt",
            "set(CMAKE_CXX_STANDARD 20)\n",
            "horovod/torch/CMakeLists.txt has no 'set(CMAKE_CXX_STANDARD 14)'",
        ),
        ("third_party/gloo/CMakeLists.txt", "set(CMAKE_CXX_STANDARD 11)\n", "has no '-std=c++11'"),
        ("horovod/common/common.h", "#pragma once\n", "common.h has no #include line"),
    ],
    ids=["torch-standard", "gloo-flag", "common-include"],
)
def test_patch_sources_refuses_a_changed_source(tmp_path, rel, text, says):
    src = fake_sdist(tmp_path, {**FAKE_SDIST, rel: text})
    with pytest.raises(SourceChanged, match="Horovod's source changed") as raised:
        edits.patch_sources(src)
    assert says in str(raised.value)


def test_patch_sources_refuses_a_missing_file(tmp_path):
    files = {rel: text for rel, text in FAKE_SDIST.items() if rel != "horovod/common/group_table.h"}
    with pytest.raises(SourceChanged, match="group_table.h is missing"):
        edits.patch_sources(fake_sdist(tmp_path, files))
