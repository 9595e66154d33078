"""Pure helpers of the mechanism scripts' ``--task chain`` analyses (benchmarks/mechanisms/mechanism_*.py), hand-worked."""

import os
import sys

import pytest

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)

from harness import mechanisms as mechanism_common  # noqa: E402


def test_line_of_token_follows_the_checkers_line_numbering():
    # "6 * 3 = 18\n\n6 * 5 = 30\n18 + 30 = 48\n" + EOS: the blank line is not numbered (chain.check_steps); a token
    # spanning a line break gets the line of its first character; newline-only and EOS tokens the line they end.
    pieces = ["6", " *", " 3", " =", " 18", "\n", "\n", "6", " * 5 = 30\n18", " +", " 30 = 48", "\n", ""]
    assert mechanism_common.line_of_token(pieces) == [1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3]
    # leading whitespace before the first line is line 0
    assert mechanism_common.line_of_token(["\n", " ", "4", "\n", "x"]) == [0, 0, 1, 1, 2]


def test_region_shares_of_negative_advantage_mass():
    import mechanism_oppo

    # lines of 5 tokens, first wrong line 2; negative mass 1 (before) + 3 (on) + 0 (after) = 4
    shares = mechanism_oppo.region_shares([0, 1, 2, 2, 3], [-1.0, 0.5, -2.0, -1.0, 0.25], 2)
    assert shares["tokens"] == {"before": 0.4, "on": 0.4, "after": 0.2}
    assert shares["mass"] == {"before": 0.25, "on": 0.75, "after": 0.0}
    # no negative advantage: no mass shares
    assert mechanism_oppo.region_shares([1, 2], [0.5, 0.0], 1)["mass"]["on"] is None


def test_cluster_bootstrap_resamples_whole_clusters():
    # one cluster: every draw is its mean
    assert mechanism_common.cluster_bootstrap([0.2, 0.4], ["q", "q"], draws=50) == pytest.approx([0.3, 0.3])
    # clusters a = [0, 0, 0, 0], b = [1]: a quarter of the draws are (b, b), mean 1, so the upper end is 1; resampling
    # the five completions instead would need five draws of the one 1 (probability 1/5**5) for a mean of 1
    low, high = mechanism_common.cluster_bootstrap([0.0] * 4 + [1.0], ["a"] * 4 + ["b"], draws=400)
    assert (low, high) == (0.0, 1.0)
    assert mechanism_common.cluster_bootstrap([], []) is None


def test_summarize_regions_counts_prompts_texts_and_the_wrong_line_above_its_tokens():
    import mechanism_oppo

    def completion(question, text, first_wrong, tokens, mass):
        shares = dict(tokens=dict(zip(mechanism_oppo.REGIONS, tokens)), mass=dict(zip(mechanism_oppo.REGIONS, mass)))
        return dict(question=question, text=text, first_wrong=first_wrong, reason="arithmetic", loss=shares,
                    anchored=shares)

    regions = [completion("q1", "x", 2, (0.5, 0.25, 0.25), (0.0, 1.0, 0.0)),   # on: 1.0 > 0.25
               completion("q1", "x", 2, (0.5, 0.25, 0.25), (0.0, 1.0, 0.0)),   # the same text again
               completion("q2", "y", 1, (0.0, 0.5, 0.5), (0.0, 0.4, 0.6))]     # on: 0.4 < 0.5, on+after 1.0 = 1.0
    entry = mechanism_oppo.summarize_regions(regions)["all"]
    assert (entry["prompts"], entry["distinct_texts"], entry["completions"]) == (2, 2, 3)
    assert entry["loss_share_on_above_tokens"] == pytest.approx(2 / 3)
    assert entry["loss_share_on_after_above_tokens"] == pytest.approx(2 / 3)
    assert entry["loss_negative_mass_share"]["on"] == pytest.approx(2.4 / 3)
    # over prompts: q1's completions [1.0, 1.0], q2's [0.4]: means 1.0, 0.4 or 2.4 / 3
    low, high = entry["loss_on_mass_interval_over_prompts"]
    assert (low, high) == (pytest.approx(0.4), pytest.approx(1.0))
    assert entry["by_first_wrong_line"][2]["completions"] == 2
    assert entry["by_first_wrong_line"][1]["loss_negative_mass_share"]["after"] == pytest.approx(0.6)


