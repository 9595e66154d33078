"""Run a script under ``torchrun --nproc_per_node N`` on the CPU (gloo), for multi-process tests.

(``accelerate launch --cpu --num_processes 2`` starts only one process on this kind of machine; torchrun is
what accelerate picks up as a real 2-process gloo run.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_PORT_TAKEN = ("EADDRINUSE", "Address already in use", "address already in use")


def run_torchrun(script: str, *args: str, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``script`` in ``nproc`` processes; raise with both processes' output when it fails."""
    return _run_launcher(
        lambda port: ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
                      f"--master_port={port}"],
        script, args, timeout,
    )


def run_accelerate(config_file: str, script: str, *args: str, nproc: int = 2, timeout: int = 900):
    """Run ``script`` in ``nproc`` processes through ``accelerate launch --config_file config_file`` (the DeepSpeed
    tests: accelerate starts DeepSpeed from the config's ``deepspeed_config``); raise with the output when it fails."""
    return _run_launcher(
        lambda port: ["-m", "accelerate.commands.launch", "--config_file", config_file, "--num_processes", str(nproc),
                      "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)],
        script, args, timeout,
    )


def _run_launcher(launcher, script: str, args, timeout: int) -> subprocess.CompletedProcess:
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = repo_root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["OMP_NUM_THREADS"] = "1"  # two processes on two cores
    for attempt in range(2):
        cmd = [sys.executable, *launcher(_free_port()), script, *args]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=repo_root)
        # The free port is found, released, then bound by torchrun: another process may take it in between.
        # Only that start-up race is retried, once, with a new port; any other failure is reported as is.
        port_taken = any(text in result.stderr for text in _PORT_TAKEN)
        if result.returncode == 0 or not port_taken or attempt == 1:
            break
    if result.returncode != 0:
        raise AssertionError(
            f"{cmd[2]} failed ({result.returncode}): {' '.join(cmd)}\n--- stdout ---\n{result.stdout[-6000:]}"
            f"\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


def run_then_shut_down(main, *args) -> None:
    """Entry point of the scripts in tests/mp_scripts: run ``main(*args)``, then close the process group.

    Exiting with gloo's process group still open lets its threads be torn down by the interpreter's exit, which
    aborts a rank now and then ("terminate called without an active exception", exit -6) after all its work and
    output are done. Closing the group first makes the exit status mean what the script did.
    """
    main(*args)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
