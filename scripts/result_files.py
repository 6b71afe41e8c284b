"""Reads the result files of edbatch's tools for scripts/report.py and scripts/bench_table.py:
the JSON object of `edbatch run --json` (indented over many lines), a JSON list of objects, or
JSON lines (one object per line: scripts/bench_*.sh, bench_core, bench_blocks, ...); and checks
the paths they write."""
import json
import os


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


def _same_file(a, b):
    """Whether paths a and b name one file (any name: links, relative and absolute paths)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(error, inputs, outputs):
    """Refuses, with error(message) (argparse's parser.error: a usage error, exit status 2),
    output paths that would replace an input file (by any name) or another output, that name a
    directory, or whose directory does not exist. outputs: [(flag, path)]; None paths (flags not
    given) are left out. Run it before any work, so that nothing is read or written first."""
    given = [(flag, path) for flag, path in outputs if path is not None]
    for n, (flag, path) in enumerate(given):
        if os.path.isdir(path):
            error(f"{flag} {path}: is a directory (expected the name of a file to write)")
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            error(f"{flag} {path}: no directory '{parent}' to write it in")
        for src in inputs:
            if _same_file(path, src):
                error(f"{flag} {path}: is the input file {src}; writing it would replace the "
                      "results it holds (name another file)")
        for other_flag, other in given[:n]:
            if _same_file(path, other):
                error(f"{flag} {path}: is the file {other_flag} writes too (name another file)")
