"""Seeded random structures for the user-cell tests: trees of mixed arity (0 to 6 children),
lattices, DAGs as edge lists in shuffled node order, single-node instances, empty batches."""
import random

import edbatch
from edbatch.packing import synthetic_lattices

VOCAB = 40


def random_tree(rng, budget):
    """A tree of at most `budget` nodes, 0 to 6 children per node."""
    if budget <= 1 or rng.random() < 0.25:
        return rng.randrange(VOCAB)
    arity = rng.randint(1, min(6, budget - 1))
    shares = [1] * arity
    for _ in range(budget - 1 - arity):
        shares[rng.randrange(arity)] += 1
    return tuple(random_tree(rng, s) for s in shares)


def random_dag(rng, n, node_kinds, arc_kinds):
    """An edge-list instance of n nodes in shuffled order (pack_edges sorts them)."""
    names = list(range(n))
    rng.shuffle(names)  # names[k]: the given number of the k-th node in a topological order
    edges = []
    for k in range(1, n):
        for j in rng.sample(range(k), min(k, rng.randint(0, 3))):
            edges.append((names[j], names[k], rng.randrange(arc_kinds)))
    rng.shuffle(edges)
    return {"num_nodes": n, "edges": edges, "inputs": [rng.randrange(VOCAB) for _ in range(n)],
            "kinds": [rng.randrange(node_kinds) for _ in range(n)]}


def packed(kind, seed, edge_inputs=None):
    """A packed mini-batch: kind "trees", "lattices", "dags" or "empty"."""
    rng = random.Random(seed)
    if kind == "trees":
        trees = [random_tree(rng, b) for b in (1, 9, 30, 1, 17)]
        return edbatch.pack_trees(trees, edge_inputs=edge_inputs)
    if kind == "lattices":
        return edbatch.pack_lattices(synthetic_lattices(4, vocab_size=VOCAB, seed=seed,
                                                        min_len=1, max_len=9, word_prob=0.5))
    if kind == "dags":
        dags = [random_dag(rng, n, 2, 3) for n in (1, 6, 12, 3)]
        return edbatch.pack_edges(dags, edge_inputs=edge_inputs and "target")
    assert kind == "empty"
    return edbatch.pack_trees([])
