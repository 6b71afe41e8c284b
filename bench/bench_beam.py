#!/usr/bin/env python3
"""Beam search over a mini-batch of sentences with a user LSTM cell: edbatch.nn.StepDecoder, each
kept hypothesis going on from its parent's state (reorder), against the same search in PyTorch as
its users write it: every live hypothesis of every unfinished sentence as one row, one step for
the whole batch, the states gathered by parent and finished sentences' rows dropped (index),
with the user's own cell module run eagerly ("pytorch-module"), compiled ("pytorch-compile",
torch.compile with a dynamic row count) and as nn.LSTMCell holding the same weights
("pytorch-lstmcell": ATen's fused cell).

The model: a token's embedding (E columns), the LSTM cell (hidden H), an output layer to V words
and log-softmax. The encoder's final states are seeded random rows (the search is timed, not an
encoder). Every implementation runs the same search code (Search.step): a sentence's K * V
continuations scored, the best 2K taken, those among the best K that end in EOS set aside as
finished, the best K others kept; a sentence is done with K finished hypotheses, and at --max-len
its live ones finish. The output layer, the softmax and the search are the same PyTorch code on
both sides: the difference is the cell steps and how the states follow their parents.

The implementations run round-robin, one search each per repetition, so machine noise hits them
alike; each row gives sentences per second (median, p10, p90 over the repetitions) and the ratio of
edbatch's median rate to its own from the same run. Before timing, every sentence's best
hypothesis is compared across implementations: a different best score (beyond --score-rtol) or
token sequence on more than --max-differ of the sentences stops the benchmark with exit status 1.
For one CPU core: taskset -c 0 python3 bench/bench_beam.py --device cpu (one torch thread and one
edbatch thread unless --threads).

--time-step ROWS times the decoder's step and reorder alone instead, at each row count (the same
user cell, H and E; loops of 30 steps from zero states, every step after a loop's first reordered
from random parents, repeats allowed, as beam search does), each call timed with a wait for the
device on both sides: the host work per step and row that a search pays, without its output
layer and search code. With --calls (CUDA) each row also counts the CUDA runtime calls per step,
its reorder included (torch.profiler).

--time-start ROWS times a loop's start instead, at each row count: start() from zero states and
from given states (seeded random rows on --device), and the first step after it, each call timed
with a wait for the device on both sides (the first --warmup loops untimed). On CUDA, start copies
the weights into the engine and the first step reads the given states, both in device memory.

    python3 bench/bench_beam.py [--device cpu|cuda] [--batch 32,128] [--hidden 256] [--beam 4]
    python3 bench/bench_beam.py --device cuda --time-step 128,512 [--steps 600] [--calls]
    python3 bench/bench_beam.py --device cuda --time-start 128,512 [--reps 50]
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_torch_ext as ext  # noqa: E402  (finds and loads edbatch)
from torch_baseline import HelpFormatter, count, json_line, quantile  # noqa: E402

edbatch = ext.edbatch
BOS, EOS = 1, 0


class UserLSTM(nn.Module):
    """The user's cell: (x, (h, c)) -> (h, c), one product for the four gates of [x, h], in
    nn.LSTMCell's order (input, forget, cell, output)."""

    def __init__(self, size, input_size):
        super().__init__()
        self.gates = nn.Linear(input_size + size, 4 * size)

    def forward(self, x, state):
        h, c = state
        z = self.gates(torch.cat([x, h], -1))
        i, f, g, o = z.chunk(4, -1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c_new), c_new


class Model(nn.Module):
    def __init__(self, vocab, E, H, eos_gain):
        super().__init__()
        self.emb = nn.Embedding(vocab, E)
        self.cell = UserLSTM(H, E)
        self.out = nn.Linear(H, vocab)
        with torch.no_grad():
            self.out.weight.mul_(4.0)
            # EOS's logit swings with the state: some hypotheses end after a few words, others
            # run to the cap.
            self.out.weight[EOS].mul_(eos_gain)


