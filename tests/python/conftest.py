import os
import sys

# From a CMake build (CTest sets EDBATCH_LIBRARY): the package from the checkout's python/.
# Otherwise the installed package (`pip install`) is tested.
if os.environ.get("EDBATCH_LIBRARY"):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import pytest  # noqa: E402


@pytest.fixture(params=["program", "op"])
def backend(request, monkeypatch):
    """Where edbatch.nn.Propagate runs its programs: "program", the Python runner of
    program_runner.py (checks the tracer and the format without the extension's op), or "op",
    torch.ops.edbatch.propagate (skipped while the loaded extension does not register it)."""
    from edbatch import propagate
    if request.param == "program":
        import program_runner
        monkeypatch.setattr(propagate, "run_program", program_runner.run_program)
    elif not propagate.has_propagate_op():
        pytest.skip("torch.ops.edbatch.propagate is not registered by the loaded extension "
                    "(user cells need the extension's propagate op)")
    return request.param


def pytest_addoption(parser):
    parser.addoption("--pip-install", action="store_true",
                     help="run test_pip_install.py: `pip install .` of a copy of the checkout "
                          "into a fresh virtual environment (compiles the extension: minutes)")


def pytest_configure(config):
    config.addinivalue_line("markers", "pip_install: needs --pip-install (minutes)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--pip-install"):
        return
    skip = pytest.mark.skip(reason="`pip install .` compiles the extension: run with --pip-install")
    for item in items:
        if "pip_install" in item.keywords:
            item.add_marker(skip)
