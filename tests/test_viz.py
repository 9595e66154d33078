"""trl_credit.core.viz: per-token advantages as coloured HTML and PNG, and the trainer hook that logs them."""

import html
import os
import re
from dataclasses import dataclass

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from trl_credit.core.viz import CreditLoggingArguments, credit_rows, render_html, render_png
from trl_credit.model_card import MethodModelCardMixin
from trl_credit.tasks.rewards import final_number_reward

# The colormap as documented in trl_credit.core.viz, written out again here: linear in RGB from (202, 0, 32) at -vmax
# through white at 0 to (5, 113, 176) at +vmax, clipped beyond ±vmax.
RED, WHITE, BLUE, GREY = (202, 0, 32), (255, 255, 255), (5, 113, 176), (221, 221, 221)


def expected_color(value, vmax):
    t = max(-1.0, min(1.0, value / vmax))
    end = BLUE if t > 0 else RED
    return "#%02x%02x%02x" % tuple(round(w + abs(t) * (e - w)) for w, e in zip(WHITE, end))


def test_expected_color_anchor_points():
    assert expected_color(-2.0, 2.0) == "#ca0020" and expected_color(0.0, 2.0) == "#ffffff"
    assert expected_color(2.0, 2.0) == "#0571b0" and expected_color(1.0, 2.0) == "#82b8d8"


SPAN = re.compile(r"<span class='tok( masked)?' style='background-color:(#[0-9a-f]{6})'[^>]*>(.*?)</span>", re.S)


def parse_rows(page):
    """[(title, [(token, colour, masked), ...]), ...] from the HTML."""
    rows = []
    for block in page.split("<div class='row'>")[1:]:
        title = re.search(r"<div class='title'>(.*?)</div>", block).group(1)
        spans = [(html.unescape(text).replace("↵\n", "\n"), color, bool(masked)) for masked, color, text in SPAN.findall(block)]
        rows.append((html.unescape(title), spans))
    return rows


def test_each_method_structure_in_html():
    tokens = [
        ["The", " sum", " is", " 7", "."],  # Cue-GRPO / GRPO: one weight per completion
        ["First", ",", " 3", "+", "4"],  # OPPO: one value per token
        ["Step", " 1", ".", " Step", " 2"],  # DATPO: blocks
        ["Let", " me", " retry", ":", " 7"],  # SRPO: shared prefix masked
    ]
    advantages = [
        0.75,
        torch.tensor([0.1, -0.2, 0.4, -1.0, 2.0]),
        [0.5, 0.5, 0.5, -0.25, -0.25],
        [0.0, 0.0, 1.2, 1.2, 1.2],
    ]
    mask = [[1] * 5, [1] * 5, [1] * 5, [0, 0, 1, 1, 1]]
    blocks = [None, None, [0, 0, 0, 1, 1], None]
    rows = credit_rows(tokens, advantages, mask, blocks, titles=["cue", "oppo", "datpo", "srpo"])
    page = render_html(rows)
    vmax = 2.0  # largest |advantage| among trained tokens
    parsed = parse_rows(page)
    assert [title.split(" · ")[0] for title, _ in parsed] == ["cue", "oppo", "datpo", "srpo"]
    for (title, spans), row_tokens, row_adv, row_mask in zip(parsed, tokens, advantages, mask):
        row_adv = torch.as_tensor(row_adv, dtype=torch.float64).expand(len(row_tokens)).tolist()
        assert [s[0] for s in spans] == row_tokens
        for (token, color, masked), adv, trained in zip(spans, row_adv, row_mask):
            if trained:
                assert not masked and color == expected_color(adv, vmax), (title, token)
            else:
                assert masked and color == "#%02x%02x%02x" % GREY
    # the per-completion row is one colour; the OPPO row has five different colours
    assert len({c for _, c, _ in parsed[0][1]}) == 1 and len({c for _, c, _ in parsed[1][1]}) == 5
    # DATPO: one boundary between block 0 and block 1, before " Step"
    datpo = page.split("<div class='row'>")[3]
    assert datpo.count("class='sep'") == 1 and re.search(r"class='sep'[^>]*></span><span[^>]*>\s*Step", datpo)
    assert "2 blocks" in parsed[2][0]
    # SRPO: struck prefix, and the title counts it
    assert "text-decoration:line-through" in page and "2/5 tokens masked" in parsed[3][0]
    assert "advantage +0.750" in parsed[0][0]


def test_fixed_vmax_clips_and_html_escapes():
    rows = credit_rows([["<b>", "&"]], [[3.0, -0.5]])
    page = render_html(rows, vmax=1.0)
    (_, spans), = parse_rows(page)
    assert spans == [("<b>", expected_color(1.0, 1.0), False), ("&", expected_color(-0.5, 1.0), False)]
    assert "<b>" not in page.split("<div class='row'>")[1].replace("<div class='title'>", "")


def test_bad_shapes_name_the_row():
    with pytest.raises(ValueError, match="row 0 have 2 values for 3 tokens"):
        credit_rows([["a", "b", "c"]], [[1.0, 2.0]])


