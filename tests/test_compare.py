"""trl-credit-eval --compare_base: a trained adapter against its base model on the same problems, with an interval."""

import json
import math
import warnings

import pytest

from trl_credit.evaluation.compare import format_difference, paired_difference
from trl_credit.evaluation.evaluate import main


def report(counts, n=4, prompts=None):
    prompts = prompts or [f"q{i}" for i in range(len(counts))]
    return {"num_problems": len(counts), "num_samples": n, "accuracy": sum(counts) / (n * len(counts)),
            "problems": [{"num_correct": c, "num_samples": n, "prompt": p, "answer": "1"}
                         for c, p in zip(counts, prompts)]}


def test_paired_difference_by_hand():
    # trained shares .5, 1, 0; base .25, .5, 0 -> d = .25, .5, 0; mean .25; sd = sqrt((0 + .0625 + .0625) / 2) = .25;
    # half width 1.959964 * .25 / sqrt(3) = 0.282897
    result = paired_difference(report([2, 4, 0]), report([1, 2, 0]))
    assert result["trained"] == 0.5 and result["base"] == 0.25
    assert result["difference"] == pytest.approx(0.25)
    assert result["low"] == pytest.approx(0.25 - 0.282897, abs=1e-6)
    assert result["high"] == pytest.approx(0.25 + 0.282897, abs=1e-6)
    line = format_difference(result)
    assert "trained 50.0% vs base 25.0%: +25.0 points" in line and "-3.3 to +53.3" in line
    assert "no measured difference" in line  # the interval holds 0
    # every problem one sample better (d = .25 each): sd 0, the interval is the point, above 0
    better = paired_difference(report([2, 2, 2]), report([1, 1, 1]))
    assert better["low"] == pytest.approx(0.25) and "better than the base" in format_difference(better)
    single = paired_difference(report([2]), report([1]))
    assert single["low"] is None and "no interval" in format_difference(single)


def test_paired_difference_refuses_other_problems_or_sample_counts():
    with pytest.raises(ValueError, match="same settings"):
        paired_difference(report([1, 2]), report([1, 2], n=8))
    with pytest.raises(ValueError, match="different problems"):
        paired_difference(report([1, 2]), report([1, 2], prompts=["q0", "other"]))


def test_compare_base_evaluates_the_adapters_base_with_the_same_settings(tiny_model_path, tmp_path, capsys,
                                                                       monkeypatch):
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(str(tmp_path / "adapter"))
    out = tmp_path / "adapter-eval"
    figures, curves = [], []  # (png, {label: y values}) of every figure saved, read where matplotlib draws and saves
    real_plot, real_savefig = Axes.plot, Figure.savefig

    def plot(self, x, y, *args, **kwargs):
        curves.append((kwargs.get("label"), list(y)))
        return real_plot(self, x, y, *args, **kwargs)

    def savefig(self, path, *args, **kwargs):
        figures.append((str(path), dict(curves)))
        curves.clear()
        return real_savefig(self, path, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", plot)
    monkeypatch.setattr(Figure, "savefig", savefig)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["--adapter", str(tmp_path / "adapter"), "--num_problems", "3", "-n", "2", "--max_new_tokens",
                     "4", "--rollout_template", "lines", "--output_dir", str(out), "--no_progress", "--device", "cpu",
                     "--compare_base"])
    assert code == 0
    assert not [w for w in caught if issubclass(w.category, FutureWarning) and "checkpointing" in str(w.message)]
    printed = capsys.readouterr().out
    trained = json.loads((out / "report.json").read_text())
    base = json.loads((tmp_path / "adapter-eval-base" / "report.json").read_text())
    assert trained["settings"]["adapter"] == str(tmp_path / "adapter") and base["settings"]["adapter"] is None
    assert base["settings"]["model"] == tiny_model_path  # the base the adapter records
    for key in ("rollout_template", "num_samples", "num_problems", "max_new_tokens", "temperature", "seed"):
        assert base["settings"][key] == trained["settings"][key]
    assert base["settings"]["rollout_template"] == "lines"
    assert f"trained {100 * trained['accuracy']:.1f}% vs base {100 * base['accuracy']:.1f}%" in printed
    assert not math.isnan(trained["accuracy"])
    # the adapter's plot, drawn last, holds the base's pass@k beside its own (values from the two reports)
    png, drawn = figures[-1]
    assert png == str(out / "pass_at_k.png") and f"both in plot {png}" in printed
    assert drawn["pass@k"] == pytest.approx([100 * trained["pass_at_k"][k] for k in ("1", "2")])
    assert drawn["pass@k (base)"] == pytest.approx([100 * base["pass_at_k"][k] for k in ("1", "2")])
    assert "pass@k (base)" not in figures[0][1]  # the adapter's first plot, before the base ran
    # greedy accuracy of both models on the same problems, pass@k at the largest k, and the sharpening baseline
    trained_greedy = json.loads((tmp_path / "adapter-eval-greedy" / "report.json").read_text())
    base_greedy = json.loads((tmp_path / "adapter-eval-base-greedy" / "report.json").read_text())
    for greedy in (trained_greedy, base_greedy):
        assert greedy["settings"]["temperature"] == 0.0 and greedy["num_samples"] == 1
        assert greedy["num_problems"] == trained["num_problems"]
    assert base_greedy["settings"]["adapter"] is None and trained_greedy["settings"]["adapter"] is not None
    assert (f"greedy accuracy: trained {100 * trained_greedy['accuracy']:.1f}% vs base "
            f"{100 * base_greedy['accuracy']:.1f}%") in printed
    assert f"pass@2: trained {100 * trained['pass_at_k']['2']:.1f}%" in printed
    assert f"{100 * max(base_greedy['accuracy'], base['accuracy']):.1f}%; the trained model's better" in printed
    with pytest.raises(SystemExit, match="--adapter"):
        main(["--model", tiny_model_path, "--compare_base"])


def test_beyond_sampling_names_the_sharpening_baseline():
    from trl_credit.evaluation.compare import format_beyond_sampling

    trained = dict(report([2, 2]), pass_at_k={"1": 0.5, "2": 0.75}, settings={"temperature": 0.7})
    base = dict(report([1, 1]), pass_at_k={"1": 0.25, "2": 0.4}, settings={"temperature": 0.7})
    text = format_beyond_sampling(trained, base, report([1, 0], n=1), report([1, 1], n=1))
    # base greedy 100% beats base at 0.7 (25%): the baseline is greedy; the trained model's best is 50%
    assert "greedy accuracy: trained 50.0% vs base 100.0%: -50.0 points" in text
    assert "pass@2: trained 75.0% vs base 40.0%" in text
    assert "(the base at its better of greedy and temperature 0.7: greedy) 100.0%" in text and "not above it" in text
