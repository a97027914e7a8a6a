"""Reads the ``fmesh`` source tree with ``ast`` and lists what breaks the package's architecture rules.

* **Layers**: a module imports only from its own layer or below
  (errors <- layout <- mesh <- recipes <- context <- cli); ``fmesh/__init__.py`` is the facade.
* **Only the context needs torch**: no other module imports torch, except the one method whose
  public contract (``../shared/API.md``) is a ``torch.Tensor``.
* **Torch internals in one module**: a private torch module or name appears only in
  ``fmesh/context/_torch.py``.
* **Private means private**: a ``_name`` defined in one fmesh module is not used by another.
* **Errors in one module**: every exception and warning class is defined in ``fmesh/errors.py``.

``tests/test_architecture.py`` runs these checks on the real tree and on copies with planted violations.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import attrs

LAYERS: dict[str, int] = {
    "fmesh.errors": 0,
    "fmesh.layout": 1,
    "fmesh.mesh": 2,
    "fmesh.parallel": 3,
    "fmesh.elastic": 3,
    "fmesh.topology": 3,
    "fmesh.rendering": 3,
    "fmesh.planning": 3,
    "fmesh.costs": 3,
    "fmesh.manifest": 3,
    "fmesh.context": 4,
    "fmesh.cli": 5,
    "fmesh.__main__": 5,
}
LAYER_NAMES = ("errors", "layout", "mesh", "recipes", "context", "cli")
FACADE = "fmesh"
TYPE_ONLY = "<TYPE_CHECKING>"  # the owner of nodes under ``if TYPE_CHECKING:`` at module level
TORCH_INTERNALS = "fmesh.context._torch"
TORCH_LAYER = LAYERS["fmesh.context"]
ERRORS = "fmesh.errors"
_EXCEPTION_BASES = {"BaseException", "Exception", "ArithmeticError", "LookupError"}
# API.md section 1: ``mesh.ranks(rank)`` is a ``torch.Tensor``; the pure answer is ``Mesh.rank_grid``.
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


def modules(package: pathlib.Path) -> list[Module]:
    """Every ``.py`` file under ``package`` (the ``fmesh`` folder), parsed."""
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append(Module(".".join(parts), path, ast.parse(path.read_text(), str(path))))
    return found


def layer_of(module: str) -> int | None:
    """The layer of ``module`` (its longest prefix in :data:`LAYERS`), ``None`` if unclassified."""
    best: tuple[int, int] | None = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), layer)
    return None if best is None else best[1]


def _imports(module: Module) -> Iterator[tuple[ast.AST, str, tuple[str, ...]]]:
    """``(node, imported module, names taken from it)`` for every import, at any depth."""
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


def layering(package: pathlib.Path) -> list[Violation]:
    """Imports that go up a layer, torch in a pure layer, and unclassified modules."""
    found = []
    for module in modules(package):
        if module.name == FACADE:
            continue
        mine = layer_of(module.name)
        if mine is None:
            found.append(Violation(module.name, 1, "layers", "module is not classified in tests/architecture.py"))
            continue
        owner = _enclosing(module.tree)
        for node, target, _ in _imports(module):
            line = getattr(node, "lineno", 1)
            allowed = mine == TORCH_LAYER or (module.name, owner.get(node, "")) in TORCH_ALLOWED_IN
            if target.split(".")[0] == "torch" and not allowed:
                found.append(Violation(module.name, line, "torch-free", f"the {LAYER_NAMES[mine]} layer imports "
                                       f"{target}; only the context may"))
            if target == FACADE or not target.startswith(FACADE + "."):
                if target == FACADE:
                    found.append(Violation(module.name, line, "layers", "imports the facade 'fmesh'; import the "
                                           "module that defines the name"))
                continue
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                found.append(Violation(module.name, line, "layers", f"{LAYER_NAMES[mine]} module imports {target} "
                                       f"from the {LAYER_NAMES[theirs]} layer above it"))
    return found


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


def privacy(package: pathlib.Path) -> list[Violation]:
    """Private names used outside their module, and torch internals outside ``_torch``."""
    parsed = modules(package)
    defined = {module.name: _defined_private_names(module) for module in parsed}
    ours = set().union(*defined.values())
    found = []
    for module in parsed:
        own = defined[module.name]
        for node, target, names in _imports(module):
            line = getattr(node, "lineno", 1)
            if target.split(".")[0] == "torch" and _is_private_path(target) and module.name != TORCH_INTERNALS:
                found.append(Violation(module.name, line, "torch-internals", f"imports private torch module {target}"))
            for name in names:
                if not _private(name):
                    continue
                if target.split(".")[0] == "torch" and module.name != TORCH_INTERNALS:
                    found.append(Violation(module.name, line, "torch-internals", f"imports {name} from {target}"))
                elif target.startswith(FACADE) and f"{target}.{name}" != TORCH_INTERNALS:
                    found.append(Violation(module.name, line, "privacy", f"imports private {name} from {target}"))
                elif f"{target}.{name}" == TORCH_INTERNALS and not module.name.startswith("fmesh.context"):
                    found.append(Violation(module.name, line, "privacy", "only fmesh.context may use _torch"))
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr) or node.attr in own:
                continue
            if isinstance(node.value, ast.Name) and node.value.id == "_torch":
                continue  # the module itself, by name
            if module.name == TORCH_INTERNALS:
                continue  # its job: torch's private fields (some share a name with ours, e.g. _rank_map)
            if node.attr in ours:
                found.append(Violation(module.name, node.lineno, "privacy",
                                       f"uses {node.attr}, private to another fmesh module"))
            elif module.name != TORCH_INTERNALS:
                found.append(Violation(module.name, node.lineno, "torch-internals",
                                       f"uses {node.attr}, a private name fmesh does not define (torch's?)"))
    return found


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def exception_homes(package: pathlib.Path) -> list[Violation]:
    """Exception and warning classes defined outside ``fmesh/errors.py``."""
    found = []
    for module in modules(package):
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


def all_violations(package: pathlib.Path) -> list[Violation]:
    """Every rule at once."""
    return [*layering(package), *privacy(package), *exception_homes(package)]