class Search:
    """One beam search's bookkeeping for B sentences, K hypotheses each, rows sentence-major
    (sentence j's hypotheses are rows j*K .. j*K+K-1 of the live sentences)."""

    def __init__(self, B, K, max_len, device):
        self.K, self.max_len = K, max_len
        self.alive = torch.arange(B, device=device)  # the live sentences, in row order
        # A sentence starts with one hypothesis: the other K - 1 rows score -inf.
        self.scores = torch.full((B, K), float("-inf"), device=device)
        self.scores[:, 0] = 0
        self.tokens = torch.full((B * K, 0), BOS, dtype=torch.long, device=device)
        self.finished = torch.zeros(B, dtype=torch.long, device=device)
        self.best = torch.full((B,), float("-inf"), device=device)
        self.best_tokens = torch.full((B, max_len), -1, dtype=torch.long, device=device)
        self.next = torch.full((B * K,), BOS, dtype=torch.long, device=device)
        self.steps = torch.zeros(B, dtype=torch.long, device=device)  # each sentence's steps

    def step(self, logp, t):
        """logp: (rows, V) of the live rows. Returns the rows the next step goes on from (an
        index into this step's rows), or None when every sentence is done."""
        b, K = self.alive.numel(), self.K
        V = logp.shape[1]
        total = (self.scores.reshape(-1, 1) + logp).reshape(b, K * V)
        values, index = total.topk(2 * K, dim=1)
        parent, token = index // V, index % V
        rows = parent + torch.arange(b, device=logp.device)[:, None] * K
        last = t + 1 == self.max_len
        ended = torch.ones_like(token[:, :K], dtype=torch.bool) if last else token[:, :K] == EOS
        # The best ended hypothesis of each sentence, if it beats the sentence's best so far.
        ended_scores = values[:, :K].masked_fill(~ended, float("-inf"))
        top, at = ended_scores.max(1)
        better = top > self.best[self.alive]
        chosen = rows.gather(1, at[:, None]).squeeze(1)
        seq = torch.cat([self.tokens[chosen], token.gather(1, at[:, None])], 1)
        seq = torch.nn.functional.pad(seq, (0, self.max_len - seq.shape[1]), value=-1)
        self.best_tokens[self.alive] = torch.where(better[:, None], seq,
                                                   self.best_tokens[self.alive])
        self.best[self.alive] = torch.where(better, top, self.best[self.alive])
        self.finished[self.alive] += ended.sum(1)
        self.steps[self.alive] = t + 1
        # The best K that do not end go on.
        # (a parent has one EOS continuation: of the best 2K, at least K do not end)
        going = token != EOS
        going &= going.cumsum(1) <= K
        pick = going.nonzero()[:, 1].reshape(b, K) if not last else None
        done = (self.finished[self.alive] >= K) if not last else torch.ones_like(better)
        go_on = (~done).nonzero().squeeze(1)  # the host waits here, as any search must
        if go_on.numel() == 0:
            return None
        pick = pick[go_on]
        from_rows = rows[go_on].gather(1, pick).reshape(-1)
        self.tokens = torch.cat([self.tokens[from_rows],
                                 token[go_on].gather(1, pick).reshape(-1, 1)], 1)
        self.scores = values[go_on].gather(1, pick)
        self.next = token[go_on].gather(1, pick).reshape(-1)
        self.alive = self.alive[go_on]
        return from_rows


def run_search(model, cell_rows, B, K, max_len, state, device):
    """The search; cell_rows(x, from_rows) steps the live rows (from_rows: the rows of the step
    before they go on from, None at the first step). Returns the best scores and tokens."""
    search = Search(B, K, max_len, device)
    from_rows = None
    for t in range(max_len):
        h = cell_rows(model.emb(search.next), from_rows)
        logp = torch.log_softmax(model.out(h), -1)
        from_rows = search.step(logp, t)
        if from_rows is None:
            break
    return search.best, search.best_tokens, search.steps


