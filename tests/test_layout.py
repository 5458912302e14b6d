"""The layout of the code (issue 22): the import graph of ``model_build`` has no cycle, each unit
imports only what its ``__init__`` docstring allows, docs/architecture.md's table says the same, and
no module of ``model_build/``, ``constructs/`` or ``stacks/`` is longer than :data:`LINE_BUDGET`.

What counts as an import: every ``import`` and ``from ... import`` statement of a module, at
module level, inside a function (a lazy import) or under ``if TYPE_CHECKING:``. A lazy import that
only breaks a cycle at run time is still the cycle in design terms, so it counts.
``from model_build.a import b`` is an edge to the module ``a.b`` where ``b`` is one, else to ``a``
(its ``__init__``). The implicit import of a module's parent packages is not an edge: Python runs
them first, and a package's ``__init__`` may re-export its modules' names.

A unit is a subpackage of ``model_build`` (``export``, ``release``...), a shared module
(``errors``, ``types``... : every top-level module but ``__main__``) or ``__main__``, the CLI front,
which may import anything. Each subpackage's docstring has a "May import:" paragraph naming, in
double backquotes, the units it may import (``shared`` for the shared modules) or single modules of
them (``release.identity``); a shared module imports shared modules only.

Private names stay in their module (issue 48): no module of the product (``model_build/``,
``constructs/``, ``stacks/``, ``app.py``, the files of ``triton_mme_cdk/``), of ``benchmarks/`` or
of ``examples/`` uses another module's ``_name``, neither by ``from m import _name`` nor as
``m._name`` (through a name an import bound to ``m``), and a private module
(``benchmarks._common``) is imported only from inside its own package. What two modules share is public in the one that owns it. The tests are
outside the rule: a test is white-box by purpose (it pins a module's internals and swaps its seams,
``monkeypatch.setattr(convert, ...)``), and a test file covers several modules, so "the module it
tests" is no mechanical fact; making a name public only for a test would widen the interface the
product sees. The rule reads names a module defines at its top level, not attributes of instances.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The package's folder, and the import name its modules have (triton_mme_cdk.checkout).
FOLDER = "model_build"
PACKAGE = "triton_mme_cdk.model_build"
#: The most lines a module of model_build/, constructs/ or stacks/ may have.
LINE_BUDGET = 500
#: The folders the line budget applies to.
BUDGETED = ("model_build", "constructs", "stacks")
SHARED = "shared"


def package_modules(root: Path) -> dict[str, Path]:
    """``dotted name -> file`` of every module of the package under ``root``."""
    found = {}
    for path in sorted((root / FOLDER).rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(root / FOLDER).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports (see the module docstring for what counts)."""
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if in_package(alias.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not in_package(node.module):
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                edges.add(submodule if submodule in modules else node.module)
    return {edge for edge in edges if edge != name}


def in_package(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = package_modules(root)
    return {name: import_edges(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def unit_of(module: str) -> str:
    """``export`` for ``triton_mme_cdk.model_build.export.convert``, ``errors`` for ``...model_build.errors``."""
    parts = module[len(PACKAGE):].split(".")
    return parts[1] if len(parts) > 1 else ""


def subpackages(root: Path) -> list[str]:
    return sorted(p.parent.name for p in (root / FOLDER).glob("*/__init__.py"))


def shared_modules(root: Path) -> set[str]:
    return {p.stem for p in (root / FOLDER).glob("*.py")} - {"__init__", "__main__"}


def unit_docstring(root: Path, unit: str) -> str:
    return ast.get_docstring(ast.parse((root / FOLDER / unit / "__init__.py").read_text())) or ""


def may_import(docstring: str) -> set[str]:
    """The ``double-backquoted`` names of a docstring's "May import:" paragraph."""
    match = re.search(r"May import:(.*?)(?:\n\s*\n|$)", docstring, re.DOTALL)
    return set(re.findall(r"``([a-z_.]+)``", match.group(1))) if match else set()


def layering_violations(root: Path) -> list[str]:
    """Each import a unit's "May import:" does not allow, as ``module -> module``."""
    graph = import_graph(root)
    shared = shared_modules(root)
    allowed = {unit: may_import(unit_docstring(root, unit)) for unit in subpackages(root)}
    found = []
    for module, targets in sorted(graph.items()):
        unit = unit_of(module)
        if unit in ("", "__main__"):
            continue
        for target in sorted(targets):
            other = unit_of(target)
            if other == unit:
                continue
            if unit in shared:
                ok = other in shared
            else:
                names = allowed[unit]
                dotted = target[len(PACKAGE) + 1:]
                ok = (other in shared and SHARED in names) or other in names or dotted in names
            if not ok:
                found.append(f"{module} -> {target}")
    return found


#: The folders and files held to the rule on private names (see the module docstring); ``examples``
#: (a consumer's own app, where there is one) uses the package's public names alone.
PRIVATE_SCOPE = ("model_build", "constructs", "stacks", "benchmarks", "app.py", "triton_mme_cdk", "examples")
#: Folders whose modules are ``triton_mme_cdk.<folder>...`` (the folder ``triton_mme_cdk/`` links them).
LINKED = ("model_build", "constructs", "stacks")
IMPORT_ROOT = "triton_mme_cdk"


def scoped_modules(root: Path) -> dict[str, Path]:
    """``dotted name -> file`` of every module :data:`PRIVATE_SCOPE` holds, by its import name."""
    found = {}
    for entry in PRIVATE_SCOPE:
        path = root / entry
        if entry.endswith(".py"):
            files = [path] if path.is_file() else []
        elif entry == IMPORT_ROOT:  # its own files: its folders are links to the others
            files = sorted(path.glob("*.py"))
        else:
            files = sorted(path.rglob("*.py"))
        for file in files:
            parts = list(file.relative_to(root).with_suffix("").parts)
            if parts[0] in LINKED:
                parts.insert(0, IMPORT_ROOT)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = file
    return found


def is_private(name: str) -> bool:
    """``_name``, not ``__dunder__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_module_outside(module: str, importer: str) -> bool:
    """Whether ``module`` is private (``benchmarks._common``, or inside such a package) and
    ``importer`` is not inside the package that holds it."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if is_private(part):
            package = ".".join(parts[:index])
            return not (importer == package or importer.startswith(package + "."))
    return False


def private_uses(root: Path) -> list[str]:
    """Each use of another module's private name in :data:`PRIVATE_SCOPE`, as ``file:line: what``."""
    modules = scoped_modules(root)
    found = []
    for name, path in modules.items():
        found += [f"{path.relative_to(root)}:{use}" for use in module_private_uses(name, path, modules)]
    return sorted(set(found))


def module_private_uses(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """The uses of other modules' private names in the module ``name``, as ``line: what``."""
    roots = {module.split(".")[0] for module in modules}
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    bound: dict[str, str] = {}  # a name an import binds -> the module of the tree it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names if alias.name.split(".")[0] in roots]
            for alias in node.names:
                if alias.name in targets:
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] in roots:
            targets = [node.module]
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules:
                    targets.append(submodule)
                    bound[alias.asname or alias.name] = submodule
                elif is_private(alias.name) and node.module != name:
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
        else:
            continue
        found += [f"{node.lineno}: imports the private module {target}"
                  for target in targets if private_module_outside(target, name)]

    def module_of(value: ast.expr) -> str | None:
        if isinstance(value, ast.Name):
            return bound.get(value.id)
        if isinstance(value, ast.Attribute) and (base := module_of(value.value)) is not None:
            dotted = f"{base}.{value.attr}"
            return dotted if dotted in modules or dotted in roots else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = module_of(node.value)
            if owner is not None and owner != name and f"{owner}.{node.attr}" not in modules:
                found.append(f"{node.lineno}: {owner}.{node.attr}")
    return found


def over_budget(root: Path, budget: int = LINE_BUDGET) -> list[str]:
    return [
        f"{path.relative_to(root)}: {count} lines"
        for folder in BUDGETED
        for path in sorted((root / folder).rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > budget
    ]


# ---------------------------------------------------------------------------------------------
# The layout of this tree
# ---------------------------------------------------------------------------------------------


def test_the_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(import_graph(ROOT))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


#: Every tree of Python modules of this repository and the import name its modules have, for the
#: graph of the whole (issue 60: no import cycle anywhere, benchmarks included).
TREES = {"model_build": PACKAGE, "constructs": "triton_mme_cdk.constructs", "stacks": "stacks",
         "benchmarks": "benchmarks", "client/triton_mme_client": "triton_mme_client", "bootstrap": "bootstrap"}


def repository_graph(root: Path) -> dict[str, set[str]]:
    """``module -> modules it imports`` over :data:`TREES` (the same rules as :func:`import_edges`)."""
    modules: dict[str, Path] = {}
    for folder, package in TREES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [package, *path.relative_to(root / folder).with_suffix("").parts]
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    if submodule in modules or node.module in modules:
                        edges.add(submodule if submodule in modules else node.module)
        graph[name] = edges - {name}
    return graph


def test_no_tree_of_the_repository_has_an_import_cycle() -> None:
    """The constructs, the stacks, the benchmarks, the client and the bootstrap scripts too, and
    across them (a construct importing the build, the build the client)."""
    graph = repository_graph(ROOT)
    assert {"benchmarks.gpu_check", "triton_mme_client.routes", "stacks.pipeline_stack"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_units_are_layered() -> None:
    """The graph of units (a subpackage or a module at the top) has no cycle either: each unit
    sits above the ones it imports, as docs/architecture.md draws them."""
    units: dict[str, set[str]] = {}
    for module, targets in import_graph(ROOT).items():
        unit = unit_of(module)
        units.setdefault(unit, set()).update(unit_of(t) for t in targets if unit_of(t) != unit)
    cycle = find_cycle(units)
    assert cycle is None, "units import each other: " + " -> ".join(cycle or [])


def test_every_unit_says_what_it_owns_and_what_it_may_import() -> None:
    known = set(subpackages(ROOT)) | {SHARED}
    for unit in subpackages(ROOT):
        docstring = unit_docstring(ROOT, unit)
        assert "Owns:" in docstring, f"model_build/{unit}/__init__.py: no 'Owns:' paragraph"
        names = may_import(docstring)
        assert names, f"model_build/{unit}/__init__.py: no 'May import:' paragraph"
        unknown = {name for name in names if name.split(".")[0] not in known}
        assert not unknown, f"model_build/{unit}/__init__.py: May import names no unit: {sorted(unknown)}"


def test_each_unit_imports_only_what_its_docstring_allows() -> None:
    assert not layering_violations(ROOT), "\n".join(layering_violations(ROOT))


def test_no_relative_imports() -> None:
    """``runtime_files`` (what the image holds and the keys hash) follows absolute imports only."""
    relative = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in package_modules(ROOT).values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert not relative, relative


def test_no_module_exceeds_the_line_budget() -> None:
    assert not over_budget(ROOT), f"longer than {LINE_BUDGET} lines: " + ", ".join(over_budget(ROOT))


#: The most lines a function of a construct or a stack may have (issue 60).
FUNCTION_BUDGET = 80


def long_functions(root: Path, folders: tuple[str, ...] = ("constructs", "stacks"),
                   budget: int = FUNCTION_BUDGET) -> list[str]:
    """Each function or method of ``folders`` longer than ``budget`` lines, its decorators and
    docstring included."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    if (count := (node.end_lineno or node.lineno) - first + 1) > budget:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {count} lines")
    return found


def test_no_construct_or_stack_function_exceeds_80_lines(tmp_path: Path) -> None:
    assert not long_functions(ROOT), "\n".join(long_functions(ROOT))
    made_up = tmp_path / "constructs"
    made_up.mkdir()
    (made_up / "long.py").write_text("def f() -> None:\n" + "    x = 1\n" * FUNCTION_BUDGET)
    assert long_functions(tmp_path) == [f"constructs/long.py:1 f: {FUNCTION_BUDGET + 1} lines"]


def test_no_module_uses_another_modules_private_names() -> None:
    """What two modules share is public where it belongs (issue 48); see the module docstring."""
    assert not private_uses(ROOT), "\n".join(private_uses(ROOT))


def test_the_architecture_table_says_what_the_docstrings_say() -> None:
    """docs/architecture.md's table row of each unit lists the same "may import" names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| `model_build/([a-z_]+)/` \|.*\| ([^|]*) \|\s*$", text, re.MULTILINE))
    assert sorted(rows) == subpackages(ROOT), "the table's rows are not the subpackages"
    for unit, cell in rows.items():
        documented = set(re.findall(r"`([a-z_.]+)`", cell))
        assert documented == may_import(unit_docstring(ROOT, unit)), f"{unit}: the table says {sorted(documented)}"


# ---------------------------------------------------------------------------------------------
# Each check fails when it should
# ---------------------------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_lazy_import_that_closes_a_cycle_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "model_build/__init__.py": "",
        "model_build/a.py": "from triton_mme_cdk.model_build.b import B\nA = 1\n",
        "model_build/b.py": "B = 2\n\ndef f():\n    from triton_mme_cdk.model_build import a\n    return a.A\n",
    })
    assert find_cycle(import_graph(root)) == ["triton_mme_cdk.model_build.a", "triton_mme_cdk.model_build.b", "triton_mme_cdk.model_build.a"]


def test_an_import_the_docstring_does_not_allow_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "model_build/__init__.py": "",
        "model_build/errors.py": "from triton_mme_cdk.model_build.low import x\n",
        "model_build/low/__init__.py": '"""Owns: x.\n\nMay import: ``shared``.\n"""\n',
        "model_build/low/x.py": ("from triton_mme_cdk.model_build.high import y\n"
                                 "from triton_mme_cdk.model_build.errors import E\n"),
        "model_build/high/__init__.py": '"""Owns: y.\n\nMay import: ``shared``, ``low``.\n"""\n',
        "model_build/high/y.py": "from triton_mme_cdk.model_build.low.x import X\n",
    })
    assert layering_violations(root) == ["triton_mme_cdk.model_build.errors -> triton_mme_cdk.model_build.low.x",
                                         "triton_mme_cdk.model_build.low.x -> triton_mme_cdk.model_build.high.y"]


def test_a_module_over_the_budget_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"stacks/long.py": "x = 1\n" * (LINE_BUDGET + 1), "constructs/short.py": "x = 1\n"})
    assert over_budget(root) == [f"stacks/long.py: {LINE_BUDGET + 1} lines"]


