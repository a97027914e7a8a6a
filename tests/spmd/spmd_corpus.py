"""A corpus of manual-region programs a researcher writes, each with the same computation on whole tensors, over the
(dp=2, tp=2) mesh; and mistakes in them. Each program's body takes ``bug``: ``None`` is the right program, any
other value one mistake (:data:`MISTAKES` lists them, with what the message must name and the fix it must print,
which is the code the right program has)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from spmd_harness import Program

from fmesh.spmd import P

B, S, E, FF, V = 4, 8, 8, 16, 16
HEADS = 2
g = torch.Generator().manual_seed(11)


def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


X, W1, B1, W2, B2 = rnd(B, S, E), rnd(E, FF, scale=0.3), rnd(FF), rnd(FF, E, scale=0.3), rnd(E)
LNW = 1 + rnd(E, scale=0.1)
LOGITS, TARGETS = rnd(B * S, V), torch.randint(0, V, (B * S,), generator=g)
EMB, IDS = rnd(V, E), torch.randint(0, V, (B, S), generator=g)


@attrs.frozen
class Entry:
    name: str
    body: Callable[..., Any]  # (ax, *blocks, bug=None)
    reference: Callable[..., Any]
    inputs: tuple[torch.Tensor, ...]
    in_specs: tuple[P, ...]
    out_specs: tuple[P, ...]
    grads: tuple[bool, ...]
    names: tuple[str, ...]

    def program(self, bug: str | None = None) -> Program:
        body = self.body
        return Program(lambda ax, *a: body(ax, *a, bug=bug), self.reference, self.inputs, self.in_specs,
                       self.out_specs, self.grads, self.names)


CORPUS: dict[str, Entry] = {}


def entry(inputs: tuple[tuple[str, torch.Tensor, P, bool], ...], out_specs: tuple[P, ...],
          reference: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(body: Callable[..., Any]) -> Callable[..., Any]:
        CORPUS[body.__name__] = Entry(body.__name__, body, reference, tuple(t for _, t, _, _ in inputs),
                                      tuple(s for _, _, s, _ in inputs), out_specs,
                                      tuple(w for _, _, _, w in inputs), tuple(n for n, _, _, _ in inputs))
        return body
    return register


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w1 + b1) @ w2 + b2


MLP_IN = (("x", X, P("dp"), True), ("w1", W1, P(None, "tp"), True), ("b1", B1, P("tp"), True),
          ("w2", W2, P("tp", None), True), ("b2", B2, P(), True))


@entry(MLP_IN, (P("dp"),), mlp)
def tensor_parallel_mlp(ax: Any, x: Any, w1: Any, b1: Any, w2: Any, b2: Any, bug: str | None = None) -> Any:
    """Column- then row-parallel (Megatron): the pending sum reduced before the bias."""
    x = x if bug == "input not pvary-ed over tp" else ax.pvary(x, "tp")
    if bug == "input pvary-ed twice":
        x = ax.pvary(x, "tp")
    w1, b1, w2 = (ax.pvary(w, "dp") for w in (w1, b1, w2))
    b2 = b2 if bug == "bias not pvary-ed over dp" else ax.pvary(b2, "dp")
    h = F.gelu(x @ w1 + b1)
    if bug == "bias before the psum":
        return ax.psum(h @ w2 + b2, "tp")
    if bug == "pmean for psum":
        return ax.pmean(h @ w2, "tp") + b2
    if bug == "psum over the wrong axis":
        return ax.psum(h @ w2, "dp") + b2
    return ax.psum(h @ w2, "tp") + b2


@entry((*MLP_IN[:2], ("b1", B1, P("tp"), True), *MLP_IN[3:]), (P("dp"),), mlp)
def einsum_and_addmm_mlp(ax: Any, x: Any, w1: Any, b1: Any, w2: Any, b2: Any, bug: str | None = None) -> Any:
    """The same layers as einsum and addmm."""
    x = ax.pvary(x, "tp")
    w1, b1, w2, b2 = (w if bug == "weights not pvary-ed over dp" else ax.pvary(w, "dp") for w in (w1, b1, w2, b2))
    h = F.gelu(torch.einsum("bse,ef->bsf", x, w1) + b1)
    flat = h.reshape(-1, h.shape[-1])
    if bug == "addmm bias on the pending sum":
        y = torch.addmm(b2, flat, w2)
        return ax.psum(y, "tp").view(x.shape)
    y = ax.psum(torch.mm(flat, w2), "tp")
    return torch.add(y, b2).view(x.shape)


SP_IN = (("x", X, P("dp", "tp"), True), *MLP_IN[1:])


@entry(SP_IN, (P("dp", "tp"),), mlp)
def sequence_parallel_mlp(ax: Any, x: Any, w1: Any, b1: Any, w2: Any, b2: Any, bug: str | None = None) -> Any:
    """The sequence gathered before the column-parallel layer, reduce-scattered after the row-parallel one."""
    w1, b1, w2 = (ax.pvary(w, "dp") for w in (w1, b1, w2))
    b2 = ax.pvary(b2, ("dp", "tp"))
    if bug == "no sequence gather":
        h = x
    elif bug == "gather at the wrong dimension":
        h = ax.all_gather(x, "tp", dim=2)
    else:
        h = ax.all_gather(x, "tp", dim=1)
    y = F.gelu(h @ w1 + b1) @ w2
    if bug == "all_gather where psum_scatter belongs":
        return ax.all_gather(y, "tp", dim=1) + b2
    if bug == "psum then psum_scatter":
        return ax.psum_scatter(ax.psum(y, "tp"), "tp", dim=1) + b2
    return ax.psum_scatter(y, "tp", dim=1) + b2


def layer_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (E,), w)


@entry((("x", X, P("dp", "tp"), True), ("w", LNW, P(), True)), (P("dp", "tp"),), layer_norm)
def sequence_parallel_layer_norm(ax: Any, x: Any, w: Any, bug: str | None = None) -> Any:
    """A layer norm on sequence-split activations: its weight's gradient summed over both axes."""
    if bug == "weight not pvary-ed":
        return F.layer_norm(x, (E,), w)
    if bug == "weight pvary-ed over dp only":
        return F.layer_norm(x, (E,), ax.pvary(w, "dp"))
    if bug == "weight pvary-ed over tp only":
        return F.layer_norm(x, (E,), ax.pvary(w, "tp"))
    if bug == "weight pvary-ed twice":
        return F.layer_norm(x, (E,), ax.pvary(ax.pvary(w, ("dp", "tp")), "dp"))
    return F.layer_norm(x, (E,), ax.pvary(w, ("dp", "tp")))


