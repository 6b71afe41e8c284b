import os
import sys

# Run from a checkout: the package from python/, the library from $EDBATCH_LIBRARY (CTest sets it).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