def test_datpo_fork_regions_against_the_first_wrong_line():
    import mechanism_datpo

    def sentence(line, chosen):
        return dict(line=line, chosen=chosen)

    # rollout 1: wrong at line 2, lines 1-4, forks chosen on lines 2 and 4; rollout 2: correct (not counted);
    # rollout 3: wrong at line 1, fork on line 3
    prompts = [dict(rollouts=[
        dict(forks=[5, 15], first_wrong=2, sentences=[sentence(1, False), sentence(2, True), sentence(3, False),
                                                       sentence(4, True)]),
        dict(forks=[4], first_wrong=None, sentences=[sentence(1, True), sentence(2, False)]),
        dict(forks=[9], first_wrong=1, sentences=[sentence(1, False), sentence(2, False), sentence(3, True)]),
    ], branches=[dict(fork_line=2, first_wrong=2, correct=True), dict(fork_line=2, first_wrong=2, correct=False),
                 dict(fork_line=4, first_wrong=2, correct=False), dict(fork_line=1, first_wrong=None, correct=True),
                 dict(fork_line=3, first_wrong=1, correct=None)])]
    out = mechanism_datpo.fork_regions(prompts)
    assert (out["incorrect_forked_rollouts"], out["chosen_forks"]) == (2, 3)
    assert out["chosen_share"] == pytest.approx({"before": 0.0, "on": 1 / 3, "after": 2 / 3})
    # all 7 sentences of the two incorrect rollouts: before 1 (line 1 of rollout 1), on 2, after 4
    assert out["sentence_share"] == pytest.approx({"before": 1 / 7, "on": 2 / 7, "after": 4 / 7})
    corrected = out["branch_correct_by_region"]
    assert (corrected["on"]["correct"], corrected["on"]["branches"]) == (1, 2)
    assert (corrected["after"]["correct"], corrected["after"]["branches"]) == (0, 1)  # the unscored branch is left out
    assert corrected["before"] == dict(correct=0, branches=0, ci95=None)


def test_line_starts_and_solution_structure():
    import mechanism_cue_grpo
    import mechanism_datpo

    assert mechanism_datpo.line_starts(["6", " * 3 = 18", "\n", "18", " + 2 = 20\n", "\\boxed{20}"]) == {0, 3, 5}
    question = "6 * 3 + 6 * 5, then subtract 7"
    assert mechanism_cue_grpo.solution_structure(question, "3 + 5 = 8\n6 * 8 = 48") == "factored"
    assert mechanism_cue_grpo.solution_structure(question, "5 * 6 = 30\n3 * 6 = 18") == "term"
    assert mechanism_cue_grpo.solution_structure(question, "6 * 8 = 48") == "other"
    assert mechanism_cue_grpo.solution_structure("12 - 3, then add 4", "12 - 3 = 9") == "plain"


@pytest.mark.parametrize("k,n,expected", [(5, 10, (0.2366, 0.7634))])
def test_wilson_interval(k, n, expected):
    low, high = mechanism_common.wilson(k, n)
    assert low == pytest.approx(expected[0], abs=1e-4) and high == pytest.approx(expected[1], abs=1e-4)


def test_structure_partition_reads_the_question_from_the_chain_prompt():
    import mechanism_cue_grpo

    from trl_credit.tasks.chain import make_chain_dataset, parse_question

    test = make_chain_dataset(num_train=0, num_test=40, seed=0)["test"]
    row = next(r for r in test if parse_question(r["question"]).distributive)
    a, op, b, c = parse_question(row["question"]).core
    completions = [f"{b} {op} {c} = 0", f"{a} * {b} = {a * b}", "hello"]
    assert mechanism_cue_grpo.structure_partition(completions, row["prompt"]) == ["factored", "term", "other"]
    plain = next(r for r in test if not parse_question(r["question"]).distributive)
    assert mechanism_cue_grpo.structure_partition(["1 + 1 = 2"], plain["prompt"]) == ["plain"]


