"""What a testbed model does before any training (docs/testbed.md#the-trap-regime): its held-out accuracy greedy
and at several temperatures, the sharpening baseline (the best of those, named), pass@k up to 64, and the share of
training prompts whose group of G samples at the training temperature is all-fail (no gradient for GRPO).

    python -m trl_credit.testbed.profile --regime trap [--results benchmarks/results/trap/base_profile.json]
"""

from __future__ import annotations

import argparse
import time

import torch

from trl_credit.tasks import sums
from trl_credit.testbed import runner
from trl_credit.testbed.model import make_tokenizer, save_profile, testbed_model_path
from trl_credit.testbed.regimes import regime_recipe

__all__ = ["TEMPERATURES", "base_profile", "sharpening_baseline"]

#: the temperatures the base model is scored at (besides greedy); 1.0 is the training temperature
TEMPERATURES = (0.3, 0.5, 0.7, 1.0)


def sharpening_baseline(greedy_accuracy: float, by_temperature: dict) -> dict:
    """The untrained model at its best temperature (greedy counts as temperature 0): what lowering the entropy alone
    reaches, so a method learns something only where it beats it. ``{"temperature": ..., "accuracy": ...}``."""
    options = {"greedy": greedy_accuracy, **{f"{float(t):g}": a for t, a in by_temperature.items()}}
    best = max(options, key=options.get)
    return {"temperature": best, "accuracy": options[best]}


@torch.no_grad()
def base_profile(model, tokenizer, test, train, temperatures=TEMPERATURES, samples: int = 8, group: int = 8,
                 train_problems: int = 512, passk_samples: int = 64, passk_problems: int | None = 128) -> dict:
    """The profile of the module docstring. Held-out numbers on ``test`` (``samples`` per problem per temperature;
    pass@k from ``passk_samples`` samples at temperature 1 on the first ``passk_problems``), the all-fail share on
    the first ``train_problems`` of ``train`` (one group of ``group`` samples each at temperature 1)."""
    start = time.process_time()
    by_temperature, reports = {}, {}
    for temperature in temperatures:
        report = runner.evaluate(model, tokenizer, test, samples=samples, temperature=temperature,
                                 greedy=temperature == 1.0, passk_samples=passk_samples if temperature == 1.0 else 0,
                                 passk_problems=passk_problems)
        by_temperature[f"{float(temperature):g}"] = report["accuracy"]
        reports[f"{float(temperature):g}"] = report
    at_one = reports["1"]
    groups = runner.evaluate(model, tokenizer, train.select(range(min(train_problems, len(train)))),
                             samples=group, seed=4321)
    all_fail = [c == 0 for c in groups["correct_per_problem"]]
    per64 = at_one.get("passk_correct_per_problem", [])
    failed8 = [i for i, c in enumerate(at_one["correct_per_problem"][: len(per64)]) if c == 0]
    return dict(
        greedy_accuracy=at_one["greedy_accuracy"], accuracy_by_temperature=by_temperature,
        sharpening_baseline=sharpening_baseline(at_one["greedy_accuracy"], by_temperature),
        pass_at_k=at_one["pass_at_k"], pass_at_k_large=at_one.get("pass_at_k_large", {}),
        passk_samples=passk_samples, passk_problems=len(per64),
        share_solved_in_64=sum(c > 0 for c in per64) / len(per64) if per64 else None,
        test_all_fail_in_8=sum(c == 0 for c in at_one["correct_per_problem"]) / len(at_one["correct_per_problem"]),
        test_all_fail_in_8_solved_in_64=(sum(per64[i] > 0 for i in failed8) / len(failed8)) if failed8 else None,
        train_all_fail_share=sum(all_fail) / len(all_fail), train_groups=len(all_fail), group_size=group,
        train_accuracy=groups["accuracy"], structures=at_one["structures"],
        greedy_correct=at_one["greedy_correct"], correct_per_problem=at_one["correct_per_problem"],
        passk_correct_per_problem=per64, cpu_seconds=time.process_time() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--regime", default="trap")
    parser.add_argument("--model", default=None, help="a testbed model folder (default: the regime's build)")
    parser.add_argument("--results", default=None, help="write the profile here (JSON)")
    args = parser.parse_args(argv)
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    path = args.model or testbed_model_path(regime_recipe(args.regime), progress=True)
    data = sums.make_dataset()
    profile = base_profile(LlamaForCausalLM.from_pretrained(path), make_tokenizer(), data["test"], data["train"])
    save_profile(profile, path, args.regime, args.results, per_item="per_problem")


if __name__ == "__main__":
    main()
