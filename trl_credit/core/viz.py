"""See the credit: per-token advantages of a batch as coloured text (HTML for trackers and notebooks, PNG for papers).

Every token is drawn on a background whose colour encodes the advantage the loss gives it, on one diverging scale
(:func:`advantage_color`): red below zero, white at zero, blue above, saturated at ``±vmax`` (by default the
largest ``|advantage|`` shown). What each method's structure looks like:

- **GRPO / Cue-GRPO**: one advantage per completion, so a row is one colour; Cue-GRPO's per-completion weight
  (``docs/cue_grpo.md``) shows as rows of the same reward with different shades.
- **OPPO**: a value per token (``docs/oppo.md``): colour changes token by token.
- **DATPO**: one value per block of a tree (``docs/datpo.md``): runs of one colour, and with ``block_ids`` a
  thin bar at each block boundary.
- **SRPO/RRPO** (``docs/srpo.md``): a suffix row's shared prefix is excluded from the loss (its ``tool_mask`` is
  0): those tokens are greyed and struck through; only the suffix is coloured.

Inputs are generic: per row a list of token strings, advantages (a scalar, a list, or a (T,) tensor), an optional
mask (False = no gradient, drawn struck) and optional block ids. :func:`render_html` returns an HTML fragment,
:func:`render_png` writes a PNG with matplotlib.

During training, :class:`CreditLoggingMixin` (mixed into the trainers) logs ``log_credit_rows`` rows every logging
step (:class:`CreditLoggingArguments`): to wandb / trackio as HTML when they are in ``report_to``, else to
``<output_dir>/credit/step_XXXXX.html``.
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = [
    "NEGATIVE_RGB",
    "ZERO_RGB",
    "POSITIVE_RGB",
    "MASKED_RGB",
    "CreditRow",
    "CreditLoggingArguments",
    "CreditLoggingMixin",
    "advantage_color",
    "check_credit_logging_arguments",
    "credit_rows",
    "render_html",
    "render_png",
]

#: The diverging colormap, as three anchors: linear in RGB from NEGATIVE (at -vmax) through ZERO (at 0) to POSITIVE
#: (at +vmax). ColorBrewer RdBu's end points and white.
NEGATIVE_RGB = (202, 0, 32)
ZERO_RGB = (255, 255, 255)
POSITIVE_RGB = (5, 113, 176)
#: Background of masked tokens (no gradient), drawn struck through.
MASKED_RGB = (221, 221, 221)


def advantage_color(value: float, vmax: float) -> str:
    """``#rrggbb`` of ``value`` on the diverging scale saturated at ``±vmax`` (linear interpolation per channel)."""
    if not math.isfinite(value):
        return _hex(MASKED_RGB)
    t = 0.0 if vmax <= 0 else max(-1.0, min(1.0, value / vmax))
    end = POSITIVE_RGB if t > 0 else NEGATIVE_RGB
    rgb = tuple(round(z + abs(t) * (e - z)) for z, e in zip(ZERO_RGB, end))
    return _hex(rgb)


def _hex(rgb) -> str:
    return "#" + "".join(f"{int(c):02x}" for c in rgb)


