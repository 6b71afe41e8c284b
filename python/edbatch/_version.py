"""The package's version, read by setup.py; the CMake project's VERSION says the same."""
__version__ = "0.1.0"
