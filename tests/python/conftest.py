import os
import sys

# From a CMake build (CTest sets EDBATCH_LIBRARY): the package from the checkout's python/.
# Otherwise the installed package (`pip install`) is tested.
if os.environ.get("EDBATCH_LIBRARY"):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
