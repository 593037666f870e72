"""The current figures: `benchmarks/results/figures.yaml`, one entry per row of the table that
opens `docs/results.md`; an entry's `readme: {N: name}` puts its N-th number in the README's
headline table, one number a row, named with what it is, its unit and its shape; and pages
quote a figure between `<!-- figure: ID -->` and `<!-- /figure -->` (or its N-th number,
`<!-- figure: ID N -->`). All are generated from it (`python -m benchmarks.results_page`).

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
    from benchmarks import ledger, machines
except ImportError:  # run as a script from benchmarks/
    import ledger
    import machines

FIGURES = os.path.join(ledger.RESULTS, "figures.yaml")
KEYS = {"id", "what", "note", "ledger", "figure", "machine", "reproduce", "readme"}
OPTIONAL = {"note", "ledger", "readme"}
# The README's headline table: at most this many rows (one number of a figure a row).
README_ROWS = 14
# A page quotes a figure, or its N-th number, between these comments; results_page rewrites it.
QUOTE_MARK = re.compile(
    r"<!-- figure: (?P<id>[a-z0-9-]+)(?: (?P<n>\d+))? -->(?P<text>.*?)<!-- /figure -->", re.S
)
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

    def __init__(self, expression, spec, value, lines, fields=()):
        self.expression, self.spec, self.value, self.lines = expression, spec, value, lines
        self.fields = list(fields)  # (ledger, line number, field) read
        sign, comma, digits = _FORMAT.match(spec).groups()
        self.text = format(_rounded(value, int(digits)), f"{sign}{comma}.{digits}f")


def _rounded(value, digits):
    return value.quantize(decimal.Decimal(1).scaleb(-digits), decimal.ROUND_HALF_UP)


def load(path=FIGURES):
    """The entries of `figures.yaml`, in the order of the tables."""
    with open(path, encoding="utf-8") as f:
        entries = yaml.safe_load(f)
    for entry in entries:
        unknown, missing = set(entry) - KEYS, KEYS - OPTIONAL - set(entry)
        if unknown or missing:
            raise ValueError(f"{entry.get('what')}: unknown keys {unknown}, missing {missing}")
        if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", str(entry["id"])):
            raise ValueError(f"{entry['id']!r}: an id is lowercase words joined by '-'")
        unknown_machines = set(machines.keys(entry["machine"])) - set(machines.BY_KEY)
        if unknown_machines:
            raise ValueError(f"{entry['id']}: machine {unknown_machines} not in machines.py")
        literal = NUMBER.findall(_QUOTE.sub("", entry["figure"]))
        if literal:
            raise ValueError(f"{entry['what']}: a figure's numbers are {{...}} quotes: {literal}")
    ids = [entry["id"] for entry in entries]
    if len(set(ids)) != len(ids):
        raise ValueError(f"figures.yaml: an id twice in {ids}")
    if sum(len(readme_picks(entry)) for entry in entries) > README_ROWS:
        raise ValueError(f"figures.yaml: more than {README_ROWS} README rows")
    return entries


def readme_picks(entry):
    """`[(N, name), ...]`: the numbers of `entry`'s figure that the README's table shows, one
    a row (`readme: {N: name}`; N counts from 1, as a page's `<!-- figure: ID N -->`), each
    named with what it is, its unit and its shape: a cell holds one number."""
    picks = entry.get("readme") or {}
    count = len(_QUOTE.findall(entry["figure"]))
    if not isinstance(picks, dict) or not all(
        isinstance(n, int) and 1 <= n <= count and isinstance(name, str) and name.strip()
        for n, name in picks.items()
    ):
        raise ValueError(
            f"{entry['id']}: readme is {{N: name}}, N from 1 to {count} (the figure's numbers), "
            "each name saying what the number is, its unit and its shape"
        )
    return sorted(picks.items())


def _number(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {value!r}, not a number")
    return decimal.Decimal(repr(value))


class _Evaluator:
    def __init__(self, default_ledger, read):
        self.default, self.read, self.lines, self.fields = default_ledger, read, [], []

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
            self.fields.append((name, number, field))
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
        result.append(Quote(expression.strip(), spec, value, evaluate.lines, evaluate.fields))
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


def _links(entry_quotes, page="ledgers/"):
    """`[name a](ledgers/name.md#name-a), [b](ledgers/name.md#name-b)`: each line read, by
    ledger and number, linking the ledger's page."""
    read = lines(entry_quotes)
    parts = []
    for name in dict.fromkeys(name for name, _ in read):
        numbers = sorted(number for other, number in read if other == name)
        parts += [
            f"[{name + ' ' if i == 0 else ''}{number}]({page}{name}.md#{name}-{number})"
            for i, number in enumerate(numbers)
        ]
    return ", ".join(parts)


def _cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def _unlinked(text):
    """`text` with its Markdown links replaced by their words."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)


def readme_rows(entries=None, read=ledger.read):
    """The README's headline table: one number a row (`readme_picks`), its name linking its
    figure's row of the results page (which links the ledger lines), the number with its unit
    (the `x` of a ratio) in the next cell."""
    head = ["| figure | value | machine |", "|---|---|---|"]
    rows = []
    for entry in entries if entries is not None else load():
        picks = readme_picks(entry)
        if not picks:
            continue
        found = quotes(entry, read)
        units = [entry["figure"][m.end() : m.end() + 1] for m in _QUOTE.finditer(entry["figure"])]
        for n, name in picks:
            unit = units[n - 1] if units[n - 1] in ("x", "%") else ""
            rows.append(
                f"| [{_cell(_unlinked(name))}](docs/results.md#figure-{entry['id']}) | "
                f"{found[n - 1].text}{unit} | {_cell(machines.names(entry['machine']))} |"
            )
    return "\n".join(head + rows)


def page_rows(entries=None, read=ledger.read):
    """The results page's table of current figures, a row per entry (anchor `figure-<id>`) with
    the ledger lines it reads (on each ledger's page), then how each figure is read and
    reproduced, folded."""
    entries = entries if entries is not None else load()
    head = ["| figure | value | machine | ledger lines |", "|---|---|---|---|"]
    rows, how = [], []
    for entry in entries:
        found = quotes(entry, read)
        rows.append(
            f'| <a id="figure-{entry["id"]}"></a>{_cell(entry["what"])} '
            f"| {_cell(shown(entry, found))} | {_cell(machines.names(entry['machine']))} "
            f"| {_links(found)} |"
        )
        derived = _QUOTE.sub(
            lambda m: f"`{m.group(1).rpartition(':')[0].strip()}`", entry["figure"]
        )
        where = f"from `{entry['ledger']}`: " if entry.get("ledger") else ""
        note = f" {' '.join(entry['note'].split())}" if entry.get("note") else ""
        how.append(
            f"- **{_cell(entry['what'])}**.{note} Read {where}{' '.join(derived.split())}. "
            f"Reproduce: {' '.join(entry['reproduce'].split())}."
        )
    folded = (
        '<details markdown="1">\n<summary>How each figure is read, and the command that '
        "reproduces it</summary>\n\n" + "\n".join(how) + "\n\n</details>"
    )
    return "\n".join(head + rows) + "\n\n" + folded


def quote_text(entry, number=None, read=ledger.read):
    """What a page's `<!-- figure: ID [N] -->` quote shows: the figure, or its N-th number."""
    found = quotes(entry, read)
    if number is None:
        return " ".join(shown(entry, found).split())
    if not 1 <= number <= len(found):
        raise ValueError(f"figure {entry['id']} has {len(found)} numbers, not {number}")
    return found[number - 1].text


def render_quotes(text, entries=None, read=ledger.read):
    """`text` with every `<!-- figure: ID [N] -->...<!-- /figure -->` quote rewritten from
    figures.yaml (an unknown ID raises)."""
    by_id = {entry["id"]: entry for entry in (entries if entries is not None else load())}
    # A line that starts with a comment is an HTML block in Markdown: it would cut the paragraph.
    for line in text.splitlines():
        if line.lstrip().startswith("<!-- figure:"):
            raise ValueError(f"a figure's quote starts a line (it would end the paragraph): {line}")

    def replace(match):
        if match.group("id") not in by_id:
            raise ValueError(f"a quote of an unknown figure {match.group('id')!r}")
        number = int(match.group("n")) if match.group("n") else None
        value = quote_text(by_id[match.group("id")], number, read)
        n = f" {match.group('n')}" if match.group("n") else ""
        return f"<!-- figure: {match.group('id')}{n} -->{value}<!-- /figure -->"

    return QUOTE_MARK.sub(replace, text)


def shows(text, value):
    """Whether `text` (a number as a table shows it: `2,054`, `+2.95`, `0.16`) is `value`
    rounded half up to the digits it shows."""
    text = text.replace(",", "")
    return decimal.Decimal(text) == _rounded(value, len(text.partition(".")[2]))
