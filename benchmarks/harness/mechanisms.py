"""Shared pieces of the mechanism scripts (``benchmarks/mechanisms/mechanism_<method>.py``).

Each script builds one trainer on SmolLM2-135M-Instruct (offline) + LoRA on the built-in arithmetic task, collects
what the trainer computed through stable surfaces (the batches its ``on_credit`` callback sees, the rewards TRL
computed, TRL's ``_metrics``, and the pure functions the trainer module calls, wrapped to record their arguments and
results), and writes ``benchmarks/results/mechanism_<method>.json`` (raw numbers) and ``.png`` (figure).

1-digit + 1-digit addition with the ``final_number`` reward gives SmolLM2 a base accuracy around 45% (README,
temperature 0.7, 64 tokens), so most groups of 8 rollouts hold both correct and incorrect completions.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402  (sets offline environment variables before torch/transformers)
import torch  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def add_common_arguments(parser: argparse.ArgumentParser, prompts: int = 4, generations: int = 8, tokens: int = 64,
                         temperature: float = 0.7, steps: int = 1) -> None:
    parser.add_argument("--prompts", type=int, default=prompts, help="prompts per generation batch")
    parser.add_argument("--generations", type=int, default=generations, help="rollouts per prompt (num_generations)")
    parser.add_argument("--tokens", type=int, default=tokens, help="max completion tokens")
    parser.add_argument("--temperature", type=float, default=temperature)
    parser.add_argument("--steps", type=int, default=steps, help="generation batches (optimizer steps when training)")
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--digits", type=int, default=1, help="arithmetic task: digits per operand")
    parser.add_argument("--operands", type=int, default=2, help="arithmetic task: operands per problem")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", choices=["arithmetic", "chain"], default="arithmetic",
                        help="arithmetic (SmolLM2-135M-Instruct, reward final_number) or chain (smollm2-135m-chain, "
                        "rewards [accuracy, chain_format], docs/testbed.md); chain writes mechanism_<method>_chain.*")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--train", action="store_true",
                        help="take an optimizer step after each generation batch (LoRA) instead of only generating")
    parser.add_argument("--output", default=None, help="JSON path (default benchmarks/results/mechanism_<method>.json;"
                        " the PNG goes next to it)")


def output_paths(args, method: str) -> tuple[str, str]:
    suffix = "_chain" if getattr(args, "task", "arithmetic") == "chain" else ""
    json_path = args.output or os.path.join(RESULTS, f"mechanism_{method}{suffix}.json")
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    return json_path, os.path.splitext(json_path)[0] + ".png"


def is_chain(args) -> bool:
    return getattr(args, "task", "arithmetic") == "chain"


def build_trainer(method: str, args, own: dict | None = None, lora: bool = True, **trainer_kwargs):
    """The method's trainer with its offline settings (harness.METHODS), overridden by the CLI sizes. On the chain
    task: the warm-started ``smollm2-135m-chain``, rewards [accuracy, chain_format], and for SRPO the chain prompt
    as is (``rollout_template="none"``), one thought per line and the chain step checker (as benchmarks/learning/learning.py).
    """
    from trl_credit.models import CHAIN_MODEL, default_model_path, resolve_model_path
    from trl_credit.tasks.data import load_task_dataset
    from trl_credit.tasks.rewards import accuracy_reward, final_number_reward

    torch.set_num_threads(args.threads)
    settings = harness.common_settings(args.prompts, args.tokens, args.steps, args.seed, args.learning_rate)
    settings.update(num_generations=args.generations, temperature=args.temperature)
    if is_chain(args):
        from trl_credit.tasks.chain import chain_format_reward

        if method in ("srpo", "rrpo"):
            settings.update(rollout_template="none", thought_delimiter="\n", step_checker="chain")
        settings.update(own or {})
        dataset = load_task_dataset("chain", num_train=200, num_test=20, seed=0)
        model_path, rewards = resolve_model_path(CHAIN_MODEL), [accuracy_reward, chain_format_reward]
    else:
        settings.update(own or {})
        dataset = load_task_dataset("arithmetic", num_train=80, num_test=20, digits=args.digits,
                                    num_operands=args.operands, seed=0)
        model_path, rewards = default_model_path(), [final_number_reward]
    out_dir = tempfile.mkdtemp(prefix=f"mechanism_{method}_")
    config = harness.method_config(method, out_dir, settings)
    trainer = harness.build_trainer(method, config, model_path, dataset["train"], rewards,
                                    peft_config=harness.lora_config() if lora else None, **trainer_kwargs)
    return trainer


class Recorder(harness.ModulePatches):
    """Records each generation batch of a credit trainer (its ``on_credit`` callback: inputs and the batch TRL trains
    on), every ``_calculate_rewards`` call made for it (an instance-level wrap: the extra rows' calls too, which the
    batch's record does not hold), and the calls of module-level functions."""

    def __init__(self):
        self.batches = []  # dicts: inputs, output (cpu tensors), rewards (list of reward-call results)
        self.calls = {}  # name -> list of (args, kwargs, result)
        self._rewards = []
        super().__init__()

    def attach(self, trainer, on_output=None):
        rewards = trainer._calculate_rewards

        @functools.wraps(rewards)
        def calculate_rewards(*a, **k):
            result = rewards(*a, **k)
            self._rewards.append(result.detach().cpu())
            return result

        def keep_batch(step):
            # called once per generation batch, after every reward call of it: the calls since the last batch
            output = step.output
            record = dict(inputs=step.inputs, rewards=self._rewards,
                          output={k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in output.items()})
            if on_output is not None:
                record.update(on_output(trainer, step.inputs, output) or {})
            self.batches.append(record)
            self._rewards = []

        trainer._calculate_rewards = calculate_rewards
        trainer.add_credit_callback(keep_batch)

    def wrap(self, module, name: str):
        original = getattr(module, name, None)
        if original is None:
            where = getattr(module, "__name__", type(module).__name__)
            raise SystemExit(f"{where}.{name} is gone: this script records its calls; update the script.")
        self.calls[name] = []

        @functools.wraps(original)
        def wrapper(*a, **k):
            result = original(*a, **k)
            self.calls[name].append((a, k, result))
            return result

        self.replace(module, name, wrapper)


def collect(trainer, steps: int, train: bool) -> float:
    """Run ``steps`` generation batches: full optimizer steps when ``train``, else generation + scoring only."""
    batches = harness.prepare_manual_stepping(trainer)
    start = time.perf_counter()
    for _ in range(steps):
        if train:
            harness.run_step(trainer, batches)
        else:
            trainer._generate_and_score_completions(next(batches))
    return time.perf_counter() - start


def success_of(trainer, rewards_per_func: torch.Tensor) -> torch.Tensor:
    """bool (N,): the verifier's verdict per row, as the trainers decide it (trl_credit.core.setup.rollout_success)."""
    from trl_credit.core.setup import rollout_success

    return rollout_success(trainer, rewards_per_func).cpu()


def interpolate(values, grid: int = 20) -> list[float]:
    """A per-token curve resampled at ``grid`` evenly spaced normalized positions in [0, 1] (linear)."""
    n = len(values)
    if n == 0:
        return [float("nan")] * grid
    if n == 1:
        return [float(values[0])] * grid
    out = []
    for j in range(grid):
        x = j / (grid - 1) * (n - 1)
        lo = int(math.floor(x))
        hi = min(lo + 1, n - 1)
        out.append(float(values[lo] + (values[hi] - values[lo]) * (x - lo)))
    return out


def quantiles(rows: list[list[float]], qs=(0.25, 0.5, 0.75)) -> list[list[float]]:
    """Per column quantiles of equally long rows (NaN-free columns)."""
    if not rows:
        return [[] for _ in qs]
    tensor = torch.tensor(rows, dtype=torch.float64)
    return [torch.quantile(tensor, q, dim=0).tolist() for q in qs]


def wilson(k: int, n: int) -> list[float] | None:
    """95% Wilson score interval of k/n (trl_credit.evaluation.metrics.wilson_interval, as srpo_localization.wilson)."""
    from trl_credit.evaluation.metrics import wilson_interval

    return wilson_interval(k, n, 1.96)


# Chain analyses: where a line lies against the checker's first wrong line h_o.
REGIONS = ("before", "on", "after")


def region_of(line: int, first_wrong: int) -> str:
    return "before" if line < first_wrong else "on" if line == first_wrong else "after"


def cluster_bootstrap(values: list[float], clusters: list, draws: int = 2000, seed: int = 0) -> list[float] | None:
    """95% percentile interval of the mean of ``values`` when they come in correlated ``clusters`` (e.g. the
    completions of one prompt): clusters are resampled with replacement, the mean taken over their values."""
    import random

    groups = {}
    for value, cluster in zip(values, clusters):
        groups.setdefault(cluster, []).append(float(value))
    if not groups:
        return None
    rng, keys, means = random.Random(seed), list(groups), []
    for _ in range(draws):
        picked = [v for key in rng.choices(keys, k=len(keys)) for v in groups[key]]
        means.append(sum(picked) / len(picked))
    means.sort()
    return [means[int(0.025 * (draws - 1))], means[int(0.975 * (draws - 1))]]


def reset_position(h: int, h_o: int | None) -> str | None:
    """A reset h* against the checker's first wrong thought h_o (SRPO paper Fig. 4): the kept prefix (thoughts
    1..h*-1) is clean when h* <= h_o; None when the checker found no wrong thought."""
    if h_o is None:
        return None
    region = region_of(h, h_o)
    return "exact" if region == "on" else region


def reset_summary(resets: list[dict]) -> dict:
    """Where resets land against the checker and how often their suffixes are right, from per-reset records
    ``{h, h_o, suffixes, suffixes_correct}`` (h_o None: the checker found no wrong thought). Correction rates come
    with two intervals: Wilson over suffixes (too narrow: a reset's suffixes share its prefix) and a bootstrap over
    resets (``cluster_bootstrap``, the suffixes of one reset resampled together; Wilson's over resets when every
    suffix is wrong, or every one right, where the bootstrap has no width)."""
    checked = [r for r in resets if r["h_o"] is not None]
    positions = [reset_position(r["h"], r["h_o"]) for r in checked]

    def rate(rows):
        n = sum(r["suffixes"] for r in rows)
        k = sum(r["suffixes_correct"] for r in rows)
        values, clusters = [], []
        for index, r in enumerate(rows):
            values += [1.0] * r["suffixes_correct"] + [0.0] * (r["suffixes"] - r["suffixes_correct"])
            clusters += [index] * r["suffixes"]
        # Every resample of all-wrong (all-right) resets has the same mean: the bootstrap's [0, 0] would read as
        # certainty. Wilson's interval with one draw per reset is the honest width when suffixes share a prefix.
        over_resets = (wilson(k and len(rows), len(rows)) if n and k in (0, n)
                       else cluster_bootstrap(values, clusters))
        return dict(correct=k, suffixes=n, resets=len(rows), rate=k / n if n else None,
                    ci95=wilson(k, n) if n else None, ci95_over_resets=over_resets)

    summary = dict(resets=len(resets), checked=len(checked), unchecked=len(resets) - len(checked),
                   **{p: positions.count(p) for p in ("before", "exact", "after")},
                   mean_deviation=mean(r["h"] - r["h_o"] for r in checked),
                   correction_clean_prefix=rate([r for r in checked if r["h"] <= r["h_o"]]),
                   correction_erroneous_prefix=rate([r for r in checked if r["h"] > r["h_o"]]))
    for p in ("before", "exact", "after"):
        summary[f"{p}_rate_ci95"] = wilson(summary[p], len(checked)) if checked else None
    return summary


def record_resets(trainer) -> list[dict]:
    """Record every reset an SRPOTrainer makes while it trains (one process): h*, the checker's h_o (with a step
    checker), the seed's thoughts H, who chose h*, and how many of its suffixes the verifier scored / found right.
    Wraps the rollout's ``_choose_resets`` (the resets of a generation batch, in slot order) and
    ``_log_pass_rates`` (that batch's rows: the suffix rows come in the same order, ``suffixes_per_reset`` per
    reset, srpo/parts.py ``_training_rows``). Returns the list the records are appended to."""
    from trl_credit.srpo.parts import ROW_SUFFIX

    rollout, records, pending = trainer.rollout, [], []
    choose, log_pass_rates = rollout._choose_resets, rollout._log_pass_rates

    def choose_and_record(*args, **kwargs):
        resets = choose(*args, **kwargs)
        pending.append(resets)
        return resets

    def log_and_record(ctx, batch):  # the batch's context (trl_credit/core/context.py)
        resets = pending.pop(0)
        per_reset = ctx.args.suffixes_per_reset
        suffix_rows = (batch.row_kinds == ROW_SUFFIX).nonzero().flatten().tolist()
        if len(suffix_rows) != per_reset * len(resets):
            raise RuntimeError(f"record_resets: {len(suffix_rows)} suffix rows for {len(resets)} resets x {per_reset}"
                               " (one process only)")
        for index, reset in enumerate(resets):
            rows = suffix_rows[index * per_reset:(index + 1) * per_reset]
            scorable = [row for row in rows if bool(batch.scorable[row])]
            records.append(dict(step=ctx.step, h=int(reset.step), h_o=reset.oracle,
                                H=len(reset.ends), source=reset.source, suffixes=len(scorable),
                                suffixes_correct=sum(bool(batch.success[row]) for row in scorable)))
        return log_pass_rates(ctx, batch)

    rollout._choose_resets, rollout._log_pass_rates = choose_and_record, log_and_record
    return records


def mean(values) -> float:
    values = [float(v) for v in values if v == v]
    return sum(values) / len(values) if values else float("nan")


def write_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


def settings_of(args, trainer) -> dict:
    if is_chain(args):
        return dict(vars(args), model="smollm2-135m-chain (warm start, docs/testbed.md) + LoRA r=64 (all linear)",
                    task="built-in chain (docs/testbed.md), rewards [accuracy, chain_format]",
                    trainer=type(trainer).__name__, threads=torch.get_num_threads())
    return dict(vars(args), model="SmolLM2-135M-Instruct + LoRA r=64 (all linear layers)",
                task=f"built-in arithmetic ({args.digits}-digit, {args.operands} operands, +), reward final_number",
                trainer=type(trainer).__name__, threads=torch.get_num_threads())


def task_label(args) -> str:
    """Model and task for figure titles."""
    return "smollm2-135m-chain + LoRA, chain" if is_chain(args) else "SmolLM2-135M + LoRA, arithmetic"


def save_figure(fig, path: str, title: str) -> None:
    """Every mechanism figure: the run's settings as the title, saved as PNG next to its JSON, then closed."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def line_of_token(pieces) -> list[int]:
    """Line of every completion token, from the tokens' decoded texts ``pieces`` (special tokens decoded to ""):
    the 1-indexed non-empty line (chain.check_steps' numbering: blank lines are not counted) holding the token's
    first non-whitespace character; a whitespace-only token (a newline, an end-of-sequence token) gets the line it
    ends or follows, 0 before the first line."""
    lines, current, at_line_start, out = 0, 0, True, []
    for piece in pieces:
        label = None
        for ch in piece:
            if ch == "\n":
                at_line_start = True
            elif not ch.isspace():
                if at_line_start:
                    lines, at_line_start = lines + 1, False
                    current = lines
                if label is None:
                    label = current
        out.append(current if label is None else label)
    return out


def token_pieces(ids, tokenizer) -> list[str]:
    """Each token's decoded text (special tokens as "")."""
    return [tokenizer.decode([int(t)], skip_special_tokens=True) for t in ids]
