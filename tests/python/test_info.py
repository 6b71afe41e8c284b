"""`python -m edbatch` and edbatch.backends() / device_status() report the loaded extension: the
version of the CMake project, the backends the build carries, and what the devices say."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import edbatch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def cmake_version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(edbatch VERSION ([0-9.]+)", text).group(1)


def python_m_edbatch(*args):
    env = dict(os.environ)
    if env.get("EDBATCH_LIBRARY"):  # the checkout's package, as conftest.py uses
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"),
                                             env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "edbatch", *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_version_backends_and_devices():
    assert edbatch.__version__ == cmake_version()
    backends = edbatch.backends()
    assert backends[:2] == ["cpu", "null"] and set(backends) <= {"cpu", "null", "cuda"}
    assert edbatch.device_status("cpu") == "" and edbatch.device_status("null") == ""
    if "cuda" not in backends:
        assert edbatch.device_status("cuda") == "edbatch was built without CUDA"
    elif not torch.cuda.is_available():
        assert edbatch.device_status("cuda") != ""
    assert "unknown device 'tpu'" in edbatch.device_status("tpu")


def test_python_m_edbatch_prints_the_same():
    info = json.loads(python_m_edbatch("--json"))
    assert info["version"] == cmake_version()
    assert info["backends"] == edbatch.backends()
    assert info["torch"] == torch.__version__
    assert info["cells"] == edbatch.cells()
    assert len(info["devices"]["cuda"]["gpus"]) == (torch.cuda.device_count()
                                                    if torch.cuda.is_available() else 0)
    text = python_m_edbatch()
    lines = text.splitlines()
    assert lines[0] == f"edbatch {cmake_version()}"
    assert "backends built in: " + ", ".join(info["backends"]) in text
    assert f"  cuda: {info['devices']['cuda']['status']}" in lines


def load_with(path):
    env = dict(os.environ, EDBATCH_LIBRARY=path, PYTHONPATH=os.path.join(ROOT, "python"))
    done = subprocess.run([sys.executable, "-c", "import edbatch"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    return done.stderr.strip().splitlines()[-1]


def test_a_missing_library_is_named():
    """EDBATCH_LIBRARY naming no file: an ImportError naming the variable and the path."""
    last = load_with(os.path.join(ROOT, "no-such-lib.so"))
    assert "EDBATCH_LIBRARY is" in last and "no-such-lib.so" in last


def test_a_library_that_is_not_the_extension_is_named(tmp_path):
    """A file that is no library, and a library that registers no edbatch ops (another of
    torch's own): ImportErrors naming the file."""
    text = tmp_path / "text.so"
    text.write_text("not a library")
    last = load_with(str(text))
    assert last.startswith("ImportError: edbatch:") and "could not be loaded" in last
    other = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_global_deps.so")
    if not os.path.isfile(other):
        pytest.skip("no libtorch_global_deps.so beside this torch")
    last = load_with(other)
    assert "is not edbatch's PyTorch extension" in last and "libtorch_global_deps.so" in last


def test_the_extension_loads_once_whatever_the_library_named_later(tmp_path):
    """A second copy of the extension would register its operators again, which aborts the
    process: once they are registered, load() (after a reload of the package, or with
    EDBATCH_LIBRARY naming another copy) uses them as they are."""
    copy = tmp_path / "copy.so"
    copy.write_bytes(open(edbatch._lib.load(), "rb").read())
    script = (
        "import os, torch, edbatch\n"
        "edbatch._lib.load()\n"
        f"os.environ['EDBATCH_LIBRARY'] = {str(copy)!r}\n"
        "edbatch._lib._loaded = None\n"
        "edbatch._lib.load()\n"
        "packed = edbatch.pack_trees([(1, 2)])\n"
        "m = edbatch.nn.Propagate(lambda x, h: torch.tanh(x + h), state_size=3)\n"
        "print(m(packed, x=torch.ones(3, 3)).shape)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch.Size([3, 3])" in done.stdout