@dataclass
class CreditRow:
    """One completion: its tokens, the advantage of each, whether each is trained, its block ids and a title."""

    tokens: list[str]
    advantages: list[float]
    mask: list[bool]
    block_ids: list[int] | None = None
    title: str = ""

    def summary(self) -> str:
        trained = [a for a, m in zip(self.advantages, self.mask) if m]
        parts = []
        if trained:
            lo, hi = min(trained), max(trained)
            mean = sum(trained) / len(trained)
            parts.append(f"advantage {mean:+.3f}" if lo == hi else f"advantage mean {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        masked = len(self.mask) - sum(self.mask)
        if masked:
            parts.append(f"{masked}/{len(self.mask)} tokens masked")
        if self.block_ids is not None:
            parts.append(f"{len(set(b for b, m in zip(self.block_ids, self.mask) if m))} blocks")
        return " · ".join(parts)


def _as_list(values) -> list:
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().tolist()
    elif hasattr(values, "tolist"):
        values = values.tolist()
    return values


def credit_rows(
    tokens: Sequence[Sequence[str]],
    advantages: Sequence[Any],
    mask: Sequence[Sequence[Any]] | None = None,
    block_ids: Sequence[Sequence[int] | None] | None = None,
    titles: Sequence[str] | None = None,
) -> list[CreditRow]:
    """Build :class:`CreditRow` objects from per-row inputs.

    ``advantages[i]`` is a scalar (one per completion, broadcast over its tokens), a list or a (T,) tensor with one
    value per token of ``tokens[i]``; a (B,) or (B, T) tensor works too. ``mask[i][t]`` false marks a token the
    loss does not train (drawn struck). ``block_ids[i][t]`` groups tokens into blocks (boundaries drawn).
    """
    advantages = _as_list(advantages)
    rows = []
    for i, row_tokens in enumerate(tokens):
        row_tokens = list(row_tokens)
        adv = _as_list(advantages[i])
        if isinstance(adv, (int, float)):
            adv = [float(adv)] * len(row_tokens)
        adv = [float(a) for a in adv]
        if len(adv) != len(row_tokens):
            raise ValueError(
                f"advantages of row {i} have {len(adv)} values for {len(row_tokens)} tokens: pass one scalar per "
                "row or one value per token"
            )
        row_mask = [True] * len(row_tokens) if mask is None else [bool(m) for m in _as_list(mask[i])]
        if len(row_mask) != len(row_tokens):
            raise ValueError(f"mask of row {i} has {len(row_mask)} values for {len(row_tokens)} tokens")
        blocks = None
        if block_ids is not None and block_ids[i] is not None:
            blocks = [int(b) for b in _as_list(block_ids[i])]
            if len(blocks) != len(row_tokens):
                raise ValueError(f"block_ids of row {i} have {len(blocks)} values for {len(row_tokens)} tokens")
        title = titles[i] if titles is not None else f"row {i}"
        rows.append(CreditRow(row_tokens, adv, row_mask, blocks, title))
    return rows


def _vmax(rows: Sequence[CreditRow], vmax: float | None) -> float:
    if vmax is not None:
        return float(vmax)
    values = [abs(a) for row in rows for a, m in zip(row.advantages, row.mask) if m and math.isfinite(a)]
    return max(values, default=0.0) or 1.0


_STYLE = (
    ".credit{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;line-height:1.9}"
    ".credit .row{margin:0 0 14px 0}.credit .title{font-weight:bold;font-family:sans-serif;font-size:12px}"
    ".credit .tok{white-space:pre-wrap;border-radius:2px;padding:1px 0}"
    ".credit .masked{color:#888;text-decoration:line-through}"
    ".credit .sep{display:inline-block;width:2px;height:1.2em;background:#222;margin:0 1px;vertical-align:middle}"
    ".credit .legend span{padding:1px 6px;font-size:11px}"
)


def _token_text(token: str) -> str:
    # Newlines would vanish inside a span: show them as a return sign, then break the line.
    return html.escape(token).replace("\n", "↵\n")


def render_html(rows: Sequence[CreditRow], vmax: float | None = None, title: str | None = None) -> str:
    """An HTML fragment (with its own ``<style>``): one titled paragraph per row, one coloured span per token.

    Each token span carries ``data-advantage`` and, for trained tokens, a background of
    :func:`advantage_color` ``(advantage, vmax)``; masked tokens get class ``masked`` and a grey background.
    """
    scale = _vmax(rows, vmax)
    out = [f"<div class='credit'><style>{_STYLE}</style>"]
    if title:
        out.append(f"<h4>{html.escape(title)}</h4>")
    legend = "".join(
        f"<span style='background-color:{advantage_color(v, scale)}'>{v:+.3g}</span>"
        for v in (-scale, -scale / 2, 0.0, scale / 2, scale)
    )
    out.append(f"<div class='legend'>advantage: {legend} <span class='tok masked' "
               f"style='background-color:{_hex(MASKED_RGB)}'>masked</span></div>")
    for row in rows:
        head = " · ".join(part for part in (row.title, row.summary()) if part)
        out.append(f"<div class='row'><div class='title'>{html.escape(head)}</div>")
        previous_block = None
        for t, (token, adv, trained) in enumerate(zip(row.tokens, row.advantages, row.mask)):
            block = row.block_ids[t] if row.block_ids is not None else None
            if block is not None and previous_block is not None and block != previous_block:
                out.append(f"<span class='sep' title='block {block}'></span>")
            previous_block = block
            data = f" data-advantage='{adv:.6g}'" + (f" data-block='{block}'" if block is not None else "")
            if trained:
                out.append(
                    f"<span class='tok' style='background-color:{advantage_color(adv, scale)}'"
                    f" title='advantage {adv:+.4f}'{data}>{_token_text(token)}</span>"
                )
            else:
                out.append(
                    f"<span class='tok masked' style='background-color:{_hex(MASKED_RGB)}'"
                    f" title='masked: no gradient'{data}>{_token_text(token)}</span>"
                )
        out.append("</div>")
    out.append("</div>")
    return "".join(out)


def render_png(
    rows: Sequence[CreditRow],
    path: str,
    vmax: float | None = None,
    title: str | None = None,
    chars_per_line: int = 100,
    dpi: int = 150,
) -> str:
    """Draw the rows as coloured monospace text with matplotlib and save a PNG to ``path``; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.patches import Rectangle

    scale = _vmax(rows, vmax)
    # Lay tokens out on a character grid: x in characters, y in lines (one line per wrap, a title line per row).
    placed, lines = [], 0
    for row in rows:
        placed.append(("title", 0, lines, " · ".join(part for part in (row.title, row.summary()) if part), None))
        lines += 1
        x = 0
        previous_block = None
        for t, (token, adv, trained) in enumerate(zip(row.tokens, row.advantages, row.mask)):
            block = row.block_ids[t] if row.block_ids is not None else None
            boundary = block is not None and previous_block is not None and block != previous_block
            previous_block = block
            for k, piece in enumerate(token.split("\n")):
                if k > 0:  # a newline inside the token: break the line
                    x, lines = 0, lines + 1
                text = piece if k == 0 else piece
                if x + len(text) > chars_per_line and x > 0:
                    x, lines = 0, lines + 1
                color = advantage_color(adv, scale) if trained else _hex(MASKED_RGB)
                placed.append(("token", x, lines, text, (color, trained, boundary and k == 0)))
                x += max(len(text), 1 if k == 0 and "\n" in token else len(text))
        lines += 1.5
    char_w, line_h = 0.085, 0.24  # inches at fontsize 10 in DejaVu Sans Mono (~0.6 em per character)
    width = chars_per_line * char_w + 1.6
    height = lines * line_h + (0.5 if title else 0.2)
    fig = plt.figure(figsize=(width, height), dpi=dpi)
    ax = fig.add_axes((0.01, 0.01, (chars_per_line * char_w) / width, 0.98 - (0.4 / height if title else 0)))
    ax.set_xlim(0, chars_per_line)
    ax.set_ylim(lines, 0)
    ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    for kind, x, y, text, extra in placed:
        if kind == "title":
            ax.text(x, y + 0.75, text, fontsize=9, fontweight="bold", family="sans-serif", va="baseline")
            continue
        color, trained, boundary = extra
        ax.add_patch(Rectangle((x, y + 0.1), max(len(text), 0.5), 0.85, facecolor=color, edgecolor="none"))
        ax.text(x, y + 0.75, text, fontsize=10, family="monospace", va="baseline",
                color="black" if trained else "#777777")
        if not trained and text.strip():
            ax.plot([x, x + len(text)], [y + 0.52, y + 0.52], color="#777777", linewidth=0.8)
        if boundary:
            ax.plot([x, x], [y + 0.05, y + 1.0], color="#222222", linewidth=1.5)
    cmap = LinearSegmentedColormap.from_list(
        "credit", [tuple(c / 255 for c in rgb) for rgb in (NEGATIVE_RGB, ZERO_RGB, POSITIVE_RGB)]
    )
    cax = fig.add_axes((1 - 1.0 / width, 0.1, 0.15 / width, 0.8))
    fig.colorbar(plt.cm.ScalarMappable(norm=Normalize(-scale, scale), cmap=cmap), cax=cax, label="advantage")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Logging during training


@dataclass
class CreditLoggingArguments:
    """Config mixin (next to ``SuccessArguments`` in each method config): log a few rows of per-token credit."""

    log_credit_rows: int = field(
        default=0,
        metadata={
            "help": "Rows of the generation batch (main process) whose per-token advantages are rendered as coloured "
            "HTML every logging step: to wandb/trackio when in `report_to`, else to `<output_dir>/credit/"
            "step_XXXXX.html`. 0 = off."
        },
    )


def check_credit_logging_arguments(args) -> None:
    """Raise a clear error for a bad ``log_credit_rows`` (called when the trainer is built)."""
    value = getattr(args, "log_credit_rows", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`log_credit_rows` must be an integer >= 0 (0 = off), got {value!r}.")


class CreditLoggingMixin:
    """Trainer mixin: ``self._log_credit(output)`` after the advantages of a generation batch are final.

    ``output`` is the dict ``_generate_and_score_completions`` returns (``completion_ids``, ``completion_mask``,
    ``advantages`` (B,) or (B, T), optional ``tool_mask``: 0 marks tokens the loss skips, e.g. SRPO's shared
    prefix). ``block_ids`` (optional, one list per local row) draws block boundaries (DATPO). Does nothing unless
    ``args.log_credit_rows > 0``, on the main process, once per logging step.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_credit_logging_arguments(self.args)

    def _log_credit(self, output: dict, block_ids: Sequence[Sequence[int] | None] | None = None) -> str | None:
        num_rows = int(getattr(self.args, "log_credit_rows", 0) or 0)
        if num_rows <= 0 or not self.model.training or not self.accelerator.is_main_process:
            return None
        step = self.state.global_step + 1  # the optimizer step these rollouts train: TRL logs it under this number
        logging_steps = max(int(getattr(self.state, "logging_steps", 0) or self.args.logging_steps or 1), 1)
        if step % logging_steps != 0 or getattr(self, "_credit_logged_step", None) == step:
            return None
        self._credit_logged_step = step
        rows = self._credit_rows(output, num_rows, block_ids)
        page = render_html(rows, title=f"{getattr(self, '_name', type(self).__name__)} credit · step {step}")
        report_to = self.args.report_to or []
        logged = False
        # A row of its own, stamped with the optimizer step these rollouts train, the step key the Trainer's
        # callbacks log and wandb plots against: TRL's profiling timers log rows of their own between a generation
        # and the step's metrics, so a row left open (wandb's commit=False) went out with a timer, one step early.
        row_step = {"train/global_step": step}
        if "wandb" in report_to:
            try:
                import wandb

                if wandb.run is not None:
                    wandb.log({"credit": wandb.Html(page), **row_step})
                    logged = True
            except ImportError:
                pass
        if "trackio" in report_to:
            try:
                import trackio

                if hasattr(trackio, "Html"):
                    trackio.log({"credit": trackio.Html(page), **row_step})
                    logged = True
            except ImportError:
                pass
        if not logged:
            folder = os.path.join(self.args.output_dir, "credit")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"step_{step:05d}.html"), "w", encoding="utf-8") as f:
                f.write(f"<!doctype html><meta charset='utf-8'>{page}\n")
        return page

    def _credit_rows(self, output: dict, num_rows: int, block_ids=None) -> list[CreditRow]:
        completion_ids = output["completion_ids"][:num_rows]
        completion_mask = output["completion_mask"][:num_rows].bool()
        trained = completion_mask
        if output.get("tool_mask") is not None:
            trained = trained & output["tool_mask"][:num_rows].bool()
        advantages = output["advantages"][:num_rows]
        rewards = self._credit_row_rewards(len(output["completion_ids"]))
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        tokens, advs, masks, blocks, titles = [], [], [], [], []
        for i in range(len(completion_ids)):
            keep = completion_mask[i].nonzero().flatten().tolist()  # padding is not shown
            ids = completion_ids[i].tolist()
            tokens.append([tokenizer.decode([ids[t]]) for t in keep])
            adv = advantages[i]
            advs.append(float(adv) if adv.dim() == 0 else [float(adv[t]) for t in keep])
            masks.append([bool(trained[i, t]) for t in keep])
            row_blocks = block_ids[i] if block_ids is not None and i < len(block_ids) else None
            blocks.append([row_blocks[t] for t in keep] if row_blocks is not None else None)
            title = f"row {i}"
            if rewards is not None:
                title += " · " + ", ".join(f"{name} {values[i]:.3g}" for name, values in rewards.items())
            titles.append(title)
        return credit_rows(tokens, advs, masks, blocks, titles)

    def _credit_row_rewards(self, num_local: int) -> dict[str, list[float]] | None:
        # TRL appends the gathered rewards of the batch to its completions log, process 0's rows first; when the
        # counts do not line up (a method logged other rows) the titles go without rewards rather than wrong ones.
        logs = getattr(self, "_logs", None)
        if not logs or "rewards" not in logs:
            return None
        total = num_local * self.accelerator.num_processes
        rewards = {}
        for name, values in logs["rewards"].items():
            values = list(values)
            if len(values) < total:
                return None
            rewards[name] = values[-total:][:num_local]
        return rewards or None
