"""build_horovod's pure parts: the wheel cache's key, the build environment, the reading of `horovodrun
--check-build`, and what main() does with the cache. Nothing here builds or installs anything (the sdist's
edits: test_horovod_source_edits.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_horovod import build_horovod as bh

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
