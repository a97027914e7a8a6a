"""Benchmark (nightly): the manual region's checker against the differential fuzzer, on many more programs than
the suite's 300 (``tests/spmd/spmd_fuzz.py``: random programs over a (dp=2, tp=2) mesh, a mistake planted in two
of three, each run on a simulated 4-rank world in this process against one process).

Prints each verdict's count (``caught``: refused, and wrong; ``right``: passed, and right; ``false positive``:
refused, but right; ``silently wrong``: passed, but wrong; ``loud``: torch itself refused the unchecked program,
its shapes wrong; ``not built``: the generator made no program), what the fixes each caught program prints make of
it applied (``tests/spmd/spmd_fixes.py``), the caught mistakes by kind, and the seeds of any
silently wrong program or false positive (each a test to write). Each 100 programs run in a fresh process
(a process whose rank threads end stuck is run again: torch's fork_rng deadlocked beside other threads, no longer
used by the rehearsal; the retry stays as a guard).

    python bench/spmd_fuzz.py [--programs 5000] [--start 0]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CHUNK = 100  # programs per fresh process (thousands of short-lived rank threads in one process once ended stuck)


def judge_range(start: int, count: int) -> tuple[Counter[str], Counter[tuple[str, str]], list[Any]]:
    """Each verdict's count for seeds ``start .. start + count - 1``, by mistake kind too, and the odd seeds."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "spmd"))
    sys.path.insert(0, ROOT)
    import spmd_fuzz
    from spmd_fixes import fix_verdict
    from spmd_harness import judge

    counts: Counter[str] = Counter()
    kinds: Counter[tuple[str, str]] = Counter()
    odd: list[Any] = []
    for seed in range(start, start + count):
        faulthandler.dump_traceback_later(120, exit=True)  # a program stuck: every thread's stack, then out
        made = spmd_fuzz.program(seed)
        if made is None:
            counts["not built"] += 1
            continue
        try:
            verdict, message = judge(made[0])
        except (RuntimeError, ValueError, IndexError):
            counts["not built"] += 1
            continue
        counts[verdict] += 1
        kinds[(made[1] or "none planted", verdict)] += 1
        if verdict == "caught":  # the fixes it prints, applied
            try:
                fixed, _ = fix_verdict(made[0])
            except Exception as error:  # counted, and its seed printed
                fixed = "error"
                odd.append((seed, "fix error", made[1], repr(error)[:200]))
            counts["fix: " + fixed] += 1
            if fixed == "silently wrong":
                odd.append((seed, "fix silently wrong", made[1], message[:200]))
        if verdict in ("silently wrong", "false positive"):
            odd.append((seed, verdict, made[1], message[:200]))
    return counts, kinds, odd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=5000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--chunk", action="store_true", help="judge these seeds here, print them as JSON")
    args = parser.parse_args()
    if args.chunk:
        found = judge_range(args.start, args.programs)
        print(json.dumps([dict(found[0]), [[k, v, n] for (k, v), n in found[1].items()], found[2]]))
        return
    counts: Counter[str] = Counter()
    kinds: Counter[tuple[str, str]] = Counter()
    odd: list[Any] = []
    retried: list[int] = []
    began = time.perf_counter()
    for start in range(args.start, args.start + args.programs, CHUNK):
        count = min(CHUNK, args.start + args.programs - start)
        for _ in range(3):  # a process whose rank threads ended stuck (rare): the chunk again, afresh
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--chunk", "--start", str(start),
                                  "--programs", str(count)], capture_output=True, text=True, timeout=1800)
            if run.returncode == 0:
                break
            retried.append(start)
        else:
            raise SystemExit(f"seeds {start}..{start + count - 1} failed:\n{run.stderr[-3000:]}")
        chunk_counts, chunk_kinds, chunk_odd = json.loads(run.stdout.strip().splitlines()[-1])
        counts.update(chunk_counts)
        kinds.update({(k, v): n for k, v, n in chunk_kinds})
        odd.extend(chunk_odd)
    took = time.perf_counter() - began
    right = counts["right"] + counts["false positive"]
    print(f"{args.programs} seeds ({args.start}..{args.start + args.programs - 1}) in {took:.0f} s"
          + (f" (chunks run again after their rank threads ended stuck: {retried})" if retried else "") + "\n")
    print("| verdict | programs |")
    print("| --- | --- |")
    for verdict in ("caught", "right", "false positive", "silently wrong", "loud", "not built"):
        print(f"| {verdict} | {counts[verdict]} |")
    print(f"\nfalse positives: {counts['false positive']} of {right} right programs "
          f"({100 * counts['false positive'] / max(right, 1):.2f}%); silently wrong: {counts['silently wrong']}\n")
    print("| the fixes printed for a caught program, applied | programs |")
    print("| --- | --- |")
    for verdict in ("right", "loud", "no edit", "still refused", "silently wrong", "error"):
        print(f"| {verdict} | {counts['fix: ' + verdict]} |")
    print()
    print("| mistake planted | caught | right (harmless) | false positive | silently wrong | loud |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind in sorted({k for k, _ in kinds}):
        row = [kinds[(kind, v)] for v in ("caught", "right", "false positive", "silently wrong", "loud")]
        print(f"| {kind} | " + " | ".join(str(n) for n in row) + " |")
    for seed, verdict, kind, message in odd:
        print(f"\nseed {seed}: {verdict} ({kind}): {message}")


if __name__ == "__main__":
    main()
