"""Model cards that name the method, its hyperparameters and the base model.

TRL's ``create_model_card`` already names the trainer (``_name``), its paper (``_paper``) and tags
(``_tag_names``); it leaves the base model out when it was loaded from a local folder (our offline default), and
it does not list method hyperparameters. :class:`MethodModelCardMixin` appends both.
"""

from __future__ import annotations

import dataclasses
import os

from trl import GRPOConfig

__all__ = ["MethodModelCardMixin", "method_hyperparameters"]


def method_hyperparameters(args) -> dict:
    """The config fields a method adds on top of ``GRPOConfig``, plus the GRPO settings every method depends on."""
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    method = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name not in grpo_fields}
    shared = {
        name: getattr(args, name, None)
        for name in ("num_generations", "max_completion_length", "temperature", "learning_rate", "beta", "loss_type")
    }
    return {**shared, **method}


class MethodModelCardMixin:
    """Mix into a GRPOTrainer subclass (before it in the bases) to enrich the pushed model card."""

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, "README.md")
        if not os.path.exists(path):
            return
        base_model = getattr(self.model.config, "_name_or_path", None) or "unknown"
        lines = [
            "",
            f"## {self._name} hyperparameters",
            "",
            f"Trained with `trl_credit.{type(self).__name__}` ({self._name}"
            + (f", {self._paper.get('title')}" if self._paper.get("title") else "")
            + f") from the base model `{base_model}`.",
            "",
            "| hyperparameter | value |",
            "| --- | --- |",
        ]
        lines += [f"| `{name}` | `{_cell(value)}` |" for name, value in method_hyperparameters(self.args).items()]
        with open(path, "a", encoding="utf-8") as card:
            card.write("\n".join(lines) + "\n")


def _cell(value, limit: int = 80) -> str:
    # Strings are shown with repr so newlines and quotes cannot break the table; long templates are shortened.
    text = repr(value) if isinstance(value, str) else str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
