"""The user-cell examples: each model equals its node-by-node PyTorch version in loss and in
the gradients of every parameter, and a few optimizer steps lower its loss; seq2seq_beam's beam
search on a StepDecoder equals the same search over its cell run eagerly."""
import importlib
import os
import sys

import pytest
import torch

import edbatch

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
sys.path.insert(0, EXAMPLES)


def example(name):
    return importlib.import_module(name)


def sst_batch(edge_inputs=None):
    vocab = {}
    lines = edbatch.packing.synthetic_sst(6, vocab_size=30, seed=3, max_words=7)
    parsed = [edbatch.parse_sst(line, vocab) for line in lines]
    packed = edbatch.pack_trees([t for t, _ in parsed], [l for _, l in parsed],
                                edge_inputs=edge_inputs)
    return packed, len(vocab)


def lattice_batch():
    records = edbatch.packing.synthetic_lattices(4, vocab_size=30, seed=3, min_len=2,
                                                 max_len=7, tags=5)
    return edbatch.pack_lattices(records), 30


def dag_batch(dag_gru):
    return edbatch.pack_edges(dag_gru.synthetic_dags(5, 30, 4, seed=3)), 30


def models():
    child_sum, nary, lattice, dag = (example(n) for n in ("child_sum_tree_lstm", "nary_tree_lstm",
                                                          "lattice_user_cell", "dag_gru"))
    return {
        "child_sum": (child_sum, lambda: sst_batch("parent"),
                      lambda v: child_sum.Sentiment(v, 9)),
        "nary": (nary, sst_batch, lambda v: nary.Sentiment(v, 9)),
        "lattice": (lattice, lattice_batch, lambda v: lattice.Tagger(v, 9, 5)),
        "dag": (dag, lambda: dag_batch(dag), lambda v: dag.Tagger(v, 9, 4)),
    }


@pytest.mark.parametrize("name", ["child_sum", "nary", "lattice", "dag"])
def test_example_equals_node_by_node(backend, name):
    module, batch, make = models()[name]
    torch.manual_seed(4)
    packed, vocab = batch()
    model = make(vocab)
    labels = packed.labels

    def loss_and_grads(logits):
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits[labels >= 0], labels[labels >= 0])
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                             if p.grad is not None}

    ours, ours_grads = loss_and_grads(model(packed))
    want, want_grads = loss_and_grads(module.node_by_node(model, packed))
    assert ours == pytest.approx(want, rel=1e-5)
    assert ours_grads.keys() == want_grads.keys()
    for n, g in want_grads.items():
        torch.testing.assert_close(ours_grads[n], g, rtol=1e-5,
                                   atol=1e-6 * max(1.0, g.abs().max().item()), msg=n)


@pytest.mark.parametrize("name", ["child_sum", "nary", "lattice", "dag"])
def test_example_training_lowers_the_loss(backend, name):
    _, batch, make = models()[name]
    torch.manual_seed(5)
    packed, vocab = batch()
    model = make(vocab)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = model.loss(packed)[0]
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]


def test_train_tree_lstm_script(monkeypatch, capsys):
    """examples/train_tree_lstm.py (the built-in Tree-LSTM op with prefetching) runs as a script:
    its loss per epoch, and the same first mini-batch's loss from its node-by-node model."""
    script = example("train_tree_lstm")
    monkeypatch.setattr(sys, "argv", ["train_tree_lstm.py", "--synthetic", "40", "--batch", "16",
                                      "--epochs", "2", "--hidden", "8", "--compare-steps", "1"])
    script.main()
    out = capsys.readouterr().out
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2
    line = next(line for line in out.splitlines() if line.startswith("first mini-batch loss"))
    ours, theirs = (float(part.split()[-1]) for part in line.split(":")[1].split(","))
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_dag_gru_script_reads_edge_lists_with_null_labels(monkeypatch, capsys, tmp_path):
    """examples/dag_gru.py --data: JSON lines whose inputs and labels hold null (no input, no
    label, as pack_edges reads them) train."""
    data = tmp_path / "dags.jsonl"
    data.write_text('{"num_nodes": 3, "edges": [[0, 1], [1, 2]], "inputs": [1, null, 2], '
                    '"labels": [0, null, 1]}\n{"num_nodes": 2, "edges": [[1, 0]], '
                    '"labels": [2, 1]}\n')
    script = example("dag_gru")
    monkeypatch.setattr(sys, "argv", ["dag_gru.py", "--data", str(data), "--hidden", "8",
                                      "--epochs", "2"])
    script.main()
    epochs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2


