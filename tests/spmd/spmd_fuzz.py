"""A differential fuzzer for the manual region's types: random programs over the (dp=2, tp=2) mesh, written on
whole tensors (the reference) and translated to the region (each member's blocks, the collectives that each
operation needs), at most one mistake planted in the translation. The judge (``spmd_harness.judge``) runs the
region on the simulated world, unchecked and checked, against one process: the truth is whether every output and
every gradient equals the reference; the checker's verdict is whether it raised.

Layouts along each axis: ``R`` (whole on every member), ``("S", d)`` (split at dimension ``d``), ``P`` (a
pending sum). A value whole along an axis may be typed varying there (``Val.var``: after ``pvary`` or a varying
``all_gather``). Each operation states the layouts it takes; :func:`convert` makes them with the collective that
does so, and is where most mistakes are planted (the collective dropped, on the wrong axis, at the wrong
dimension, a mean for a sum, a member's block cut at the same place on every member).

    python -c "import sys; sys.path.insert(0, 'tests/spmd'); import spmd_fuzz; print(spmd_fuzz.tally(range(50)))"
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from spmd_harness import Program, judge

from fmesh.spmd import P

AXES = ("dp", "tp")
N = 2  # members per axis
Layout = Any  # "R" | ("S", d) | "P"
Step = Callable[[Any, dict[str, Any]], None]
Ref = Callable[[dict[str, Any]], None]


@attrs.frozen
class Val:
    name: str
    shape: tuple[int, ...]
    lay: tuple[Layout, ...]  # per axis
    grad: bool
    var: frozenset[str] = frozenset()  # axes along which a whole value is typed varying

    def split(self, axis: str) -> int | None:
        lay = self.lay[AXES.index(axis)]
        return lay[1] if isinstance(lay, tuple) else None

    def local(self) -> tuple[int, ...]:
        shape = list(self.shape)
        for lay in self.lay:
            if isinstance(lay, tuple):
                shape[lay[1]] //= N
        return tuple(shape)


UNARY: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("exp", lambda x: x.clamp(-5, 5).exp()), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("gelu", F.gelu),
    ("silu", F.silu), ("relu", F.relu), ("abs", torch.abs), ("square", lambda x: x * x), ("sin", torch.sin),
    ("softplus", F.softplus), ("neg", torch.neg), ("scale", lambda x: x * 2.5), ("divide", lambda x: x / 3.0),
    ("clone", torch.clone), ("plus one", lambda x: x + 1.0), ("where positive", lambda x: torch.where(x > 0, x, 0.0)),
    ("masked", lambda x: x.masked_fill(x < -0.5, 0.0)),
]
LINEAR_UNARY = {"neg", "scale", "divide", "clone"}
BINARY: list[tuple[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = [
    ("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", lambda x, y: x / (1.5 + y.tanh())),
    ("maximum", torch.maximum), ("where", lambda x, y: torch.where(y > 0, x, y)),
]


class Skip(Exception):
    """An operation abandoned by the generator (what it emitted before stays a consistent program)."""


class Builder:
    """One random program: its values, the region's steps and the reference's, and the planted mistake."""

    def __init__(self, seed: int, mistaken: bool) -> None:
        self.rng = random.Random(seed)
        self.steps: list[Step] = []
        self.refs: list[Ref] = []
        self.vals: list[Val] = []
        self.count = 0
        self.used: set[str] = set()
        self.mistake: str | None = None
        self.plant = mistaken  # a mistake still to plant
        self.inputs: list[tuple[Val, torch.Tensor]] = []
        self.g = torch.Generator().manual_seed(seed)

    # -------------------------------------------------------------- helpers

    def fresh(self, shape: tuple[int, ...], lay: tuple[Layout, ...], grad: bool, var: Iterable[str] = ()) -> Val:
        self.count += 1
        made = Val(f"v{self.count}", shape, lay, grad, frozenset(a for a in var if lay[AXES.index(a)] == "R"))
        self.vals.append(made)
        return made

    def wrong(self, kind: str, p: float = 0.35) -> bool:
        """Whether to plant the mistake ``kind`` here (once per program)."""
        if self.plant and self.rng.random() < p:
            self.plant = False
            self.mistake = kind
            return True
        return False

    def emit(self, out: Val, local: Callable[..., Any], ref: Callable[..., Any], *ins: Val) -> Val:
        names = [v.name for v in ins]
        self.used.update(names)
        self.steps.append(lambda ax, env: env.__setitem__(out.name, local(ax, *[env[n] for n in names])))
        self.refs.append(lambda env: env.__setitem__(out.name, ref(*[env[n] for n in names])))
        return out

    def same(self, out: Val, v: Val) -> Val:
        """``out`` is ``v``'s value (a collective dropped: the mistake)."""
        return self.emit(out, lambda ax, x: x, lambda x: x, v)

    def relaid(self, v: Val, axis: str, lay: Layout, var: bool | None = None) -> Val:
        i = AXES.index(axis)
        new = list(v.lay)
        new[i] = lay
        varying = set(v.var) - {axis}
        if var or (var is None and axis in v.var and lay == "R"):
            varying.add(axis)
        return self.fresh(v.shape, tuple(new), v.grad, varying)

    # -------------------------------------------------------------- layouts

    def convert(self, v: Val, axis: str, want: Layout) -> Val:
        """``v`` laid ``want`` along ``axis``, by the collective that does it (the mistakes are planted here)."""
        i = AXES.index(axis)
        have = v.lay[i]
        other = AXES[1 - i]
        if have == want:
            return v
        if have == "P" and want == "R":
            if self.wrong("psum dropped"):
                return self.same(self.relaid(v, axis, "R"), v)
            if self.wrong("pmean for psum", 0.2):
                return self.emit(self.relaid(v, axis, "R"), lambda ax, x: ax.pmean(x, axis), lambda x: x, v)
            if self.wrong("psum over the wrong axis", 0.2) and v.lay[1 - i] != "P":
                return self.emit(self.relaid(v, axis, "R"), lambda ax, x: ax.psum(x, other), lambda x: x, v)
            return self.emit(self.relaid(v, axis, "R"), lambda ax, x: ax.psum(x, axis), lambda x: x, v)
        if have == "P" and isinstance(want, tuple):
            d = want[1] - len(v.shape)
            if self.wrong("psum_scatter dropped"):
                return self.same(self.relaid(v, axis, want), v)
            return self.emit(self.relaid(v, axis, want), lambda ax, x: ax.psum_scatter(x, axis, dim=d), lambda x: x, v)
        if isinstance(have, tuple) and want == "R":
            d = have[1] - len(v.shape)
            if self.wrong("all_gather dropped"):
                return self.same(self.relaid(v, axis, "R"), v)
            if len(v.shape) > 1 and self.wrong("all_gather at the wrong dimension", 0.2):
                e = next(e for e in range(-len(v.shape), 0) if e != d)
                return self.emit(self.relaid(v, axis, "R"),
                                 lambda ax, x: ax.all_gather_invariant(x, axis, dim=e), lambda x: x, v)
            if self.rng.random() < 0.5:  # the varying gather: whole, typed varying (its gradient reduce-scattered)
                return self.emit(self.relaid(v, axis, "R", var=True), lambda ax, x: ax.all_gather(x, axis, dim=d),
                                 lambda x: x, v)
            return self.emit(self.relaid(v, axis, "R", var=False),
                             lambda ax, x: ax.all_gather_invariant(x, axis, dim=d), lambda x: x, v)
        if have == "R" and isinstance(want, tuple):
            if v.lay[1 - i] == want:  # two axes on one dimension: nested splits, not generated
                raise Skip(f"{other} splits dimension {want[1]} already")
            v = self.typed_varying(v, axis)
            d = want[1]
            n = v.local()[d] // N

            def cut(ax: Any, x: torch.Tensor, at_zero: bool = self.wrong("block cut at the same place", 0.3)) -> Any:
                start = 0 if at_zero else ax.axis_index(axis) * n
                return x.narrow(d, start, n)
            return self.emit(self.relaid(v, axis, want), cut, lambda x: x, v)
        if isinstance(have, tuple) and isinstance(want, tuple):  # split elsewhere: through the whole
            return self.convert(self.convert(v, axis, "R"), axis, want)
        raise AssertionError((have, want))

    def typed_varying(self, v: Val, axis: str) -> Val:
        """``v`` typed varying along ``axis`` where it is whole there and wants a gradient (``pvary``)."""
        i = AXES.index(axis)
        if v.lay[i] != "R" or axis in v.var or not v.grad:
            return v
        if self.wrong("pvary dropped", 0.3):
            return self.same(self.fresh(v.shape, v.lay, v.grad, v.var | {axis}), v)
        return self.emit(self.fresh(v.shape, v.lay, v.grad, v.var | {axis}), lambda ax, x: ax.pvary(x, axis),
                         lambda x: x, v)

    def varying(self, v: Val, axis: str) -> bool:
        lay = v.lay[AXES.index(axis)]
        return lay != "R" or axis in v.var

    def meet(self, vals: list[Val]) -> list[Val]:
        """Operands of one operation: a whole one that wants a gradient pvary-ed where another varies."""
        for axis in AXES:
            if any(self.varying(v, axis) for v in vals):
                vals = [self.typed_varying(v, axis) for v in vals]
        return vals

    def alike(self, a: Val, b: Val, partial_ok: bool) -> tuple[Val, Val]:
        """``a`` and ``b`` laid alike along every axis (``b`` follows ``a``, pending sums completed unless
        ``partial_ok`` and both are)."""
        for axis in AXES:
            i = AXES.index(axis)
            la, lb = a.lay[i], b.lay[i]
            if la == "P" and not (partial_ok and lb == "P"):
                a = self.convert(a, axis, "R")
                la = "R"
            if lb != la:
                b = self.convert(b, axis, la)
        a, b = self.meet([a, b])
        return a, b

    def complete(self, v: Val) -> Val:
        for axis in AXES:
            if v.lay[AXES.index(axis)] == "P":
                v = self.convert(v, axis, "R")
        return v

    def whole_at(self, v: Val, dim: int) -> Val:
        for axis in AXES:
            if v.split(axis) == dim:
                v = self.convert(v, axis, "R")
        return v

    def pick(self, ndim: int | None = None, floating: bool = True) -> Val | None:
        found = [v for v in self.vals if (ndim is None or len(v.shape) == ndim)]
        return self.rng.choice(found[-6:]) if found else None

    # -------------------------------------------------------------- operations (each: a new value, or None)

    def unary(self) -> Val | None:
        v = self.pick()
        if v is None:
            return None
        name, fn = self.rng.choice(UNARY)
        if name not in LINEAR_UNARY:
            v = self.complete(v)
        return self.emit(self.fresh(v.shape, v.lay, v.grad, v.var), lambda ax, x: fn(x), fn, v)

    def binary(self) -> Val | None:
        a = self.pick()
        if a is None:
            return None
        same = [v for v in self.vals if v.shape == a.shape and v is not a]
        b = self.rng.choice(same) if same else None
        if b is None:
            return None
        name, fn = self.rng.choice(BINARY)
        a, b = self.alike(a, b, partial_ok=name in ("add", "sub"))
        return self.emit(self.fresh(a.shape, a.lay, a.grad or b.grad, a.var | b.var), lambda ax, x, y: fn(x, y),
                         fn, a, b)

    def bias(self) -> Val | None:
        """A row vector added along the last dimension (a bias, a position table when the last is split)."""
        a = self.pick()
        if a is None:
            return None
        a = self.complete(a)
        n = a.shape[-1]
        table = torch.randn(n, generator=self.g, dtype=torch.float64)
        grad = self.rng.random() < 0.5
        given = self.rng.random() < 0.5  # the table given split, or whole and cut in the region
        lay = tuple(("S", 0) if a.split(axis) == len(a.shape) - 1 and given else "R" for axis in AXES)
        w = self.input(table, lay, grad)
        for axis in AXES:
            if a.split(axis) == len(a.shape) - 1:
                w = self.convert(w, axis, ("S", 0))
        w, a = self.meet([w, a])
        return self.emit(self.fresh(a.shape, a.lay, True, a.var | w.var), lambda ax, x, y: x + y,
                         lambda x, y: x + y, a, w)

    def reduce(self) -> Val | None:
        v = self.pick()
        if v is None or len(v.shape) < 2:
            return None
        r = self.rng.randrange(len(v.shape))
        keep = self.rng.random() < 0.3
        kind = self.rng.choice(["sum", "mean", "amax"])
        if kind == "amax":
            v = self.complete(v)
        shape = tuple(n for k, n in enumerate(v.shape) if k != r or keep)
        shape = tuple(1 if k == r else n for k, n in enumerate(v.shape)) if keep else shape

        def moved(lay: Layout) -> Layout:
            if lay == "R" or lay == "P":
                return lay
            d = lay[1]
            if d == r:
                return "P"
            return ("S", d - (1 if d > r and not keep else 0))
        lay = tuple(moved(x) for x in v.lay)
        fn = {"sum": lambda x: x.sum(r, keepdim=keep), "mean": lambda x: x.mean(r, keepdim=keep),
              "amax": lambda x: x.detach().amax(r, keepdim=keep)}[kind]
        out = self.emit(self.fresh(shape, lay, v.grad and kind != "amax", v.var), lambda ax, x: fn(x), fn, v)
        if kind == "sum":
            return out
        complete = {"mean": "pmean", "amax": "pmax"}[kind]
        pending = out
        for axis in AXES:  # a mean or a max along a split dimension: completed at once
            if v.split(axis) == r:
                dropped = self.wrong(f"{complete} dropped", 0.3)
                swapped = not dropped and kind == "mean" and self.wrong("psum for pmean", 0.3)
                done = self.relaid(out, axis, "R")
                if dropped:
                    out = self.same(done, out)
                elif swapped:
                    out = self.emit(done, lambda ax, x, a=axis: ax.psum(x, a), lambda x: x, out)
                else:
                    out = self.emit(done, lambda ax, x, a=axis, c=complete: getattr(ax, c)(x, a), lambda x: x, out)
        if out is not pending:  # a pending mean or max is not a pending sum: no later operation takes it
            self.vals.remove(pending)
        return out

    def scan(self) -> Val | None:
        v = self.pick()
        if v is None:
            return None
        r = self.rng.randrange(len(v.shape))
        if any(lay == "P" for lay in v.lay) and self.rng.random() < 0.5:
            v = self.complete(v)
        splitting = [axis for axis in AXES if v.split(axis) == r]
        out = self.fresh(v.shape, v.lay, v.grad, v.var)
        if splitting:
            axis = splitting[0]
            if self.wrong("local cumsum along a split dimension", 0.6):
                return self.emit(out, lambda ax, x: x.cumsum(r), lambda x: x.cumsum(r), v)
            return self.emit(out, lambda ax, x: ax.cumsum(x, axis, dim=r), lambda x: x.cumsum(r), v)
        return self.emit(out, lambda ax, x: x.cumsum(r), lambda x: x.cumsum(r), v)

    def normalise(self) -> Val | None:
        v = self.pick()
        if v is None:
            return None
        r = self.rng.choice([len(v.shape) - 1, self.rng.randrange(len(v.shape))])
        name, fn = self.rng.choice([("softmax", lambda x: x.softmax(r)), ("log_softmax", lambda x: F.log_softmax(x, r)),
                                    ("layer_norm", None), ("rms", None)])
        v = self.complete(v)
        if name in ("layer_norm", "rms"):
            r = len(v.shape) - 1
            n = v.shape[-1]
            fn = ((lambda x: F.layer_norm(x, (n,))) if name == "layer_norm" else
                  (lambda x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)))
        if not self.wrong(f"{name} along a split dimension", 0.4):
            v = self.whole_at(v, r)
        assert fn is not None
        return self.emit(self.fresh(v.shape, v.lay, v.grad, v.var), lambda ax, x: fn(x), fn, v)

    def input(self, value: torch.Tensor, lay: tuple[Layout, ...], grad: bool) -> Val:
        v = self.fresh(tuple(value.shape), lay, grad)
        self.inputs.append((v, value))
        return v

    def weight(self, shape: tuple[int, ...]) -> Val:
        lay = tuple(self.rng.choice(["R", "R", ("S", 0), ("S", len(shape) - 1)]) for _ in AXES)
        if len({x for x in lay if x != "R"}) < sum(1 for x in lay if x != "R"):
            lay = (lay[0], "R")
        return self.input(torch.randn(shape, generator=self.g, dtype=torch.float64) / math.sqrt(shape[0]), lay,
                          self.rng.random() < 0.8)

    def matmul(self) -> Val | None:
        """x @ w for a weight w [k, n]: row-parallel (k split in both: a pending sum), column-parallel (n split),
        or the batch split; written as matmul, einsum, linear, or addmm with a bias."""
        x = self.pick()
        if x is None:
            return None
        k = x.shape[-1]
        n = self.rng.choice([8, 4])
        w = self.weight((k, n))
        last = len(x.shape) - 1
        for axis in AXES:  # the layouts a product takes, along each axis
            i = AXES.index(axis)
            lx, lw = x.lay[i], w.lay[i]
            if lx == "P":
                if lw != "R" or w.grad:
                    x = self.convert(x, axis, "R")
            elif lx == ("S", last):
                if lw != ("S", 0):
                    if self.rng.random() < 0.5 and lw == "R":
                        w = self.convert(w, axis, ("S", 0))
                    else:
                        x = self.convert(x, axis, "R")
                        if lw == ("S", 0):
                            w = self.convert(w, axis, "R")
            elif isinstance(lx, tuple):
                if lw != "R":
                    w = self.convert(w, axis, "R")
            elif lw == ("S", 0):
                x = self.convert(x, axis, ("S", last))
        x, w = self.meet([x, w])

        def out_lay(lx: Layout, lw: Layout) -> Layout:
            if lx == "P" or (lx == ("S", last) and lw == ("S", 0)):
                return "P"
            if lw == ("S", 1):
                return ("S", last)
            return lx
        lay = tuple(out_lay(lx, lw) for lx, lw in zip(x.lay, w.lay, strict=True))
        out = self.fresh((*x.shape[:-1], n), lay, x.grad or w.grad, x.var | w.var)
        how = self.rng.choice(["matmul", "einsum", "linear", "addmm"])
        if how == "addmm" and len(x.shape) == 2:
            b = self.input(torch.randn(n, generator=self.g, dtype=torch.float64), tuple(
                ("S", 0) if lay_ == ("S", 1) else "R" for lay_ in lay), self.rng.random() < 0.5)
            b = self.meet([b, x, w])[0]
            fused = any(lay_ == "P" for lay_ in lay) and self.wrong("bias added before the pending sum", 0.7)
            if fused:
                return self.emit(out, lambda ax, x, w, b: torch.addmm(b, x, w), lambda x, w, b: x @ w + b, x, w, b)
            done = self.emit(out, lambda ax, x, w: x @ w, lambda x, w: x @ w, x, w)
            done = self.complete(done)
            return self.emit(self.fresh(done.shape, done.lay, True, done.var | b.var), lambda ax, y, b: y + b,
                             lambda y, b: y + b, done, b)
        fn = {"matmul": lambda x, w: x @ w, "einsum": lambda x, w: torch.einsum("...k,kn->...n", x, w),
              "linear": lambda x, w: F.linear(x, w.t()), "addmm": lambda x, w: x @ w}[how]
        return self.emit(out, lambda ax, x, w: fn(x, w), fn, x, w)

    def attention(self) -> Val | None:
        """Self-attention of x [b, s, e] with 2 heads (scaled_dot_product_attention, or by hand): heads split
        (e along an axis: one head per member), sequence split (context parallelism: keys and values gathered,
        the causal mask from global positions), or batch split."""
        x = next((v for v in reversed(self.vals[-6:]) if len(v.shape) == 3), None)
        if x is None:
            return None
        _b, _s, e = x.shape
        if e % 4:
            return None
        x = self.complete(x)
        heads = 2
        causal = self.rng.random() < 0.5
        by_hand = self.rng.random() < 0.3
        seq_axes = [axis for axis in AXES if x.split(axis) == 1]
        kv = x
        for axis in seq_axes:
            if not self.wrong("keys and values not gathered (context parallelism)", 0.3):
                kv = self.convert(kv, axis, "R")
        local_mask = causal and seq_axes and self.wrong("is_causal with the sequence split", 0.5)
        x, kv = self.meet([x, kv])

        def heads_of(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(t.shape[0], t.shape[1], -1, e // heads).transpose(1, 2)

        def ref(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            out = F.scaled_dot_product_attention(heads_of(q), heads_of(k), heads_of(k), is_causal=causal)
            return out.transpose(1, 2).reshape(q.shape)

        def local(ax: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            qh, kh = heads_of(q), heads_of(k)
            mask = None
            if causal and not local_mask:
                ql, kl = q.shape[1], k.shape[1]
                qpos = torch.arange(ql)
                for axis in seq_axes:
                    qpos = qpos + ax.axis_index(axis) * ql
                mask = qpos[:, None] >= torch.arange(kl)[None, :]
            if by_hand:
                scores = qh @ kh.transpose(-2, -1) / math.sqrt(e // heads)
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                elif causal:
                    scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
                out = scores.softmax(-1) @ kh
            else:
                out = F.scaled_dot_product_attention(qh, kh, kh, attn_mask=mask, is_causal=causal and mask is None)
            return out.transpose(1, 2).reshape(q.shape)
        return self.emit(self.fresh(x.shape, x.lay, x.grad or kv.grad, x.var | kv.var), local, ref, x, kv)

    def view(self) -> Val | None:
        """transpose; the last dimension as (2 heads, head size) and back; a size-1 dimension added and dropped."""
        v = self.pick()
        if v is None:
            return None
        kind = self.rng.choice(["transpose", "heads", "unsqueeze"])
        n = len(v.shape)
        if kind == "transpose" and n >= 2:
            a, b = self.rng.sample(range(n), 2)
            swap = {a: b, b: a}
            lay = tuple(("S", swap.get(x[1], x[1])) if isinstance(x, tuple) else x for x in v.lay)
            shape = tuple(v.shape[swap.get(k, k)] for k in range(n))
            return self.emit(self.fresh(shape, lay, v.grad, v.var), lambda ax, x: x.transpose(a, b),
                             lambda x: x.transpose(a, b), v)
        if kind == "heads" and v.shape[-1] % 4 == 0:
            for axis in AXES:  # a split of the last dimension goes to the heads (2 of them: one per member)
                if v.split(axis) is not None and v.split(axis) != n - 1 and v.shape[v.split(axis)] < 2:
                    return None
            lay = tuple(("S", n - 1) if x == ("S", n - 1) else x for x in v.lay)
            split = self.fresh((*v.shape[:-1], 2, v.shape[-1] // 2), lay, v.grad, v.var)
            split = self.emit(split, lambda ax, x: x.unflatten(-1, (-1, v.shape[-1] // 2)),
                              lambda x: x.unflatten(-1, (2, -1)), v)
            back = self.fresh(v.shape, v.lay, v.grad, v.var)
            return self.emit(back, lambda ax, x: x.flatten(-2), lambda x: x.flatten(-2), split)
        if kind == "unsqueeze":
            lay = tuple(("S", x[1] + 1) if isinstance(x, tuple) else x for x in v.lay)
            up = self.emit(self.fresh((1, *v.shape), lay, v.grad, v.var), lambda ax, x: x.unsqueeze(0),
                           lambda x: x.unsqueeze(0), v)
            r = self.rng.randrange(1, n + 1)
            up = self.whole_at(up, r) if self.rng.random() < 0.5 else up
            red = self.fresh(tuple(k for i, k in enumerate(up.shape) if i != 0), v.lay if up.lay == lay else tuple(
                ("S", x[1] - 1) if isinstance(x, tuple) else x for x in up.lay), up.grad, up.var)
            return self.emit(red, lambda ax, x: x.squeeze(0), lambda x: x.squeeze(0), up)
        return None

    def index(self) -> Val | None:
        """index_select along a dimension, or a write of some rows (``t[rows] = v``)."""
        v = self.pick()
        if v is None:
            return None
        r = self.rng.randrange(len(v.shape))
        size = v.shape[r]
        if size < 2:
            return None
        rows = torch.tensor(self.rng.sample(range(size), 2))
        if any(lay == "P" for lay in v.lay) and self.rng.random() < 0.5:
            v = self.complete(v)
        if not self.wrong("indexing a split dimension with global positions", 0.4):
            v = self.whole_at(v, r)
        if self.rng.random() < 0.5:
            shape = tuple(2 if k == r else n for k, n in enumerate(v.shape))
            return self.emit(self.fresh(shape, v.lay, v.grad, v.var), lambda ax, x: x.index_select(r, rows),
                             lambda x: x.index_select(r, rows), v)

        def write(ax: Any, x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            picked = (slice(None),) * r + (rows,)
            y[picked] = x[picked] * 2.0
            return y
        return self.emit(self.fresh(v.shape, v.lay, v.grad, v.var), write, lambda x: write(None, x), v)

    def exchange(self) -> Val | None:
        """all_to_all (a split moved between dimensions), a ring all-gather out of ppermute, a scale from .item()."""
        v = self.pick()
        if v is None:
            return None
        kind = self.rng.choice(["all_to_all", "ring", "item"])
        splits = [(axis, v.split(axis)) for axis in AXES if v.split(axis) is not None]
        if kind == "all_to_all" and splits and len(v.shape) >= 2:
            axis, d = splits[0]
            free = [e for e in range(len(v.shape)) if e != d and all(v.split(a) != e for a in AXES)
                    and v.shape[e] % N == 0]
            if not free:
                return None
            e = self.rng.choice(free)
            swapped = self.wrong("all_to_all with its dimensions swapped", 0.4)
            out = self.relaid(v, axis, ("S", e))
            return self.emit(out, lambda ax, x: ax.all_to_all(x, axis, split_dim=d if swapped else e,
                                                              concat_dim=e if swapped else d), lambda x: x, v)
        if kind == "ring" and splits:
            axis, d = splits[0]
            out = self.relaid(v, axis, "R", var=True)

            def ring(ax: Any, x: torch.Tensor) -> torch.Tensor:
                index = ax.axis_index(axis)
                pieces: list[Any] = [None] * N
                pieces[index] = x
                current = x
                for step in range(1, N):
                    current = ax.ppermute(current, axis, [(i, (i + 1) % N) for i in range(N)])
                    pieces[(index - step) % N] = current
                whole = torch.cat(pieces, d)  # in order: the types cannot see it (strided), so it is declared
                return ax.reinterpret(whole, axis, "varying", same=True)
            return self.emit(out, ring, lambda x: x, v)
        if kind == "item":
            v = self.complete(v)
            scale = next((a for a in AXES if v.split(a) is not None), None)
            if scale is not None and not self.wrong("a number from .item() of a split value", 0.5):
                v = self.convert(v, scale, "R")
            out = self.fresh(v.shape, v.lay, v.grad, v.var)
            return self.emit(out, lambda ax, x: x * (1.0 + 0.01 * x.detach().sum().item()),
                             lambda x: x * (1.0 + 0.01 * x.detach().sum().item()), v)
        return None

    # -------------------------------------------------------------- the program

    def start(self) -> None:
        b, s, e = 4, 4, 8
        for shape in ([(b, s, e)] if self.rng.random() < 0.6 else [(b * s, e)]) + [(b, s, e)] * self.rng.randrange(2):
            lay: list[Layout] = []
            for _ in AXES:
                options: list[Layout] = ["R", "P"] + [("S", d) for d in range(len(shape)) if ("S", d) not in lay]
                lay.append(self.rng.choice(options))
            self.input(torch.randn(shape, generator=self.g, dtype=torch.float64), tuple(lay), self.rng.random() < 0.7)

    def build(self, ops: int) -> Program | None:
        self.start()
        choices = [self.unary, self.binary, self.bias, self.reduce, self.scan, self.normalise, self.matmul,
                   self.attention, self.view, self.index, self.exchange]
        for _ in range(ops):
            try:
                self.rng.choice(choices)()
            except Skip:
                continue
        outs = []
        for v in [v for v in self.vals if v.name not in self.used and v.shape]:  # every value nothing used
            for axis in sorted(v.var):  # whole, typed varying: the mean of the members' (equal) values
                v = self.emit(self.fresh(v.shape, v.lay, v.grad), lambda ax, x, a=axis: ax.pmean(x, a), lambda x: x, v)
            outs.append(v)
        if not outs or self.plant:
            return None
        inputs = self.inputs
        steps, refs = list(self.steps), list(self.refs)
        names = [v.name for v, _ in inputs]
        out_names = [v.name for v in outs]

        def body(ax: Any, *blocks: torch.Tensor) -> Any:
            env = dict(zip(names, blocks, strict=True))
            for step in steps:
                step(ax, env)
            return tuple(env[n] for n in out_names)

        def reference(*values: torch.Tensor) -> Any:
            env = dict(zip(names, values, strict=True))
            for ref in refs:
                ref(env)
            return tuple(env[n] for n in out_names)
        return Program(body, reference, tuple(t for _, t in inputs), tuple(spec(v) for v, _ in inputs),
                       tuple(spec(v) for v in outs), tuple(v.grad for v, _ in inputs), tuple(names))


def spec(v: Val) -> P:
    entries: list[Any] = [None] * len(v.shape)
    for axis, lay in zip(AXES, v.lay, strict=True):
        if isinstance(lay, tuple):
            entries[lay[1]] = axis
    return P(*entries, partial=[a for a, lay in zip(AXES, v.lay, strict=True) if lay == "P"])


def program(seed: int) -> tuple[Program, str | None] | None:
    """Program ``seed`` (a mistake planted in two of three) and its mistake, or ``None`` where none was built."""
    mistaken = seed % 3 != 0
    builder = Builder(seed, mistaken)
    made = builder.build(random.Random(seed).randrange(2, 7))
    return None if made is None else (made, builder.mistake)


def tally(seeds: Iterable[int]) -> dict[str, Any]:
    """Each verdict's count over ``seeds``, and the seeds of the silently wrong and the false positives."""
    counts: Counter[str] = Counter()
    seen: dict[str, list[tuple[int, str | None, str]]] = {"silently wrong": [], "false positive": [], "loud": []}
    for seed in seeds:
        made = program(seed)
        if made is None:
            counts["not built"] += 1
            continue
        try:
            verdict, message = judge(made[0])
        except (RuntimeError, ValueError, IndexError) as error:  # the reference itself refused: no program
            counts["not built"] += 1
            seen.setdefault("reference refused", []).append((seed, made[1], str(error)[:200]))
            continue
        counts[verdict] += 1
        if verdict in seen:
            seen[verdict].append((seed, made[1], message[:300]))
    return {"counts": dict(counts), **seen}
