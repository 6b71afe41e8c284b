"""`pip install --no-build-isolation .`: the edbatch Python package with its torch extension,
compiled from the library sources against the torch that is installed (docs/pytorch.md).

The CPU backends are built; for CUDA use the CMake build (EDBATCH_LIBRARY, docs/pytorch.md).
Needs the Debian packages of scripts/deps.sh (Eigen, TBB, fmt, nlohmann-json).
"""
import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
# As the CMake build: the host's vector units unless EDBATCH_NATIVE=OFF (portable wheels).
NATIVE = [] if os.environ.get("EDBATCH_NATIVE", "ON") == "OFF" else ["-march=native"]


def sources():
    folders = ["src/core", "src/io", "src/zoo", "fsm", "memplan", "kernels/cpu", "kernels/null",
               "kernels/no_cuda", "src/torch"]
    files = []
    for folder in folders:
        files += sorted(glob.glob(os.path.join(folder, "*.cpp")))
    return files


os.chdir(ROOT)
setup(
    name="edbatch",
    version="0.1.0",
    description="Dynamic batching of tree, lattice and DAG cells as PyTorch ops",
    package_dir={"": "python"},
    packages=["edbatch"],
    ext_modules=[
        CppExtension(
            name="edbatch._edbatch",
            sources=sources(),
            include_dirs=[ROOT, os.path.join(ROOT, "include"), "/usr/include/eigen3"],
            libraries=["tbb", "fmt"],
            define_macros=[("EIGEN_DONT_PARALLELIZE", None)],
            extra_compile_args=["-O3", "-std=c++17"] + NATIVE,
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    # Keep setuptools' build folder apart from the CMake build folders.
    options={"build": {"build_base": "build-pip"}},
    python_requires=">=3.9",
)
