"""Time of edbatch.nn.Propagate at growing fan-in: one node fed by F leaves, an attention edge
cell (a score and a value per arc) and a node cell, forward and backward, for each reduce, each
repetition on a new structure (F + its number of leaves), so that scheduling and planning are
measured. The time per arc should stay flat as F grows (work linear in the fan-in); the sum's
relative error against float64 is printed beside it.

    /usr/bin/python3 bench/bench_fan_in.py [--fan-in 10,100,1000,10000 --reduce sum,softmax
                                            --hidden 16 --reps 5]

Prints a table (stderr) and one JSON line per reduce and fan-in (stdout): median, p10 and p90
seconds of a forward and backward, microseconds per arc, and the relative error of the hub's
reduced message (sum: against a float64 sum of the same messages)."""
import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import edbatch  # noqa: E402
from torch_baseline import HelpFormatter, json_line  # noqa: E402


class Attend(nn.Module):
    """Edge cell: (score, value) of the child's state."""

    def __init__(self, h):
        super().__init__()
        self.score, self.value = nn.Linear(h, 1), nn.Linear(h, h)

    def forward(self, child, x):
        return self.score(child), self.value(child)


class Pass(nn.Module):
    """Edge cell of the sum: the child's state as it is (the message the error is checked on)."""

    def forward(self, child, x):
        return child * 1.0


def node_cell(x, message):
    return torch.tanh(message[-1] + x) if isinstance(message, tuple) else message + x


def quantile(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def measure(reduce, fan_in, hidden, reps):
    torch.manual_seed(fan_in)
    edge = Attend(hidden) if reduce == "softmax" else Pass()
    model = edbatch.nn.Propagate(node_cell, edge, reduce=reduce, state_size=hidden,
                                 message_size=(1, hidden) if reduce == "softmax" else None)
    times = []
    for r in range(reps + 1):  # the first traces the cells and warms up
        # A new structure each time (fan-in F + r), so that no schedule or plan is reused.
        n = fan_in + r
        packed = edbatch.pack_trees([tuple(range(n))])  # n leaves, then the hub
        x = (0.5 + torch.rand(n, hidden)).requires_grad_()  # the leaves' rows (the hub has none)
        t0 = time.perf_counter()
        h = model(packed, x=x)
        h.sum().backward()
        times.append((time.perf_counter() - t0) * fan_in / n)  # per F arcs
    times = times[1:]
    error = None
    if reduce == "sum":  # the hub's state is the sum of the leaves' (each its x row)
        want = x.detach().double().sum(0)
        got = h.detach()[n].double()
        error = ((got - want).abs() / want.abs()).max().item()
    return times, error


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=HelpFormatter)
    ap.add_argument("--fan-in", default="10,100,1000,10000",
                    help="fan-ins of the hub node, comma-separated")
    ap.add_argument("--reduce", default="sum,softmax", help="reduces, comma-separated")
    ap.add_argument("--hidden", type=int, default=16, help="state size")
    ap.add_argument("--reps", type=int, default=5, help="measured repetitions per point")
    args = ap.parse_args(argv)
    try:
        fan_ins = [int(f) for f in args.fan_in.split(",")]
    except ValueError:
        ap.error(f"--fan-in: comma-separated whole numbers expected, got {args.fan_in!r}")
    reduces = args.reduce.split(",")
    if any(f < 1 for f in fan_ins) or args.hidden < 1 or args.reps < 1:
        ap.error("--fan-in, --hidden and --reps must be at least 1")
    if any(r not in ("sum", "softmax", "mean", "max") for r in reduces):
        ap.error(f"--reduce: sum, softmax, mean or max, got {args.reduce!r}")
    print(f"{'reduce':8} {'fan-in':>7} {'median s':>10} {'p10':>8} {'p90':>8} {'us/arc':>8} "
          f"{'rel. error':>11}", file=sys.stderr)
    for reduce in reduces:
        for fan_in in fan_ins:
            times, error = measure(reduce, fan_in, args.hidden, args.reps)
            med = statistics.median(times)
            print(f"{reduce:8} {fan_in:7} {med:10.4f} {quantile(times, 0.1):8.4f} "
                  f"{quantile(times, 0.9):8.4f} {1e6 * med / fan_in:8.2f} "
                  f"{'' if error is None else f'{error:.2e}':>11}", file=sys.stderr)
            print(json_line({"bench": "fan_in", "reduce": reduce, "fan_in": fan_in,
                             "hidden": args.hidden, "reps": args.reps, "median_s": med,
                             "p10_s": quantile(times, 0.1), "p90_s": quantile(times, 0.9),
                             "us_per_arc": 1e6 * med / fan_in, "relative_error": error}))


if __name__ == "__main__":
    main()