def test_reset_summary_by_hand():
    """Three checked resets (before, exact, after h_o) and one the checker found nothing wrong in."""
    resets = [dict(h=1, h_o=3, suffixes=4, suffixes_correct=2),   # before: clean prefix
              dict(h=2, h_o=2, suffixes=4, suffixes_correct=1),   # exact: clean prefix
              dict(h=4, h_o=2, suffixes=3, suffixes_correct=0),   # after: the prefix keeps the error
              dict(h=1, h_o=None, suffixes=4, suffixes_correct=4)]
    summary = mechanism_common.reset_summary(resets)
    assert (summary["resets"], summary["checked"], summary["unchecked"]) == (4, 3, 1)
    assert (summary["before"], summary["exact"], summary["after"]) == (1, 1, 1)
    assert summary["mean_deviation"] == pytest.approx((-2 + 0 + 2) / 3)
    clean, erroneous = summary["correction_clean_prefix"], summary["correction_erroneous_prefix"]
    assert (clean["correct"], clean["suffixes"], clean["resets"], clean["rate"]) == (3, 8, 2, 3 / 8)
    assert (erroneous["correct"], erroneous["suffixes"], erroneous["resets"], erroneous["rate"]) == (0, 3, 1, 0.0)
    # Over resets: the two clean resets are right 2/4 and 1/4, so any resample's mean lies in [1/4, 2/4].
    low, high = clean["ci95_over_resets"]
    assert 0.25 <= low <= high <= 0.5
    # One reset, all its suffixes wrong: resampling resets gives [0, 0], which would read as certainty. The interval
    # is then Wilson's over resets (a reset's suffixes counted as one draw), here 0 of 1: [0, 0.7935] by hand,
    # centre = half = (z^2/2)/(1 + z^2) with z = 1.96.
    low, high = erroneous["ci95_over_resets"]
    assert low == 0.0 and high == pytest.approx(2 * (1.96 ** 2 / 2) / (1 + 1.96 ** 2), abs=1e-4)


def test_reset_interval_when_every_reset_agrees():
    """8 resets with no correct suffix (the grid's erroneous prefixes) and 3 with all suffixes correct: the
    interval over resets is Wilson's with n = resets, not the zero-width bootstrap."""
    wrong = [dict(h=3, h_o=1, suffixes=4, suffixes_correct=0)] * 8
    right = [dict(h=1, h_o=2, suffixes=4, suffixes_correct=4)] * 3
    summary = mechanism_common.reset_summary(wrong + right)
    # Wilson 0 of 8: centre = half = (z^2/16)/(1 + z^2/8) = 0.24010/1.48020 = 0.16221 -> [0, 0.3244].
    assert summary["correction_erroneous_prefix"]["ci95_over_resets"] == pytest.approx([0.0, 0.3244], abs=1e-4)
    # Wilson 3 of 3: the mirror image of 0 of 3, (z^2/6)/(1 + z^2/3) = 0.64027/2.28053 = 0.28076 -> [0.4385, 1].
    assert summary["correction_clean_prefix"]["ci95_over_resets"] == pytest.approx([0.4385, 1.0], abs=1e-4)


