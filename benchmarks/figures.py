"""The current figures: `benchmarks/results/figures.yaml`, one entry per row of the README's
Results table and of the table that opens `docs/results.md`, both generated from it
(`python -m benchmarks.results_page`).

Each entry names the ledger lines its numbers come from in its `figure` template: every `{...}`
is an expression over ledger lines, then the format it is shown in,

    {test_bleu[57]:.2f}                                 the value of one line's field
    {mean(test_bleu[54,56,57]):.2f}                     the mean of several lines
    {lines_per_second[7] / lines_per_second[6]:.2f}     a ratio (+, -, *, / and numbers)
    {translate_file.lines_per_second[7]:,.0f}           a field of another ledger's line

`field[n]` is line n (1-based, as the results page numbers and anchors them) of the entry's
`ledger`; several lines (`field[a,b]`) only inside `mean`, `min` or `max`. The format is `.Nf`
with an optional `+` (sign) and `,` (thousands). Values are computed in decimal from the numbers
as the ledger writes them and rounded half up, so what is shown is the ledger's number rounded.
"""

import ast
import decimal
import os
import re

import yaml

try:
    from benchmarks import ledger
except ImportError:  # run as a script from benchmarks/
    import ledger

FIGURES = os.path.join(ledger.RESULTS, "figures.yaml")
KEYS = {"what", "ledger", "figure", "machine", "reproduce"}
_QUOTE = re.compile(r"\{([^{}]+)\}")
_FORMAT = re.compile(r"^(\+?)(,?)\.(\d+)f$")
# A number as a table shows it (`2,054`, `0.16`, `+2.95`, both of `0.77-0.78`), not the digits
# inside a word (`float32`, `beam-4`).
NUMBER = re.compile(r"(?<![\w.-])[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<=\d-)\d+(?:\.\d+)?")
_AGGREGATES = {
    "mean": lambda values: sum(values) / len(values),
    "min": min,
    "max": max,
}
_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class Quote:
    """One number of a figure: its `expression`, format, exact `value` (a Decimal), the
    `lines` it reads (`{(ledger, line number)}`, in the order read) and its `text` as shown."""

    def __init__(self, expression, spec, value, lines):
        self.expression, self.spec, self.value, self.lines = expression, spec, value, lines
        sign, comma, digits = _FORMAT.match(spec).groups()
        self.text = format(_rounded(value, int(digits)), f"{sign}{comma}.{digits}f")


def _rounded(value, digits):
    return value.quantize(decimal.Decimal(1).scaleb(-digits), decimal.ROUND_HALF_UP)


def load(path=FIGURES):
    """The entries of `figures.yaml`, in the order of the tables."""
    with open(path, encoding="utf-8") as f:
        entries = yaml.safe_load(f)
    for entry in entries:
        unknown, missing = set(entry) - KEYS, KEYS - {"ledger"} - set(entry)
        if unknown or missing:
            raise ValueError(f"{entry.get('what')}: unknown keys {unknown}, missing {missing}")
        literal = NUMBER.findall(_QUOTE.sub("", entry["figure"]))
        if literal:
            raise ValueError(f"{entry['what']}: a figure's numbers are {{...}} quotes: {literal}")
    return entries


