"""`pip install` of the source distribution of a copy of the checkout (`setup.py sdist`, so
MANIFEST.in must carry every file the build reads) into a fresh virtual environment that sees the
system's packages (Debian's torch), without build isolation or dependencies (no index needed):
the installed package imports from the environment, runs a built-in cell equal to the reference
(pip_check.py), and `python -m edbatch` reports the checkout's version and the backends that
match the installed torch. Compiles the extension (minutes): runs with --pip-install only, which
CTest's python_pip_install gives."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

pytestmark = pytest.mark.pip_install

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def cmake_version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(edbatch VERSION ([0-9.]+)", text).group(1)


def clean_env():
    """The environment without what points Python at the checkout's package or a CMake build."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "EDBATCH_LIBRARY", "PYTHONHOME"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    work = tmp_path_factory.mktemp("pip")
    source = work / "edbatch"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        "build*", ".git", ".deb", ".whl", "out", "*.egg-info", "__pycache__", ".venv*"))
    done = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(work / "dist")],
                          cwd=source, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    (sdist,) = (work / "dist").glob("edbatch-*.tar.gz")
    env = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env)],
                   check=True, timeout=300)
    python = str(env / "bin" / "python")
    start = time.monotonic()
    done = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                           "--no-index", "-v", str(sdist)], cwd=work, env=clean_env(),
                          capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    print(f"pip install took {seconds:.0f} s")
    choice = [l for l in (done.stdout + done.stderr).splitlines() if "backends (" in l]
    return python, choice


def run(python, *args):
    done = subprocess.run([python, *args], cwd="/", env=clean_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_installed_package_runs_a_cell(venv):
    python, _ = venv
    result = json.loads(run(python, os.path.join(ROOT, "tests", "python", "pip_check.py")))
    prefix = os.path.dirname(os.path.dirname(python))
    assert result["module"].startswith(prefix), result["module"]
    assert result["cpu"]["max_error"] < 1e-4


def test_python_m_edbatch(venv):
    python, choice = venv
    info = json.loads(run(python, "-m", "edbatch", "--json"))
    assert info["version"] == cmake_version()
    assert info["extension"].startswith(os.path.dirname(os.path.dirname(python)))
    assert info["torch"] == torch.__version__
    # The CUDA backend exactly when the installed torch has CUDA and a toolkit is there.
    if torch.version.cuda is None:
        assert info["backends"] == ["cpu", "null"]
        assert info["devices"]["cuda"]["status"] == "edbatch was built without CUDA"
    assert len(choice) >= 1 and ("CUDA and CPU" in choice[-1]) == ("cuda" in info["backends"])
    text = run(python, "-m", "edbatch")
    assert text.startswith(f"edbatch {cmake_version()}\n")
    assert "backends built in: " + ", ".join(info["backends"]) in text
