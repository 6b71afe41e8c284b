"""`python -m edbatch [--json]`: the version, the backends built in and the devices seen."""
import argparse
import json

from .info import info, format_info

parser = argparse.ArgumentParser(prog="python -m edbatch", description=__doc__)
parser.add_argument("--json", action="store_true", help="print one JSON object instead")
args = parser.parse_args()
d = info()
print(json.dumps(d) if args.json else format_info(d))
