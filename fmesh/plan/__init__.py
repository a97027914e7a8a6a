"""Everything that reasons about a job without a process group: pure values and arithmetic, no torch.

Bottom to top (a module imports only those above it in this list, never the Context):

* :mod:`fmesh.plan.communicators`: the communicator planner: the distinct communicators a set of meshes needs,
  in the order every rank creates them (the Context builds its process groups from it);
* :mod:`fmesh.plan.topology`: hosts x ranks per host, rank orders, which axes cross a host;
* :mod:`fmesh.plan.parallel`: the training recipe, :class:`~fmesh.ParallelDims`, and its meshes;
* :mod:`fmesh.plan.costs`: the cost model of a collective (:func:`~fmesh.cost`, :class:`~fmesh.plan.costs.Links`);
* :mod:`fmesh.plan.rescale`: a job scaled down after a loss or up after a join (``scale_down``, ``scale_up``);
* :mod:`fmesh.plan.jobs`: the job plan (:class:`~fmesh.plan.jobs.JobPlan`): every mesh, its groups and hosts;
* :mod:`fmesh.plan.manifest` and :mod:`fmesh.plan.manifest_diff`: the communicators a job creates, as a file, and
  the difference of two;
* :mod:`fmesh.plan.recovery`: the recovery plan after a loss: which communicators are kept, shrunk or created,
  and the data that moves;
* the model-aware planner: a model and how it is trained (:mod:`fmesh.plan.model`), GPUs and links
  (:mod:`fmesh.plan.hardware`), memory per GPU (:mod:`fmesh.plan.memory`), bytes per step per axis
  (:mod:`fmesh.plan.traffic`), step time (:mod:`fmesh.plan.step`), the search over layouts
  (:mod:`fmesh.plan.search`) and the model's plan (:mod:`fmesh.plan.model_plan`);
* the tables the command line prints, one module each, on :func:`fmesh.plan.table.format_table`:
  :mod:`fmesh.plan.job_table`, :mod:`fmesh.plan.manifest_table`, :mod:`fmesh.plan.diff_table`,
  :mod:`fmesh.plan.recovery_table`, :mod:`fmesh.plan.model_table`.

Importing :mod:`fmesh.plan` imports them all, so ``fmesh.plan.recovery.recover_job`` works after ``import fmesh``.

>>> import fmesh
>>> fmesh.plan.rescale.scale_down(fmesh.ParallelDims(8, dp_shard=4, tp=2), [2]).degrees["dp_shard"]
3
"""

from fmesh.plan import (
    communicators,
    costs,
    diff_table,
    hardware,
    job_table,
    jobs,
    manifest,
    manifest_diff,
    manifest_table,
    memory,
    model,
    model_plan,
    model_table,
    parallel,
    recovery,
    recovery_table,
    rescale,
    search,
    step,
    table,
    topology,
    traffic,
)

__all__ = [
    "communicators",
    "costs",
    "diff_table",
    "hardware",
    "job_table",
    "jobs",
    "manifest",
    "manifest_diff",
    "manifest_table",
    "memory",
    "model",
    "model_plan",
    "model_table",
    "parallel",
    "recovery",
    "recovery_table",
    "rescale",
    "search",
    "step",
    "table",
    "topology",
    "traffic",
]
