"""Calculon (Isaev et al., SC'23; github.com/calculon-ai/calculon) on the rows of ``bench/data/published_runs.json``:
its step time per row, written to ``bench/data/calculon_runs.json`` for ``bench/planner_validation.py``'s table.

Calculon is no dependency of fmesh: run this with a Python that can import a checkout of it (pure Python; it needs
pandas and psutil), in its own virtual environment:

    python3 -m venv /tmp/calc && /tmp/calc/bin/pip install pandas psutil
    /tmp/calc/bin/python bench/calculon_rows.py --calculon /path/to/calculon

Korthikanti et al.'s rows run on Calculon's own inputs for them (``validation/seqsel/tab5``: its model and
execution files, fitted by its authors to those rows); the other Megatron-LM rows are written in the same form
(GPT model: ``feedforward = 4 * hidden``; execution: the row's tp, pp, dp, batch, micro-batch, interleaving,
recomputation, fp16, no optimizer sharding, no data-parallel overlap, as Calculon's tab5 inputs set them), all on
``systems/a100_80g.json``. Rows whose weights are sharded over the data-parallel ranks (FSDP, ZeRO-3) have no
counterpart in Calculon, whose ``optimizer_sharding`` shards the optimizer state only: they get ``null``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TAB5 = {"K22 22B": "megatron-22B", "K22 175B": "gpt3-175B", "K22 530B": "turing-530B", "K22 1T": "megatron-1T"}


def _execution(row: dict[str, Any]) -> dict[str, Any]:
    return {"num_procs": row["gpus"], "tensor_par": row["tp"], "pipeline_par": row["pp"],
            "data_par": row["dp_replicate"], "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1,
            "batch_size": row["global_batch"], "microbatch_size": row["micro_batch"], "datatype": "float16",
            "fused_activation": False, "attention_type": "multihead",
            "activation_recompute": {"full": "full", "selective": "attn_only", "none": "none"}[row["recompute"]],
            "pipeline_interleaving": row["pipeline_interleave"], "optimizer_sharding": False,
            "tensor_par_comm_type": "rs_ag" if row["sequence_parallel"] else "ar", "tensor_par_overlap": "none",
            "seq_par_ag_redo": row["sequence_parallel"], "data_par_overlap": False, "weight_offload": False,
            "activations_offload": False, "optimizer_offload": False, "training": True}


def _application(config: dict[str, Any]) -> dict[str, Any]:
    return {"hidden": config["hidden"], "feedforward": 4 * config["hidden"], "seq_size": config["seq_len"],
            "attn_heads": config["heads"], "attn_size": config["hidden"] // config["heads"],
            "num_blocks": config["layers"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calculon", required=True, help="a checkout of github.com/calculon-ai/calculon")
    args = parser.parse_args()
    sys.path.insert(0, args.calculon)
    import calculon  # type: ignore[import-not-found]
    from calculon.llm import Llm  # type: ignore[import-not-found]

    with open(os.path.join(HERE, "data", "published_runs.json")) as handle:
        data = json.load(handle)
    system = calculon.System(calculon.io.read_json_file(os.path.join(args.calculon, "systems", "a100_80g.json")))
    rows = []
    for row in data["rows"]:
        if row["dp_shard"] > 1:
            rows.append({"id": row["id"], "seconds": None,
                         "why": "weights sharded over the data-parallel ranks: Calculon shards the optimizer only"})
            continue
        prefix = " ".join(row["id"].split()[:2])
        if prefix in TAB5:
            name = TAB5[prefix]
            mode = "full" if row["recompute"] == "full" else "seqsel"
            app = calculon.io.read_json_file(os.path.join(args.calculon, "models", f"{name}.json"))
            exe = calculon.io.read_json_file(os.path.join(args.calculon, "validation", "seqsel", "tab5",
                                                          f"{name}_{mode}.json"))
            how = f"Calculon's own inputs: models/{name}.json, validation/seqsel/tab5/{name}_{mode}.json"
        else:
            app, exe = _application(data["models"][row["model"]]), _execution(row)
            how = "written from the row"
        model = Llm(Llm.Application(app), logging.getLogger("calculon"))
        model.compile(system, Llm.Execution.from_json(exe))
        model.run(system)
        rows.append({"id": row["id"], "seconds": model.get_stats_json(False)["total_time"], "inputs": how})
    commit = subprocess.run(["git", "-C", args.calculon, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    out = {"calculon": f"github.com/calculon-ai/calculon at {commit or 'an unknown commit'}",
           "system": "systems/a100_80g.json", "command": "python bench/calculon_rows.py --calculon PATH",
           "rows": rows}
    with open(os.path.join(HERE, "data", "calculon_runs.json"), "w") as handle:
        handle.write(json.dumps(out, indent=1) + "\n")
    print(f"{sum(r['seconds'] is not None for r in rows)} of {len(rows)} rows costed by Calculon")


if __name__ == "__main__":
    main()
