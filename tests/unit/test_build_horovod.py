"""build_horovod's pure parts: the sdist edits, the wheel cache's key, the build environment and the
reading of `horovodrun --check-build`. Nothing here builds or installs anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_horovod import build_horovod as bh
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

CHECK_BUILD_CPU = """\
Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [ ] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [ ] MPI
    [X] Gloo
"""


def fake_sdist(root: Path, files: dict[str, str] = FAKE_SDIST) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_patch_sources_makes_the_nine_edits(tmp_path):
    src = fake_sdist(tmp_path)
    bh.patch_sources(src)
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
        bh.torch_cxx_standard(
            "#if !defined(_MSC_VER) && __cplusplus < 201703L\n"
            "#error C++17 or later compatible compiler is required to use ATen.\n"
        )
        == 17
    )
    assert bh.torch_cxx_standard("#error C++20 or later compatible compiler is required to use ATen.") == 20
    assert bh.torch_cxx_standard("#pragma once\n") == 17  # no such guard: what Horovod needs anyway
    src = fake_sdist(tmp_path)
    bh.patch_sources(src, torch_standard=20)
    assert (src / "horovod/torch/CMakeLists.txt").read_text().startswith("set(CMAKE_CXX_STANDARD 20)\n")
    assert "set(CMAKE_CXX_STANDARD 17)" in (src / "CMakeLists.txt").read_text()  # the rest of Horovod stays on 17


def test_without_the_unity_builds_the_libraries_keep_their_sources_as_they_are(tmp_path):
    src = fake_sdist(tmp_path)
    bh.patch_sources(src, unity=False)
    assert (src / "horovod/torch/CMakeLists.txt").read_text() == (
        "set(CMAKE_CXX_STANDARD 17)\nadd_library(${PYTORCH_TARGET_LIB} SHARED ${SOURCES} ${PYTORCH_SOURCES})\n"
    )
    assert (src / "third_party/gloo/gloo/CMakeLists.txt").read_text() == FAKE_SDIST[
        "third_party/gloo/gloo/CMakeLists.txt"
    ]


def test_the_unity_build_is_for_a_cpu_build_against_a_cpu_torch():
    # What the torch import may print first (a warning on stderr) does not hide the line.
    cpu = "functional_tensor.py:368: UserWarning: Failed to initialize NumPy\ntorch for the CPU only\n#pragma once\n"
    assert bh.wants_unity_build(cpu)
    assert not bh.wants_unity_build(cpu, gpu_operations="NCCL")
    assert not bh.wants_unity_build("torch with a GPU backend\n#pragma once\n")


def test_patch_sources_twice_changes_nothing(tmp_path):
    src = fake_sdist(tmp_path)
    bh.patch_sources(src)
    once = {rel: (src / rel).read_text() for rel in FAKE_SDIST}
    bh.patch_sources(src)
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
        bh.patch_sources(src)
    assert says in str(raised.value)


def test_patch_sources_refuses_a_missing_file(tmp_path):
    files = {rel: text for rel, text in FAKE_SDIST.items() if rel != "horovod/common/group_table.h"}
    with pytest.raises(SourceChanged, match="group_table.h is missing"):
        bh.patch_sources(fake_sdist(tmp_path, files))


@pytest.fixture
def no_subprocess(monkeypatch):
    """main() on a target whose torch is known and whose Horovod is missing; building and installing are recorded."""
    calls = []
    monkeypatch.setattr(bh, "torch_and_py_tag", lambda py: ("2.13.0+cpu", "cp311"))
    monkeypatch.setattr(bh, "horovod_installed", lambda py: False)
    monkeypatch.setattr(bh, "build_wheel", lambda *a: calls.append("build") or Path("/nowhere/horovod.whl"))
    monkeypatch.setattr(bh, "install", lambda py, wheel: calls.append(f"install {wheel.name}"))
    monkeypatch.setattr(bh, "check_build", lambda py, gpu: calls.append("check"))
    return calls


def test_if_cached_never_compiles(tmp_path, no_subprocess):
    assert bh.main(["--if-cached", "--cache", str(tmp_path)]) == bh.NOT_CACHED
    assert no_subprocess == []
    directory = bh.wheel_dir(tmp_path, "2.13.0+cpu", "cp311")
    directory.mkdir(parents=True)
    (directory / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    assert bh.main(["--if-cached", "--cache", str(tmp_path)]) == 0
    assert no_subprocess == ["install horovod-0.28.1-cp311-cp311-linux_x86_64.whl", "check"]


def test_wheel_only_fills_the_cache_and_installs_nothing(tmp_path, no_subprocess):
    assert bh.main(["--wheel-only", "--cache", str(tmp_path)]) == 0
    assert no_subprocess == ["build"]


def test_cache_key_names_the_edits():
    # A wheel built before the process-set edit (key without "iface1") is never reused.
    assert bh.cache_key("2.13.0+cpu", "cp311") == "horovod-0.28.1-iface1-torch-2.13.0+cpu-cp311-cpu"
    assert bh.cache_key("2.13.0", "cp312", "NCCL") == "horovod-0.28.1-iface1-torch-2.13.0-cp312-gpu-NCCL"


def test_wheel_dir_defaults(tmp_path):
    home = Path.home()
    assert bh.default_cache_root({}) == home / ".cache" / "airflow-provider-horovod"
    assert bh.default_cache_root({"XDG_CACHE_HOME": ""}) == home / ".cache" / "airflow-provider-horovod"
    assert bh.default_cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "airflow-provider-horovod"
    assert bh.default_cache_root({"XDG_CACHE_HOME": "/x", "HOROVOD_WHEEL_CACHE": str(tmp_path)}) == tmp_path
    assert (
        bh.wheel_dir(tmp_path, "2.13.0+cpu", "cp311") == tmp_path / "horovod-0.28.1-iface1-torch-2.13.0+cpu-cp311-cpu"
    )


def test_cached_wheel_ignores_partial_copies(tmp_path):
    assert bh.cached_wheel(tmp_path) is None
    (tmp_path / ".horovod-0.28.1-cp311-cp311-linux_x86_64.whl.partial").write_text("")
    assert bh.cached_wheel(tmp_path) is None
    (tmp_path / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_text("")
    assert bh.cached_wheel(tmp_path) == tmp_path / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"


def test_build_env_cpu():
    env = bh.build_env({"PATH": "/bin", "HOROVOD_GPU_OPERATIONS": ""}, jobs=3)
    assert env["PATH"] == "/bin"
    assert env["HOROVOD_WITH_PYTORCH"] == "1"
    assert env["HOROVOD_CPU_OPERATIONS"] == "GLOO"
    assert env["HOROVOD_WITHOUT_MPI"] == env["HOROVOD_WITHOUT_TENSORFLOW"] == env["HOROVOD_WITHOUT_MXNET"] == "1"
    assert env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"
    assert env["MAKEFLAGS"] == "-j3"
    assert "HOROVOD_GPU_OPERATIONS" not in env
    assert "HOROVOD_NCCL_LIB" not in env


def test_build_env_gpu_with_torchs_nccl():
    base = {"MAKEFLAGS": "-j1", "HOROVOD_BUILD_CUDA_CC_LIST": "90"}
    assert bh.wants_torch_nccl(base, "NCCL")
    env = bh.build_env(base, "NCCL", "/site/nvidia/nccl/include", "/tmp/w/nccl-lib")
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    assert env["HOROVOD_NCCL_INCLUDE"] == "/site/nvidia/nccl/include"
    assert env["HOROVOD_NCCL_LIB"] == "/tmp/w/nccl-lib"
    assert env["HOROVOD_NCCL_LINK"] == "SHARED"
    assert env["MAKEFLAGS"] == "-j1"
    assert base == {"MAKEFLAGS": "-j1", "HOROVOD_BUILD_CUDA_CC_LIST": "90"}  # not changed in place


def test_cuda_home_named_first_else_the_default_where_it_has_nvcc(tmp_path):
    assert bh.cuda_home({"CUDA_HOME": "/opt/cuda", "HOROVOD_CUDA_HOME": "/opt/hvd-cuda"}, tmp_path) == "/opt/hvd-cuda"
    assert bh.cuda_home({"CUDA_PATH": "/opt/cuda-path"}, tmp_path) == "/opt/cuda-path"
    assert bh.cuda_home({"CUDA_HOME": ""}, tmp_path) is None  # no nvcc under the default: CMake looks on PATH
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    assert bh.cuda_home({}, tmp_path) == str(tmp_path)


def test_build_env_names_the_cuda_toolkit_to_cmake():
    env = bh.build_env({"CUDA_HOME": "/usr/local"}, cuda="/usr/local/cuda")
    assert env["HOROVOD_CUDA_HOME"] == env["CUDA_HOME"] == "/usr/local/cuda"  # torch's cpp_extension reads CUDA_HOME
    assert "HOROVOD_CUDA_HOME" not in bh.build_env({})
    assert "CUDA_HOME" not in bh.build_env({})


def test_torchs_nccl_only_when_no_nccl_is_named():
    assert not bh.wants_torch_nccl({}, "")
    assert not bh.wants_torch_nccl({"HOROVOD_NCCL_HOME": "/opt/nccl"}, "NCCL")
    assert not bh.wants_torch_nccl({"HOROVOD_NCCL_LIB": "/opt/nccl/lib"}, "NCCL")


def test_parse_check_build():
    assert bh.parse_check_build(CHECK_BUILD_CPU) == {"PyTorch", "Gloo"}
    assert set(bh.required_features()) <= bh.parse_check_build(CHECK_BUILD_CPU)
    assert "NCCL" in bh.required_features("NCCL")
    assert not set(bh.required_features("NCCL")) <= bh.parse_check_build(CHECK_BUILD_CPU)


def test_parse_check_build_without_pytorch_or_gloo():
    without = CHECK_BUILD_CPU.replace("[X] PyTorch", "[ ] PyTorch").replace("[X] Gloo", "[ ] Gloo")
    assert bh.parse_check_build(without) == set()
    assert bh.parse_check_build("horovodrun: command failed\n") == set()
