"""What the user-cell examples share: importing edbatch from a checkout, data, the training loop."""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_edbatch():
    """The installed package, else the checkout's python/ with the CMake build's library."""
    try:
        import edbatch
        return edbatch
    except ImportError:
        pass
    sys.path.insert(0, os.path.join(ROOT, "python"))
    for build in ("build", "build-torch"):
        lib = os.path.join(ROOT, build, "libedbatch_torch.so")
        if "EDBATCH_LIBRARY" not in os.environ and os.path.exists(lib):
            os.environ["EDBATCH_LIBRARY"] = lib
    import edbatch
    return edbatch


def arguments(description, data_help, hidden=32, epochs=5, examples=200):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", help=data_help)
    parser.add_argument("--examples", type=int, default=examples,
                        help="synthetic examples when --data is not given")
    parser.add_argument("--hidden", type=int, default=hidden)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


def sst_lines(args, edbatch):
    if args.data:
        with open(args.data) as f:
            return [line for line in f if line.strip()]
    return edbatch.packing.synthetic_sst(args.examples, vocab_size=200, seed=args.seed,
                                         max_words=12)


def node_loss(logits, labels):
    """Mean cross-entropy over labelled nodes, and (correct, counted) of the predictions."""
    keep = labels >= 0
    loss = torch.nn.functional.cross_entropy(logits[keep], labels[keep])
    return loss, int((logits[keep].argmax(1) == labels[keep]).sum()), int(keep.sum())


def train(model, batches, epochs, lr):
    """Adam over the mini-batches; prints loss and node accuracy per epoch; returns the losses."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history = []
    for epoch in range(epochs):
        total = correct = counted = 0
        for packed in batches:
            opt.zero_grad()
            loss, right, n = model.loss(packed)
            loss.backward()
            opt.step()
            total += loss.item() * n
            correct += right
            counted += n
        history.append(total / max(counted, 1))
        print(f"epoch {epoch + 1}: loss {history[-1]:.4f}, "
              f"accuracy {correct / max(counted, 1):.3f}")
    return history
