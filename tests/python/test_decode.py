"""edbatch.nn.StepDecoder: greedy decoding step by step on one engine against the same loop run
eagerly in PyTorch one sentence at a time; sentences stop at their own end token; the graph grows
by one cell call per running sentence and step."""
import copy
import gc
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import edbatch

EOS, BOS = 0, 1


class UserLSTM(nn.Module):
    """A user LSTM cell: (x, (h, c)) -> (h, c)."""

    def __init__(self, size, input_size):
        super().__init__()
        self.W = nn.Linear(input_size, 4 * size)
        self.U = nn.Linear(size, 4 * size, bias=False)

    def forward(self, x, state):
        h, c = state
        i, f, g, o = (self.W(x) + self.U(h)).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


def planning_every_step(module, E, loop, wrap=lambda d: d):
    """loop(decoder) on a new decoder of `module` with plan reuse off: every step scheduled and
    planned afresh (none repeated)."""
    before = edbatch.set_plan_cache(0)
    try:
        planned = edbatch.nn.StepDecoder(module, input_size=E)
        result = loop(wrap(planned))
        assert planned.stats()["repeated"] == 0
    finally:
        edbatch.set_plan_cache(before)
    return result


def lattice_lstm_step(w, x, state):
    """The lattice LSTM's char arc cell in PyTorch (the zoo's lattice_lstm_arc)."""
    h, c = state
    gate = {g: x @ w["char_U_" + g].T + h @ w["char_W_" + g].T + w["char_b_" + g] for g in "fcio"}
    c = torch.sigmoid(gate["i"]) * torch.tanh(gate["c"]) + torch.sigmoid(gate["f"]) * c
    return torch.sigmoid(gate["o"]) * torch.tanh(c), c


class Model:
    """Embedding, a cell, an output layer: the parts of a greedy decoder."""

    def __init__(self, seed, vocab, E, H):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(vocab, E, generator=g)
        self.out_w = torch.randn(vocab, H, generator=g) * 2.0
        self.out_b = torch.randn(vocab, generator=g)
        self.out_b[EOS] += 1.0  # the end token comes up after a few steps for some sentences
        self.h0 = torch.randn(7, H, generator=g)
        self.c0 = torch.randn(7, H, generator=g)

    def next_tokens(self, h):
        return (h @ self.out_w.T + self.out_b).argmax(-1)


def eager_greedy(model, step, max_len):
    """Each sentence alone, one step after the other, in PyTorch: tokens and states per step."""
    tokens, states = [], []
    for i in range(model.h0.shape[0]):
        state = (model.h0[i:i + 1], model.c0[i:i + 1])
        tok, toks, sts = torch.tensor([BOS]), [], []
        for _ in range(max_len):
            state = step(model.emb[tok], state)
            tok = model.next_tokens(state[0])
            toks.append(int(tok))
            sts.append(torch.cat(state, 1)[0])
            if int(tok) == EOS:
                break
        tokens.append(toks)
        states.append(sts)
    return tokens, states


def batched_greedy(model, decoder, max_len):
    """The mini-batch on one engine: every running sentence steps together."""
    B = model.h0.shape[0]
    decoder.start(B, (model.h0, model.c0))
    tokens, states = [[] for _ in range(B)], [[] for _ in range(B)]
    tok = torch.full((B,), BOS)
    per_step = []
    while not decoder.done:
        ids = decoder.running
        before = decoder.stats()["graph_nodes"]
        h, c = decoder.step(model.emb[tok[ids]])
        per_step.append((ids.numel(), decoder.stats()["graph_nodes"] - before))
        nxt = model.next_tokens(h)
        for r, i in enumerate(ids.tolist()):
            tokens[i].append(int(nxt[r]))
            states[i].append(torch.cat([h[r], c[r]]))
        tok[ids] = nxt
        decoder.stop((nxt == EOS) | torch.tensor([len(tokens[i]) >= max_len for i in ids.tolist()]))
    return tokens, states, per_step


