"""The tests a change can affect, found through the import graph; runs them (a contributor's loop).

    python .ci/affected_tests.py                 # the fast tests that the change can affect
    python .ci/affected_tests.py --scenario      # and the scenario tests among them
    python .ci/affected_tests.py --print         # only print the pytest command
    python .ci/affected_tests.py --base HEAD~3   # the change since another commit
    python .ci/affected_tests.py -- -n 2 -x      # more pytest flags

The change: the files `git diff --name-only BASE` names (BASE: the merge base with `main`)
with the uncommitted and untracked ones. The graph: every import of the files under
`keras_transformer/`, `benchmarks/` and `tests/` (read with `ast`, wherever it stands: the
package imports TensorFlow and much else inside functions), the names the package's `__init__`
loads on first use (`_EXPORTS`, its sub-packages), module names written in strings (`python -m
keras_transformer.cli`, `"keras_transformer.export.ct2:export_ctranslate2"`, a script's text)
and the console script (`keras-transformer` is `keras_transformer.cli`). A test file is
affected when it imports a changed module, directly or through other modules. The test helpers
(`tests/conftest.py`, `tests/_*.py`, `tests/shared_runs.py`, ...) are followed name by name: a
test depends on the fixtures it names (a parameter, `usefixtures`, `getfixturevalue`), on the
hooks and autouse fixtures of `tests/conftest.py`, and on what the helper functions it imports
import. A changed test file selects itself; a file the graph does not hold (a guide, a config,
`.ci/peak_memory.py`) selects the tests whose strings name it (its path, its file name or its
directory); a change to setup.py, pyproject.toml or tests/conftest.py selects every test.

It prints each changed file with the number of test files it selects, then runs
`python -m pytest -q -m "not scenario" FILES...` (`--scenario`: without the `-m`).
"""

import argparse
import ast
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("keras_transformer", "benchmarks")  # imported by their dotted names
TESTS = "tests"  # its files are top-level modules (pytest puts tests/ on sys.path)
EVERYTHING = ("setup.py", "setup.cfg", "pyproject.toml", "tests/conftest.py")
CONFTEST = "conftest"
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
CODE_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+))", re.MULTILINE)