def layer_norm_hidden(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (E,))


@entry((("x", X, P("dp", None, "tp"), True),), (P("dp", None, "tp"),), layer_norm_hidden)
def norm_over_a_split_hidden(ax: Any, x: Any, bug: str | None = None) -> Any:
    """A layer norm needs the whole hidden dimension: gathered, normalised, each member keeping its block."""
    whole = x if bug == "layer norm over the split dimension" else ax.all_gather(x, "tp", dim=2)
    n = x.shape[-1]
    return F.layer_norm(whole, (E,)).narrow(2, ax.axis_index("tp") * n, n)


def attention(x: torch.Tensor, causal: bool = False) -> torch.Tensor:
    q = x.view(x.shape[0], x.shape[1], HEADS, -1).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q, q, is_causal=causal).transpose(1, 2).reshape(x.shape)


def heads(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], -1, E // HEADS).transpose(1, 2)


@entry((("x", X, P("dp", None, "tp"), True),), (P("dp", None, "tp"),), attention)
def attention_one_head_per_member(ax: Any, x: Any, bug: str | None = None) -> Any:
    """Heads split over tp (two heads: one per member), SDPA."""
    q = heads(x)
    if bug == "output gathered over the heads":
        out = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(x.shape)
        return ax.all_gather(out, "tp", dim=2)
    return F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(x.shape)


TEMPERATURE = torch.tensor(0.7, dtype=torch.float64)


