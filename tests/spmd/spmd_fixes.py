"""Every fix the checker prints, applied to the program mechanically: the error's record
(:class:`fmesh.spmd.fix.Fix`, from which its message's ``fix: ...`` is made) says which edit; where comes from the
run it was raised in, as a reader finds the line in a traceback.

A program runs under a :class:`Trace`: the ``ax`` it receives is a :class:`Proxy`, and a torch function mode counts
the program's own calls (torch calls and ``ax`` calls in one sequence; the calls an edit inserts, and the calls
inside ``ax``'s collectives, are not counted). An error raised in call ``n`` is located there (an :class:`Edit`:
the fix, ``n``, and where among the call's arguments the fix's value sits); an edit at call ``n`` is applied when
the run of the edited program reaches call ``n`` again. A fix that names the call that made a value (``made``)
is located by the mark each call leaves on what it makes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from spmd_harness import Program
from torch.overrides import TorchFunctionMode

from fmesh.errors import SpmdTypeError
from fmesh.spmd.fix import Fix

Path = tuple[Any, ...]  # ("args", 2) / ("args", 0, 1) / ("kwargs", "attn_mask")


@attrs.frozen
class Edit:
    """A fix located: at call ``at`` of the program (``None``: at an output or its spec), on the argument at
    ``path`` (an insert)."""

    fix: Fix
    at: int | None = None
    path: Path = ()


def _paths(args: Sequence[Any], kwargs: dict[str, Any]) -> list[tuple[Path, Any]]:
    found: list[tuple[Path, Any]] = []
    for k, value in enumerate(args):
        found.append((("args", k), value))
        if isinstance(value, (list, tuple)):
            found.extend((("args", k, j), v) for j, v in enumerate(value))
    found.extend((("kwargs", key), value) for key, value in kwargs.items())
    return found


def _is(value: Any, target: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value is target or getattr(target, "_base", None) is value)


def _get(args: Sequence[Any], kwargs: dict[str, Any], path: Path) -> Any:
    if path[0] == "kwargs":
        return kwargs[path[1]]
    value = args[path[1]]
    return value[path[2]] if len(path) > 2 else value


def _set(args: Sequence[Any], kwargs: dict[str, Any], path: Path, new: Any) -> tuple[list[Any], dict[str, Any]]:
    args, kwargs = list(args), dict(kwargs)
    if path[0] == "kwargs":
        kwargs[path[1]] = new
    elif len(path) > 2:
        inner = list(args[path[1]])
        inner[path[2]] = new
        args[path[1]] = type(args[path[1]])(inner) if isinstance(args[path[1]], tuple) else inner
    else:
        args[path[1]] = new
    return args, kwargs


def _mark(result: Any, n: int) -> None:
    for value in (result if isinstance(result, (list, tuple)) else [result]):
        if isinstance(value, torch.Tensor) and not hasattr(value, "_fix_made"):
            value._fix_made = n  # type: ignore[attr-defined]


# A product's bias moved after the reduction: (the bias's argument, the product without it)
_BIASED: dict[str, tuple[Path, Callable[..., torch.Tensor]]] = {
    "addmm": (("args", 0), lambda a, k: torch.mm(a[1], a[2])),
    "linear": (("args", 2), lambda a, k: F.linear(a[0], a[1])),
}


class Trace(TorchFunctionMode):  # type: ignore[misc]
    """One run of the program: its calls counted, the edits at each applied, an error located."""

    def __init__(self, ax: Any, edits: Sequence[Edit]) -> None:
        super().__init__()
        self.ax, self.count, self.inside = ax, 0, 0
        self.edits: dict[int, list[Edit]] = {}
        for edit in edits:
            if edit.at is not None:
                self.edits.setdefault(edit.at, []).append(edit)

    def locate(self, error: SpmdTypeError, n: int | None, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """``error``'s fix located at call ``n`` (with its arguments), once (the innermost call names it)."""
        if not hasattr(error, "edit"):
            error.edit = locate(error.fix, n, args, kwargs)  # type: ignore[attr-defined]

    def call(self, n: int, func: Callable[..., Any], name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Call ``n`` (``func``, named ``name``), its edits applied; an error located; what it makes marked."""
        ax = self.ax
        for edit in self.edits.get(n, []):
            fix = edit.fix
            if fix.action == "insert":
                value = _get(args, kwargs, edit.path)
                new = getattr(ax, fix.call)(value, fix.axes, **dict(fix.kwargs))
                paths = [p for p, _ in _paths(args, kwargs)]
                for path, other in _paths(args, kwargs):  # the value where the call reads it again after (keys, values)
                    if other is value and paths.index(path) >= paths.index(edit.path):
                        args, kwargs = _set(args, kwargs, path, new)
            elif fix.action in ("replace", "drop", "bias", "mask", "argument", "offset"):
                func = self._edited(func, name, fix, args, kwargs)
        for path, value in _paths(args, kwargs):
            if isinstance(value, torch.Tensor):
                value._fix_used = (n, path)  # type: ignore[attr-defined]
        try:
            result = func(*args, **kwargs)
        except SpmdTypeError as error:
            self.locate(error, n, args, kwargs)
            raise
        _mark(result, n)
        return result

    def _edited(self, func: Callable[..., Any], name: str, fix: Fix, args: Sequence[Any],
                kwargs: dict[str, Any]) -> Callable[..., Any]:
        ax = self.ax
        options = dict(fix.kwargs)
        if fix.action == "drop":
            return lambda *a, **k: a[0]
        if fix.action == "replace":
            return lambda *a, **k: getattr(ax, fix.call)(a[0], fix.axes, **options)
        if fix.action == "bias":
            where, product = _BIASED[name]

            def biased(*a: Any, **k: Any) -> Any:
                return getattr(ax, fix.call)(product(a, k), fix.axes) + _get(a, k, where)
            return biased
        if fix.action == "mask":
            def masked(*a: Any, **k: Any) -> Any:
                q_len, k_len = a[0].shape[-2], a[1].shape[-2]
                positions = torch.arange(q_len) + ax.axis_index(fix.axes[0]) * q_len
                k = {**k, "attn_mask": positions[:, None] >= torch.arange(k_len)[None, :], "is_causal": False}
                return func(*a[:3], **k)
            return masked
        if fix.action == "argument":
            return lambda *a, **k: func(a[0], **{**k, options["name"]: ax.axis_index(fix.axes[0]) * options["scale"]})
        if fix.action == "offset" and fix.made:  # narrow(x, dim, start, length): this member's block
            def cut(*a: Any, **k: Any) -> Any:
                x, dim, start, length = a[:4]
                return func(x, dim, start + ax.axis_index(fix.axes[0]) * length, length, **k)
            return cut
        if fix.action == "offset":  # tensor[index] = value: the index of dimension ``dim`` shifted
            def shifted(*a: Any, **k: Any) -> Any:
                tensor, index = a[0], a[1]
                where = list(index) if isinstance(index, tuple) else [index]
                d = options["dim"] + tensor.dim()
                while len(where) <= d:
                    where.append(slice(None))
                cut = where[d]
                offset = ax.axis_index(fix.axes[0]) * options["length"]
                start = cut.start or 0 if isinstance(cut, slice) else cut
                where[d] = slice(offset + start, offset + start + options["length"])
                return func(tensor, tuple(where), *a[2:], **k)
            return shifted
        raise AssertionError(fix)


def locate(fix: Fix | None, n: int | None = None, args: Sequence[Any] = (),
           kwargs: dict[str, Any] | None = None) -> Edit | None:
    """Where ``fix`` applies, raised in call ``n`` (``None``: in none of the program's calls), with its arguments;
    ``None`` where no edit can be made."""
    if fix is None or fix.action == "text":
        return None
    if fix.action == "spec" or (fix.output is not None and not fix.made):
        return Edit(fix)
    if fix.made:
        made = getattr(fix.target, "_fix_made", None)
        return Edit(fix, made) if made is not None else None
    if fix.action == "insert" and n is not None:
        path = next((p for p, v in _paths(args, kwargs or {}) if _is(v, fix.target)), None)
        if path is None and fix.target is not None and _is(args[0] if args else None, fix.target):
            path = ("args", 0)
        if path is not None:
            return Edit(fix, n, path)
    if fix.action == "insert":  # raised where no call of the program is under way: at the call that last used it
        used = getattr(fix.target, "_fix_used", None)
        return Edit(fix, *used) if used is not None else None
    return Edit(fix, n) if n is not None else None


def located(error: SpmdTypeError) -> Edit | None:
    """The edit ``error``'s fix makes: located in the run (:class:`Trace`), or else from the record alone (an
    output, a spec, the call that made a value)."""
    return error.edit if hasattr(error, "edit") else locate(error.fix)  # type: ignore[no-any-return]


def fixed(program: Program, rounds: int = 6) -> tuple[Program, list[str]]:
    """``program`` with every fix the checked run prints applied, one after another until it runs (at most
    ``rounds``): the program, and the fixes printed."""
    from spmd_harness import run

    edits: list[Edit] = []
    printed: list[str] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the 4 rank threads each compute (as judge does)
    try:
        return _fixed(program, rounds, edits, printed, run)
    finally:
        torch.set_num_threads(threads)


def _fixed(program: Program, rounds: int, edits: list[Edit], printed: list[str],
           run: Callable[..., Any]) -> tuple[Program, list[str]]:
    for _ in range(rounds):
        outcome = run(applied(program, edits), True, [])
        if outcome.error is None:
            return applied(program, edits), printed
        printed.append(str(outcome.error.fix))
        edit = located(outcome.error)
        if edit is None:
            raise Unfixed("no edit", str(outcome.type_error))
        edits.append(edit)
    raise Unfixed("still refused", f"after {rounds} fixes: {printed}")


class Unfixed(AssertionError):
    """A program the printed fixes did not make pass the check: ``no edit`` (a fix no tool makes, or one not
    located) or ``still refused`` (after the most rounds)."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(f"{why}: {message}")
        self.why = why


def fix_verdict(program: Program) -> tuple[str, list[str]]:
    """What the fixes printed for a refused ``program`` make of it, applied: ``right`` (equal to one process),
    ``silently wrong``, ``loud`` (torch refuses the fixed program's shapes), ``no edit``, ``still refused``."""
    from spmd_harness import judge

    try:
        fixed_program, printed = fixed(program)
    except Unfixed as error:
        return error.why, []
    verdict, _ = judge(fixed_program)
    return ("right" if verdict == "right" else "silently wrong" if verdict == "silently wrong" else
            "loud" if verdict == "loud" else "still refused"), printed


def _name(func: Any) -> str:
    return getattr(func, "__name__", type(func).__name__).strip("_")


class Counter(TorchFunctionMode):  # type: ignore[misc]
    """The program's torch calls, through :meth:`Trace.call`."""

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func: Any, kinds: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        trace = self.trace
        if trace.inside:
            return func(*args, **(kwargs or {}))
        n = trace.count
        trace.count += 1
        return trace.call(n, func, _name(func), args, dict(kwargs or {}))


class Proxy:
    """The ``ax`` the program sees: each of its calls counted, through :meth:`Trace.call`."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace

    def __getattr__(self, name: str) -> Any:
        trace = self._trace
        found = getattr(trace.ax, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            n = trace.count
            trace.count += 1
            trace.inside += 1
            try:
                return trace.call(n, found, name, args, kwargs)
            finally:
                trace.inside -= 1
        return call


def _spec(specs: tuple[Any, ...], edits: Sequence[Edit]) -> tuple[Any, ...]:
    out = list(specs)
    for edit in edits:
        if edit.fix.action == "spec" and edit.fix.output is not None:
            out[edit.fix.output] = edit.fix.spec
    return tuple(out)


def applied(program: Program, edits: Sequence[Edit]) -> Program:
    """``program`` with ``edits`` made: its body run under a :class:`Trace`, its outputs and specs edited."""
    body = program.body
    outputs = [e for e in edits if e.at is None and e.fix.action in ("insert", "block")]

    def edited(ax: Any, *blocks: Any) -> Any:
        trace = Trace(ax, edits)
        with Counter(trace):
            try:
                out = body(Proxy(trace), *blocks)
            except SpmdTypeError as error:
                trace.locate(error, None, (), {})
                raise
        values = [out] if isinstance(out, torch.Tensor) else list(out)
        for edit in outputs:
            fix = edit.fix
            assert fix.output is not None
            value = values[fix.output]
            if fix.action == "block":
                options = dict(fix.kwargs)
                n = value.shape[options["dim"]] // options["size"]
                values[fix.output] = value.narrow(options["dim"], ax.axis_index(fix.axes[0]) * n, n)
            else:
                values[fix.output] = getattr(ax, fix.call)(value, fix.axes, **dict(fix.kwargs))
        return values[0] if isinstance(out, torch.Tensor) else type(out)(values)
    return attrs.evolve(program, body=edited, out_specs=_spec(program.out_specs, edits))

