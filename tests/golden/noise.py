"""Round-off bands of the golden runs whose numbers amplify float32 round-off (OPPO's), measured by perturbation.

Why: OPPO's evidence log λ_t = o_t − s_t is a difference of two log-probs. On the tiny random model of tests/tiny.py
the log-probs are about −6 while the evidence is about 0.006, so one float32 ulp of a log-prob (4.8e-7 at 6) is
~1e-4 of the evidence, and the group normalization carries that into the advantages, the loss, the update and the
second step. Two CPUs of one kind whose kernels round differently (e.g. AVX-512 vs AVX2 vector widths, MKL's code
paths) give log-probs that differ by an ulp, so OPPO's floats differ far beyond the golden files' rtol 1e-6 while
token ids stay equal. Measured on the recording machine vs a newer one: log-probs 1 ulp apart, advantages up to
1.4e-4 of their scale apart, grad_norm 1.3e-5, params sum 7e-5.

What: for each such scenario the recorder reruns it ``len(SEEDS)`` times with OPPO's o_t and s_t moved by one ulp
each, in a random direction per token (:func:`perturbed_evidence`: what a CPU rounding differently does), and stores,
per recorded quantity (:func:`band_key`: a tensor of one loss call, one logged metric, one parameter statistic), the
largest deviation of any of its values from the unperturbed run. ``compare`` admits ``record.NOISE_MARGIN`` times that
band (never less than its rtol/atol). Token ids, masks and counts stay exact.
"""

from __future__ import annotations

import contextlib
import math
import os
import re

#: Perturbation draws per scenario (the band is the largest deviation over them).
SEEDS = (101, 202, 303, 404)
#: Trainers whose recorded floats carry OPPO's evidence amplification (scenario names start with these).
SENSITIVE_METHODS = ("oppo/",)


def is_sensitive(name: str) -> bool:
    return name.startswith(SENSITIVE_METHODS)


@contextlib.contextmanager
def perturbed_log_probs(module, name: str, seed: int):
    """While inside, ``module.name`` receives its first two arguments (two log-prob tensors) each moved one float32
    ulp up or down (a random direction per token, from ``seed`` and the call's index; float64 inputs are float32 values
    widened, moved at float32): the round-off a CPU with other kernels puts on log-probs."""
    import torch

    real = getattr(module, name)
    generator = torch.Generator().manual_seed(seed)

    def one_ulp(values):
        up = torch.randint(0, 2, values.shape, generator=generator).to(values.device).bool()
        single = values.to(torch.float32)
        return torch.nextafter(single, torch.where(up, torch.inf, -torch.inf).to(torch.float32)).to(values.dtype)

    def perturbed(first, second, *args, **kwargs):
        return real(one_ulp(first), one_ulp(second), *args, **kwargs)

    setattr(module, name, perturbed)
    try:
        yield
    finally:
        setattr(module, name, real)


def perturbed_evidence(seed: int):
    """OPPO's recursion receives o_t and s_t each moved one float32 ulp (:func:`perturbed_log_probs`)."""
    import trl_credit.oppo.parts as oppo_parts

    return perturbed_log_probs(oppo_parts, "bayesian_value_recursion", seed)


def perturbed_token_rewards(seed: int):
    """PRIME's token rewards r_t = beta (log pi_phi - log pi_ref) receive both log-probs each moved one float32 ulp: a
    difference of two log-probs, like OPPO's evidence, so its whitened advantages amplify their round-off."""
    import trl_credit.prime.parts as prime_parts

    return perturbed_log_probs(prime_parts, "token_rewards", seed)


def band_key(path: str) -> str:
    """The recorded quantity a value belongs to: its path without the element indices of a tensor, e.g.
    ``/steps[0]/loss_calls[0]/advantages[3][5]`` -> ``/steps[0]/loss_calls[0]/advantages``."""
    return re.sub(r"(\[\d+\])+$", "", path)


def _floats(record, path: str = ""):
    if isinstance(record, dict):
        for key, value in record.items():
            yield from _floats(value, f"{path}/{key}")
    elif isinstance(record, list):
        for index, value in enumerate(record):
            yield from _floats(value, f"{path}[{index}]")
    elif isinstance(record, float):
        yield path, record


def bands(base: dict, perturbed: list[dict]) -> dict[str, float]:
    """Per recorded quantity (:func:`band_key`), the largest |perturbed − base| of its values over the perturbed
    runs. The runs must generate the same tokens: a perturbation that changes a token id is not round-off."""
    from tests.golden.record import compare

    reference = dict(_floats(base))
    out: dict[str, float] = {}
    for run in perturbed:
        exact = compare(base, run, rtol=math.inf, atol=math.inf)
        if exact:
            raise RuntimeError(f"a one-ulp perturbation changed more than floats: {exact[:3]}")
        for path, value in _floats(run):
            key = band_key(path)
            deviation = abs(value - reference[path])
            out[key] = max(out.get(key, 0.0), deviation if deviation == deviation else 0.0)
    return {key: value for key, value in sorted(out.items()) if value > 0}


def noise_runs(scenario: tuple, model_dir: str, output_dir: str, defaults: dict, rank: int = 0) -> list[dict]:
    """The scenario rerun under each one-ulp perturbation (SEEDS; another draw per rank)."""
    from tests.golden.record import run_scenario

    runs = []
    for seed in SEEDS:
        with perturbed_evidence(seed + 1000 * rank):
            runs.append(run_scenario(scenario, model_dir, output_dir, defaults))
    return runs


def one_process_noise(model_dir: str, work_dir: str, defaults: dict, runs: dict) -> dict:
    """Round-off bands of the sensitive scenarios, around this machine's unperturbed runs
    (``runs``; a sensitive scenario missing there is run here)."""
    from tests.golden.record import SCENARIOS, run_scenario

    noise = {}
    for name, scenario in SCENARIOS.items():
        if is_sensitive(name):
            print(f"measuring the round-off band of {name}", flush=True)
            out = os.path.join(work_dir, name.replace("/", "_") + "_noise")
            base = runs.get(name) or run_scenario(scenario, model_dir, out, defaults)
            noise[name] = bands(base, noise_runs(scenario, model_dir, out, defaults))
    return noise


def two_process_noise(ranks: list[dict]) -> dict:
    return {name: [bands(rank["runs"][name], rank["noise_runs"][name]) for rank in ranks]
            for name in ranks[0]["noise_runs"]}
