"""scripts/bench_table.py: the Markdown table of `edbatch run --json` results, from JSON lines
or the indented object that `edbatch run --json FILE` writes (data/report/run_forward.json)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "data", "report", "run_forward.json")
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "bench_table.py")

spec = importlib.util.spec_from_file_location("edbatch_bench_table", SCRIPT)
TABLE = importlib.util.module_from_spec(spec)
spec.loader.exec_module(TABLE)


def table(capsys, *files):
    assert TABLE.main(list(files)) == 0
    return capsys.readouterr().out


def write_lines(path, runs):
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    return str(path)


def test_help_explains_inputs_and_output():
    done = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    assert done.stdout.startswith("usage: bench_table.py")
    assert "JSON lines" in done.stdout and "standard output" in done.stdout


def test_reads_the_indented_object_and_json_lines(tmp_path, capsys):
    run = json.load(open(RUN))
    from_object = table(capsys, RUN)
    from_lines = table(capsys, write_lines(tmp_path / "runs.jsonl", [run]))
    assert from_object == from_lines
    rows = [l for l in from_object.splitlines() if l.startswith("| lattice_lstm |")]
    assert len(rows) == 1 and f"| {run['instances_per_s']:.0f} |" in rows[0]


def test_a_missing_field_names_file_line_and_field(tmp_path):
    run = json.load(open(RUN))
    short = dict(run)
    del short["peak_rss_bytes"]
    path = write_lines(tmp_path / "runs.jsonl", [run, short])
    with pytest.raises(SystemExit) as stop:
        TABLE.main([path])
    assert str(stop.value).startswith(f"bench_table.py: {path}:2: no field 'peak_rss_bytes'")
    nested = dict(run, ms_per_minibatch={"median": 1.0, "p90": 2.0})
    path = write_lines(tmp_path / "nested.jsonl", [nested])
    with pytest.raises(SystemExit) as stop:
        TABLE.main([path])
    assert f"{path}: no field 'ms_per_minibatch.p10'" in str(stop.value)


def test_no_runs_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    done = subprocess.run([sys.executable, SCRIPT, str(empty)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and done.stdout == ""
    assert f"{empty}: no runs" in done.stderr


def test_greedy_decoding_runs_are_labelled_and_compared_apart(tmp_path, capsys):
    run = json.load(open(RUN))
    runs = []
    for decode in (False, True):
        for blocks, policy, ms in ((True, "lb-greedy", 2.0), (False, "depth", 6.0)):
            ms = ms * (3 if decode else 1)
            runs.append(dict(run, blocks=blocks, policy=policy, decode=decode, max_len=40,
                             ms_per_minibatch=dict(run["ms_per_minibatch"], median=ms)))
    out = table(capsys, write_lines(tmp_path / "runs.jsonl", runs))
    assert out.startswith("| model | mode | blocks |")
    assert sum("| lattice_lstm | greedy decoding |" in l for l in out.splitlines()) == 2
    assert "Blocks vs op level (forward;" in out and "Blocks vs op level (greedy decoding;" in out
    # Each mode's ratio from its own runs: 6 / 2 forward, 18 / 6 decoding (batch 16, hidden 8).
    ratios = "| 3.00 | 3.00 | 3.00 |"
    assert out.count("| lattice_lstm | 16 | 8 | 1 | 6.00 | 2.00 | 2.00 " + ratios) == 1
    assert out.count("| lattice_lstm | 16 | 8 | 1 | 18.00 | 6.00 | 6.00 " + ratios) == 1


def _ms(run, ms, **changes):
    return dict(run, ms_per_minibatch=dict(run["ms_per_minibatch"], median=ms), **changes)


def test_ratios_compare_runs_of_one_size_only(tmp_path, capsys):
    run = json.load(open(RUN))
    # Op level at batch 16 / hidden 8 and blocks at batch 64 / hidden 32: nothing to compare.
    apart = [_ms(run, 6.0, blocks=False, policy="depth"),
             _ms(run, 2.0, blocks=True, policy="lb-greedy", batch=64, hidden=32)]
    out = table(capsys, write_lines(tmp_path / "apart.jsonl", apart))
    assert "Blocks vs op level" not in out
    # The table says which run had which sizes.
    assert out.startswith("| model | batch | hidden | blocks |")
    assert "| lattice_lstm | 64 | 32 | on | lb-greedy |" in out
    # Both sizes with both kinds of run: a ratio each, from its own runs.
    both = apart + [_ms(run, 2.0, blocks=True, policy="lb-greedy"),
                    _ms(run, 12.0, blocks=False, policy="depth", batch=64, hidden=32)]
    out = table(capsys, write_lines(tmp_path / "both.jsonl", both))
    assert "| model | batch | hidden | threads | op level best ms |" in out
    assert "| lattice_lstm | 16 | 8 | 1 | 6.00 | 2.00 | 2.00 | 3.00 | 3.00 | 3.00 |" in out
    assert "| lattice_lstm | 64 | 32 | 1 | 12.00 | 2.00 | 2.00 | 6.00 | 6.00 | 6.00 |" in out
    # A setting other than the sizes gets its own column where runs differ in it.
    seeds = [_ms(run, 6.0, blocks=False, policy="depth", seed=1),
             _ms(run, 2.0, blocks=True, policy="lb-greedy", seed=1),
             _ms(run, 4.0, blocks=False, policy="depth", seed=2),
             _ms(run, 2.0, blocks=True, policy="lb-greedy", seed=2)]
    out = table(capsys, write_lines(tmp_path / "seeds.jsonl", seeds))
    assert "| model | batch | hidden | threads | seed | op level best ms |" in out
    assert "| lattice_lstm | 16 | 8 | 1 | 2 | 4.00 | 2.00 | 2.00 | 2.00 | 2.00 | 2.00 |" in out


def test_two_runs_of_one_configuration_are_named(tmp_path):
    run = json.load(open(RUN))
    runs = [_ms(run, 6.0, blocks=False, policy="depth"),
            _ms(run, 2.0, blocks=True, policy="lb-greedy"),
            _ms(run, 5.0, blocks=False, policy="depth")]
    path = write_lines(tmp_path / "runs.jsonl", runs)
    with pytest.raises(SystemExit) as stop:
        TABLE.main([path])
    said = str(stop.value)
    assert said.startswith(f"bench_table.py: {path}:3: the same configuration as {path}:1 (")
    assert "batch 16, hidden 8" in said and "policy depth" in said
    # Packed and unpacked blocks runs are two configurations; the default one is unpacked.
    runs[2] = _ms(run, 1.0, blocks=True, packed=True, policy="lb-greedy")
    assert TABLE.main([write_lines(tmp_path / "packed.jsonl", runs)]) == 0


def test_every_file_needs_runs(tmp_path, capsys):
    run = json.load(open(RUN))
    runs = write_lines(tmp_path / "runs.jsonl", [_ms(run, 6.0, blocks=False, policy="depth"),
                                                 _ms(run, 2.0, blocks=True, policy="lb-greedy")])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit) as stop:
        TABLE.main([runs, str(empty)])
    assert str(stop.value).startswith(f"bench_table.py: {empty}: no runs")
    assert capsys.readouterr().out == ""  # nothing printed before the error
    out = table(capsys, runs, runs)
    assert "(forward; 2 run(s):" in out
