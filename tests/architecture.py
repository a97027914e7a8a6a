"""Reads the ``fmesh`` source tree with ``ast`` and lists what breaks the package's architecture rules.

* **Layers**: a module imports only from its own layer or below. Bottom to top: errors <- layout <- mesh (the
  values) <- plan (reasoning about a job without a process group, itself in four steps: the planner
  (communicators, topology) <- the recipes (parallel, costs, rescale) <- the reports (jobs, manifest, manifest
  diff, recovery) <- the tables the command line prints) <- pictures (in two steps: the drawing (the grid model,
  its text and HTML, the sharding picture from plain shapes) <- the pictures of values (meshes, traffic; the
  package, and ``fmesh.rendering``, its former name)) <- context (the store protocols of ``fmesh.context.store`` in
  three steps, words <- meeting and board <- protocols, under the rest of the context) <- spmd <- cli <- bench;
  ``fmesh/__init__.py`` is the facade. A module of ``fmesh.plan`` that is not listed below stands at the top of the
  plan (the ``fmesh.plan`` package itself); a module of ``fmesh.pictures`` not listed stands with the pictures of
  values. The sharding picture's values (``Sharding``, a DTensor) live above the context, in ``fmesh.spmd``, which
  cuts them into plain pieces for :mod:`fmesh.pictures.sharding`.
* **The runtime stands on the planner**: ``fmesh.context`` takes from ``fmesh.plan`` only the planner
  (:data:`CONTEXT_MAY_USE`), not the recipes or the reports.
* **No cycles**: no two modules import each other, even through imports inside functions (an import under
  ``if TYPE_CHECKING:`` does not run and does not count).
* **Only the context needs torch**: no other fmesh module imports torch, except ``fmesh.spmd`` (typed sharded
  computation on torch tensors, above the context) and the one method whose public contract is a
  ``torch.Tensor`` (``Mesh.ranks``; the pure answer is ``Mesh.rank_grid``); ``bench/`` compares with torch and may.
* **Torch internals in one module**: a private torch module or name appears only in
  ``fmesh/context/_torch.py``, whether written as an attribute or as a string (``getattr(x, "_y")``).
  ``bench/`` times what torch's users write (``DeviceMesh._flatten``) and may use torch's private names.
* **Private means private**: a ``_name`` defined in one fmesh module is not used by another (nor by ``bench/``).
* **Errors in one module**: every exception and warning class is defined in ``fmesh/errors.py``.
* **Small rooms**: no file of ``fmesh/`` over :data:`MAX_FILE_LINES` lines, no class over
  :data:`MAX_CLASS_CODE_LINES` lines of code (docstrings, comments and blank lines aside), but for the modules
  :data:`OVERSIZED` names with the work that will bring them under.

The tree is parsed once (:func:`parse_tree`); every rule reads the parsed :class:`Module` list, so
``tests/system/test_architecture.py`` plants a violation by replacing one module's parse, not by copying files.
"""

from __future__ import annotations

import ast
import functools
import pathlib
from collections.abc import Container, Iterator, Sequence

import attrs

# Bottom to top; a module may import its own layer or one below.
_ORDER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("errors", ("fmesh.errors",)),
    ("layout", ("fmesh.layout",)),
    ("mesh", ("fmesh.mesh",)),
    ("plan: planner", ("fmesh.plan.communicators", "fmesh.plan.topology")),
    ("plan: recipes", ("fmesh.plan.parallel", "fmesh.plan.costs", "fmesh.plan.rescale", "fmesh.plan.model",
                       "fmesh.plan.hardware")),
    ("plan: reports", ("fmesh.plan.jobs", "fmesh.plan.manifest", "fmesh.plan.manifest_diff", "fmesh.plan.recovery",
                       "fmesh.plan.memory", "fmesh.plan.traffic", "fmesh.plan.step", "fmesh.plan.search",
                       "fmesh.plan.model_plan")),
    ("plan: tables", ("fmesh.plan.table", "fmesh.plan.job_table", "fmesh.plan.manifest_table",
                      "fmesh.plan.diff_table", "fmesh.plan.recovery_table", "fmesh.plan.model_table")),
    ("plan", ("fmesh.plan",)),
    ("pictures: drawing", ("fmesh.pictures.grid", "fmesh.pictures.text", "fmesh.pictures.markup",
                           "fmesh.pictures.sharding")),
    ("pictures", ("fmesh.pictures", "fmesh.rendering")),
    # The store protocols stand under the rest of the context, in three steps: what they write and wait with (the
    # keys, the records, the one blocking wait, the sockets of the groups, the heartbeat) <- the meeting and the status
    # board <- the protocols themselves (the start rendezvous, the agreement and its diagnosis, the roll call, the
    # recovery's vote); the Context's rooms (groups, collectives, failures, the Context) stand on them.
    ("context: store words", ("fmesh.context.store.keys", "fmesh.context.store.records", "fmesh.context.store.wait",
                              "fmesh.context.store.connections", "fmesh.context.store.pulse")),
    ("context: store meeting", ("fmesh.context.store.meeting", "fmesh.context.store.board")),
    ("context: store protocols", ("fmesh.context.store",)),
    ("context", ("fmesh.context",)),
    ("spmd", ("fmesh.spmd",)),
    ("cli", ("fmesh.cli", "fmesh.__main__")),
    ("bench", ("bench",)),
)
LAYERS: dict[str, int] = {module: layer for layer, (_, names) in enumerate(_ORDER) for module in names}
LAYER_NAMES = tuple(name for name, _ in _ORDER)
FACADE = "fmesh"
TYPE_ONLY = "<TYPE_CHECKING>"  # the owner of nodes under ``if TYPE_CHECKING:`` at module level
TORCH_INTERNALS = "fmesh.context._torch"
TORCH_LAYERS = {LAYERS["fmesh.context"], LAYERS["fmesh.context.store"], LAYERS["fmesh.context.store.meeting"],
                LAYERS["fmesh.context.store.keys"], LAYERS["fmesh.spmd"], LAYERS["bench"]}