def implementations(model, args, B, state, device):
    h0, c0 = (s.repeat_interleave(args.beam, 0) for s in state)
    cell = model.cell
    lstm = nn.LSTMCell(args.embed, args.hidden).to(device)
    with torch.no_grad():
        lstm.weight_ih.copy_(cell.gates.weight[:, :args.embed])
        lstm.weight_hh.copy_(cell.gates.weight[:, args.embed:])
        lstm.bias_ih.copy_(cell.gates.bias)
        lstm.bias_hh.zero_()
    module = edbatch.nn.Propagate(cell, state_size=(args.hidden, args.hidden))
    decoder = edbatch.nn.StepDecoder(module, input_size=args.embed, threads=args.threads)

    def ours(x, from_rows):
        if from_rows is None:
            decoder.start(B * args.beam, (h0, c0))
        else:
            decoder.reorder(from_rows)
        return decoder.step(x)[0]

    def eager(step):
        held = {}

        def rows(x, from_rows):
            h, c = (h0, c0) if from_rows is None else (held["h"][from_rows],
                                                       held["c"][from_rows])
            held["h"], held["c"] = step(x, (h, c))
            return held["h"]
        return rows

    impls = {"edbatch": ours, "pytorch-module": eager(cell), "pytorch-lstmcell": eager(lstm)}
    if args.compile:
        # rows change every step: one graph with a dynamic row count, compiled in the check
        impls["pytorch-compile"] = eager(torch.compile(cell, dynamic=True))
    return impls


def seeded_decoder(args, R, device):
    """A decoder of the user LSTM cell with seeded weights, its generator and an x of R rows."""
    torch.manual_seed(args.seed)
    cell = UserLSTM(args.hidden, args.embed).to(device)
    module = edbatch.nn.Propagate(cell, state_size=(args.hidden, args.hidden))
    decoder = edbatch.nn.StepDecoder(module, input_size=args.embed, threads=args.threads)
    g = torch.Generator(device=device).manual_seed(args.seed)
    return decoder, g, torch.randn(R, args.embed, generator=g, device=device)


def time_step(args, rows, device):
    """--time-step: the decoder's step and reorder alone at each row count."""
    table = []
    for R in rows:
        decoder, g, x = seeded_decoder(args, R, device)
        steps, reorders = [], []
        with torch.no_grad():
            for s in range(args.steps):
                if s % 30 == 0:
                    decoder.start(R)
                else:
                    index = torch.randint(0, R, (R,), generator=g, device=device)
                    ext.sync(device)
                    t0 = time.perf_counter()
                    decoder.reorder(index)
                    reorders.append((time.perf_counter() - t0) * 1e6)
                ext.sync(device)
                t0 = time.perf_counter()
                decoder.step(x)
                ext.sync(device)
                steps.append((time.perf_counter() - t0) * 1e6)
        row = {"bench": "beam_step", "device": args.device, "rows": R, "hidden": args.hidden,
               "embed": args.embed, "threads": args.threads or torch.get_num_threads(),
               "steps": len(steps), **spread("step_us", steps), **spread("reorder_us", reorders)}
        if args.calls:
            row["calls_per_step"] = runtime_calls(decoder, R, x, g, device)
        table.append(row)
        print(json_line(row), flush=True)
    keys = [k for k in table[0] if k.endswith("_us")]
    print("\n rows " + " ".join(f"{k:>14}" for k in keys), file=sys.stderr)
    for r in table:
        print(f"{r['rows']:>5} " + " ".join(f"{r[k]!s:>14}" for k in keys), file=sys.stderr)
    for r in table:
        if "calls_per_step" in r:
            calls = ", ".join(f"{k} {v}" for k, v in sorted(r["calls_per_step"].items()))
            print(f"{r['rows']:>5} rows, CUDA runtime calls per step: {calls}", file=sys.stderr)