def check_same(model, eager, batched, max_len):
    e_tokens, e_states = eager
    b_tokens, b_states, per_step = batched
    assert b_tokens == e_tokens
    for e, b in zip(e_states, b_states):
        for se, sb in zip(e, b):
            torch.testing.assert_close(sb, se, atol=2e-5, rtol=1e-4)
    # Sentences of different lengths, some stopping at their end token before the cap.
    lengths = [len(t) for t in e_tokens]
    assert len(set(lengths)) >= 3
    assert sum(t[-1] == EOS for t in e_tokens) >= 2
    assert sum(len(t) < max_len for t in e_tokens) >= 2
    # The graph grows by the same nodes per running sentence at every step (one cell call each),
    # however long it has become, and the running set shrinks as sentences end.
    counts, added = zip(*per_step)
    assert added[0] % counts[0] == 0 and added[0] > 0
    assert all(a == added[0] // counts[0] * k for a, k in zip(added, counts))
    assert list(counts) == sorted(counts, reverse=True) and counts[-1] < counts[0]


def pick_model(step_of, vocab, E, H, max_len):
    """The first seed whose eager decoding has sentences of at least 3 lengths, at least two
    ending at the end token before the cap (the eager reference alone decides)."""
    for seed in range(200):
        model = Model(seed, vocab, E, H)
        eager = eager_greedy(model, step_of(model, seed), max_len)
        lengths = [len(t) for t in eager[0]]
        if len(set(lengths)) >= 3 and sum(t[-1] == EOS and len(t) < max_len for t in eager[0]) >= 2:
            return model, eager, seed
    pytest.fail("no seed gives sentences of several lengths")


def pick_user_lstm(vocab, E, H, max_len):
    """pick_model with a UserLSTM cell seeded like the model: (model, eager, cell)."""
    cells = {}

    def step_of(model, seed):
        torch.manual_seed(seed)
        cells[seed] = UserLSTM(H, E)
        return cells[seed]

    model, eager, seed = pick_model(step_of, vocab, E, H, max_len)
    return model, eager, cells[seed]


@torch.no_grad()
def test_greedy_user_lstm():
    vocab, E, H, max_len = 13, 5, 9, 10
    model, eager, cell = pick_user_lstm(vocab, E, H, max_len)
    module = edbatch.nn.Propagate(cell, state_size=(H, H))
    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    check_same(model, eager, batched_greedy(model, decoder, max_len), max_len)
    # A second loop on the same decoder starts afresh.
    check_same(model, eager, batched_greedy(model, decoder, max_len), max_len)
    steps = decoder.instance_steps()
    assert steps == [len(t) for t in eager[0]]
    # Steps of four or more rows build rows from the fourth on as copies of the second's nodes.
    assert decoder.stats()["copied"] > 0


class Decay(nn.Module):
    """An edge cell: (state, the arc's row) -> message. In a decoding step the arc has no row,
    so x is zeros, an input node each row adds."""

    def __init__(self, size):
        super().__init__()
        self.lin = nn.Linear(size, size)

    def forward(self, state, x):
        h, c = state
        return torch.tanh(self.lin(h)) + x.sum(-1, keepdim=True) + 0.25, c * 0.9


@torch.no_grad()
def test_greedy_through_an_edge_cell():
    vocab, E, H, max_len = 13, 5, 9, 10
    cells = {}

    def step_of(model, seed):
        torch.manual_seed(seed)
        cells[seed] = (UserLSTM(H, E), Decay(H))
        node, edge = cells[seed]
        return lambda x, state: node(x, edge(state, torch.zeros(1, E)))

    model, eager, seed = pick_model(step_of, vocab, E, H, max_len)
    node, edge = cells[seed]
    module = edbatch.nn.Propagate(node, edge, state_size=(H, H))
    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    check_same(model, eager, batched_greedy(model, decoder, max_len), max_len)
    assert decoder.stats()["copied"] > 0


class Twin(nn.Module):
    """A cell whose two state components are one tensor: (x, (h, c)) -> (h', h')."""

    def __init__(self, size, input_size):
        super().__init__()
        self.W = nn.Linear(input_size, size)
        self.U = nn.Linear(size, size, bias=False)

    def forward(self, x, state):
        h, c = state
        h = torch.tanh(self.W(x) + self.U(h + 0.5 * c))
        return h, h


@torch.no_grad()
def test_rows_built_through_the_cell_where_a_copy_would_be_ambiguous():
    """From the second step on, a row's two previous states are one node, so a copy of the
    second row could not tell which it reads: every row goes through the cell (the first step,
    from start's separate states, is copied), with the eager tokens and states."""
    vocab, E, H, max_len = 13, 5, 9, 10

    def cell_of(model, seed):
        torch.manual_seed(seed)
        return Twin(H, E)

    model, eager, seed = pick_model(cell_of, vocab, E, H, max_len)
    decoder = edbatch.nn.StepDecoder(edbatch.nn.Propagate(cell_of(model, seed),
                                                          state_size=(H, H)), input_size=E)
    check_same(model, eager, batched_greedy(model, decoder, max_len), max_len)
    assert decoder.stats()["steps"] > 2 and decoder.stats()["copied"] == 1


@torch.no_grad()
def test_a_dropped_decoder_is_freed_at_once():
    """No reference cycle: the last reference dropped frees the decoder and its engine, without
    waiting for the garbage collector (a decoder per request would otherwise pile up)."""
    module = edbatch.nn.Propagate(UserLSTM(6, 4), state_size=(6, 6))
    enabled = gc.isenabled()
    gc.disable()
    try:
        decoder = edbatch.nn.StepDecoder(module, input_size=4)
        decoder.start(3)
        decoder.step(torch.randn(3, 4))
        ref = weakref.ref(decoder)
        del decoder
        assert ref() is None
    finally:
        if enabled:
            gc.enable()


@torch.no_grad()
def test_a_decoder_is_not_copied_and_a_fork_inside_its_call_is_named():
    """Pickling or copying a decoder says to make one where it is needed (it named a lambda or
    a C++ class); a child forked while a thread of the parent was inside the decoder's call
    gets a clear error there instead of waiting for that thread's lock for good, and a decoder
    idle at the fork goes on in the child."""
    import copy
    import os
    import pickle
    module = edbatch.nn.Propagate(UserLSTM(6, 4), state_size=(6, 6))
    busy = edbatch.nn.StepDecoder(module, input_size=4)
    idle = edbatch.nn.StepDecoder(module, input_size=4)
    for make in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(TypeError, match="a StepDecoder cannot be pickled or copied"):
            make(busy)
    busy.start(2)
    idle.start(2)
    want = idle.step(torch.ones(2, 4))[0]
    idle.start(2)
    with busy._lock:  # as a thread inside busy.step() at the fork holds it
        pid = os.fork()
        if pid == 0:  # the child: report by exit code, never back into pytest
            code = 1
            try:
                try:
                    busy.step(torch.ones(2, 4))
                except RuntimeError as e:
                    code = 2 if "forked while another thread" in str(e) else 3
                if code == 2 and torch.equal(idle.step(torch.ones(2, 4))[0], want):
                    code = 0
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert busy.step(torch.ones(2, 4))[0].shape == (2, 6)  # the parent's decoder is unharmed


@torch.no_grad()
def test_steps_over_the_same_sentences_repeat_the_plan_before():
    """A step over the same running sentences as the step before is planned as a repeat of it
    (from the third step on: the first holds the initial states too); with plan reuse off every
    step is planned, and the states are bitwise the same."""
    B, E, H = 7, 5, 9
    torch.manual_seed(3)
    module = edbatch.nn.Propagate(UserLSTM(H, E), state_size=(H, H))
    g = torch.Generator().manual_seed(4)
    h0, c0 = torch.randn(B, H, generator=g), torch.randn(B, H, generator=g)
    xs = [torch.randn(B, E, generator=g) for _ in range(9)]
    stops = {5: [1, 4, 6], 7: [0]}  # after steps 5 and 7 (0-based), these sentences end

    def loop(decoder):
        decoder.start(B, (h0, c0))
        out, counts = [], []
        for t, x in enumerate(xs):
            ids = decoder.running
            counts.append(ids.numel())
            out.append(decoder.step(x[ids]))
            decoder.stop(torch.tensor([i in stops.get(t, ()) for i in ids.tolist()]))
        return out, counts

    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    kernels = []
    for _ in range(2):  # counted from start()
        states, counts = loop(decoder)
        assert counts == [7] * 6 + [4] * 2 + [3]
        assert decoder.stats()["repeated"] == sum(counts[t] == counts[t - 1]
                                                  for t in range(2, len(counts))) == 5
        kernels.append(decoder.stats()["kernels"])
    assert kernels[0] == kernels[1] > 0
    want, _ = planning_every_step(module, E, loop)
    for got, ref in zip(states, want):
        for a, b in zip(got, ref):
            assert torch.equal(a, b)


@torch.no_grad()
def test_greedy_builtin_lattice_lstm():
    vocab, E, H, max_len = 11, 6, 8, 9
    cells = {}

    def step_of(model, seed):
        torch.manual_seed(seed)
        cells[seed] = edbatch.nn.LatticeLSTM(vocab, E, H)
        w = {n: getattr(cells[seed].cell, n) for n in cells[seed].cell.weight_names}
        return lambda x, state: lattice_lstm_step(w, x, state)

    model, eager, seed = pick_model(step_of, vocab, E, H, max_len)
    decoder = edbatch.nn.StepDecoder(cells[seed])
    check_same(model, eager, batched_greedy(model, decoder, max_len), max_len)


@torch.no_grad()
def test_zero_start_and_errors():
    H, E = 4, 3
    module = edbatch.nn.Propagate(UserLSTM(H, E), state_size=(H, H))
    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    with pytest.raises(RuntimeError, match="call start"):
        decoder.step(torch.randn(3, E))
    decoder.start(3)
    x = torch.randn(3, E)
    h, c = decoder.step(x)
    eh, ec = module.node_cells[0](x, (torch.zeros(3, H), torch.zeros(3, H)))
    torch.testing.assert_close(h, eh, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(c, ec, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="shape"):
        decoder.step(torch.randn(2, E))
    with pytest.raises(ValueError, match="initial state"):
        decoder.start(3, (torch.zeros(2, H), torch.zeros(2, H)))
    with pytest.raises(ValueError, match="3 initial state tensors given, the cell has 2 outputs"):
        decoder.start(3, (torch.zeros(3, H),) * 3)
    with pytest.raises(ValueError, match="no step"):
        edbatch.nn.StepDecoder(edbatch.nn.TreeLSTM(5, E, H))
    decoder.start(2)
    with pytest.raises(TypeError, match="mask must be bool"):
        decoder.stop(torch.tensor([0.5, 1.0]))  # not stopped: a float is no answer
    assert decoder.running.tolist() == [0, 1]
    decoder.stop([False, True])
    assert decoder.running.tolist() == [0]
    decoder.stop(torch.tensor([True]))
    assert decoder.done
    decoder.stop(torch.tensor([]))  # nothing running, nothing to stop


class MinusLSTM(UserLSTM):
    """UserLSTM with other code over the same weights."""

    def forward(self, x, state):
        h, c = state
        i, f, g, o = (self.W(x) - self.U(h)).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


def test_a_cell_changed_after_the_decoder_was_made():
    """The next start() runs the cell as it is then: a replaced cell's code (the same weights),
    and a training-mode dropout refused as when the decoder is made; stop() needs a loop and a
    mask of one entry per running row."""
    torch.manual_seed(8)
    H, E = 4, 3
    module = edbatch.nn.Propagate(UserLSTM(H, E), state_size=(H, H))
    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    with pytest.raises(RuntimeError, match="stop: no loop has begun"):
        decoder.stop([True])
    old = module.node_cells[0]
    new = MinusLSTM(H, E)
    new.load_state_dict(old.state_dict())
    module.node_cells[0] = new
    state = (torch.randn(3, H), torch.randn(3, H))
    decoder.start(3, state)
    x = torch.randn(3, E)
    h, c = decoder.step(x)
    with torch.no_grad():
        eh, ec = new(x, state)
        oh, _ = old(x, state)
    torch.testing.assert_close(h, eh, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(c, ec, atol=1e-5, rtol=1e-4)
    assert (h - oh).abs().max() > 1e-2  # the old code's result differs
    with pytest.raises(ValueError, match="one bool per running row"):
        decoder.stop(torch.zeros(3, 3, dtype=torch.bool))
    decoder.stop(torch.tensor([[True], [False], [False]]))  # a column is one entry per row
    assert decoder.running.tolist() == [1, 2]
    module.node_cells[0] = nn.Sequential()  # replaced below; keeps the module whole meanwhile
    module.node_cells[0] = DropLSTM(H, E)
    with pytest.raises(ValueError, match="dropout"):
        decoder.start(2)
    module.eval()
    decoder.start(2)
    decoder.step(torch.randn(2, E))


class DropLSTM(UserLSTM):
    def __init__(self, size, input_size):
        super().__init__(size, input_size)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, state):
        return super().forward(self.drop(x), state)


class HostView:
    """A decoder on a CUDA module fed CUDA inputs, its new states brought back to the host for the
    reference loop (batched_greedy works on host tensors)."""

    def __init__(self, decoder):
        self.decoder = decoder

    def __getattr__(self, name):
        return getattr(self.decoder, name)

    def start(self, batch_size, state=None):
        self.decoder.start(batch_size, tuple(s.cuda() for s in state))

    def step(self, x):
        out = self.decoder.step(x.cuda())
        assert all(o.is_cuda for o in out)
        return tuple(o.cpu() for o in out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_greedy_on_cuda():
    """The engine runs on the module's CUDA device: the same tokens and states as the eager loop,
    in fewer launches than on the CPU (its passes are chained)."""
    vocab, E, H, max_len = 13, 5, 9, 10
    model, eager, cell = pick_user_lstm(vocab, E, H, max_len)
    on_cpu = edbatch.nn.StepDecoder(edbatch.nn.Propagate(cell, state_size=(H, H)), input_size=E)
    check_same(model, eager, batched_greedy(model, on_cpu, max_len), max_len)
    module = edbatch.nn.Propagate(cell, state_size=(H, H)).cuda()
    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    assert decoder.device.type == "cuda"
    check_same(model, eager, batched_greedy(model, HostView(decoder), max_len), max_len)
    assert decoder.stats()["nodes"] == on_cpu.stats()["nodes"]
    assert decoder.stats()["kernels"] < on_cpu.stats()["kernels"]

    lattice = edbatch.nn.LatticeLSTM(vocab, E, H).cuda()
    decoder = edbatch.nn.StepDecoder(lattice)
    assert decoder.device.type == "cuda"
    decoder.start(3)
    x = torch.randn(3, E, device="cuda")
    h, c = decoder.step(x)
    w = {n: getattr(lattice.cell, n) for n in lattice.cell.weight_names}
    zeros = torch.zeros(3, H, device="cuda")
    eh, ec = lattice_lstm_step(w, x, (zeros, zeros))
    torch.testing.assert_close(h, eh, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(c, ec, atol=1e-5, rtol=1e-4)


# Beam search: every sentence keeps K hypotheses; each step extends them by their K * V
# continuations, keeps the best K that do not end (and sets aside those that end at EOS), and
# continues each kept hypothesis from its parent's state (StepDecoder.reorder).

def beam_choose(live, logp, K, last):
    """One sentence's choice: live is its hypotheses [(tokens, score)], logp (len(live), V) their
    next log-probabilities. Returns the kept [(parent, token, score)] and the ended ones."""
    V = logp.shape[1]
    total = (torch.tensor([s for _, s in live])[:, None] + logp).reshape(-1)
    top = total.topk(min(2 * K, total.numel()))
    kept, ended = [], []
    for score, j in zip(top.values.tolist(), top.indices.tolist()):
        parent, tok = divmod(j, V)
        (ended if tok == EOS or last else kept).append((parent, tok, score))
        if len(kept) == K or last and len(ended) == K:
            break
    return kept, ended


def beam_step(live, finished, logp, K, last):
    """Applies beam_choose to one sentence: returns its kept (parent, token) pairs and new live
    list; empty when the sentence is done (K ended hypotheses, or the cap)."""
    kept, ended = beam_choose(live, logp, K, last)
    finished.extend((live[p][0] + [tok], s) for p, tok, s in ended)
    if last or len(finished) >= K or not kept:
        return [], []
    return [(p, tok) for p, tok, _ in kept], [(live[p][0] + [tok], s) for p, tok, s in kept]


def eager_beam(model, step, K, max_len):
    """Each sentence alone in eager PyTorch, its hypotheses' states indexed by parent."""
    results = []
    for i in range(model.h0.shape[0]):
        state = (model.h0[i:i + 1], model.c0[i:i + 1])
        live, finished, toks = [([], 0.0)], [], torch.tensor([BOS])
        for t in range(max_len):
            state = step(model.emb[toks], state)
            logp = torch.log_softmax(state[0] @ model.out_w.T + model.out_b, -1)
            kept, live = beam_step(live, finished, logp, K, t + 1 == max_len)
            if not kept:
                break
            parents = torch.tensor([p for p, _ in kept])
            state = tuple(s[parents] for s in state)
            toks = torch.tensor([tok for _, tok in kept])
        results.append(finished)
    return results


@torch.no_grad()
def test_reordered_steps_repeat_the_schedule():
    """Steps of a constant row count, each reordered from random parents (repeats allowed):
    from the third on each repeats the schedule of the one before, its operands (the parents'
    states) planned afresh, and the states are bitwise those of a decoder that schedules and
    plans every step, and those of the user's cell run eagerly."""
    R, E, H, steps = 11, 6, 5, 9
    torch.manual_seed(8)
    cell = UserLSTM(H, E)
    module = edbatch.nn.Propagate(cell, state_size=(H, H))
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(R, E, generator=g) for _ in range(steps)]
    parents = [torch.randint(0, R, (R,), generator=g) for _ in range(steps)]
    assert all(p.tolist() != sorted(p.tolist()) for p in parents)

    def loop(decoder):
        decoder.start(R)
        out = []
        for x, p in zip(xs, parents):
            out.append(decoder.step(x))
            decoder.reorder(p)
        return out

    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    got = loop(decoder)
    assert decoder.stats()["repeated"] == decoder.stats()["replanned"] == steps - 2
    want = planning_every_step(module, E, loop)
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    # And the user's cell run eagerly, each row's state taken from its parent's after a step.
    state = (torch.zeros(R, H), torch.zeros(R, H))
    for x, p, out in zip(xs, parents, got):
        state = cell(x, state)
        for x_, y in zip(out, state):
            torch.testing.assert_close(x_, y, rtol=1e-5, atol=1e-6)
        state = tuple(v[p] for v in state)


def batched_beam(model, decoder, K, max_len):
    """Every sentence's hypotheses as rows of one decoder, kept ones reordered after each step.
    Also returns each reorder's index."""
    B = model.h0.shape[0]
    decoder.start(B, (model.h0, model.c0))
    live = [[([], 0.0)] for _ in range(B)]
    finished = [[] for _ in range(B)]
    active, toks, indices = list(range(B)), torch.full((B,), BOS), []
    for t in range(max_len):
        h, _ = decoder.step(model.emb[toks])
        logp = torch.log_softmax(h @ model.out_w.T + model.out_b, -1)
        index, next_toks, still, row = [], [], [], 0
        for i in active:
            k = len(live[i])
            kept, live[i] = beam_step(live[i], finished[i], logp[row:row + k], K, t + 1 == max_len)
            index += [row + p for p, _ in kept]
            next_toks += [tok for _, tok in kept]
            still += [i] if kept else []
            row += k
        indices.append((row, index))
        assert decoder.reorder(index).tolist() == list(range(len(index)))
        active, toks = still, torch.tensor(next_toks, dtype=torch.long)
        if decoder.done:
            break
    return finished, indices


def check_beams(eager, batched):
    (got, indices) = batched
    assert len(got) == len(eager)
    for e, b in zip(eager, got):
        assert [tokens for tokens, _ in b] == [tokens for tokens, _ in e]
        for (_, sb), (_, se) in zip(b, e):
            assert abs(sb - se) <= 1e-4 * max(1.0, abs(se))
    # The search did what beam search does: parents with several children, parents dropped,
    # children out of their parents' order, hypotheses of several lengths, and the last step
    # keeping nothing.
    assert any(len(set(ix)) < len(ix) for _, ix in indices)
    assert any(set(range(rows)) - set(ix) for rows, ix in indices)
    assert any(ix != sorted(ix) for _, ix in indices)
    assert len({len(tokens) for f in eager for tokens, _ in f}) >= 3
    assert indices[-1][1] == []


def user_beam_case(vocab, E, H):
    torch.manual_seed(5)
    cell = UserLSTM(H, E)
    return Model(5, vocab, E, H), cell, edbatch.nn.Propagate(cell, state_size=(H, H))


@torch.no_grad()
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_beam_search_reorders_states(device):
    """Beam search over a mini-batch on one decoder gives every sentence the hypotheses and
    scores of the same search run eagerly on that sentence alone; with plan reuse off, the same
    bits (a step after a reorder reads its parents from new places)."""
    vocab, E, H, K, max_len = 13, 5, 9, 3, 8
    model, cell, module = user_beam_case(vocab, E, H)
    eager = eager_beam(model, cell, K, max_len)
    decoder = HostView(edbatch.nn.StepDecoder(module.to(device), input_size=E)) \
        if device == "cuda" else edbatch.nn.StepDecoder(module, input_size=E)
    got = batched_beam(model, decoder, K, max_len)
    check_beams(eager, got)
    assert decoder.stats()["repeated"] > 0  # steps of as many rows as the one before, reordered
    # ... their operands planned afresh where the reorder moved rows
    assert 0 < decoder.stats()["replanned"] <= decoder.stats()["repeated"]
    assert decoder.stats()["copied"] > 0  # rows from the fourth on copied from the second's
    want = planning_every_step(module, E, lambda d: batched_beam(model, d, K, max_len),
                               HostView if device == "cuda" else lambda d: d)
    assert got == want

    lattice = edbatch.nn.LatticeLSTM(vocab, E, H)
    w = {n: getattr(lattice.cell, n) for n in lattice.cell.weight_names}
    eager = eager_beam(model, lambda x, state: lattice_lstm_step(w, x, state), K, max_len)
    lattice_decoder = edbatch.nn.StepDecoder(lattice.to(device))
    check_beams(eager, batched_beam(model, HostView(lattice_decoder) if device == "cuda"
                                    else lattice_decoder, K, max_len))


@torch.no_grad()
def test_reorder_continues_named_rows_and_refuses_others():
    H, E = 4, 3
    module = edbatch.nn.Propagate(UserLSTM(H, E), state_size=(H, H))
    decoder = edbatch.nn.StepDecoder(module, input_size=E)
    with pytest.raises(RuntimeError, match="no loop has begun"):
        decoder.reorder([0])
    g = torch.Generator().manual_seed(8)
    h0, c0 = torch.randn(4, H, generator=g), torch.randn(4, H, generator=g)
    decoder.start(4, (h0, c0))
    # Before any step: the initial states are reordered (positions of any integer dtype).
    assert decoder.reorder(torch.tensor([3, 3, 0], dtype=torch.int32)).tolist() == [0, 1, 2]
    x = torch.randn(3, E, generator=g)
    h, c = decoder.step(x)
    eh, ec = module.node_cells[0](x, (h0[[3, 3, 0]], c0[[3, 3, 0]]))
    torch.testing.assert_close(h, eh, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(c, ec, atol=1e-5, rtol=1e-4)
    # After stop(): positions are rows of the running instances.
    decoder.stop([False, True, False])
    x = torch.randn(2, E, generator=g)
    h2, c2 = decoder.step(x)
    assert decoder.instance_steps() == [2, 1, 2]
    decoder.reorder(np.array([1, 0, 1, 1]))
    assert decoder.instance_steps() == [2, 2, 2, 2]
    x = torch.randn(4, E, generator=g)
    h3, c3 = decoder.step(x)
    eh, ec = module.node_cells[0](x, (h2[[1, 0, 1, 1]], c2[[1, 0, 1, 1]]))
    torch.testing.assert_close(h3, eh, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(c3, ec, atol=1e-5, rtol=1e-4)
    assert decoder.instance_steps() == [3, 3, 3, 3]
    for bad, error, match in [
        ([4], ValueError, r"position 4 is not a running row: positions are in \[0, 4\)"),
        ([-1], ValueError, "position -1 is not a running row"),
        ([[0, 1]], ValueError, r"index has shape \(1, 2\)"),
        ([0.0, 1.0], TypeError, "integer positions of running rows, got torch.float32"),
        ([True, False, True, True], TypeError, r"bool mask \(stop\(mask\)"),
        ("01", TypeError, "got str"),
        (None, TypeError, "got NoneType"),
    ]:
        with pytest.raises(error, match=match):
            decoder.reorder(bad)
    assert decoder.running.tolist() == [0, 1, 2, 3]  # a refused reorder changes nothing
    # The engine's class checks the instance ids it is given too (as step's): a ValueError, as
    # torch raises an argument its op refuses.
    for call, name in [(lambda: decoder._impl.reorder(torch.tensor([9]), torch.tensor([0])),
                        "reorder"),
                       (lambda: decoder._impl.step(torch.tensor([-1]), torch.zeros(1, E)), "step")]:
        with pytest.raises(ValueError, match=rf"\[edbatch.Decoder.{name}\] instance id "
                                               rf"(9|-1) outside \[0, 4\)"):
            call()
    assert decoder.instance_steps() == [3, 3, 3, 3]
    assert decoder.reorder([]).numel() == 0 and decoder.done
    assert decoder.instance_steps() == []
    decoder.start(2)  # a new loop after a reorder to nothing
    assert decoder.running.tolist() == [0, 1] and decoder.instance_steps() == [0, 0]


@torch.no_grad()
def test_reorder_of_a_single_tensor_state():
    """A GRU's state is one tensor: a step after reorder(index) equals a loop started from the
    rows index of the step before."""
    vocab, E, H = 11, 6, 5
    torch.manual_seed(3)
    gru = edbatch.nn.LatticeGRU(vocab, E, H)
    g = torch.Generator().manual_seed(4)
    h0, x1 = torch.randn(5, H, generator=g), torch.randn(5, E, generator=g)
    index = [4, 0, 0, 2, 4, 4]
    x2 = torch.randn(len(index), E, generator=g)
    reordered = edbatch.nn.StepDecoder(gru)
    reordered.start(5, h0)
    h1 = reordered.step(x1)
    reordered.reorder(index)
    got = reordered.step(x2)
    direct = edbatch.nn.StepDecoder(gru)
    direct.start(len(index), h1[index])
    torch.testing.assert_close(got, direct.step(x2), atol=0, rtol=0)
    assert not torch.equal(got, reordered.step(x2))  # the state moved on


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_cuda_start_reads_the_weights_and_states_on_the_device():
    """On a CUDA engine, start() takes CUDA weights and states on the device (no copy through
    the host that PyTorch would wait for), the weights as they are when it is called: a change
    after it does not reach the loop's steps, and the next start() reads the changed weights.
    The first step reads the states, after a stop too, and through the host for a CPU x."""
    vocab, E, H = 13, 6, 7
    _, _, cell = pick_user_lstm(vocab, E, H, 5)
    cuda_module = edbatch.nn.Propagate(copy.deepcopy(cell), state_size=(H, H)).cuda()
    on_cuda = edbatch.nn.StepDecoder(cuda_module, input_size=E)
    on_cpu = edbatch.nn.StepDecoder(edbatch.nn.Propagate(cell, state_size=(H, H)), input_size=E)
    g = torch.Generator().manual_seed(3)
    device_path = edbatch.info.cuda_tensor_path() == "gpu"
    for loop, first in enumerate(["cuda x", "stop", "cpu x"]):
        h0, c0, x = (torch.randn(4, n, generator=g) for n in (H, H, E))
        state = (h0.cuda(), c0.cuda())
        if device_path:
            torch.cuda.set_sync_debug_mode("error")  # a copy to the host raises
        try:
            on_cuda.start(4, state)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        on_cpu.start(4, (h0, c0))
        if first == "stop":
            mask = torch.tensor([False, True, False, False])
            assert torch.equal(on_cuda.stop(mask), on_cpu.stop(mask))
            x = x[~mask]
        want = on_cpu.step(x)
        for p in list(cuda_module.parameters()) + list(cell.parameters()):
            p.mul_(0.5)  # after start: the loop keeps the weights it started with
        got = on_cuda.step(x if first == "cpu x" else x.cuda())
        assert all(t.is_cuda == (first != "cpu x") for t in got)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-4, msg=f"loop {loop}")
        again = on_cuda.step(x.cuda())  # the states have moved on from the start's
        for a, b in zip(again, on_cpu.step(x)):
            torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-4, msg=f"loop {loop}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_cuda_steps_stay_on_the_device():
    """On a CUDA engine, a CUDA x (strided, on a side stream) and the new states stay in device
    memory: no copy through the host that PyTorch would wait for. Steps, a stop and a reorder give
    the CPU engine's states; a CPU x on the same decoder gets CPU states back."""
    vocab, E, H = 13, 6, 7
    model, eager, cell = pick_user_lstm(vocab, E, H, 5)
    module = edbatch.nn.Propagate(cell, state_size=(H, H))
    on_cpu = edbatch.nn.StepDecoder(module, input_size=E)
    on_cuda = edbatch.nn.StepDecoder(
        edbatch.nn.Propagate(copy.deepcopy(cell), state_size=(H, H)).cuda(), input_size=E)
    g = torch.Generator().manual_seed(8)
    h0, c0 = torch.randn(6, H, generator=g), torch.randn(6, H, generator=g)
    on_cpu.start(6, (h0, c0))
    on_cuda.start(6, (h0.cuda(), c0.cuda()))
    device_path = edbatch.info.cuda_tensor_path() == "gpu"
    side = torch.cuda.Stream()
    for step, change in enumerate(["stop", "reorder", None, "cpu x"]):
        n = on_cpu.running.numel()
        wide = torch.randn(n, 2 * E, generator=g)
        x = wide[:, ::2]  # strided rows
        want = on_cpu.step(x)
        if change == "cpu x":
            got = on_cuda.step(x)
            assert all(not t.is_cuda for t in got)
        else:
            x_cuda = wide.cuda()[:, ::2]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                if device_path:
                    torch.cuda.set_sync_debug_mode("error")  # a copy to the host raises
                try:
                    got = on_cuda.step(x_cuda)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
                assert all(t.is_cuda for t in got)
                got = tuple(t.cpu() for t in got)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"step {step}")
        if change == "stop":
            mask = torch.tensor([True, False, False, True, False, False])
            assert torch.equal(on_cuda.stop(mask), on_cpu.stop(mask))
        elif change == "reorder":
            index = [3, 0, 0, 2, 3]
            assert torch.equal(on_cuda.reorder(index), on_cpu.reorder(index))
    assert on_cuda.stats()["nodes"] == on_cpu.stats()["nodes"]
