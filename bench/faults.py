"""The seeded fault campaign (``tests/faults.py``): N random faults over random jobs, each judged by the failure
model's promises; a table of what was run and what broke.

    python bench/faults.py --seeds 1000             # the nightly command: seeds 0..999, worlds of 2 to 8
    python bench/faults.py --seeds 20 --worlds 2-4  # the suite's sample (tests/context/test_fault_campaign.py)
    python bench/faults.py --only 5 --worlds 2-4    # one seed again, with every rank's outcome

Each run's verdict is one line (``-v``: every rank's outcome too); a violation prints the whole run. The process
checks after each run that it holds no extra thread, file descriptor or child (the leak check). Exit status 1 when
any run broke a promise.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds, from --first (default 100)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--only", type=int, nargs="*", help="these seeds only")
    parser.add_argument("--worlds", default="2-8", help="the world sizes drawn from, LOW-HIGH (default 2-8)")
    parser.add_argument("-v", "--verbose", action="store_true", help="every rank's outcome of every run")
    args = parser.parse_args(argv)
    low, _, high = args.worlds.partition("-")
    worlds = (int(low), int(high or low))
    seeds = args.only if args.only else list(range(args.first, args.first + args.seeds))
    faults.launched_once()
    counts: collections.Counter[str] = collections.Counter()
    # Per first fault (kind, point, whether the launcher marked the dead): runs, each promise's violations, and the
    # longest time from the fault to a survivor's first error.
    classes: dict[tuple[str, str, bool], dict[str, float]] = {}
    unmarked = 0  # runs whose launcher marked no dead rank
    broken = []
    started = time.monotonic()
    for seed in seeds:
        trial = faults.draw(seed, worlds)
        before = (threading.active_count(), len(os.listdir("/proc/self/fd")))
        verdict = faults.run(trial)
        left = faults.leaks(before)
        if left:
            verdict = faults.Verdict(trial, (*verdict.violations, left), verdict.outcomes, verdict.seconds,
                                     verdict.struck, verdict.named)
        for fault in verdict.struck:
            counts[f"{fault.kind} at {fault.point}"] += 1
        counts["(a fault not reached)"] += len(trial.faults) - len(verdict.struck)
        unmarked += not trial.marks
        first = trial.faults[0]
        key = (first.kind, first.point, trial.marks)
        row = classes.setdefault(key, {"runs": 0, "worst": 0.0, **dict.fromkeys(faults.PROMISES, 0)})
        row["runs"] += 1
        if verdict.named is not None and first in verdict.struck:
            row["worst"] = max(row["worst"], verdict.named)
        for violation in verdict.violations:
            row[faults.broken(violation)] += 1
        if verdict.ok and not args.verbose:
            print(f"ok   {trial} [{verdict.seconds:.1f}s]" + ("" if verdict.struck else " (no fault reached)"),
                  flush=True)
        else:
            print(("ok   " if verdict.ok else "FAIL ") + str(verdict), flush=True)
        if not verdict.ok:
            broken.append(seed)
    took = time.monotonic() - started
    print(f"\n{len(seeds)} runs ({sum(counts.values())} faults) in {took:.0f}s, worlds {worlds[0]}-{worlds[1]}: "
          f"{len(seeds) - len(broken)} kept every promise, {len(broken)} broke one: {broken}; {unmarked} runs with "
          "no launcher marks")
    for name, count in sorted(counts.items()):
        print(f"  {count:5d}  {name}")
    print("\nby first fault (marks: the launcher marked the dead): runs, violations per promise, the longest time "
          "from the fault to a survivor's first error")
    print(f"  {'first fault':36} {'marks':5} {'runs':>4} " + " ".join(f"{p:>12}" for p in faults.PROMISES)
          + "  worst")
    for (kind, point, marks), row in sorted(classes.items()):
        print(f"  {kind + ' at ' + point:36} {'yes' if marks else 'no':5} {row['runs']:4.0f} "
              + " ".join(f"{row[p]:12.0f}" for p in faults.PROMISES) + f"  {row['worst']:.1f}s")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