class Graph:
    """The import graph of a tree: nodes are module names (`keras_transformer.word_rules`,
    `_recipes`) and, in the test helpers, `module::name` for each top-level function or class;
    `deps[node]` is what it imports."""

    def __init__(self, root=ROOT, packages=PACKAGES):
        self.root = root
        self.packages = packages
        self.files = {}  # module name -> path relative to root
        self.trees = {}
        for rel in self._python_files():
            name = self.module_name(rel)
            if name:
                self.files[name] = rel
        for name, rel in self.files.items():
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                self.trees[name] = ast.parse(f.read(), rel)
        self.scripts = self._console_scripts()
        self.lazy = {name: self._lazy_exports(tree) for name, tree in self.trees.items()}
        self.lazy = {name: names for name, names in self.lazy.items() if names is not None}
        self.deps = {}
        self.strings = {}  # node -> the string constants it holds (for files outside the graph)
        self.fixtures = set()  # conftest's fixtures, by name
        self.registry = set()  # the modules "module:function" strings of the package name
        self.dynamic = set()  # the package's modules that import a module named at run time
        for name in self.files:
            self._read(name)
        for name in self.dynamic:  # they import what the registries name
            self.deps[name] |= set().union(*(self._module_edges(m) for m in self.registry))

    # ------------------------------------------------------------------ files and names
    def _python_files(self):
        for top in self.packages:
            for directory, dirs, names in os.walk(os.path.join(self.root, top)):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
                for n in sorted(names):
                    if n.endswith(".py"):
                        yield os.path.relpath(os.path.join(directory, n), self.root)
        tests = os.path.join(self.root, TESTS)
        for n in sorted(os.listdir(tests)) if os.path.isdir(tests) else []:
            if n.endswith(".py"):
                yield os.path.join(TESTS, n)

    @staticmethod
    def module_name(rel):
        parts = rel[: -len(".py")].split(os.sep)
        if parts[0] == TESTS:
            return parts[1] if len(parts) == 2 else None
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)

    def is_test_file(self, name):
        rel = self.files.get(name, "")
        return rel.startswith(TESTS + os.sep) and os.path.basename(rel).startswith("test_")

    def by_name(self, name):
        """Whether `name` is followed name by name: a test helper (not a test file), or a
        package's `__init__` (the functions of `keras_transformer.training` import the trainer
        when called; importing `keras_transformer.training.recipe` runs none of them)."""
        rel = self.files.get(name, "")
        if rel.startswith(TESTS + os.sep):
            return not self.is_test_file(name)
        return rel.endswith("__init__.py") and name not in self.lazy

    def _console_scripts(self):
        """`{script: module}` from setup.py's `console_scripts`."""
        scripts = {}
        path = os.path.join(self.root, "setup.py")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for script, module in re.findall(r"[\"']([\w-]+)\s*=\s*([\w.]+):\w+[\"']", text):
                scripts[script] = module
        return scripts

    @staticmethod
    def _lazy_exports(tree):
        """A package whose `__init__` loads names on first use (a module-level `__getattr__`):
        `{name: module}` from its module-level dicts of module names (`_EXPORTS`); else None."""
        body = tree.body
        if not any(isinstance(s, ast.FunctionDef) and s.name == "__getattr__" for s in body):
            return None
        names = {}
        for s in body:
            if isinstance(s, ast.Assign) and isinstance(s.value, ast.Dict):
                for k, v in zip(s.value.keys, s.value.values):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                        if isinstance(k.value, str) and isinstance(v.value, str):
                            names[k.value] = v.value
        return names

    # ------------------------------------------------------------------ imports
    def _local(self, dotted):
        """The longest prefix of `dotted` that is a module here, or None."""
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            candidate = ".".join(parts[:n])
            if candidate in self.files:
                return candidate
        return None

    def _module_edges(self, module):
        """Importing `module` runs its packages' `__init__`s and itself."""
        parts = module.split(".")
        return {".".join(parts[:n]) for n in range(1, len(parts) + 1)} & set(self.files)

    def _from_edges(self, module, names):
        edges = self._module_edges(module)
        if module not in self.files:
            return edges
        for n in names:
            if n == "*":
                edges |= self._all_of(module)
            elif f"{module}.{n}" in self.files:
                edges |= self._module_edges(f"{module}.{n}")
            elif n in self.lazy.get(module, {}):
                edges |= self._module_edges(self.lazy[module][n])
            elif self.by_name(module):
                edges.add(f"{module}::{n}")
        return edges

    def _all_of(self, module):
        """Every name of `module` (an import of the whole of it)."""
        if module in self.lazy:
            return set().union(*(self._module_edges(m) for m in self.lazy[module].values()))
        if self.by_name(module):
            return {f"{module}::{n}" for n in _top_level_names(self.trees[module])}
        return set()

    def _string_edges(self, value, argument):
        """A module a string names: the console script, a script's imports, and where the string
        is passed (an argument, an argv list) a module's dotted name (`-m`, `monkeypatch`)."""
        edges = set()
        for token in value.split():
            token = token.strip("\"'`,()[]")
            if os.path.basename(token) in self.scripts:  # the console script
                edges |= self._module_edges(self.scripts[os.path.basename(token)])
            head = token.split(":", 1)[0]  # "module:function"
            if argument and DOTTED.match(head) and "." in head:
                local = self._local(head)
                if local:
                    edges |= self._module_edges(local)
        for a, b in CODE_IMPORT.findall(value):  # a script in a string
            module = a or b
            local = self._local(module)
            if local:
                edges |= self._module_edges(local)
        return edges

    def _imports(self, module, nodes, whole_tree):
        """The edges of the imports and strings in `nodes` (statements of `module`)."""
        edges, strings = set(), set()
        lazy_root = module in self.lazy
        in_tests = self.files[module].startswith(TESTS + os.sep)
        is_package = self.files[module].endswith("__init__.py")
        for stmt in nodes:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                    node.value.docstring = True  # a docstring (or a bare string): no code
                for child in _arguments(node):
                    child.argument = True
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        edges |= self._module_edges(alias.name)
                        bound = alias.asname or alias.name.split(".")[0]
                        target = alias.name if alias.asname else alias.name.split(".")[0]
                        scope = stmt if isinstance(stmt, _DEFS) else whole_tree
                        edges |= self._attribute_edges(target, bound, scope)
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        package = module if is_package else module.rpartition(".")[0]
                        for _ in range(node.level - 1):
                            package = package.rpartition(".")[0]
                        base = ".".join(p for p in (package, base) if p)
                    edges |= self._from_edges(base, [a.name for a in node.names])
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if getattr(node, "docstring", False):
                        continue
                    strings.add(node.value)
                    if in_tests:
                        edges |= self._string_edges(node.value, getattr(node, "argument", False))
                    elif ":" in node.value and self._local(node.value.split(":", 1)[0]):
                        self.registry.add(self._local(node.value.split(":", 1)[0]))
                elif isinstance(node, ast.Call) and not in_tests and not lazy_root:
                    if ast.unparse(node.func).endswith(("import_module", "__import__")):
                        literal = node.args and isinstance(node.args[0], ast.Constant)
                        if literal and isinstance(node.args[0].value, str):
                            edges |= self._module_edges(node.args[0].value)
                        else:  # a name from a registry ("module:function" strings)
                            self.dynamic.add(module)
        return edges, strings

    def _attribute_edges(self, target, bound, tree):
        """`import keras_transformer as kt` ... `kt.Transformer`: the module each name used on
        `bound` comes from (a lazy package's export, a sub-package, a helper's function)."""
        if target not in self.lazy and not self.by_name(target):
            return set()
        used, loads = set(), 0
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == bound:
                    used.add(node.attr)
                    loads -= 1  # counted again as a Name below
            elif isinstance(node, ast.Name) and node.id == bound:
                loads += 1
        if loads > 0:  # passed around whole, not only as `bound.x`: all of it
            return self._all_of(target)
        return self._from_edges(target, sorted(used))

    def _read(self, name):
        tree = self.trees[name]
        if not self.by_name(name):
            body = [s for s in tree.body if not _is_function(s, "__getattr__")]
            self.deps[name], self.strings[name] = self._imports(name, body, tree)
            return
        # A helper: its module-level statements, and each function, class or constant (an
        # assignment that calls nothing: a script's text) on its own.
        top = _top_level_names(tree)
        module_stmts = [s for s in tree.body if not _symbol_names(s)]
        edges, strings = self._imports(name, module_stmts, tree)
        edges |= {f"{name}::{n}" for n in _names_used(module_stmts) & top}
        for stmt in tree.body:
            for symbol in _symbol_names(stmt):
                node = f"{name}::{symbol}"
                own, own_strings = self._imports(name, [stmt], tree)
                own |= {f"{name}::{n}" for n in _names_used([stmt]) & top if n != symbol}
                own.add(name)
                if name == CONFTEST and _fixture(stmt) is not None:
                    self.fixtures.add(symbol)
                    own |= {f"{name}::{a}" for a in _arg_names(stmt) if a in top}
                    if _fixture(stmt):  # autouse: every test uses it
                        edges.add(node)
                if name == CONFTEST and symbol.startswith("pytest_"):
                    edges.add(node)  # a hook: runs for every test
                self.deps[node], self.strings[node] = own, own_strings
        self.deps[name], self.strings[name] = edges, strings

    def test_deps(self, name):
        """A test file's edges: its imports, conftest, and the conftest fixtures it names."""
        edges = set(self.deps[name])
        if CONFTEST in self.files:
            tree = self.trees[name]
            named = _arg_names_anywhere(tree) | {
                n.value for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }  # fmt: skip
            edges.add(CONFTEST)
            edges |= {f"{CONFTEST}::{f}" for f in named & self.fixtures}
        return edges

    # ------------------------------------------------------------------ what a change affects
    def users(self):
        """`{node: the nodes that import it}`."""
        users = {}
        for node, edges in self.deps.items():
            if self.is_test_file(node):
                edges = self.test_deps(node)
            for e in edges:
                users.setdefault(e, set()).add(node)
        return users

    def nodes_of(self, rel):
        """The nodes a change to the file `rel` changes: its module (and its names), or the
        nodes whose strings name it."""
        rel = rel.replace("/", os.sep)
        for name, path in self.files.items():
            if path == rel:
                return {name} | {n for n in self.deps if n.startswith(name + "::")}
        keys = _mention_keys(rel.replace(os.sep, "/"))
        return {n for n, found in self.strings.items() if any(_mentions(s, keys) for s in found)}

    def affected(self, changed):
        """`(test files, {changed file: number of test files it selects})` for the changed
        files `changed` (paths relative to the root, with `/`)."""
        tests = sorted(n for n in self.files if self.is_test_file(n))
        users = self.users()
        selected, why = set(), {}
        for rel in changed:
            if rel in EVERYTHING:
                found = set(tests)
            else:
                found, todo = set(), list(self.nodes_of(rel))
                seen = set(todo)
                while todo:
                    node = todo.pop()
                    if self.is_test_file(node):
                        found.add(node)
                    for user in users.get(node, ()):
                        if user not in seen:
                            seen.add(user)
                            todo.append(user)
            why[rel] = len(found)
            selected |= found
        return sorted(self.files[n].replace(os.sep, "/") for n in selected), why


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _arguments(node):
    """The values `node` passes on: a call's arguments, a list's or a tuple's elements."""
    if isinstance(node, ast.Call):
        return [*node.args, *(k.value for k in node.keywords)]
    if isinstance(node, (ast.List, ast.Tuple)):
        return node.elts
    return []


