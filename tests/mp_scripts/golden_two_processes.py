"""Golden runs in 2 processes (launched by tests/golden/record.py and tests/test_golden.py through torchrun).

usage: golden_two_processes.py MODEL_DIR OUT_DIR CONFIG_DEFAULTS_JSON [noise]
Runs every scenario of ``tests.golden.record.TWO_PROCESS_SCENARIOS`` (configs built from the given constructor
defaults) and writes this process's records to OUT_DIR/rank<N>.json; with ``noise`` (the recorder), also the reruns of
the round-off-sensitive scenarios under one-ulp perturbations (tests/golden/noise.py) as ``noise_runs``.
"""

import json
import os
import sys

from tests.golden.noise import is_sensitive, noise_runs
from tests.golden.record import TWO_PROCESS_SCENARIOS, load, run_scenario


def main(model_dir: str, out_dir: str, defaults_file: str, noise: str = ""):
    defaults = load(defaults_file)
    rank = int(os.environ.get("RANK", "0"))
    runs = {
        name: run_scenario(scenario, model_dir, os.path.join(out_dir, name.replace("/", "_")), defaults)
        for name, scenario in TWO_PROCESS_SCENARIOS.items()
    }
    record = {"rank": rank, "world": int(os.environ.get("WORLD_SIZE", "1")), "runs": runs}
    if noise == "noise":
        record["noise_runs"] = {
            name: noise_runs(scenario, model_dir, os.path.join(out_dir, name.replace("/", "_")), defaults, rank)
            for name, scenario in TWO_PROCESS_SCENARIOS.items()
            if is_sensitive(name)
        }
    # One file per rank: the two processes' stdout lines can interleave.
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as report:
        json.dump(record, report)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, *sys.argv[1:])