CONTEXT = "fmesh.context"
PLAN = "fmesh.plan"
# What the Context may take from the plan: the planner (the communicators and their one recovery rule; hosts).
CONTEXT_MAY_USE = frozenset({"fmesh.plan.communicators", "fmesh.plan.topology"})
BENCH = "bench"
MAX_FILE_LINES = 600
MAX_CLASS_CODE_LINES = 300
# Modules over the limits, each with the work that brings it under (drop the entry then: a test says so).
OVERSIZED: dict[str, str] = {}
ERRORS = "fmesh.errors"
_EXCEPTION_BASES = {"BaseException", "Exception", "ArithmeticError", "LookupError"}
# ``mesh.ranks(rank)`` is a ``torch.Tensor`` (its public contract); the pure answer is ``Mesh.rank_grid``.
TORCH_ALLOWED_IN = {("fmesh.mesh.mesh", "Mesh.ranks"), ("fmesh.mesh.mesh", TYPE_ONLY)}


@attrs.frozen
class Violation:
    module: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: [{self.rule}] {self.detail}"


@attrs.frozen
class Module:
    name: str
    path: pathlib.Path
    tree: ast.Module
    text: str = attrs.field(default="", repr=False)  # the source parsed (a planted violation's included)

    def lines(self) -> list[str]:
        return (self.text or self.path.read_text()).splitlines()


def modules(package: pathlib.Path) -> list[Module]:
    """Every ``.py`` file under ``package`` (the ``fmesh`` or ``bench`` folder), parsed."""
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        text = path.read_text()
        found.append(Module(".".join(parts), path, ast.parse(text, str(path)), text))
    return found


def parse_tree(*packages: pathlib.Path) -> tuple[Module, ...]:
    """Every module of ``packages`` (``fmesh/`` and ``bench/``), parsed once for all the rules."""
    return tuple(module for package in packages for module in modules(package))


def planted(tree: Sequence[Module], name: str, code: str) -> tuple[Module, ...]:
    """``tree`` with ``code`` appended to module ``name`` (re-parsed): a violation planted without copying files."""
    found = [m for m in tree if m.name == name]
    assert found, f"no module {name}"
    source = found[0].path.read_text() + "\n" + code
    changed = Module(name, found[0].path, ast.parse(source, str(found[0].path)), source)
    return tuple(changed if m.name == name else m for m in tree)


def layer_of(module: str) -> int | None:
    """The layer of ``module`` (its longest prefix in :data:`LAYERS`), ``None`` if unclassified."""
    best: tuple[int, int] | None = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), layer)
    return None if best is None else best[1]


@functools.cache  # each module is read once however many rules and planted trees ask
def _imports(module: Module) -> tuple[tuple[ast.AST, str, tuple[str, ...]], ...]:
    """``(node, imported module, names taken from it)`` for every import, at any depth."""
    return tuple(_find_imports(module))


def _find_imports(module: Module) -> Iterator[tuple[ast.AST, str, tuple[str, ...]]]:
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = module.name.split(".")
                if module.path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node, target, tuple(alias.name for alias in node.names)