def test_png_written_with_the_colormap_colors(tmp_path):
    import matplotlib.image as mpimg

    rows = credit_rows([["plus", " one", "\n", "minus", " one"], ["masked", " tail"]], [[1.0, 1.0, 0.0, -1.0, -1.0], 0.5],
                       mask=[[1] * 5, [0, 1]], block_ids=[[0, 0, 0, 1, 1], None])
    path = render_png(rows, str(tmp_path / "credit.png"), title="demo")
    assert os.path.getsize(path) > 1000
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    pixels = {tuple(int(round(c * 255)) for c in px[:3]) for px in mpimg.imread(path).reshape(-1, 4)}
    assert BLUE in pixels and RED in pixels and GREY in pixels


@dataclass
class VizConfig(GRPOConfig, CreditLoggingArguments):
    pass


class VizTrainer(MethodModelCardMixin, GRPOTrainer):
    _name = "Viz"

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.seen = getattr(self, "seen", []) + [output]
        self._log_credit(output)
        return output


def _trainer(tiny_model_path, tiny_dataset, tmp_path, **overrides):
    args = VizConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_generations=4,
                     per_device_train_batch_size=4, max_completion_length=6, max_steps=2, logging_steps=1,
                     **overrides)
    return VizTrainer(model=tiny_model_path, reward_funcs=final_number_reward, args=args, train_dataset=tiny_dataset)


def test_trainer_hook_writes_html_every_logging_step(tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path, log_credit_rows=2)
    trainer.train()
    files = sorted(os.listdir(tmp_path / "credit"))
    assert files == ["step_00001.html", "step_00002.html"]  # numbered as TRL logs the steps
    page = open(tmp_path / "credit" / files[-1], encoding="utf-8").read()
    output = trainer.seen[-1]
    parsed = parse_rows(page)
    assert len(parsed) == 2
    vmax = max(abs(float(output["advantages"][i])) for i in range(2)) or 1.0
    for i, (title, spans) in enumerate(parsed):
        n = int(output["completion_mask"][i].sum())
        ids = output["completion_ids"][i, :n].tolist()
        assert [s[0] for s in spans] == [tiny_tokenizer.decode([t]) for t in ids]
        assert {s[1] for s in spans} == {expected_color(float(output["advantages"][i]), vmax)}
        assert title.startswith(f"row {i} · final_number_reward ")


def test_hook_off_by_default_and_checked(tiny_model_path, tiny_dataset, tmp_path):
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    trainer.train()
    assert not os.path.exists(tmp_path / "credit")
    with pytest.raises(ValueError, match="log_credit_rows"):
        _trainer(tiny_model_path, tiny_dataset, tmp_path, log_credit_rows=-1)


@pytest.mark.parametrize("method", ["cue_grpo", "oppo", "datpo", "srpo"])
def test_each_trainer_output_renders_with_the_hook(method, tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path):
    """The one-line hook each trainer gets (``self._log_credit(output)`` once its advantages are final), on real
    outputs: every shown token carries the colour of its own advantage; tokens outside the loss mask are struck."""
    import trl_credit
    from tests.trainers.test_all_trainers import CASES, parity_reward, short_reward

    trainer_name, config_name, settings, _ = CASES[method]
    base = getattr(trl_credit, trainer_name)

    args = getattr(trl_credit, config_name)(
        output_dir=str(tmp_path), per_device_train_batch_size=8, max_completion_length=8, max_steps=1,
        logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=0, log_credit_rows=8,
        **settings)
    trainer = base(model=tiny_model_path, reward_funcs=[parity_reward, short_reward], args=args,
                   train_dataset=tiny_dataset)
    seen = []  # the batch TRL trains on (on_credit); the page itself comes from the trainer's own hook
    trainer.add_credit_callback(lambda step: seen.append(step.output))
    trainer.train()
    page = open(tmp_path / "credit" / "step_00001.html", encoding="utf-8").read()
    output = seen[-1]
    rows = parse_rows(page)
    assert len(rows) == min(8, len(output["completion_ids"]))
    advantages = output["advantages"].double()
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(output["completion_mask"])
    trained = output["completion_mask"].bool()
    if output.get("tool_mask") is not None:
        trained = trained & output["tool_mask"].bool()
    shown = trained[: len(rows)] & output["completion_mask"][: len(rows)].bool()
    vmax = float(advantages[: len(rows)][shown].abs().max()) if shown.any() else 0.0
    vmax = vmax or 1.0
    masked_expected = 0
    for i, (_, spans) in enumerate(rows):
        keep = output["completion_mask"][i].nonzero().flatten().tolist()
        assert [s[0] for s in spans] == [tiny_tokenizer.decode([int(output["completion_ids"][i, t])]) for t in keep]
        for (_, color, masked), t in zip(spans, keep):
            if trained[i, t]:
                assert not masked and color == expected_color(float(advantages[i, t]), vmax)
            else:
                masked_expected += 1
                assert masked
    row_html = page.split("<div class='row'>", 1)[1]  # after the legend
    assert row_html.count("class='tok masked'") == masked_expected
