#!/usr/bin/env python3
"""cuDNN's LSTM on the recurrent part of the bilstm_tagger: two directions of two stacked LSTMs
over a mini-batch of sentences of 10..50 words (the synthetic tagged data), hidden = input size.
Forward and forward+backward, median and p10/p90 of --iters timed runs after warm-up; one JSON
line per configuration. It measures what a cuDNN path could save against edbatch's device time
for the whole tagger (bench_cuda), not a model of its own.

  cudnn_lstm.py [--batch 32,128] [--hidden 128,512] [--iters 30]
"""

import argparse
import json
import time

import torch


def timed(fn, iters, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    return {"median": ms[len(ms) // 2], "p10": ms[int(0.1 * (len(ms) - 1))],
            "p90": ms[int(0.9 * (len(ms) - 1))]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", default="32,128")
    p.add_argument("--hidden", default="128,512")
    p.add_argument("--iters", type=int, default=30)
    a = p.parse_args()
    torch.backends.cudnn.enabled = True
    dev = torch.device("cuda")
    for batch in map(int, a.batch.split(",")):
        for hidden in map(int, a.hidden.split(",")):
            g = torch.Generator().manual_seed(1)
            lens = torch.randint(10, 51, (batch,), generator=g)
            steps = int(lens.max())
            lstms = [torch.nn.LSTM(hidden, hidden, num_layers=2).to(dev) for _ in range(2)]
            x = torch.randn(steps, batch, hidden, device=dev)

            def forward():
                packed = torch.nn.utils.rnn.pack_padded_sequence(x, lens, enforce_sorted=False)
                return [lstm(packed)[0].data.sum() for lstm in lstms]

            def train():
                sum(forward()).backward()

            with torch.no_grad():
                fwd = timed(forward, a.iters)
            both = timed(train, a.iters)
            print(json.dumps({"bench": "cudnn_lstm", "batch": batch, "hidden": hidden,
                              "words": int(lens.sum()), "cudnn": torch.backends.cudnn.version(),
                              "forward_ms": fwd, "train_ms": both}), flush=True)


if __name__ == "__main__":
    main()
