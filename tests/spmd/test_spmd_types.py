"""The per-axis types' rule for means (fmesh.spmd.types.averaged), in one process on the fake backend: a psum of
the members' means of their own blocks is refused in the forward pass, a pmean of them is the mean of the whole,
and a sum divided by the whole's count passes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import fmesh
from fmesh.spmd import P, shard_map


def run(body: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    with fmesh.Context.fake(2) as ctx:
        mesh = fmesh.make_mesh((2,), ("dp",))
        region = shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P(), ctx=ctx, names=["x"])
        return region(x).to_local()


@pytest.mark.parametrize("mean", [
    lambda x: x.mean(),
    lambda x: (x * 2.0 + 1.0).mean() * 0.5,  # a mean scaled is still a mean
    lambda x: F.mse_loss(x, torch.zeros_like(x)),
    lambda x: F.cross_entropy(x.view(2, 2), torch.tensor([0, 1])),
], ids=["mean", "scaled mean", "mse_loss", "cross_entropy"])
def test_a_psum_of_block_means_is_refused_and_a_pmean_is_not(mean: Callable[[torch.Tensor], torch.Tensor]) -> None:
    x = torch.arange(4.0)
    with pytest.raises(fmesh.SpmdTypeError, match=r"psum of .* along 'dp': the sum of the members' means is 2 times "
                                                  r"the mean of the whole; fix: ax.pmean"):
        run(lambda ax, b: ax.psum(mean(b), "dp"), x)
    assert run(lambda ax, b: ax.pmean(mean(b), "dp"), x).shape == ()


@pytest.mark.parametrize("body", [
    lambda ax, b: ax.psum(b.sum() / 4, "dp"),  # a sum over the whole's count: the mean, by hand
    lambda ax, b: ax.psum(F.mse_loss(b, torch.zeros_like(b), reduction="sum"), "dp"),
    lambda ax, b: ax.psum(b.mean(dim=0, keepdim=True), "dp").sum(),  # not every element: the rule does not guess
], ids=["sum over the count", "reduction sum", "mean of one dimension kept"])
def test_sums_are_not_refused(body: Callable[..., torch.Tensor]) -> None:
    assert run(body, torch.arange(4.0)).numel() == 1
