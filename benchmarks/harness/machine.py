"""The kind of CPU a measurement ran on (Linux ``/proc/cpuinfo``; empty elsewhere). CPU seconds compare only between
runs on one kind (benchmarks/tools/tool_summary.py), and golden floats reproduce bit for bit only there
(tests/golden/record.py)."""

from __future__ import annotations

#: The instruction-set flags that pick torch's and MKL's kernels.
KERNEL_FLAGS = ("avx", "amx", "fma", "f16c", "sse4")


def cpu_kind() -> dict:
    """``{"model": the CPU's model name, "flags": its kernel flags}``; ``{}`` where /proc/cpuinfo cannot be read."""
    try:
        with open("/proc/cpuinfo") as file:
            lines = file.read().splitlines()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = sorted(flag for flag in fields.get("flags", "").split() if flag.startswith(KERNEL_FLAGS))
    return {"model": fields.get("model name", ""), "flags": " ".join(flags)}