def attention_scaled(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    q = x.view(x.shape[0], x.shape[1], HEADS, -1).transpose(1, 2)
    scores = (q @ q.transpose(-2, -1) * t).softmax(-1)
    return (scores @ q).transpose(1, 2).reshape(x.shape)


@entry((("x", X, P("dp", None, "tp"), True), ("t", TEMPERATURE, P(), True)), (P("dp", None, "tp"),),
       attention_scaled)
def attention_by_hand(ax: Any, x: Any, t: Any, bug: str | None = None) -> Any:
    """Heads split over tp, the attention written out, a learnt temperature replicated."""
    q = heads(x)
    if bug == "temperature not pvary-ed":
        scores = q @ q.transpose(-2, -1) * t
    elif bug == "temperature pvary-ed over tp only":
        scores = q @ q.transpose(-2, -1) * ax.pvary(t, "tp")
    else:
        scores = q @ q.transpose(-2, -1) * ax.pvary(t, ("dp", "tp"))
    return (scores.softmax(-1) @ q).transpose(1, 2).reshape(x.shape)


@entry((("x", X, P("dp", "tp"), True),), (P("dp", "tp"),), lambda x: attention(x, causal=True))
def context_parallel_attention(ax: Any, x: Any, bug: str | None = None) -> Any:
    """The sequence split over tp: keys and values gathered, the causal mask from global positions."""
    q = heads(x)
    kv = heads(x if bug == "keys not gathered" else ax.all_gather(x, "tp", dim=1))
    n, keys = x.shape[1], x.shape[1] * ax.axis_size("tp")
    if bug == "is_causal with a split sequence":
        out = F.scaled_dot_product_attention(q, kv, kv, is_causal=True)
    elif bug == "causal mask from local positions":
        mask = torch.ones(n, keys, dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
    else:
        positions = torch.arange(n) + ax.axis_index("tp") * n
        mask = positions[:, None] >= torch.arange(keys)[None, :]
        out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
    return out.transpose(1, 2).reshape(x.shape)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, targets)


@entry((("logits", LOGITS, P("dp", "tp"), True), ("targets", TARGETS, P("dp"), False)), (P(),), cross_entropy)
def vocab_parallel_cross_entropy(ax: Any, logits: Any, targets: Any, bug: str | None = None) -> Any:
    """The vocabulary split over tp (Megatron): max, exponentials and the target's logit each reduced."""
    if bug == "cross_entropy on the split logits":
        return ax.pmean(F.cross_entropy(logits, targets), "dp")
    n = logits.shape[-1]
    start = ax.axis_index("tp") * n
    if bug == "max not reduced":
        top = logits.detach().amax(-1, keepdim=True)
        top = top * 1.0
    else:
        top = ax.pmax(logits.detach().amax(-1, keepdim=True), "tp")
    shifted = logits - top
    if bug == "exponentials not summed":
        total = shifted.exp().sum(-1).log()
    else:
        total = ax.psum(shifted.exp().sum(-1), "tp").log()
    outside = (targets < start) | (targets >= start + n)
    local = (targets - start).masked_fill(outside, 0)
    picked = shifted.gather(-1, local[:, None]).squeeze(-1).masked_fill(outside, 0.0)
    if bug == "target logit from global positions":
        picked = shifted.gather(-1, targets[:, None]).squeeze(-1)
        return ax.pmean((total - ax.psum(picked, "tp")).mean(), "dp")
    if bug == "psum of the mean over dp":
        return ax.psum((total - ax.psum(picked, "tp")).mean(), "dp")
    return ax.pmean((total - ax.psum(picked, "tp")).mean(), "dp")


def embedding(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, weight)


@entry((("weight", EMB, P("tp"), True), ("ids", IDS, P("dp"), False)), (P("dp"),), embedding)
def vocab_parallel_embedding(ax: Any, weight: Any, ids: Any, bug: str | None = None) -> Any:
    """The table's rows split over tp: each member looks up the ids it holds, zeroes the others, psum."""
    weight = ax.pvary(weight, "dp")
    n = weight.shape[0]
    start = ax.axis_index("tp") * n
    if bug == "global ids into the local rows":
        return ax.psum(F.embedding(ids, weight), "tp")
    outside = (ids < start) | (ids >= start + n)
    rows = F.embedding((ids - start).masked_fill(outside, 0), weight)
    return ax.psum(rows.masked_fill(outside[..., None], 0.0), "tp")


def identity(x: torch.Tensor) -> torch.Tensor:
    return x * 1.0


@entry((("x", X, P("dp", "tp"), True),), (P("dp"),), identity)
def ring_all_gather(ax: Any, x: Any, bug: str | None = None) -> Any:
    """The sequence gathered by passing blocks around the tp ring (ppermute), put in order, declared whole."""
    index, n = ax.axis_index("tp"), ax.axis_size("tp")
    pieces: list[Any] = [None] * n
    pieces[index] = x
    current = x
    for step in range(1, n):
        current = ax.ppermute(current, "tp", [(i, (i + 1) % n) for i in range(n)])
        pieces[(index - step) % n] = current
    whole = torch.cat(pieces, 1)
    return ax.pmean(ax.reinterpret(whole, "tp", "varying", same=True), "tp")


@entry((("x", X, P("dp", partial="tp"), True),), (P("dp", "tp"),), identity)
def ring_reduce_scatter(ax: Any, x: Any, bug: str | None = None) -> Any:
    """A pending sum reduce-scattered around the tp ring: partial accumulators passed on (ppermute keeps a
    pending sum under a whole permutation), then declared this member's complete block."""
    index, n = ax.axis_index("tp"), ax.axis_size("tp")
    parts = ax.reinterpret(x, "tp", "varying")  # each member's part: its own values, chunked by its index
    chunks = parts.chunk(n, 1)
    total = chunks[(index + 1) % n] * 1.0
    for step in range(2, n + 1):
        total = ax.ppermute(total, "tp", [(i, (i - 1) % n) for i in range(n)]) + chunks[(index + step) % n]
    if bug == "the pending sum scattered by hand, with no ring":
        return x.chunk(n, 1)[index] * 1.0
    return ax.reinterpret(total, "tp", "varying", dim=1)


def shifted(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros_like(x[:2]), x[:2]]).sum() * 1.0