def time_start(args, rows, device):
    """--time-start: start() and the first step after it, from zero and from given states."""
    table = []
    for R in rows:
        decoder, g, x = seeded_decoder(args, R, device)
        given = tuple(torch.randn(R, args.hidden, generator=g, device=device) for _ in range(2))
        for states in ("zeros", "given"):
            starts, firsts = [], []
            with torch.no_grad():
                for rep in range(args.warmup + args.reps):
                    ext.sync(device)
                    t0 = time.perf_counter()
                    decoder.start(R, given if states == "given" else None)
                    ext.sync(device)
                    t1 = time.perf_counter()
                    decoder.step(x)
                    ext.sync(device)
                    if rep >= args.warmup:
                        starts.append((t1 - t0) * 1e6)
                        firsts.append((time.perf_counter() - t1) * 1e6)
            row = {"bench": "beam_start", "device": args.device, "rows": R, "states": states,
                   "hidden": args.hidden, "embed": args.embed,
                   "threads": args.threads or torch.get_num_threads(), "loops": len(starts),
                   **spread("start_us", starts), **spread("first_step_us", firsts)}
            table.append(row)
            print(json_line(row), flush=True)
    print(f"\n rows states {'start_us':>9} {'p10':>9} {'p90':>9} {'first_us':>9} {'p10':>9} "
          f"{'p90':>9}", file=sys.stderr)
    for r in table:
        print(f"{r['rows']:>5} {r['states']:<6} {r['start_us']:>9} {r['p10_start_us']:>9} "
              f"{r['p90_start_us']:>9} {r['first_step_us']:>9} {r['p10_first_step_us']:>9} "
              f"{r['p90_first_step_us']:>9}", file=sys.stderr)


def runtime_calls(decoder, R, x, g, device, loops=2):
    """--calls: the CUDA runtime calls (launches, copies, event and stream calls) per step, its
    reorder included, counted by torch.profiler over loops of 30 steps as time_step runs them
    (the parents drawn before, so that only the decoder's calls count)."""
    from torch.profiler import ProfilerActivity, profile
    parents = [torch.randint(0, R, (R,), generator=g, device=device) for _ in range(30)]
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for s in range(30 * loops):
            if s % 30 == 0:
                decoder.start(R)
            else:
                decoder.reorder(parents[s % 30])
            decoder.step(x)
        ext.sync(device)
    steps = 30 * loops
    return {e.key: round(e.count / steps, 2) for e in p.key_averages()
            if e.key.startswith("cuda") and e.key not in ("cudaDeviceSynchronize",
                                                           "cudaGetDeviceCount")}


def spread(name, values):
    """The median of `values` as `name`, and its p10 and p90 (None for no values)."""
    v = sorted(values)
    got = [statistics.median(v), quantile(v, 0.1), quantile(v, 0.9)] if v else [None] * 3
    return {k: None if x is None else round(x, 1)
            for k, x in zip((name, "p10_" + name, "p90_" + name), got)}


def check_same(name, results, args):
    best, tokens, steps = results["edbatch"]
    for impl, (b, t, s) in results.items():
        differ = ((b - best).abs() > args.score_rtol * best.abs().clamp(min=1)) | \
            (t != tokens).any(1) | (s != steps)
        share = differ.float().mean().item()
        if share > args.max_differ:
            sys.exit(f"bench_beam: {name}: {impl}'s best hypothesis differs from edbatch's on "
                     f"{share:.0%} of the sentences (more than --max-differ {args.max_differ})")


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=HelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    ap.add_argument("--batch", default="32,128", help="sentences per search, comma-separated")
    ap.add_argument("--hidden", type=count(), default=256, help="the cell's hidden size H")
    ap.add_argument("--embed", type=count(), default=256, help="the token embedding's size E")
    ap.add_argument("--vocab", type=count(2), default=1000, help="output words V")
    ap.add_argument("--beam", type=count(), default=4, help="hypotheses kept per sentence K")
    ap.add_argument("--max-len", type=count(), default=30, help="the longest hypothesis")
    ap.add_argument("--eos-gain", type=float, default=2.0,
                    help="scale of EOS's output row: larger ends hypotheses sooner")
    ap.add_argument("--reps", type=count(), default=9, help="timed searches per implementation")
    ap.add_argument("--warmup", type=count(0), default=2, help="untimed searches first")
    ap.add_argument("--threads", type=count(0), default=1,
                    help="edbatch's threads and torch's on the CPU (0: torch's default)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction,
                    default=hasattr(torch, "compile"),
                    help="also time the user's module under torch.compile (pytorch-compile; "
                         "default: where torch has it)")
    ap.add_argument("--time-step", default="", metavar="ROWS",
                    help="time the decoder's step and reorder alone at these row counts "
                         "(comma-separated) instead of the search")
    ap.add_argument("--time-start", default="", metavar="ROWS",
                    help="time start() (zero and given states) and the first step alone at "
                         "these row counts (comma-separated) instead of the search; --reps "
                         "loops each, after --warmup")
    ap.add_argument("--steps", type=count(), default=600,
                    help="--time-step: steps timed per row count")
    ap.add_argument("--calls", action="store_true",
                    help="--time-step on CUDA: also count the CUDA runtime calls per step (with "
                         "its reorder) under torch.profiler")
    ap.add_argument("--seed", type=int, default=1, help="seed of the weights and start states")
    ap.add_argument("--score-rtol", type=float, default=1e-3,
                    help="how far apart two implementations' best scores may be")
    ap.add_argument("--max-differ", type=float, default=0.05,
                    help="the share of sentences whose best hypothesis may differ (float "
                         "rounding can swap near ties)")
    return ap


