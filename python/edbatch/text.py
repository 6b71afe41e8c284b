"""Text read as the C++ readers read it: words split at ASCII whitespace only (space, \\t, \\n, \\v,
\\f, \\r; not at U+3000 or U+00A0, which belong to words), so that a file gives the same words
both ways; numbers in ASCII digits; quoted text in errors shortened. The zoo's lattice format."""
import operator
import re

_SPACE = " \t\n\v\f\r"
_WORD = re.compile(f"[^{_SPACE}]+")
_QUOTED = 80  # characters of the user's text an error quotes


def words(text):
    """The words of `text` between ASCII whitespace."""
    return _WORD.findall(text)


def blank(line):
    """Whether `line` holds ASCII whitespace only."""
    return not line.strip(_SPACE)


def strip(line):
    return line.strip(_SPACE)


def quote(text):
    """repr(text) for an error, its first characters only when it is long."""
    if len(text) <= _QUOTED:
        return repr(text)
    return f"{text[:_QUOTED]!r}... ({len(text)} characters)"


def shorten(text):
    """text (a repr) for an error, its first characters only when it is long."""
    return text if len(text) <= _QUOTED else f"{text[:_QUOTED]}... ({len(text)} characters)"


def check_text(value, owner, what):
    """Raises TypeError unless `value` is a str (bytes: decode them first)."""
    if isinstance(value, (bytes, bytearray)):
        raise TypeError(f"{owner}: {what} is {type(value).__name__}, not a str: decode it first "
                        f"(.decode('utf-8'))")
    if not isinstance(value, str):
        raise TypeError(f"{owner}: {what} must be a str, got {type(value).__name__}")


def index_of(v):
    """v as an int when it is one or stands for one (a NumPy integer, a 0-d integer tensor);
    None for anything else (bools, floats, strings)."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def text_int(token):
    """token as an int when text files write it so (ASCII digits after an optional minus sign),
    else None: not the other forms Python's int() takes ("1_0", full-width digits, "--1")."""
    return int(token) if re.fullmatch(r"-?[0-9]+", token) else None


def parse_lattices(text):
    """Lattice records from the zoo's text format (docs/models.md); a leading byte order mark
    is skipped. ValueError naming the lattice and what was expected where the text is not."""
    check_text(text, "parse_lattices", "the text")
    tokens = iter(words(text.lstrip("\ufeff")))

    def number(what, low=None):
        token = next(tokens, None)
        if token is None:
            raise ValueError(f"parse_lattices: the text ends where {what} should be")
        value = text_int(token)
        if value is None or (low is not None and value < low):
            at_least = "" if low is None else f" (an integer >= {low})"
            raise ValueError(f"parse_lattices: expected {what}{at_least}, got {quote(token)}")
        return value

    records = []
    for i in range(number("the number of lattices", 0)):
        length = number(f"lattice {i}'s length", 0)
        tags = [number(f"lattice {i}'s tags") for _ in range(length)]
        arcs = []
        for k in range(length):
            n = number(f"lattice {i}'s arc count of state {k}", 0)
            arcs.append([(number(f"an arc's source in lattice {i}"),
                          number(f"an arc's word id in lattice {i}")) for _ in range(n)])
        records.append({"arcs": arcs, "tags": tags})
    extra = next(tokens, None)
    if extra is not None:
        raise ValueError(f"parse_lattices: text after the {len(records)} lattices the first line "
                         f"announces: {quote(extra)}")
    return records