class EagerSteps:
    """seq2seq_beam's decoding loop cell in plain PyTorch: the user's cell on the rows, the states
    gathered by parent (what the example's Engine does on a StepDecoder)."""

    def __init__(self, model):
        self.cell = model.chain.node_cells[0]

    def start(self, state):
        self.state = state

    def reorder(self, rows):
        self.state = tuple(s[torch.tensor(rows, dtype=torch.long)] for s in self.state)

    def step(self, x):
        self.state = self.cell(x, self.state)
        return self.state


def greedy_alone(seq2seq, model, source):
    """One source decoded greedily by itself, node by node: its tokens and log-probability."""
    cell = model.chain.node_cells[0]
    state = (torch.zeros(1, cell.lstm.hidden_size),) * 2  # the chain's first node: no message
    for tok in source + [seq2seq.SEP]:  # the chain up to SEP, as Propagate runs it
        state = cell(model.embed(torch.tensor([tok])), state)
    tokens, score = [], 0.0
    for t in range(len(source) + 2):
        logp = torch.log_softmax(model.out(state[0]), -1)[0]
        tok = int(logp.argmax())
        score += float(logp[tok])
        if tok == seq2seq.EOS:
            break
        tokens.append(tok)
        state = cell(model.embed(torch.tensor([tok])), state)
    return tokens, score


@torch.no_grad()
def test_seq2seq_beam_search_on_the_decoder_equals_plain_pytorch():
    """examples/seq2seq_beam.py: its beam search over a StepDecoder gives every sentence the
    hypothesis and score of the same search over the user's cell run eagerly (states gathered by
    parent), and beam 1 the tokens of each sentence decoded greedily by itself."""
    seq2seq = example("seq2seq_beam")
    torch.manual_seed(6)
    model = seq2seq.Reverser(13, embed=7).eval()
    model.out.weight.mul_(8.0)  # peaked next-token distributions: parents trade places
    sources = seq2seq.synthetic(9, seed=4, lengths=(1, 9))
    orders = []

    class Recorded(seq2seq.Engine):
        def reorder(self, rows):
            orders.append(list(rows))
            super().reorder(rows)

    for beam in (1, 3):
        ours = seq2seq.beam_search(model, Recorded(model), sources, beam)
        want = seq2seq.beam_search(model, EagerSteps(model), sources, beam)
        assert [t for t, _ in ours] == [t for t, _ in want]
        assert [s for _, s in ours] == pytest.approx([s for _, s in want], rel=1e-4, abs=1e-5)
        if beam == 1:
            alone = [greedy_alone(seq2seq, model, s) for s in sources]
            assert [t for t, _ in ours] == [t for t, _ in alone]
            assert [s for _, s in ours] == pytest.approx([s for _, s in alone], rel=1e-4,
                                                         abs=1e-5)
    # The search reordered: rows out of order, parents with several children, rows dropped.
    assert any(rows != sorted(rows) for rows in orders)
    assert any(len(set(rows)) < len(rows) for rows in orders)
    assert any(len(rows) < len(before) for before, rows in zip(orders, orders[1:]))
    # Hypotheses of several lengths, some ended by EOS before the cap.
    assert len({len(t) for t, _ in ours}) >= 3
    assert any(len(t) < len(s) + 2 for (t, _), s in zip(ours, sources))


def test_seq2seq_beam_script_trains_and_decodes(monkeypatch, capsys):
    script = example("seq2seq_beam")
    monkeypatch.setattr(sys, "argv", ["seq2seq_beam.py", "--examples", "60", "--epochs", "2",
                                      "--hidden", "8", "--beam", "2"])
    script.main()
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("epoch ")]) == 2
    assert [line.split(":")[0] for line in out if line.startswith("beam ")] == ["beam 1",
                                                                               "beam 2"]