def counts(ap, flag, value):
    """A flag's comma-separated positive integers, or a usage error naming it."""
    try:
        got = [int(v) for v in value.split(",")]
    except ValueError:
        got = []
    if not got or min(got) < 1:
        ap.error(f"{flag} {value!r}: positive integers, comma-separated")
    return got


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    if args.vocab < 2 * args.beam:
        ap.error(f"--vocab {args.vocab} is below 2 * --beam: the search takes the best 2K")
    batches = counts(ap, "--batch", args.batch)
    step_rows = counts(ap, "--time-step", args.time_step) if args.time_step else []
    start_rows = counts(ap, "--time-start", args.time_start) if args.time_start else []
    if step_rows and start_rows:
        ap.error("--time-step and --time-start: give one of them")
    device = torch.device(args.device)
    if args.calls and (not step_rows or device.type != "cuda"):
        ap.error("--calls counts CUDA runtime calls of --time-step: give --time-step ROWS and "
                 "--device cuda")
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    if step_rows:
        time_step(args, step_rows, device)
        return
    if start_rows:
        time_start(args, start_rows, device)
        return
    torch.manual_seed(args.seed)
    model = Model(args.vocab, args.embed, args.hidden, args.eos_gain).to(device).eval()
    rows = []
    for B in batches:
        g = torch.Generator().manual_seed(args.seed + B)
        state = tuple(torch.randn(B, args.hidden, generator=g).to(device) for _ in range(2))
        impls = implementations(model, args, B, state, device)
        name = f"B={B}"
        with torch.no_grad():
            results = {k: run_search(model, f, B, args.beam, args.max_len, state, device)
                       for k, f in impls.items()}
            check_same(name, results, args)
            steps = results["edbatch"][2].float()
            times = {k: [] for k in impls}
            for rep in range(args.warmup + args.reps):
                for impl, f in impls.items():
                    ext.sync(device)
                    t0 = time.perf_counter()
                    run_search(model, f, B, args.beam, args.max_len, state, device)
                    ext.sync(device)
                    if rep >= args.warmup:
                        times[impl].append(time.perf_counter() - t0)
        base = B / statistics.median(times["edbatch"])
        for impl, ts in times.items():
            rates = sorted(B / t for t in ts)
            med = statistics.median(rates)
            row = {"bench": "beam", "impl": impl, "device": args.device, "batch": B,
                   "hidden": args.hidden, "embed": args.embed, "vocab": args.vocab,
                   "beam": args.beam, "max_len": args.max_len,
                   "mean_steps": round(steps.mean().item(), 2),
                   "max_steps": int(steps.max().item()),
                   "threads": args.threads or torch.get_num_threads(), "reps": len(ts),
                   "sent_per_s": round(med, 1), "p10_sent_per_s": round(quantile(rates, 0.1), 1),
                   "p90_sent_per_s": round(quantile(rates, 0.9), 1),
                   "edbatch_speedup": round(base / med, 2)}
            rows.append(row)
            print(json_line(row), flush=True)
    print(f"\n{'batch':>5} {'impl':<17} {'sent/s':>9} {'p10':>9} {'p90':>9} {'edbatch x':>9} "
          f"{'steps':>6}", file=sys.stderr)
    for r in rows:
        print(f"{r['batch']:>5} {r['impl']:<17} {r['sent_per_s']:>9.1f} "
              f"{r['p10_sent_per_s']:>9.1f} {r['p90_sent_per_s']:>9.1f} "
              f"{r['edbatch_speedup']:>9.2f} {r['mean_steps']:>6.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
