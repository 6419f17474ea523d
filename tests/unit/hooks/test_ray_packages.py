"""Local working_dir and py_modules as the packages Ray's dashboard takes: content-addressed zips,
laid out as Ray lays them out, with the runtime_env naming them by URI."""

import hashlib
import io
import os
import zipfile

import pytest

from airflow_provider_horovod.hooks.ray_packages import (
    PACKAGE_PREFIX,
    package_file,
    package_folder,
    with_uploaded_packages,
)


def make_tree(root, files):
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return root


def unpack(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist() if not info.is_dir()}


@pytest.fixture
def mylib(tmp_path):
    return make_tree(
        tmp_path / "mylib", {"__init__.py": "X = 1\n", "sub/util.py": "def f(): pass\n", "data/table.csv": "a,b\n1,2\n"}
    )


def test_same_content_same_uri_and_bytes(mylib, tmp_path):
    a = package_folder(str(mylib), keep_name=True)
    copy = make_tree(
        tmp_path / "elsewhere" / "mylib",
        {"__init__.py": "X = 1\n", "sub/util.py": "def f(): pass\n", "data/table.csv": "a,b\n1,2\n"},
    )
    os.utime(copy / "__init__.py", (0, 0))  # timestamps are not content
    b = package_folder(str(copy), keep_name=True)
    assert a.uri == b.uri
    assert a.data == b.data
    assert a.uri.startswith(f"gcs://{PACKAGE_PREFIX}")
    assert a.uri.endswith(".zip")
    assert a.name == a.uri[len("gcs://") :]


def test_one_changed_byte_makes_a_new_uri(mylib):
    before = package_folder(str(mylib), keep_name=True).uri
    (mylib / "data" / "table.csv").write_text("a,b\n1,3\n")
    assert package_folder(str(mylib), keep_name=True).uri != before


def test_a_renamed_file_makes_a_new_uri(mylib):
    before = package_folder(str(mylib), keep_name=True).uri
    (mylib / "sub" / "util.py").rename(mylib / "sub" / "utils.py")
    assert package_folder(str(mylib), keep_name=True).uri != before


def test_py_modules_keep_the_folder_name_and_working_dir_does_not(mylib):
    as_module = package_folder(str(mylib), keep_name=True)
    as_working_dir = package_folder(str(mylib), keep_name=False)
    assert unpack(as_module.data) == {
        "mylib/__init__.py": b"X = 1\n",
        "mylib/sub/util.py": b"def f(): pass\n",
        "mylib/data/table.csv": b"a,b\n1,2\n",
    }
    assert unpack(as_working_dir.data) == {
        "__init__.py": b"X = 1\n",
        "sub/util.py": b"def f(): pass\n",
        "data/table.csv": b"a,b\n1,2\n",
    }
    assert as_module.uri != as_working_dir.uri


def test_the_zip_unpacks_to_the_same_files(mylib, tmp_path):
    package = package_folder(str(mylib), keep_name=True)
    out = tmp_path / "unpacked"
    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        archive.extractall(out)
    for relative in ("__init__.py", "sub/util.py", "data/table.csv"):
        assert (out / "mylib" / relative).read_bytes() == (mylib / relative).read_bytes()


def test_default_excludes(mylib):
    make_tree(
        mylib,
        {
            "__pycache__/x.cpython-311.pyc": b"\0",
            "sub/__pycache__/y.json": b"{}",
            ".git/HEAD": "ref",
            "mod.pyc": b"\0",
            ".venv/bin/python": "",
            "venv/lib/x.py": "",
        },
    )
    names = set(unpack(package_folder(str(mylib), keep_name=False).data))
    assert names == {"__init__.py", "sub/util.py", "data/table.csv"}


def test_excluded_files_do_not_change_the_uri(mylib):
    before = package_folder(str(mylib), keep_name=True).uri
    make_tree(mylib, {"__pycache__/x.pyc": b"\1", ".git/objects/ab": b"x"})
    assert package_folder(str(mylib), keep_name=True).uri == before


