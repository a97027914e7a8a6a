"""A job started by Slurm (``srun``): the launcher's variables torch reads, from the ones Slurm sets.

``srun`` starts one process per task and sets ``SLURM_PROCID`` (the task's rank), ``SLURM_NTASKS`` (the world
size), ``SLURM_LOCALID`` (its rank on its node) and ``SLURM_STEP_NODELIST`` (the step's hosts, in Slurm's
compressed form, ``gpu[01-04]``), but none of ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.
:func:`launcher_variables` derives those: the store is hosted by rank 0, on the step's first host, at
``MASTER_PORT`` if the job sets it, else at a port derived from ``SLURM_JOB_ID`` (the same in every task of the
job, and different between the jobs sharing a node). :meth:`fmesh.Context.from_env` uses them when the launcher's
variables are missing.

Unlike torchrun, ``srun`` keeps the other tasks running when one dies (unless ``--kill-on-bad-exit``), so the
survivors can :meth:`~fmesh.Context.recover` in place, provided the store outlives the lost task: rank 0 hosts it
here, so losing rank 0 ends the job (host the store elsewhere and set ``MASTER_ADDR``/``MASTER_PORT`` for that).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SLURM_RANK, SLURM_HOSTS = "SLURM_PROCID", "SLURM_STEP_NODELIST"  # both set by srun for each task
PORT_BASE, PORT_SPAN = 15000, 20000  # a derived MASTER_PORT lies in 15000..34999


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list (``node[01-03,07],login1``).

    >>> first_host("gpu[07-09,12],cpu3"), first_host("login1,login2"), first_host("a[3]b")
    ('gpu07', 'login1', 'a3b')
    """
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    if match is None or not (match.group(1) or match.group(2)):
        raise ValueError(f"expected a Slurm host list such as 'node[01-04]', but got SLURM_STEP_NODELIST={nodelist!r}")
    prefix, ranges, suffix = match.groups()
    if ranges is None:
        return prefix + suffix
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def _tasks_on_first_node(raw: str) -> int:
    """``SLURM_STEP_TASKS_PER_NODE``'s first count (``4(x2),3`` -> 4)."""
    return int(raw.split(",")[0].split("(")[0])


def launcher_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` as Slurm's
    variables give them, for those ``environ`` lacks; empty when ``environ`` is not a Slurm task's
    (``SLURM_PROCID`` and ``SLURM_STEP_NODELIST``, which only ``srun`` sets: a batch script run by ``sbatch`` has
    ``SLURM_PROCID=0`` too, and is a world of one). ``ValueError`` naming the variable when one is missing or not
    a number.

    >>> slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242",
    ...          "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}
    >>> launcher_variables(slurm)["MASTER_ADDR"], launcher_variables(slurm)["RANK"]
    ('gpu07', '5')
    >>> launcher_variables({**slurm, "MASTER_PORT": "29500", "RANK": "5"})
    {'WORLD_SIZE': '8', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '4', 'MASTER_ADDR': 'gpu07'}
    """
    if SLURM_RANK not in environ or SLURM_HOSTS not in environ:
        return {}
    missing = [name for name in ("SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID") if name not in environ]
    if missing:
        raise ValueError(f"this process has SLURM_PROCID={environ[SLURM_RANK]!r} but not {missing}; expected the "
                         "variables srun sets for each task (start the job with srun), or set RANK, WORLD_SIZE, "
                         "MASTER_ADDR and MASTER_PORT yourself")
    try:
        job = int(environ["SLURM_JOB_ID"])
    except ValueError:
        raise ValueError(f"expected SLURM_JOB_ID to be a number, but got {environ['SLURM_JOB_ID']!r}") from None
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE", environ.get("SLURM_TASKS_PER_NODE", environ["SLURM_NTASKS"]))
    derived = {
        "RANK": environ[SLURM_RANK],
        "WORLD_SIZE": environ.get("SLURM_STEP_NUM_TASKS", environ["SLURM_NTASKS"]),
        "LOCAL_RANK": environ["SLURM_LOCALID"],
        "LOCAL_WORLD_SIZE": str(_tasks_on_first_node(per_node)),
        "MASTER_ADDR": first_host(environ[SLURM_HOSTS]),
        "MASTER_PORT": str(PORT_BASE + job % PORT_SPAN),
    }
    return {name: value for name, value in derived.items() if name not in environ}
