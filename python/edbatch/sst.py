"""SST bracketed lines: parsing into nested tuples of word ids with post-order labels, packing,
and seeded synthetic lines (docs/pytorch.md)."""
import collections
import collections.abc
import random
import re

from .checks import flag
from .text import blank, check_text, index_of, quote, strip, text_int

# What parse_sst returns: a tree and its labels, which collate reads as such (a plain 2-tuple
# whose second item is a list of word ids is a tree as well).
LabelledTree = collections.namedtuple("LabelledTree", ["tree", "labels"])
_TOKEN = re.compile(r"[()]|[^() \t\n\v\f\r]+")  # words end at ASCII whitespace, as in C++


def parse_sst(line, vocab, add=True, unk=0):
    """Parses one SST line, e.g. "(3 (2 it) (4 (2 's) (4 good)))", into (tree, labels): the tree
    as nested tuples of word ids (vocab maps words to ids; new words are added when `add`, with
    the id len(vocab), so the vocab must hold the ids 0..len(vocab)-1, as one built here does;
    else they map to `unk`) and the node labels in post order, as a LabelledTree (a named
    tuple). Without recursion: trees of any depth. Words end at ASCII whitespace, as the C++
    readers' do. A leading byte order mark (a file's first line read without
    encoding="utf-8-sig") is skipped."""
    check_text(line, "parse_sst", "the line")
    _check_options(vocab, add, unk, "parse_sst")
    tokens = _TOKEN.findall(line.lstrip("\ufeff"))
    pos, labels, open_nodes = 0, [], []  # open_nodes: (label, children) of unclosed inner nodes

    def token(what):
        if pos >= len(tokens):
            raise ValueError(f"the line ends where {what} should be (unbalanced parentheses)")
        return tokens[pos]

    def word_id(word):
        if word not in vocab:
            if not add:
                return unk
            _check_vocab(vocab, "parse_sst")
            vocab[word] = len(vocab)
            _checked[:] = [vocab, len(vocab)]
        return vocab[word]

    try:
        while True:  # at the '(' of a node
            if token("'('") != "(":
                raise ValueError(f"expected '(' at token {pos}, got {quote(tokens[pos])}")
            pos += 1
            text = token("a label")
            label = text_int(text)
            if label is None:
                raise ValueError(f"expected an integer label at token {pos}, got {quote(text)}")
            if not -1 <= label < 2**63:
                raise ValueError(f"label {label} at token {pos} is outside [-1, 2^63) (-1: no "
                                 f"label)")
            pos += 1
            if token("a word or '('") == "(":
                open_nodes.append((label, []))
                continue
            word = tokens[pos]
            if word == ")":
                raise ValueError(f"node at token {pos - 2} has neither a word nor children")
            pos += 1
            if token("')'") != ")":
                raise ValueError(f"expected ')' after the word {quote(word)}, got "
                                 f"{quote(tokens[pos])}")
            pos += 1
            node = word_id(word)
            labels.append(label)
            # Close every open node whose children end here; stop at the next child's '('.
            while open_nodes:
                open_nodes[-1][1].append(node)
                if token("')'") == "(":
                    break
                if tokens[pos] != ")":
                    raise ValueError(f"expected ')' or '(' at token {pos}, got "
                                     f"{quote(tokens[pos])}")
                pos += 1
                parent, children = open_nodes.pop()
                node = tuple(children)
                labels.append(parent)
            if not open_nodes:
                break
        if pos < len(tokens):
            raise ValueError(f"text after the tree at token {pos}: {quote(tokens[pos])}")
    except _VocabError as e:
        raise ValueError(str(e)) from None
    except ValueError as e:
        raise ValueError(f"parse_sst: malformed line {quote(strip(line))}: {e}") from None
    return LabelledTree(node, labels)


class _VocabError(ValueError):
    """A vocabulary new words cannot be added to: not a fault of the line."""


# The vocabulary last checked or grown here (held, so that its id cannot pass to another dict)
# and its size.
_checked = [None, -1]


def _check_vocab(vocab, owner):
    """Refuses a vocabulary that new words cannot be added to with the id len(vocab) (two words
    would share an id). Checked once per vocabulary and size: parsing a corpus line by line
    checks it again only when its size changed otherwise (an edit in place that keeps the size
    is not seen)."""
    if _checked[0] is vocab and _checked[1] == len(vocab):
        return
    ids = set(vocab.values())
    if ids != set(range(len(vocab))):
        raise _VocabError(f"{owner}: words are added with the next id, len(vocab), so vocab's ids "
                         f"must be 0..{len(vocab) - 1}, but they are not (it maps {len(vocab)} "
                         f"words to {len(ids)} ids up to {max(ids, default=-1)}); give add=False "
                         f"and unk= for a fixed vocabulary")
    _checked[:] = [vocab, len(vocab)]


def _check_options(vocab, add, unk, owner):
    """Refuses a vocab that is no mapping of words to ids (a dict), an add that is not a bool
    (a string "no" would read as true) and an unk that is no word id."""
    flag(add, owner, "add")
    if not isinstance(vocab, collections.abc.Mapping) or add and not isinstance(
            vocab, collections.abc.MutableMapping):
        raise TypeError(f"{owner}: vocab must be a dict mapping words to ids (an empty one to "
                        f"build it as lines are read), got {type(vocab).__name__}")
    _check_unk(unk, owner)


def _check_unk(unk, owner):
    n = index_of(unk)
    if n is None or not 0 <= n < 2**63:
        raise ValueError(f"{owner}: unk must be a word id (an int in [0, 2^63)), got {unk!r}")


def pack_sst(lines, vocab, add=True, unk=0):
    """Parses SST lines (blank lines skipped) and packs their trees with their labels; words not
    in vocab are added when `add`, else read as `unk` (parse_sst). Errors name the line's number
    among `lines` (from 1): a list of str (a file's lines, text.splitlines()), not one str."""
    from .packing import pack_trees  # (packing imports this module's names)
    if isinstance(lines, (str, bytes, bytearray)):
        raise TypeError(f"pack_sst: lines must be a list of lines, got one "
                        f"{type(lines).__name__}: pass its lines (text.splitlines(), after "
                        f"decoding bytes)")
    _check_options(vocab, add, unk, "pack_sst")
    if add:
        _check_vocab(vocab, "pack_sst")
    parsed = []
    for n, line in enumerate(lines, 1):
        check_text(line, "pack_sst", f"line {n}")
        if blank(line):
            continue
        try:
            parsed.append(parse_sst(line, vocab, add, unk))
        except ValueError as e:
            raise ValueError(f"pack_sst: line {n}: {e}") from None
    return pack_trees([t for t, _ in parsed], [l for _, l in parsed])


def synthetic_sst(n, vocab_size=1000, seed=1, max_words=24):
    """Seeded SST-format lines over words "w<id>": random binary trees whose node labels (0..4)
    follow the summed polarity of the words below (so the labels are learnable)."""
    rng = random.Random(seed)

    def label(score):
        return 2 + max(-2, min(2, score))

    def build(words):
        if len(words) == 1:
            s = (words[0] % 5) - 2
            return f"({label(s)} w{words[0]})", s
        cut = rng.randint(1, len(words) - 1)
        left, sl = build(words[:cut])
        right, sr = build(words[cut:])
        return f"({label(sl + sr)} {left} {right})", sl + sr

    return [build([rng.randrange(vocab_size) for _ in range(rng.randint(1, max_words))])[0]
            for _ in range(n)]