def test_a_private_name_used_across_modules_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "model_build/__init__.py": "",
        "model_build/a.py": "_SECRET = 1\n__version__ = '1'\n\ndef f():\n    return _SECRET\n",
        "model_build/b.py": ("from triton_mme_cdk.model_build.a import _SECRET, __version__\n"
                             "from triton_mme_cdk.model_build import a\n"
                             "import triton_mme_cdk.model_build.a as alias\n"
                             "X = a._SECRET + alias._SECRET + a.__version__\n"),
        "model_build/c.py": "from triton_mme_cdk.model_build import a\n\nclass C:\n    _own = a.f()\n",
        "benchmarks/_common.py": "VALUE = 1\n",
        "benchmarks/run.py": "from benchmarks._common import VALUE\nfrom benchmarks.other import _helper\n",
        "benchmarks/other.py": "def _helper():\n    return 1\n",
        "stacks/s.py": "from benchmarks._common import VALUE\nimport benchmarks.other\nY = benchmarks.other._helper\n",
        "app.py": "from triton_mme_cdk.model_build import a\nZ = a._SECRET\n",
        "tests/test_a.py": "from triton_mme_cdk.model_build.a import _SECRET\n",
    })
    assert private_uses(root) == [
        "app.py:2: triton_mme_cdk.model_build.a._SECRET",
        "benchmarks/run.py:2: from benchmarks.other import _helper",
        "model_build/b.py:1: from triton_mme_cdk.model_build.a import _SECRET",
        "model_build/b.py:4: triton_mme_cdk.model_build.a._SECRET",
        "stacks/s.py:1: imports the private module benchmarks._common",
        "stacks/s.py:3: benchmarks.other._helper",
    ]