def test_record_resets_pairs_each_reset_with_its_suffix_rows():
    """Suffix rows come ``suffixes_per_reset`` per reset, in reset order, between base and fallback rows; unscorable
    suffix rows are not counted."""
    from types import SimpleNamespace

    import torch

    from trl_credit.srpo.parts import ROW_BASE, ROW_FALLBACK, ROW_SUFFIX
    from trl_credit.srpo.resets import Reset

    first = Reset(0, [1, 2, 3], None, [1, 2, 3], step=2, source="random", oracle=3)
    second = Reset(2, [4, 5], None, [1, 2], step=1, source="random", oracle=None)
    calls = []

    class Rollout:
        def _choose_resets(self, ctx, seeds, prompts, stats):
            return [first, second]

        def _log_pass_rates(self, ctx, batch):
            calls.append(batch)

    trainer = SimpleNamespace(rollout=Rollout())
    ctx = SimpleNamespace(args=SimpleNamespace(suffixes_per_reset=2), step=7)  # the batch's context, as parts get it
    records = mechanism_common.record_resets(trainer)
    # prompt 0: 2 base + reset `first`; prompt 1: 2 base + fallback (no seed); prompt 2: 2 base + reset `second`
    kinds = [ROW_BASE] * 2 + [ROW_SUFFIX] * 2 + [ROW_BASE] * 2 + [ROW_FALLBACK] * 2 + [ROW_BASE] * 2 + [ROW_SUFFIX] * 2
    success = [1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1]
    scorable = [True] * 11 + [False]
    batch = SimpleNamespace(row_kinds=torch.tensor(kinds), success=torch.tensor(success, dtype=torch.bool),
                            scorable=torch.tensor(scorable))
    trainer.rollout._choose_resets(ctx, None, None, None)
    trainer.rollout._log_pass_rates(ctx, batch)
    assert calls == [batch]  # the trainer's own metrics still run
    assert records == [dict(step=7, h=2, h_o=3, H=3, source="random", suffixes=2, suffixes_correct=1),
                       dict(step=7, h=1, h_o=None, H=2, source="random", suffixes=1, suffixes_correct=1)]
    trainer.rollout._choose_resets(ctx, None, None, None)
    with pytest.raises(RuntimeError, match="suffix rows"):
        trainer.rollout._log_pass_rates(ctx, SimpleNamespace(row_kinds=torch.tensor(kinds[:6]),
                                                                  success=batch.success, scorable=batch.scorable))


def test_record_resets_agrees_with_the_trainers_own_metrics(tiny_model_path, tiny_dataset, tmp_path):
    """On a real SRPOTrainer step (RRPO's draw, a checker that calls the last thought wrong): every record's h_o is
    the checker's, and the records' pooled correction and exact rates are the ones the trainer logs itself."""
    from tests.test_srpo_localization import make_trainer

    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, step_checker=lambda q, t: len(t), reset="random")
    records = mechanism_common.record_resets(trainer)
    trainer.train()
    log = next(entry for entry in trainer.state.log_history if "srpo/fallback_rate" in entry)
    assert records and all(r["h_o"] == r["H"] and 1 <= r["h"] <= r["H"] for r in records)
    assert sum(r["suffixes"] for r in records) == len(records) * trainer.args.suffixes_per_reset
    correct = sum(r["suffixes_correct"] for r in records) / sum(r["suffixes"] for r in records)
    assert correct == pytest.approx(log["srpo/correction_rate"])
    exact = sum(r["h"] == r["h_o"] for r in records) / len(records)
    assert exact == pytest.approx(log["srpo/localization_exact_rate"])


def test_chain_resets_pools_each_methods_resets_over_seeds(tmp_path, capsys):
    """benchmarks/mechanisms/chain_resets.py: the resets SRPO-like learning runs recorded, pooled per method over seeds; runs
    without resets (GRPO) are skipped; a folder with none is refused."""
    import json

    import chain_resets

    def run(method, seed, resets=None):
        payload = dict(method=method, seed=seed, **({} if resets is None else {"resets": resets}))
        (tmp_path / f"{method}_seed{seed}.json").write_text(json.dumps(payload))

    with pytest.raises(SystemExit, match="--learning-dir"):
        chain_resets.main(["--learning-dir", str(tmp_path)])
    run("grpo", 0)
    run("srpo", 0, [dict(step=1, h=1, h_o=2, H=3, source="scored", suffixes=4, suffixes_correct=3)])
    run("srpo", 1, [dict(step=1, h=3, h_o=2, H=3, source="scored", suffixes=4, suffixes_correct=0),
                    dict(step=2, h=2, h_o=None, H=2, source="scored", suffixes=4, suffixes_correct=4)])
    run("srpo_oracle", 0, [dict(step=1, h=2, h_o=2, H=4, source="oracle", suffixes=4, suffixes_correct=2)])
    out = chain_resets.main(["--learning-dir", str(tmp_path)])
    assert list(out) == ["srpo", "srpo_oracle"]
    srpo = out["srpo"]
    assert srpo["seeds"] == [0, 1]
    s = srpo["summary"]
    assert (s["resets"], s["checked"], s["before"], s["exact"], s["after"]) == (3, 2, 1, 0, 1)
    assert s["correction_clean_prefix"]["rate"] == 0.75 and s["correction_erroneous_prefix"]["rate"] == 0.0
    assert out["srpo_oracle"]["summary"]["exact"] == 1
    table = capsys.readouterr().out
    assert "| SRPO | 2 | 3 (2) | 1 = 0.50" in table and "| SRPO (oracle reset) | 1 |" in table
    assert (tmp_path / "resets.png").exists() and json.loads((tmp_path / "resets.json").read_text()) == out