def _is_function(stmt, name):
    return isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name


def _symbol_names(stmt):
    """The names a helper's top-level statement defines on their own: a function's, a class's,
    or those of an assignment that calls nothing (run at import, it imports nothing)."""
    if isinstance(stmt, _DEFS):
        return [stmt.name]
    if isinstance(stmt, ast.Assign) and not any(isinstance(n, ast.Call) for n in ast.walk(stmt)):
        if all(isinstance(t, ast.Name) for t in stmt.targets):
            return [t.id for t in stmt.targets]
    return []


def _top_level_names(tree):
    return {n for s in tree.body for n in _symbol_names(s)}


def _names_used(stmts):
    return {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name)}


def _fixture(stmt):
    """None for a function that is no fixture; else whether it is autouse."""
    for d in getattr(stmt, "decorator_list", []):
        call = d if isinstance(d, ast.Call) else None
        func = call.func if call else d
        if ast.unparse(func).endswith("fixture"):
            return any(
                k.arg == "autouse" and isinstance(k.value, ast.Constant) and k.value.value
                for k in (call.keywords if call else [])
            )
    return None


def _arg_names(func):
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    a = func.args
    return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


def _arg_names_anywhere(tree):
    return set().union(*(_arg_names(n) for n in ast.walk(tree)))