# ---------------------------------------------------------------------------------------------
# Repeated code in the product (issue 38): what `duplicates` reports is what architecture.md says
# ---------------------------------------------------------------------------------------------

#: Most pairs `duplicates` may report in the product code (tests, benchmarks and boilerplate rows left out).
MOST_DUPLICATE_PAIRS = 3
DUPLICATES_SECTION = "## What `duplicates` still reports in the product code"


def product_duplicate_pairs(report: str) -> set[frozenset[str]]:
    """The file pairs of a `duplicates` report's rows, without tests, benchmarks and boilerplate."""
    pairs = set()
    for line in report.splitlines():
        row = re.match(r"^D\d+ (\S+?):\d+-\d+ ~ (\S+?):\d+-\d+(.*)$", line)
        if row is None or "boilerplate" in row.group(3):
            continue
        files = frozenset(row.group(1, 2))
        if not any(name.startswith(("tests/", "benchmarks/")) for name in files):
            pairs.add(files)
    return pairs


def documented_duplicate_pairs(markdown: str) -> set[frozenset[str]]:
    """The pairs the last section of docs/architecture.md keeps, one table row each."""
    section = markdown[markdown.index(DUPLICATES_SECTION):]
    return {frozenset(pair) for pair in re.findall(r"^\| `(\S+\.py) ~ (\S+\.py)` \|", section, flags=re.MULTILINE)}


