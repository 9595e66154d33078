"""Question: How much memory and time do the trainers' CPU memory measures save on the README's main job?

Peak memory and time of the README's main job (examples/train_srpo.py, no arguments) with and without the CPU
memory measures of ``CPUMemoryMixin`` (docs/design.md#memory-on-the-cpu), run side by side.

Each variant runs the job in its own process, all variants at the same time (so machine load hits them alike), one
thread each (``OMP_NUM_THREADS=1``; the README runs one job with 2 threads). Reported per variant: peak RSS
(``ru_maxrss`` of the process), wall time, and each variant's time as a ratio of the first's; with ``--repeats``, the
median and range over the repeats. The model cache is the usual one (converted once), so the GGUF conversion is not
part of these peaks.

    python benchmarks/cost/cpu_memory.py                          # as is vs. TRL's behaviour, 1 repeat
    python benchmarks/cost/cpu_memory.py --variants as_is,no_tiles,no_mmap,off --repeats 2 --max_steps 1

What it cannot show: the time cost on another machine or allocator, or of a longer run (3 optimizer steps by default).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")

# What each variant switches off before running the example as __main__ (in the child process).
VARIANTS = {
    "as_is": "",
    "no_tiles": "t.CPUMemoryMixin.training_step = lambda self, *a: super(t.CPUMemoryMixin, self).training_step(*a)",
    "no_mmap": "t.return_freed_buffers = lambda: False",
    "mmap_1m": "t._CPU_MMAP_THRESHOLD = 1 << 20",  # the mmap threshold at 1 MiB / 4 MiB instead of 128 KiB
    "mmap_4m": "t._CPU_MMAP_THRESHOLD = 4 << 20",
    "off": "t.return_freed_buffers = lambda: False\n"
    "t.CPUMemoryMixin.training_step = lambda self, *a: super(t.CPUMemoryMixin, self).training_step(*a)",
}
CHILD = """
import resource, runpy, sys, time
import trl_credit.core.mixins as t
{patch}
start = time.perf_counter()
sys.argv = ["train_srpo.py", "--output_dir", {out!r}, "--max_steps", "{steps}", "--report_to", "none"]
runpy.run_path("examples/train_srpo.py", run_name="__main__")
print("RESULT", time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run_side_by_side(variants: list[str], max_steps: int, workdir: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    procs = {}
    for name in variants:
        code = CHILD.format(patch=VARIANTS[name], out=os.path.join(workdir, name), steps=max_steps)
        procs[name] = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{err[-3000:]}")
        seconds, peak_kb = out.strip().splitlines()[-1].split()[1:]
        results[name] = {"seconds": float(seconds), "peak_gb": int(peak_kb) * 1024 / 1e9}
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--variants", default="as_is,off", help=f"comma-separated, from {sorted(VARIANTS)}")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max_steps", type=int, default=3, help="optimizer steps (the README job: 3)")
    parser.add_argument("--output", default=os.path.join(RESULTS, "cpu_memory.json"))
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; accepted: {sorted(VARIANTS)}")
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            runs.append(run_side_by_side(variants, args.max_steps, os.path.join(workdir, str(repeat))))
            print(f"repeat {repeat}: {json.dumps(runs[-1])}", flush=True)
    summary = {}
    for name in variants:
        ratios = [run[name]["seconds"] / run[variants[0]]["seconds"] for run in runs]
        peaks = [run[name]["peak_gb"] for run in runs]
        summary[name] = {
            "peak_gb_median": statistics.median(peaks), "peak_gb_range": [min(peaks), max(peaks)],
            "seconds_median": statistics.median(run[name]["seconds"] for run in runs),
            f"time_ratio_to_{variants[0]}_median": statistics.median(ratios),
            f"time_ratio_to_{variants[0]}_range": [min(ratios), max(ratios)],
        }
        print(f"{name:>9}: peak {summary[name]['peak_gb_median']:.2f} GB, {summary[name]['seconds_median']:.0f} s, "
              f"time x{statistics.median(ratios):.2f} of {variants[0]} (range {min(ratios):.2f}-{max(ratios):.2f})")
    record = {"max_steps": args.max_steps, "repeats": args.repeats, "threads_per_process": 1,
              "cpu_count": os.cpu_count(), "load_average_at_end": os.getloadavg(), "runs": runs, "summary": summary}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(record, f, indent=1)
    return record


if __name__ == "__main__":
    main()