@functools.cache
def _enclosing(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node -> the qualified name of the function or class around it (``""`` at module level)."""
    owner: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = name
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{name}.{child.name}" if name else child.name
            elif isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING" and not name:
                inner = TYPE_ONLY
            owner[child] = inner
            visit(child, inner)

    visit(tree, "")
    return owner


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_private_path(dotted: str) -> bool:
    return any(_private(part) for part in dotted.split("."))


def layering(tree: Sequence[Module]) -> list[Violation]:
    """Imports that go up a layer, torch in a pure layer, and unclassified modules."""
    found = []
    for module in tree:
        if module.name == FACADE:
            continue
        mine = layer_of(module.name)
        if mine is None:
            found.append(Violation(module.name, 1, "layers", "module is not classified in tests/architecture.py"))
            continue
        owner = _enclosing(module.tree)
        for node, target, _ in _imports(module):
            line = getattr(node, "lineno", 1)
            allowed = mine in TORCH_LAYERS or (module.name, owner.get(node, "")) in TORCH_ALLOWED_IN
            if target.split(".")[0] == "torch" and not allowed:
                found.append(Violation(module.name, line, "torch-free", f"the {LAYER_NAMES[mine]} layer imports "
                                       f"{target}; only the context (and spmd) may"))
            if target == FACADE or not target.startswith(FACADE + "."):
                if target == FACADE and not _in_bench(module.name):  # bench/ is a client: it uses the facade
                    found.append(Violation(module.name, line, "layers", "imports the facade 'fmesh'; import the "
                                           "module that defines the name"))
                continue
            theirs = layer_of(target)
            if _in(module.name, CONTEXT) and _in(target, PLAN) and not any(_in(target, m) for m in CONTEXT_MAY_USE):
                found.append(Violation(module.name, line, "layers", f"the context imports {target}; it takes from "
                                       f"the plan only {', '.join(sorted(CONTEXT_MAY_USE))}"))
            if theirs is not None and theirs > mine:
                found.append(Violation(module.name, line, "layers", f"{LAYER_NAMES[mine]} module imports {target} "
                                       f"from the {LAYER_NAMES[theirs]} layer above it"))
    return found


@functools.cache
def _defined_private_names(module: Module) -> set[str]:
    names = set()
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _private(node.target.id):
            names.add(node.target.id)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr") or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__"
        ):
            for arg in node.args[1:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _private(arg.value):
                    names.add(arg.value)
    return names


@functools.cache
def _attribute_uses(module: Module) -> tuple[tuple[int, str], ...]:
    """``(line, name)`` of every attribute read: ``x.name``, and ``getattr``/``hasattr``/``setattr``/``delattr``
    (or ``operator.attrgetter``) given the name as a string constant."""
    return tuple(_find_attribute_uses(module))


def _find_attribute_uses(module: Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "_torch":
                continue  # the module itself, by name
            yield node.lineno, node.attr
        elif isinstance(node, ast.Call) and _base_name(node.func) in _BY_STRING:
            position = _BY_STRING[_base_name(node.func)]
            for arg in node.args[position:position + 1]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield node.lineno, arg.value


_BY_STRING = {"getattr": 1, "hasattr": 1, "setattr": 1, "delattr": 1, "attrgetter": 0}


def privacy(tree: Sequence[Module]) -> list[Violation]:
    """Private names used outside their module, and torch internals outside ``_torch``."""
    fmesh = [module for module in tree if not _in_bench(module.name)]
    defined = {module.name: _defined_private_names(module) for module in tree}
    ours = set().union(*(defined[module.name] for module in fmesh))
    found = []
    for module in tree:
        own = defined[module.name]
        bench = _in_bench(module.name)
        for node, target, names in _imports(module):
            line = getattr(node, "lineno", 1)
            if (target.split(".")[0] == "torch" and _is_private_path(target) and module.name != TORCH_INTERNALS
                    and not bench):
                found.append(Violation(module.name, line, "torch-internals", f"imports private torch module {target}"))
            for name in names:
                if not _private(name):
                    continue
                if target.split(".")[0] == "torch" and module.name != TORCH_INTERNALS and not bench:
                    found.append(Violation(module.name, line, "torch-internals", f"imports {name} from {target}"))
                elif target.startswith(FACADE) and f"{target}.{name}" != TORCH_INTERNALS:
                    found.append(Violation(module.name, line, "privacy", f"imports private {name} from {target}"))
                elif f"{target}.{name}" == TORCH_INTERNALS and (bench or not module.name.startswith("fmesh.context")):
                    found.append(Violation(module.name, line, "privacy", "only fmesh.context may use _torch"))
        for line, attr in _attribute_uses(module):
            if not _private(attr) or attr in own:
                continue
            if module.name == TORCH_INTERNALS:
                continue  # its job: torch's private fields (some share a name with ours, e.g. _rank_map)
            if attr in ours and not (bench and attr in _TORCH_NAMES_WE_SHARE):
                found.append(Violation(module.name, line, "privacy", f"uses {attr}, private to another fmesh module"))
            elif not bench and attr not in ours:
                found.append(Violation(module.name, line, "torch-internals",
                                       f"uses {attr}, a private name fmesh does not define (torch's?)"))
    return found


# Names that are both a private field of torch's DeviceMesh (which bench/ may read) and one of ours.
_TORCH_NAMES_WE_SHARE = frozenset({"_flatten", "_unflatten", "_rank_map", "_layout", "_concatenate"})


def _in(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or inside it."""
    return module == package or module.startswith(package + ".")


def _in_bench(module: str) -> bool:
    return _in(module, BENCH)


def _edges(tree: Sequence[Module]) -> dict[str, set[str]]:
    """Module -> the tree's modules it imports, at any depth (``if TYPE_CHECKING:`` imports do not run)."""
    names = {module.name for module in tree}
    edges: dict[str, set[str]] = {module.name: set() for module in tree}
    for module in tree:
        owner = _enclosing(module.tree)
        for node, target, taken in _imports(module):
            if owner.get(node) == TYPE_ONLY:
                continue
            for name in taken or ("",):
                submodule = f"{target}.{name}"
                found = submodule if submodule in names else target if target in names else None
                if found is not None and found != module.name:
                    edges[module.name].add(found)
    return edges


def cycles(tree: Sequence[Module]) -> list[Violation]:
    """Modules that import each other, directly or through others, even by imports inside functions."""
    edges = _edges(tree)
    found = []
    for start in sorted(edges):
        seen: dict[str, list[str]] = {start: [start]}
        todo = [start]
        while todo:
            here = todo.pop()
            for there in sorted(edges[here]):
                if there == start and (len(seen[here]) > 1 or here == start):
                    path = seen[here] + [start]
                    if start == min(path[:-1]):  # report each cycle once, from its smallest module
                        found.append(Violation(start, 1, "cycles", "import cycle " + " -> ".join(path)))
                elif there not in seen:
                    seen[there] = seen[here] + [there]
                    todo.append(there)
    return found


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def exception_homes(tree: Sequence[Module]) -> list[Violation]:
    """Exception and warning classes defined outside ``fmesh/errors.py``."""
    found = []
    for module in tree:
        if module.name == ERRORS:
            continue
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [_base_name(base) for base in node.bases]
            if any(b in _EXCEPTION_BASES or b.endswith(("Error", "Warning", "Exception")) for b in bases):
                found.append(Violation(module.name, node.lineno, "errors",
                                       f"class {node.name}({', '.join(bases)}) belongs in fmesh/errors.py"))
    return found


def all_violations(tree: Sequence[Module]) -> list[Violation]:
    """Every rule at once."""
    return [*layering(tree), *cycles(tree), *privacy(tree), *exception_homes(tree), *sizes(tree)]


def code_lines(module: Module) -> int:
    """The lines of ``module`` that are code: not blank, not a comment, not a docstring (what "the Context under 250
    code lines" counts)."""
    return len(_code_line_numbers(module))


def _code_line_numbers(module: Module) -> set[int]:
    docstrings: set[int] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return {number for number, line in enumerate(module.lines(), 1)
            if line.strip() and not line.strip().startswith("#") and number not in docstrings}


def sizes(tree: Sequence[Module], exempt: Container[str] = OVERSIZED.keys()) -> list[Violation]:
    """Files of ``fmesh/`` over :data:`MAX_FILE_LINES` lines and classes over :data:`MAX_CLASS_CODE_LINES` code
    lines (but the modules in ``exempt``)."""
    found = []
    for module in tree:
        if not _in(module.name, FACADE) or module.name in exempt:
            continue
        lines = len(module.lines())
        if lines > MAX_FILE_LINES:
            found.append(Violation(module.name, 1, "size", f"{lines} lines, over {MAX_FILE_LINES}: split it into "
                                   "modules of one concept each"))
        code = _code_line_numbers(module)
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                inside = sum(1 for number in code if node.lineno <= number <= (node.end_lineno or node.lineno))
                if inside > MAX_CLASS_CODE_LINES:
                    found.append(Violation(module.name, node.lineno, "size", f"class {node.name} has {inside} "
                                           f"lines of code, over {MAX_CLASS_CODE_LINES}: give its jobs rooms of "
                                           "their own"))
    return found
