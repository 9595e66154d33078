"""Put ``benchmarks/`` (its shared ``harness`` package) and its question folders (cost, mechanisms, learning, tiny, tools) on
``sys.path``, so tests import the benchmark scripts by name, as each script imports its siblings when run."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
GROUPS = ("cost", "mechanisms", "learning", "tiny", "tools")

for _folder in (BENCHMARKS, *(BENCHMARKS / group for group in GROUPS)):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
