"""The per-axis types' rule for means (fmesh.spmd.types.averaged), in one process on the fake backend: a psum of
the members' means of their own blocks must be divided by the member count before any other use (Megatron's loss
averaging), a pmean of them is the mean of the whole, and a sum divided by the whole's count passes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import fmesh
from fmesh.spmd import P, shard_map


def run(body: Callable[..., torch.Tensor], *inputs: torch.Tensor, specs: tuple[P, ...] = (P("dp"),)) -> torch.Tensor:
    with fmesh.Context.fake(2) as ctx:
        mesh = fmesh.make_mesh((2,), ("dp",))
        region = shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), ctx=ctx, names=["x", "w"])
        return region.local(*inputs)


@pytest.mark.parametrize("mean", [
    lambda x: x.mean(),
    lambda x: (x * 2.0 + 1.0).mean() * 0.5,  # a mean scaled is still a mean
    lambda x: F.mse_loss(x, torch.zeros_like(x)),
    lambda x: F.cross_entropy(x.view(2, 2), torch.tensor([0, 1])),
], ids=["mean", "scaled mean", "mse_loss", "cross_entropy"])
def test_a_psum_of_block_means_must_be_divided_and_a_pmean_need_not(
        mean: Callable[[torch.Tensor], torch.Tensor]) -> None:
    x = torch.arange(4.0, requires_grad=True)
    summed = r"the sum over 'dp' of the members' pending means: .*2 times the mean of the whole; fix: "
    with pytest.raises(fmesh.SpmdTypeError, match=summed + r"ax.pmean\(..., 'dp'\) instead of the ax.psum that "
                                                     r"made .*\(or divide it by 2 right after the psum\)"):
        run(lambda ax, b: ax.psum(mean(b), "dp"), x)  # left as the sum
    for wrong in (lambda s: s.sum(), lambda s: s / 4, lambda s: s * 3, lambda s: s + 1.0, lambda s: s.exp(),
                  lambda s: s.backward()):
        with pytest.raises(fmesh.SpmdTypeError, match=summed + r".*divide it by 2 right after the psum"):
            run(lambda ax, b: wrong(ax.psum(mean(b), "dp")), x)  # noqa: B023
    pmean = run(lambda ax, b: ax.pmean(mean(b), "dp"), x)
    # Megatron's average_losses: psum, then divide by the number of members (or times its inverse)
    for divided in (lambda s: s / 2, lambda s: s.view(1) / 2.0, lambda s: s * 0.5):
        assert torch.equal(run(lambda ax, b: divided(ax.psum(mean(b), "dp")).sum() + 0, x), pmean)  # noqa: B023


def test_an_output_left_varying_gets_the_reduction_that_fits_it() -> None:
    x = torch.arange(4.0)
    with pytest.raises(fmesh.SpmdTypeError, match=r"output 0: sum\(x\) is partial along 'dp', but its out spec "
                                                  r"claims it replicated; fix: return ax.psum\(sum\(x\), 'dp'\)"):
        run(lambda ax, b: b.sum(), x)  # a sum along the split dimension: a pending sum
    with pytest.raises(fmesh.SpmdTypeError, match=r"output 0: exp\(x\) is varying\(dim -1\) along 'dp', but its out "
                                                  r"spec claims it replicated; fix: return ax.all_gather_invariant"):
        run(lambda ax, b: b.exp(), x)
    with pytest.raises(fmesh.SpmdTypeError, match=r"mean\(x\).*fix: return ax.pmean\(mean\(x\), 'dp'\)"):
        run(lambda ax, b: b.mean(), x)
    with pytest.raises(fmesh.SpmdTypeError, match=r"fix: return ax.all_gather_invariant\(mul\(x\), 'dp', dim=-1\)"):
        run(lambda ax, b: b * 2.0, x)


@pytest.mark.parametrize("body", [
    lambda ax, b: ax.psum(b.sum() / 4, "dp"),  # a sum over the whole's count: the mean, by hand
    lambda ax, b: ax.psum(F.mse_loss(b, torch.zeros_like(b), reduction="sum"), "dp"),
], ids=["sum over the count", "reduction sum"])
def test_sums_are_not_refused(body: Callable[..., torch.Tensor]) -> None:
    assert run(body, torch.arange(4.0)).numel() == 1


WEIGHT = torch.ones(4, requires_grad=True)
PARTIAL_AND_WEIGHT = (P(partial="dp"), P())


@pytest.mark.parametrize("body", [
    lambda ax, b, w: ax.psum(b * w, "dp"),  # w's gradient would be each member's part of it: sum_i b_i x g
    lambda ax, b, w: ax.psum(w * b, "dp"),
    lambda ax, b, w: ax.psum(F.linear(b.view(1, 4), w.view(1, 4)), "dp"),
    lambda ax, b, w: ax.psum(b / w, "dp"),
], ids=["partial * w", "w * partial", "linear(partial, w)", "partial / w"])
def test_a_partial_times_a_weight_that_wants_a_gradient_is_refused(body: Callable[..., torch.Tensor]) -> None:
    with pytest.raises(fmesh.SpmdTypeError, match=r"on (view\()?x\)? .*partial along 'dp'.*pending sum by .*w.*"
                                                  r"wants a gradient.*fix: ax.psum\((view\()?x\)?, 'dp'\) first"):
        run(body, torch.arange(4.0), WEIGHT, specs=PARTIAL_AND_WEIGHT)


@pytest.mark.parametrize("body", [
    lambda ax, b, w: ax.psum(b * w.detach(), "dp"),  # a constant weight: linear in the pending sum
    lambda ax, b, w: ax.psum(b * 0.5, "dp") * w,  # summed first: w's gradient is whole on every member
    lambda ax, b, w: ax.psum(b + 0.0, "dp") + w,  # adding 0 adds nothing, however often
    lambda ax, b, w: ax.psum(b + b, "dp") + w,
], ids=["constant weight", "psum first", "plus zero", "partial + partial"])
def test_linear_uses_of_a_partial_value_pass(body: Callable[..., torch.Tensor]) -> None:
    assert run(body, torch.arange(4.0), WEIGHT, specs=PARTIAL_AND_WEIGHT).shape == (4,)


@pytest.mark.parametrize("body", [
    lambda ax, b: ax.psum(b + 1.0, "dp"),
    lambda ax, b: ax.psum(1.0 - b, "dp"),
    lambda ax, b: ax.psum(b - 2, "dp"),
    lambda ax, b: ax.psum(b.clone().add_(1.0), "dp"),
    lambda ax, b: ax.psum(torch.add(b, 3.0), "dp"),
    lambda ax, b: ax.psum(b + torch.tensor(1.0), "dp"),  # a constant made in the region: invariant
], ids=["plus number", "number minus", "minus int", "in-place add", "torch.add", "plus 0-dim constant"])
def test_a_number_added_to_a_partial_value_is_refused(body: Callable[..., torch.Tensor]) -> None:
    with pytest.raises(fmesh.SpmdTypeError, match=r"on (clone\()?x\)? .*partial along 'dp': adds .*to a pending "
                                                  r"sum: it would be added once per member; fix: "
                                                  r"ax.psum\((clone\()?x\)?, 'dp'\)"):
        run(body, torch.arange(4.0), specs=(P(partial="dp"),))
