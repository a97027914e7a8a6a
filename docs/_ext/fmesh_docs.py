"""A small Sphinx extension for fmesh's docs.

* ``.. fmesh-errors::`` renders the error catalogue, a table of every class in :mod:`fmesh.errors` (its base and
  the first paragraph of its docstring), from the code: the docs hold no second copy.
* Every public object is documented once, at its public path (``fmesh.Mesh``, ``fmesh.plan.topology.AxisSpan``).
  References written where an object is defined (``:class:`Mesh``` inside ``fmesh.mesh.mesh``,
  ``fmesh.plan.costs.cost``) are resolved to that public path; members of a public module that are also published
  at the top level are left off the module's page.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import types
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

import fmesh


@functools.cache  # one answer per build: every cross-reference asks
def public_modules() -> list[types.ModuleType]:
    """The modules whose names are public beside the front door: the values' (:mod:`fmesh.mesh`), the Context's
    (:mod:`fmesh.context`), :mod:`fmesh.errors`, :mod:`fmesh.plan` and each of its modules, the pictures
    (:mod:`fmesh.pictures` and its grid, text, markup and sharding modules) and :mod:`fmesh.layout` (the algebra's own
    functions)."""
    import fmesh.context
    import fmesh.layout
    import fmesh.mesh
    import fmesh.pictures
    import fmesh.pictures.grid
    import fmesh.pictures.markup
    import fmesh.pictures.sharding
    import fmesh.pictures.text
    import fmesh.plan

    plan = [getattr(fmesh.plan, name) for name in fmesh.plan.__all__]
    pictures = [fmesh.pictures, *(getattr(fmesh.pictures, name) for name in ("grid", "text", "markup", "sharding"))]
    return [fmesh.mesh, fmesh.context, fmesh.errors, fmesh.plan, *plan, *pictures, fmesh.layout]


@functools.cache
def public_paths() -> dict[int, str]:
    """``id(object) -> public dotted path`` for every public object: ``fmesh.NAME`` first, then ``fmesh.MODULE.NAME``
    for the names in a public module's ``__all__`` that are not published at the top."""
    paths: dict[int, str] = {}
    for name in fmesh.__all__:
        value = getattr(fmesh, name)
        if not isinstance(value, types.ModuleType):
            paths[id(value)] = f"fmesh.{name}"
    for module in public_modules():
        paths[id(module)] = module.__name__
        for member in getattr(module, "__all__", ()):
            paths.setdefault(id(getattr(module, member)), f"{module.__name__}.{member}")
    return paths


@functools.cache
def _lookup(dotted: str) -> Any:
    """The object a dotted path names, or ``None``: attributes first (``fmesh.context.launch`` is the function
    the package exports, not its submodule of that name), importing a submodule only where no attribute is."""
    parts = dotted.split(".")
    try:
        value: Any = importlib.import_module(parts[0])
    except ImportError:
        return None
    for index, part in enumerate(parts[1:], start=1):
        if hasattr(value, part):
            value = getattr(value, part)
            continue
        try:
            value = importlib.import_module(".".join(parts[: index + 1]))
        except ImportError:
            return None
    return value


def public_target(target: str, module: str | None, cls: str | None) -> str | None:
    """The public path of what ``target`` names, read from where it was written (``module``, ``cls``)."""
    paths = public_paths()
    target = target.lstrip("~.")
    candidates = [target]
    if module:
        candidates[:0] = [f"{module}.{cls}.{target}", f"{module}.{target}"] if cls else [f"{module}.{target}"]
    # Written in a published object's docstring (``fmesh.cost`` saying :data:`H100_IB`): the public modules' names.
    candidates += [f"{m.__name__}.{target}" for m in public_modules()]
    for candidate in candidates:
        parts = candidate.split(".")
        # The longest prefix that is a public object; the rest are its attributes (a method, a field).
        for cut in range(len(parts), 0, -1):
            value = _lookup(".".join(parts[:cut]))
            if value is not None and id(value) in paths and _lookup(candidate) is not None:
                return ".".join([paths[id(value)], *parts[cut:]])
    return None


def resolve_public(app: Sphinx, env: Any, node: Any, contnode: nodes.Node) -> nodes.Node | None:
    if node.get("refdomain") != "py":
        return None
    target = public_target(node["reftarget"], node.get("py:module"), node.get("py:class"))
    if target is None or target == node["reftarget"]:
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], target, node, contnode)


def skip_republished(app: Sphinx, what: str, name: str, value: Any, skip: bool, options: Any) -> bool | None:
    """Leave off a module page the members documented at the top level (``fmesh.plan.costs.cost`` is
    ``fmesh.cost``)."""
    if what != "module":
        return None
    published = (getattr(fmesh, n) for n in fmesh.__all__)
    return True if any(v is value for v in published if not isinstance(v, types.ModuleType)) else None


def attrs_defaults(app: Sphinx, what: str, name: str, value: Any, options: Any, signature: str | None,
                   return_annotation: str | None) -> tuple[str | None, str | None] | None:
    """An attrs class's signature shows ``attr_dict['offset'].default`` for a default (its generated ``__init__``
    names it so): show the default itself where its repr is Python (``0``, ``()``), else ``...``."""
    if signature is None or "attr_dict[" not in signature or not hasattr(value, "__attrs_attrs__"):
        return None
    defaults = {field.name.lstrip("_"): field.default for field in value.__attrs_attrs__}

    def shown(match: re.Match[str]) -> str:
        text = repr(defaults.get(match.group(1), ...))
        try:
            ast.parse(text, mode="eval")
        except SyntaxError:
            return "..."
        return text

    return re.sub(r"attr_dict\['(\w+)'\]\.default", shown, signature), return_annotation


class ErrorCatalogue(SphinxDirective):
    """A table of fmesh's exceptions and warnings, read from :mod:`fmesh.errors`."""

    def run(self) -> list[nodes.Node]:
        import fmesh.errors

        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 25 15 60", "", "   * - class", "     - is a",
                 "     - raised when"]
        for name in fmesh.errors.__all__:
            cls = getattr(fmesh.errors, name)
            summary = " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())
            base = cls.__mro__[1].__name__
            path = f"fmesh.{name}" if name in fmesh.__all__ else f"fmesh.errors.{name}"
            lines += [f"   * - :class:`{path}`", f"     - ``{base}``", f"     - {summary}"]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="fmesh.errors"), self.content_offset, container)
        return container.children


class MeshPicture(SphinxDirective):
    """``.. fmesh-picture::`` with a Python expression as content (``fmesh`` in scope): the HTML picture
    :func:`fmesh.pictures.html` draws of it, made when the docs are built (never a stale copy)."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        value = eval("\n".join(self.content), {"fmesh": fmesh})  # the docs' own source, not user input
        picture = value if isinstance(value, str) else fmesh.pictures.html(value)
        return [nodes.raw("", picture, format="html")]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("fmesh-errors", ErrorCatalogue)
    app.add_directive("fmesh-picture", MeshPicture)
    app.connect("missing-reference", resolve_public)
    app.connect("autodoc-skip-member", skip_republished)
    app.connect("autodoc-process-signature", attrs_defaults)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