def test_user_excludes(mylib):
    make_tree(mylib, {"ckpt/model.ckpt": b"big", "notes.ckpt": b"big"})
    package = package_folder(str(mylib), keep_name=False, excludes=("data", "*.ckpt"))
    assert set(unpack(package.data)) == {"__init__.py", "sub/util.py"}
    assert set(unpack(package_folder(str(mylib), keep_name=False, excludes=("sub/util.py",)).data)) == {
        "__init__.py",
        "data/table.csv",
        "ckpt/model.ckpt",
        "notes.ckpt",
    }


def test_a_wheel_keeps_its_file_name(tmp_path):
    wheel = tmp_path / "mypkg-1.2.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x03\x04wheel-bytes")
    package = package_file(str(wheel))
    assert package.uri == "gcs://mypkg-1.2.0-py3-none-any.whl"
    assert package.data == wheel.read_bytes()


def test_a_single_module_goes_zipped(tmp_path):
    module = tmp_path / "helpers.py"
    module.write_text("Y = 2\n")
    package = package_file(str(module))
    assert package.uri.startswith(f"gcs://{PACKAGE_PREFIX}")
    assert unpack(package.data) == {"helpers.py": b"Y = 2\n"}
    module.write_text("Y = 3\n")
    assert package_file(str(module)).uri != package.uri


def test_a_zip_working_dir_goes_as_it_is(tmp_path, mylib):
    # Ray unpacks a gcs:// zip as it is: wrapped in a second zip, the job would find only the archive.
    archive = tmp_path / "wd.zip"
    archive.write_bytes(package_folder(str(mylib), keep_name=False).data)
    package = package_file(str(archive))
    assert package.data == archive.read_bytes()
    assert package.uri == f"gcs://{PACKAGE_PREFIX}{hashlib.sha1(archive.read_bytes()).hexdigest()}.zip"
    assert "__init__.py" in unpack(package.data)


def test_with_uploaded_packages_replaces_local_paths_and_keeps_uris(tmp_path, mylib):
    wd = make_tree(tmp_path / "project", {"train.py": "print(1)\n", "big.ckpt": b"x" * 100})
    wheel = tmp_path / "dep-0.1-py3-none-any.whl"
    wheel.write_bytes(b"PK-wheel")
    env = {
        "working_dir": str(wd),
        "py_modules": [str(mylib), "s3://bucket/mod.zip", str(wheel)],
        "excludes": ["*.ckpt"],
        "env_vars": {"A": "1"},
    }
    out, packages = with_uploaded_packages(env)
    wd_package, lib_package, wheel_package = packages
    assert out == {
        "working_dir": wd_package.uri,
        "py_modules": [lib_package.uri, "s3://bucket/mod.zip", "gcs://dep-0.1-py3-none-any.whl"],
        "env_vars": {"A": "1"},
    }
    assert set(unpack(wd_package.data)) == {"train.py"}  # excludes honoured, then dropped
    assert set(unpack(lib_package.data)) == {"mylib/__init__.py", "mylib/sub/util.py", "mylib/data/table.csv"}
    assert wheel_package.data == b"PK-wheel"
    assert env["working_dir"] == str(wd)
    assert "excludes" in env  # the input is not changed


def test_with_uploaded_packages_leaves_uris_and_no_local_paths_alone():
    env = {"working_dir": "gcs://_ray_pkg_abc.zip", "py_modules": ["https://h/m.zip"], "pip": ["pandas"]}
    assert with_uploaded_packages(env) == (env, [])
    assert with_uploaded_packages({}) == ({}, [])


def test_a_requirements_file_becomes_its_requirements(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# pinned\npandas==2.2\n\n  numpy>=1.26  \n   # indented comment\n")
    out, packages = with_uploaded_packages({"pip": str(requirements)})
    assert out == {"pip": ["pandas==2.2", "numpy>=1.26"]}
    assert packages == []
    assert with_uploaded_packages({"pip": {"packages": ["x"]}})[0] == {"pip": {"packages": ["x"]}}