def _mention_keys(rel):
    """What a string that names the file `rel` holds: its path, its file name (unless it is
    `__init__.py`) or one of its directories."""
    parts = rel.split("/")
    dirs = {"/".join(parts[:n]) for n in range(1, len(parts))}
    base = parts[-1] if parts[-1] != "__init__.py" else None
    return rel, base, dirs


def _mentions(value, keys):
    rel, base, dirs = keys
    value = value.strip()
    if rel in value or (base and (value == base or value.endswith("/" + base))):
        return True
    stripped = value.rstrip("/")
    return any(stripped == d or stripped.endswith("/" + d) or value.startswith(d + "/")
               for d in dirs)  # fmt: skip


# ---------------------------------------------------------------------- the change
def _git(*args):
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def changed_files(base=None):
    """The files changed since `base` (default: the merge base with main), with the
    uncommitted and untracked ones."""
    if base is None:
        base = "main"
        try:
            base = _git("merge-base", "HEAD", "main").strip()
        except subprocess.CalledProcessError:
            pass
    names = set(_git("diff", "--name-only", base).split())
    names |= set(_git("ls-files", "--others", "--exclude-standard").split())
    return sorted(names)


def pytest_command(tests, scenario=False, extra=()):
    command = [sys.executable, "-m", "pytest", "-q"]
    if not scenario:
        command += ["-m", "not scenario"]
    return command + list(extra) + list(tests)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Run the tests that the change can affect (the import graph).",
        epilog="Arguments after `--` go to pytest.",
    )
    parser.add_argument("--base", help="the commit to compare with (default: the merge base "
                        "with main); uncommitted and untracked files count too")
    parser.add_argument("--scenario", action="store_true",
                        help="the scenario tests too (default: the fast tier only)")
    parser.add_argument("--print", dest="dry", action="store_true",
                        help="print the pytest command, run nothing")
    parser.add_argument("files", nargs="*", help="these changed files instead of git's")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)

    changed = args.files or changed_files(args.base)
    tests, why = Graph().affected(changed)
    for rel in changed:
        print(f"changed: {rel} ({why[rel]} test files)", file=sys.stderr)
    if not tests:
        print("no test file imports or names the changed files", file=sys.stderr)
        return 0
    command = pytest_command(tests, args.scenario, extra)
    print(shlex.join(["python", *command[1:]]))
    if args.dry:
        return 0
    sys.stdout.flush()
    return subprocess.run(command, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
