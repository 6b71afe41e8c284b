"""`pip install --no-build-isolation .`: the edbatch Python package with its torch extension,
compiled from the library sources against the torch that is installed (docs/pytorch.md).

The CUDA backend is built in whenever the installed torch has CUDA and a CUDA toolkit is found
(CUDA_HOME or CUDA_PATH, nvcc on PATH, /usr/local/cuda: where torch looks) whose major version
is torch's; the CPU backends otherwise. EDBATCH_CUDA=ON/OFF overrides the choice,
EDBATCH_NATIVE=OFF builds for the baseline x86-64 (portable wheels), TORCH_CUDA_ARCH_LIST picks
the GPU architectures (default: those of the GPUs present). Needs the Debian packages of
scripts/deps.sh (Eigen, TBB, fmt, nlohmann-json).
"""
import glob
import os
import re
import subprocess
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
# As the CMake build: the host's vector units unless EDBATCH_NATIVE=OFF.
NATIVE = [] if os.environ.get("EDBATCH_NATIVE", "ON") == "OFF" else ["-march=native"]


def version():
    text = open(os.path.join(ROOT, "python", "edbatch", "_version.py")).read()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


def nvcc_version(cuda_home):
    """The toolkit's "major.minor", or None when its nvcc does not run."""
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", out.stdout)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def cuda_choice():
    """(build CUDA?, why): the installed torch has CUDA and a toolkit of the same major version
    is found. EDBATCH_CUDA=ON forces it (torch's own checks then speak), OFF leaves it out."""
    import torch

    forced = os.environ.get("EDBATCH_CUDA", "").upper()
    if forced in ("OFF", "0", "NO"):
        return False, "EDBATCH_CUDA=OFF"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} has no CUDA"
    from torch.utils.cpp_extension import CUDA_HOME
    if not CUDA_HOME or not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        why = "no CUDA toolkit (nvcc) found: set CUDA_HOME"
        return forced in ("ON", "1", "YES"), why
    toolkit = nvcc_version(CUDA_HOME)
    why = f"torch {torch.__version__} (CUDA {torch.version.cuda}), nvcc {toolkit} in {CUDA_HOME}"
    if forced in ("ON", "1", "YES"):
        return True, why
    if toolkit is None or toolkit.split(".")[0] != torch.version.cuda.split(".")[0]:
        return False, why + ": the major versions differ (EDBATCH_CUDA=ON tries anyway)"
    return True, why


def sources(cuda):
    folders = ["src/core", "src/io", "src/zoo", "fsm", "memplan", "kernels/cpu", "kernels/null",
               "kernels/cuda" if cuda else "kernels/no_cuda", "src/torch"]
    files = []
    for folder in folders:
        for pattern in ("*.cpp", "*.cu") if cuda else ("*.cpp",):
            files += sorted(glob.glob(os.path.join(folder, pattern)))
    return files


def extension():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    cuda, why = cuda_choice()
    print(f"edbatch: {'CUDA and CPU' if cuda else 'CPU'} backends ({why})", file=sys.stderr)
    args = dict(
        name="edbatch._edbatch",
        sources=sources(cuda),
        include_dirs=[ROOT, os.path.join(ROOT, "include"), "/usr/include/eigen3"],
        libraries=["tbb"],
        # fmt header-only: torch 2.x puts its own (newer) fmt headers on the include path
        # without exporting the compiled library, so linking a system libfmt would not match.
        define_macros=[("EIGEN_DONT_PARALLELIZE", None), ("FMT_HEADER_ONLY", "1")],
        # -g0: Python's own flags ask for debug information, which more than doubles the
        # compile time of the torch sources and makes a 65 MB library.
        extra_compile_args=["-O3", "-g0", "-std=c++17"] + NATIVE,
    )
    if not cuda:
        return CppExtension(**args)
    from torch.utils.cpp_extension import CUDA_HOME
    lib = os.path.join(CUDA_HOME, "lib64")
    # CUDA tensors stay on the GPU (src/torch/runtime.cpp), as with the CMake build; cuBLAS is
    # opened when the CUDA backend first runs (kernels/cuda/cublas_api.cpp), from the usual
    # search (PyTorch's, once torch has loaded it) or else the toolkit's directory.
    args["define_macros"] += [("EDBATCH_TORCH_CUDA", None),
                              ("EDBATCH_CUDA_LIBRARY_DIR", '"' + lib + '"')]
    args["extra_compile_args"] = {"cxx": args["extra_compile_args"],
                                  "nvcc": ["-O3", "-std=c++17", "--expt-relaxed-constexpr"]}
    args["runtime_library_dirs"] = [lib]  # the toolkit's runtime, wherever CUDA_HOME is
    return CUDAExtension(**args)


os.chdir(ROOT)
from torch.utils.cpp_extension import BuildExtension  # noqa: E402

setup(
    name="edbatch",
    version=version(),
    description="Dynamic batching of tree, lattice and DAG cells as PyTorch ops",
    package_dir={"": "python"},
    packages=["edbatch"],
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
    # Keep setuptools' build folder apart from the CMake build folders.
    options={"build": {"build_base": "build-pip"}},
    python_requires=">=3.9",
)