@entry((("x", X, P("dp"), True),), (P(),), shifted)
def pipeline_shift(ax: Any, x: Any, bug: str | None = None) -> Any:
    """dp as two pipeline stages: stage 0's activations shifted to stage 1, whose loss alone counts."""
    received = ax.ppermute(x, "dp", [(0, 1)])
    last = float(ax.axis_index("dp") == 1)
    loss = received.sum() * last
    if bug == "loss not reduced over the stages":
        return loss
    if bug == "loss averaged over the stages":
        return ax.pmean(loss, "dp")
    return ax.psum(loss, "dp")


def running_sum(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(1)


@entry((("x", X, P("dp", "tp"), True),), (P("dp", "tp"),), running_sum)
def running_sum_over_a_split_sequence(ax: Any, x: Any, bug: str | None = None) -> Any:
    """A running sum along the sequence split over tp: each block's own, plus the earlier blocks' totals."""
    if bug == "local cumsum":
        return x.cumsum(1)
    return ax.cumsum(x, "tp", dim=1)


@entry((("x", X, P("dp", "tp"), True),), (P("dp"),), identity)
def buffer_filled_by_index(ax: Any, x: Any, bug: str | None = None) -> Any:
    """Each member writes its block of the sequence at its place in a zero buffer; the buffers summed."""
    n = x.shape[1]
    buffer = torch.zeros(x.shape[0], n * ax.axis_size("tp"), x.shape[2], dtype=x.dtype)
    start = 0 if bug == "written at the same place on every member" else ax.axis_index("tp") * n
    buffer[:, start:start + n] = x
    return ax.psum(buffer, "tp")


@entry((("x", X, P("dp", "tp"), True),), (P("dp", None, "tp"),), identity)
def ulysses_all_to_all(ax: Any, x: Any, bug: str | None = None) -> Any:
    """The sequence split moved to the hidden dimension (DeepSpeed-Ulysses' all_to_all)."""
    if bug == "all_to_all dimensions swapped":
        return ax.all_to_all(x, "tp", split_dim=1, concat_dim=2)
    return ax.all_to_all(x, "tp", split_dim=2, concat_dim=1)


def mean_square(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return ((x @ w) ** 2).mean()


@entry((("x", X, P("dp"), False), ("w", W1, P(), True)), (P(),), mean_square)
def data_parallel_loss(ax: Any, x: Any, w: Any, bug: str | None = None) -> Any:
    """Data parallel: each member's mean loss, averaged over dp; the weight's gradient summed over dp."""
    w = w if bug == "weight not pvary-ed" else ax.pvary(w, ("dp", "tp"))
    local = ((x @ w) ** 2).mean()
    if bug == "psum of the members' means":
        return ax.pmean(ax.psum(local, "dp"), "tp")
    if bug == "loss not reduced over dp":
        return ax.pmean(local * 1.0, "tp")
    return ax.pmean(ax.pmean(local, "dp"), "tp")


@entry((("x", X[:2], P("dp"), True), ("w", W1, P(), True)), (P("dp"),),
       lambda x, w: (x.reshape(-1, E) @ w).view(x.shape[0], S, FF))
def micro_batch_of_one(ax: Any, x: Any, w: Any, bug: str | None = None) -> Any:
    """One sample per dp member: the batch flattened into the rows and back (a size-1 split dimension)."""
    if bug != "weight not pvary-ed over dp":
        w = ax.pvary(w, "dp")
    if bug == "weight pvary-ed twice":
        w = ax.pvary(w, "dp")
    rows = x.reshape(-1, E) @ w
    return rows.view(x.shape[0], S, FF)


def masked_mean(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    keep = labels >= 0
    return (x.sum(-1) * keep).sum() / keep.sum()


LABELS = torch.where(torch.rand(B, S, generator=g) < 0.3, -1, 1)


@entry((("x", X, P("dp"), True), ("labels", LABELS, P("dp"), False)), (P(),), masked_mean)
def token_count(ax: Any, x: Any, labels: Any, bug: str | None = None) -> Any:
    """A loss over the tokens kept: the sum and the count, each summed over dp (a psum of a token count)."""
    keep = labels >= 0
    total = (x.sum(-1) * keep).sum()
    count = keep.sum()
    if bug == "each member's own count":
        return ax.psum(total, "dp") / count
    if bug == "pmean of the sum":
        return ax.pmean(total, "dp") / ax.psum(count, "dp")
    return ax.psum(total, "dp") / ax.psum(count, "dp")


@entry((("x", X, P("dp", None, "tp"), True), ("w", W2[:E], P("tp"), True)), (P("dp", partial="tp"),),
       lambda x, w: x @ w)
def row_parallel_partial_output(ax: Any, x: Any, w: Any, bug: str | None = None) -> Any:
    """A row-parallel product left pending: the out spec declares it partial (DTensor's Partial)."""
    if bug != "weight not pvary-ed over dp":
        w = ax.pvary(w, "dp")
    return x @ w


# Each mistake: (program, bug) -> (what the message must name, the fix it must print (in the right program))
MISTAKES: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ('attention_by_hand', 'temperature not pvary-ed'):
        (('t', 'invariant', "'dp'", "'tp'"), "ax.pvary(t, ('dp', 'tp'))"),
    ('attention_by_hand', 'temperature pvary-ed over tp only'): (('t', 'invariant', "'dp'"), "ax.pvary(t, 'dp')"),
    ('attention_one_head_per_member', 'output gathered over the heads'):
        (("'tp'", 'the same values on every member'), 'drop the ax.all_gather that made'),
    ('buffer_filled_by_index', 'written at the same place on every member'):
        (('x', "'tp'", 'same positions'), "ax.axis_index('tp')"),
    ('context_parallel_attention', 'causal mask from local positions'):
        (("'tp'", 'same on every member'), "ax.axis_index('tp')"),
    ('context_parallel_attention', 'is_causal with a split sequence'): (('is_causal', "'tp'"), 'attn_mask'),
    ('context_parallel_attention', 'keys not gathered'): (("'tp'", 'keys'), 'ax.all_gather('),
    ('data_parallel_loss', 'loss not reduced over dp'): (("'dp'", 'partial(pending mean)'), 'ax.pmean('),
    ('data_parallel_loss', "psum of the members' means"): (("'dp'", 'pending means'), 'ax.pmean('),
    ('data_parallel_loss', 'weight not pvary-ed'): (('w', 'invariant', "'dp'"), "ax.pvary(w, 'dp')"),
    ('einsum_and_addmm_mlp', 'addmm bias on the pending sum'): (('addmm', "'tp'", 'b2'), 'ax.psum('),
    ('einsum_and_addmm_mlp', 'weights not pvary-ed over dp'): (('w1', 'invariant', "'dp'"), "ax.pvary(w1, 'dp')"),
    ('micro_batch_of_one', 'weight not pvary-ed over dp'): (('w', 'invariant', "'dp'"), "ax.pvary(w, 'dp')"),
    ('micro_batch_of_one', 'weight pvary-ed twice'): (('pvary', 'w', "'dp'"), 'drop this pvary'),
    ('norm_over_a_split_hidden', 'layer norm over the split dimension'): (('layer', "'tp'", 'x'), 'ax.all_gather('),
    ('pipeline_shift', 'loss averaged over the stages'): (('pmean', 'partial', "'dp'"), 'ax.psum('),
    ('pipeline_shift', 'loss not reduced over the stages'): (('partial', "'dp'"), 'ax.psum('),
    ('ring_reduce_scatter', 'the pending sum scattered by hand, with no ring'):
        (('partial', "'tp'", 'differs per member'), 'ax.psum('),
    ('row_parallel_partial_output', 'weight not pvary-ed over dp'): (('w', 'invariant', "'dp'"), "ax.pvary(w, 'dp')"),
    ('running_sum_over_a_split_sequence', 'local cumsum'):
        (('cumsum', "'tp'", 'x'), "ax.cumsum(..., 'tp', dim=-2) instead of this cumsum"),
    ('sequence_parallel_layer_norm', 'weight not pvary-ed'):
        (('w', 'invariant', "'dp'", "'tp'"), "ax.pvary(w, ('dp', 'tp'))"),
    ('sequence_parallel_layer_norm', 'weight pvary-ed over dp only'): (('w', "'tp'"), 'ax.pvary('),
    ('sequence_parallel_layer_norm', 'weight pvary-ed over tp only'): (('w', "'dp'"), "ax.pvary(w, 'dp')"),
    ('sequence_parallel_layer_norm', 'weight pvary-ed twice'): (('pvary', 'varying', "'dp'"), 'drop this pvary'),
    ('sequence_parallel_mlp', 'all_gather where psum_scatter belongs'): (('partial', "'tp'"), 'ax.psum_scatter('),
    ('sequence_parallel_mlp', 'gather at the wrong dimension'):
        (('all_gather', "'tp'", 'dimension'), "ax.all_gather(..., 'tp', dim=-2) instead of this all_gather"),
    ('sequence_parallel_mlp', 'no sequence gather'): (("'tp'", 'x'), 'ax.all_gather'),
    ('sequence_parallel_mlp', 'psum then psum_scatter'): (('invariant', "'tp'", 'psum('), 'drop the ax.psum that made'),
    ('tensor_parallel_mlp', 'bias before the psum'): (('partial', "'tp'", 'b2'), 'ax.psum('),
    ('tensor_parallel_mlp', 'bias not pvary-ed over dp'): (('b2', 'invariant', "'dp'"), "ax.pvary(b2, 'dp')"),
    ('tensor_parallel_mlp', 'input not pvary-ed over tp'): (('x', 'invariant', "'tp'"), "ax.pvary(x, 'tp')"),
    ('tensor_parallel_mlp', 'input pvary-ed twice'): (('pvary', 'x', 'varying', "'tp'"), 'drop this pvary'),
    ('tensor_parallel_mlp', 'pmean for psum'): (('partial', "'tp'", 'matmul'), 'ax.psum('),
    ('tensor_parallel_mlp', 'psum over the wrong axis'): (("'dp'",), 'ax.psum('),
    ('token_count', "each member's own count"): (("'dp'", 'sum(ge'), 'ax.psum('),
    ('token_count', 'pmean of the sum'): (('pmean', 'partial', "'dp'"), 'ax.psum('),
    ('ulysses_all_to_all', 'all_to_all dimensions swapped'):
        (('all_to_all', "'tp'", 'x'), 'split_dim=-1, concat_dim=-2'),
    ('vocab_parallel_cross_entropy', 'cross_entropy on the split logits'):
        (('logits', "'tp'"), "ax.all_gather(logits, 'tp', dim=-1)"),
    ('vocab_parallel_cross_entropy', 'exponentials not summed'): (('partial', "'tp'", 'log'), 'ax.psum('),
    ('vocab_parallel_cross_entropy', 'max not reduced'): (('partial(pending max)', "'tp'"), 'ax.pmax('),
    ('vocab_parallel_cross_entropy', 'psum of the mean over dp'): (('pending means', "'dp'"), 'ax.pmean('),
    ('vocab_parallel_cross_entropy', 'target logit from global positions'): (("'tp'", 'same indices'), 'ax.axis_index'),
    ('vocab_parallel_embedding', 'global ids into the local rows'):
        (('weight', "'tp'", 'same indices'), 'ax.axis_index'),
}
