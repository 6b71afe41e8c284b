"""Reads the result files of edbatch's tools for scripts/report.py and scripts/bench_table.py:
the JSON object of `edbatch run --json` (indented over many lines), a JSON list of objects, or
JSON lines (one object per line: scripts/bench_*.sh, bench_core, bench_blocks, ...)."""
import json


def read_results(paths, tool):
    """[(where, record)] of every JSON object of the files, in order. `where` names the file, and
    the line for JSON lines or the item for a list, for messages. A file that cannot be read or
    parsed stops the tool with a message that names it, prefixed with `tool`."""
    out = []
    for path in paths:
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise SystemExit(f"{tool}: {path}: {e.strerror.lower()}")
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None
        else:
            if isinstance(whole, list):
                out += [(f"{path}: item {i}", r) for i, r in enumerate(whole, 1)]
            else:
                out.append((path, whole))
            continue
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{tool}: {path}:{n}: not JSON ({e.msg})")
    for where, r in out:
        if not isinstance(r, dict):
            raise SystemExit(f"{tool}: {where}: not a JSON object")
    return out