def _number(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {value!r}, not a number")
    return decimal.Decimal(repr(value))


class _Evaluator:
    def __init__(self, default_ledger, read):
        self.default, self.read, self.lines = default_ledger, read, []

    def field(self, node):
        """`(ledger, field, [line numbers], several)` of `field[n]` / `ledger.field[a,b]`."""
        target = node.value
        if isinstance(target, ast.Name):
            name, field = self.default, target.id
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            name, field = target.value.id, target.attr
        else:
            raise ValueError(f"not a ledger field: {ast.unparse(node)}")
        if name is None:
            raise ValueError(f"{ast.unparse(node)}: the entry names no ledger")
        index = node.slice
        several = isinstance(index, ast.Tuple)
        numbers = [ast.literal_eval(e) for e in (index.elts if several else [index])]
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
            raise ValueError(f"{ast.unparse(node)}: lines are integers")
        return name, field, numbers, several

    def values(self, node):
        name, field, numbers, several = self.field(node)
        rows = self.read(name)
        values = []
        for number in numbers:
            if not 1 <= number <= len(rows):
                raise ValueError(f"{name} has no line {number} ({len(rows)} lines)")
            row = rows[number - 1]
            if field not in row:
                raise ValueError(f"{name} line {number} has no field {field!r}")
            values.append(_number(row[field], f"{name} line {number} {field}"))
            if (name, number) not in self.lines:
                self.lines.append((name, number))
        return values, several

    def __call__(self, node):
        if isinstance(node, ast.Constant):
            return _number(node.value, "a constant")
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](self(node.left), self(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self(node.operand)
        if isinstance(node, ast.Subscript):
            values, several = self.values(node)
            if several:
                raise ValueError(f"{ast.unparse(node)}: several lines need mean, min or max")
            return values[0]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _AGGREGATES
            and len(node.args) == 1
            and not node.keywords
            and isinstance(node.args[0], ast.Subscript)
        ):
            return _AGGREGATES[node.func.id](self.values(node.args[0])[0])
        raise ValueError(f"not allowed in a figure: {ast.unparse(node)}")


def quotes(entry, read=ledger.read):
    """The `Quote`s of an entry's figure, in the order shown."""
    result = []
    for match in _QUOTE.finditer(entry["figure"]):
        expression, _, spec = match.group(1).rpartition(":")
        if not expression or not _FORMAT.match(spec):
            raise ValueError(f"{match.group(0)}: write {{expression:.Nf}}")
        evaluate = _Evaluator(entry.get("ledger"), read)
        with decimal.localcontext(decimal.Context(prec=28)):
            value = evaluate(ast.parse(expression.strip(), mode="eval").body)
        result.append(Quote(expression.strip(), spec, value, evaluate.lines))
    return result


def lines(entry_quotes):
    """The `(ledger, line)` pairs the quotes read, each once, in the order first read."""
    seen = []
    for quote in entry_quotes:
        seen += [line for line in quote.lines if line not in seen]
    return seen


def shown(entry, entry_quotes):
    """The figure as shown: the template with each quote's text."""
    texts = iter(q.text for q in entry_quotes)
    return _QUOTE.sub(lambda _: next(texts), entry["figure"])


def _links(entry_quotes, page):
    """`ledger: [name a](page#name-a), [b](page#name-b)`: each line read, by ledger and number."""
    read = lines(entry_quotes)
    parts = []
    for name in dict.fromkeys(name for name, _ in read):
        numbers = sorted(number for other, number in read if other == name)
        parts += [
            f"[{name + ' ' if i == 0 else ''}{number}]({page}#{name}-{number})"
            for i, number in enumerate(numbers)
        ]
    return "ledger: " + ", ".join(parts)


def _cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def _from_root(text):
    """`text`'s relative links, written from docs/, as the README (at the root) needs them."""
    return re.sub(r"\]\((?![a-z]+://|#)", "](docs/", text.strip())


def readme_rows(entries=None, read=ledger.read):
    """The README's Results table (links from the repository root)."""
    head = ["| what | figure | machine | reproduce |", "|---|---|---|---|"]
    rows = []
    for entry in entries if entries is not None else load():
        found = quotes(entry, read)
        # The entry's own links are written from docs/ (as on the results page).
        what, reproduce = (_from_root(entry[key]) for key in ("what", "reproduce"))
        rows.append(
            f"| {_cell(what)} ({_links(found, 'docs/results.md')}) | {_cell(shown(entry, found))}"
            f" | {_cell(entry['machine'])} | {_cell(reproduce)} |"
        )
    return "\n".join(head + rows)


def page_rows(entries=None, read=ledger.read):
    """The results page's opening table: the README's, with how each number is derived."""
    head = [
        "| what | figure | derived from | machine | reproduce |",
        "|---|---|---|---|---|",
    ]
    rows = []
    for entry in entries if entries is not None else load():
        found = quotes(entry, read)
        derived = _QUOTE.sub(
            lambda m: f"`{m.group(1).rpartition(':')[0].strip()}`", entry["figure"]
        )
        if entry.get("ledger"):
            derived = f"`{entry['ledger']}`: {derived}"
        rows.append(
            f"| {_cell(entry['what'])} ({_links(found, '')}) | {_cell(shown(entry, found))}"
            f" | {_cell(derived)} | {_cell(entry['machine'])} | {_cell(entry['reproduce'])} |"
        )
    return "\n".join(head + rows)


def shows(text, value):
    """Whether `text` (a number as a table shows it: `2,054`, `+2.95`, `0.16`) is `value`
    rounded half up to the digits it shows."""
    text = text.replace(",", "")
    return decimal.Decimal(text) == _rounded(value, len(text.partition(".")[2]))