def test_duplicates_reports_only_the_documented_pairs() -> None:
    """At most MOST_DUPLICATE_PAIRS pairs, each explained in docs/architecture.md, and the page names
    no pair the tool no longer finds. Without the tool, the page's own table is held to the figure."""
    import shutil
    import subprocess

    documented = documented_duplicate_pairs((ROOT / "docs" / "architecture.md").read_text())
    assert 0 < len(documented) <= MOST_DUPLICATE_PAIRS, documented
    tool = shutil.which("duplicates")
    if tool is None:
        return  # not part of `make setup`: the figure on the page is what is checked then
    done = subprocess.run([tool, "--most", "200", "--seconds", "120"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert "incomplete:" not in done.stdout, done.stdout
    assert product_duplicate_pairs(done.stdout) == documented, done.stdout


def test_the_duplicates_report_is_read_as_file_pairs() -> None:
    report = (
        "5 pairs of places (9 files read), each sharing runs of 6 or more lines\n"
        "D1 a/x.py:1-9 ~ a/y.py:10-18 (+1 more run)\n"
        "D2 a/x.py:20-26 ~ tests/t.py:1-7\n"
        "D3 a/z.py:1-6 ~ a/z.py:9-14 shape boilerplate\n"
        "D4 b/p.py:3-9 ~ b/q.py:3-9 shape\n"
        "left out: 3 runs of 6 lines that stand in more than 8 places each (too common to list)\n"
    )
    assert product_duplicate_pairs(report) == {frozenset({"a/x.py", "a/y.py"}), frozenset({"b/p.py", "b/q.py"})}
    page = f"{DUPLICATES_SECTION}\n\n| pair | why |\n|---|---|\n| `a/x.py ~ a/y.py` | alike |\n"
    assert documented_duplicate_pairs(f"# T\n\n| `c.py ~ d.py` | before the section |\n\n{page}") == {
        frozenset({"a/x.py", "a/y.py"})}



#: What the client distribution may import (issue 61): the standard library, its two dependencies, itself.
CLIENT_IMPORTS = frozenset({"triton_mme_client", "numpy", "boto3", "botocore"})


def foreign_imports(folder: Path, allowed: frozenset[str]) -> dict[str, set[str]]:
    """``file -> modules`` that the modules of ``folder`` import, at module level or lazily, outside
    ``allowed`` and the standard library."""
    import sys

    found: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                if name.split(".")[0] not in allowed | sys.stdlib_module_names:
                    found.setdefault(path.name, set()).add(name)
    return found


def test_the_client_distribution_imports_nothing_of_the_construct_library() -> None:
    """``triton_mme_client`` (client/) is installed where no CDK is: none of its modules imports
    ``triton_mme_cdk`` (or anything but the standard library, numpy, boto3 and botocore)."""
    folder = ROOT / "client" / "triton_mme_client"
    assert len(list(folder.glob("*.py"))) >= 5, "the client's modules are where the rule reads them"
    assert foreign_imports(folder, CLIENT_IMPORTS) == {}


def test_the_client_rule_finds_a_lazy_import_of_the_construct_library(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("import json\nimport numpy as np\nfrom triton_mme_client.codec import decode\n")
    (tmp_path / "bad.py").write_text("def f():\n    from triton_mme_cdk.model_build.release import routes\n")
    assert foreign_imports(tmp_path, CLIENT_IMPORTS) == {"bad.py": {"triton_mme_cdk.model_build.release"}}