def test_tiny_mechanisms_lines_and_regions_by_hand():
    import tiny_mechanisms

    # one token per character; a newline belongs to the line it ends, a blank line is not numbered
    assert tiny_mechanisms.line_of_each_token("1+2=3\n\n3+4=7\nA7") == [1] * 6 + [2] + [2] * 6 + [3] * 2
    # lines 1, 2, 2, 3 with h_o = 2: negative mass 1 (before), 3 (on), 0 (after)
    shares = tiny_mechanisms.region_shares([1, 2, 2, 3], [-1.0, -2.0, -1.0, 0.5], 2)
    assert shares["tokens"] == {"before": 0.25, "on": 0.5, "after": 0.25}
    assert shares["mass"] == {"before": 0.25, "on": 0.75, "after": 0.0}


def test_tiny_mechanisms_fork_regions_by_hand():
    import tiny_mechanisms

    # rollout 1 (h_o 2): line starts 1, 2, 3, 4; forks on lines 1 and 3; three branches, the line-3 one correct
    # rollout 2 (h_o 1): line starts 1, 2; a fork on line 1 with one incorrect branch
    rows = [dict(first_wrong=2, starts=[1, 2, 3, 4], forks=[1, 3],
                 branches=[dict(line=1, correct=False), dict(line=1, correct=True), dict(line=3, correct=True)]),
            dict(first_wrong=1, starts=[1, 2], forks=[1], branches=[dict(line=1, correct=False)])]
    s = tiny_mechanisms.summarize_forks(rows)
    assert s["forks"] == 3 and s["incorrect_forked_rollouts"] == 2
    assert s["fork_share"] == {"before": 1 / 3, "on": 1 / 3, "after": 1 / 3}
    assert s["line_start_share"] == {"before": 1 / 6, "on": 2 / 6, "after": 3 / 6}
    assert s["branches"] == {"before": 2, "on": 1, "after": 1}
    assert s["branch_correct_rate"] == {"before": 0.5, "on": 0.0, "after": 1.0}


class CharTokenizer:
    """One token per character (id = code point), enough for thought splitting and decoding."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(i) for i in ids)


def test_process_credit_and_its_line_profile_by_hand():
    import mechanism_oppo
    import torch

    question = "15 + 3, then add 8, then subtract 7"
    right = "15 + 3 = 18\n18 + 8 = 26\n26 - 7 = 19\n\\boxed{19}"   # 4 steps, rewards 1 1 1 1
    wrong = "15 + 3 = 18\n18 + 8 = 26\n26 - 7 = 23\n\\boxed{23}"   # wrong at line 3: rewards 1 1 0 0
    width = len(right)
    record = dict(inputs=[dict(prompt=question, question=question)] * 2,
                  output=dict(completion_ids=torch.tensor([[ord(c) for c in text] for text in (right, wrong)]),
                              completion_mask=torch.ones(2, width, dtype=torch.long)))
    mechanism_oppo.process_credit([record], CharTokenizer(), group_size=2)
    # R = six 1s and two 0s: mean 0.75, unbiased std sqrt((6 * 0.0625 + 2 * 0.5625) / 7) = sqrt(1.5 / 7), + 1e-4
    std = (1.5 / 7) ** 0.5 + 1e-4
    one, zero = 0.25 / std, -0.75 / std   # 0.53995, -1.61984
    right_steps = [4 * one, 3 * one, 2 * one, one]
    wrong_steps = [2 * one + 2 * zero, one + 2 * zero, 2 * zero, zero]   # -2.160, -2.700, -3.240, -1.620
    lengths = [12, 12, 12, 10]   # "15 + 3 = 18\n" ... "\boxed{23}": each line's tokens, its newline included
    for row, steps in ((0, right_steps), (1, wrong_steps)):
        expected = [value for value, n in zip(steps, lengths) for _ in range(n)]
        assert record["process"][row] == pytest.approx(expected, rel=1e-6)
    # the wrong row around its first wrong line h_o = 3: offsets -2, -1, 0, +1, in units of its mean |A_t|
    lines = mechanism_common.line_of_token(list(wrong))
    scale = sum(abs(v) * n for v, n in zip(wrong_steps, lengths)) / width
    profile = mechanism_oppo.line_profile(lines, record["process"][1], 3)
    assert profile == pytest.approx({-2: wrong_steps[0] / scale, -1: wrong_steps[1] / scale,
                                     0: wrong_steps[2] / scale, 1: wrong_steps[3] / scale})
    assert min(profile, key=profile.get) == 0   # the most negative credit per token is on the first wrong line
    assert mechanism_oppo.line_profile([1, 2], [0.0, 0.0], 1) == {}


def test_process_credit_refuses_rows_out_of_their_group():
    import mechanism_oppo
    import torch

    record = dict(inputs=[dict(prompt="q", question="1 + 1"), dict(prompt="q", question="2 + 2")],
                  output=dict(completion_ids=torch.tensor([[50], [50]]), completion_mask=torch.ones(2, 1)))
    with pytest.raises(SystemExit, match="row 1 is not in its group of 2"):
        mechanism_oppo.process_credit([record], CharTokenizer(), group_size=2)


def test_summarize_regions_with_process_credit_averages_the_line_profiles():
    import mechanism_oppo

    def completion(question, mass, profile):
        shares = dict(tokens=dict(zip(mechanism_oppo.REGIONS, (0.5, 0.25, 0.25))),
                      mass=dict(zip(mechanism_oppo.REGIONS, mass)))
        return dict(question=question, text=question, first_wrong=2, reason="arithmetic", loss=shares,
                    anchored=shares, process=shares, profile=dict(loss=profile, process=profile))

    regions = [completion("q1", (0.0, 1.0, 0.0), {-1: 0.5, 0: -2.0}),
               completion("q2", (0.2, 0.5, 0.3), {0: -1.0, 1: -0.5})]
    entry = mechanism_oppo.summarize_regions(regions)["all"]
    assert entry["process_negative_mass_share"]["on"] == pytest.approx(0.75)
    # offset 0 in both (-2.0, -1.0), -1 and +1 in one each; -3, -2, +2, +3 in none
    assert entry["profile"]["process"] == {-3: None, -2: None, -1: 0.5, 0: -1.5, 1: -0.5, 2: None, 3: None}
    # without process credit in every completion: no process block
    del regions[1]["process"]
    assert "process_negative_mass_share" not in mechanism_oppo.summarize_regions(regions)["all"]


def test_trap_step_is_a_trap_digit_added_one_too_high_on_that_line():
    import tests.benchmarks_path  # noqa: F401
    from tiny_mechanisms import trap_step

    text = "3+8=2\n\n2+9=2\n2+4=6\nanswer: 6"
    assert trap_step(text, 1, "89")  # 3 + 8 = 11 -> 1, written 2
    assert trap_step(text, 2, "89")  # blank lines do not count
    assert not trap_step(text, 3, "89")  # 4 is no trap digit
    assert not trap_step("3+8=1", 1, "89")  # right
    assert not trap_step("3+8=3", 1, "89")  # wrong, but not one too high
    assert not trap_step(text, 1, "")  # the tiny regime has no trap
    assert not trap_step(text, 9, "89")
