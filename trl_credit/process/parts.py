"""The process credit as a part of the credit core (trl_credit/core/trainer.py): :class:`ProcessCredit`, GRPO's process
supervision (DeepSeekMath §4.1.3; docs/process.md). Per generation batch:

- Each credited row (scorable, in a group, its group free of ±inf rewards) of this process is split into steps on
  its sampled tokens (``process_thought_delimiter``, SRPO's token-exact thought splitting) and scored by the
  step-reward function; with ``process_outcome="final_step"`` TRL's weighted total reward is one more step ending at
  the last token. Other rows get advantage 0 on every token and stay out of every statistic.
- A suffix row of SRPO's resets (``RowBatch.prefix_lengths``) keeps out of its group's statistics the steps that end
  inside its shared prefix (the loss masks those tokens): the step rewards are normalized over what is trained.
- Every row's step rewards are gathered (rows of a group may live on several processes), normalized per group
  (:func:`~trl_credit.process.advantages.normalized_step_rewards`) and summed into per-token advantages (B, T)
  (:func:`~trl_credit.process.advantages.token_advantages`).
- Each row's sequence-level direction is its first trained token's advantage (the sum of its normalized step
  rewards): ``RowBatch.sequence_signs`` for the per-row modifiers (Cue-GRPO's positive set), TRL's per-sequence
  loss decisions (``off_policy_mask_threshold``, VESPO) and TRL's completions table.
"""

from __future__ import annotations

import warnings

import torch

from trl_credit.core.batch import NO_GROUP, RowBatch, generated_lengths
from trl_credit.core.context import BatchContext
from trl_credit.core.logs import nonfinite_reward_groups
from trl_credit.core.registry import register_part
from trl_credit.core.setup import speaker
from trl_credit.core.success import total_rewards
from trl_credit.core.trainer import Credit
from trl_credit.process.advantages import normalized_step_rewards, token_advantages
from trl_credit.process.config import ProcessFields
from trl_credit.process.step_rewards import checked_rewards, resolve_step_reward
from trl_credit.core.steps import is_multi_turn, span_texts, step_spans

__all__ = ["ProcessCredit", "SIGN_TOLERANCE"]

#: |sum of a row's normalized step rewards| at or below this is direction 0 (float sums of opposite terms).
SIGN_TOLERANCE = 1e-9


@register_part("credit", "process", help="process supervision: per-step rewards as token advantages (DeepSeekMath)",
               fields=ProcessFields, check="_check_process_fields")
class ProcessCredit(Credit):
    """Per-token advantages from per-step rewards (module docstring). ``step_reward``: a step-reward function
    (``(prompt, completion, steps, **row) -> list[float | None]``) or a registered name, overriding the config's
    ``process_step_reward``."""

    name = "process"

    def __init__(self, step_reward=None):
        self._step_reward_arg = step_reward
        self.step_reward = None

    def setup(self, trainer) -> None:
        # Any rollout's rows are credited: TRL's (its tool loop, environments), a user's rollout_func, a rollout part's
        # (SRPO's resets). Tool results are in no step and get no advantage (docs/multiturn.md#process-credit).
        source = self._step_reward_arg
        args = trainer.args
        self.step_reward = resolve_step_reward(source if source is not None else _arg(args, "process_step_reward"))
        srpo_delimiter = getattr(args, "thought_delimiter", None)
        if getattr(trainer.rollout, "name", None) == "resets" and srpo_delimiter != _arg(args,
                                                                                           "process_thought_delimiter"):
            warnings.warn(
                f"{speaker(trainer, self)}: credit='process' with rollout='resets': SRPO resets at thoughts ending "
                f"with thought_delimiter={srpo_delimiter!r} but the process steps end with process_thought_delimiter="
                f"{_arg(args, 'process_thought_delimiter')!r}, so a reset point may fall inside a step (which is "
                "then scored and trained as one step across the prefix and the suffix). Set both to the same text.",
                UserWarning, stacklevel=2)
        if self.step_reward is None:
            raise ValueError(
                f"{speaker(trainer, self)}: credit='process' needs a step-reward function: set process_step_reward "
                "to a registered name ('chain', 'sums', or one added with trl_credit.process.register_step_reward) "
                "or pass "
                "CreditTrainer(..., credit=ProcessCredit(step_reward=callable))."
            )

    # TRL's per-sequence decisions (off_policy_mask_threshold, VESPO) read each row's sequence advantage with the
    # (B, T) advantages (batch.sequence_anchors, handed to the loss by the core: trl_credit/core/anchors.py), as for OPPO.
    sets_sequence_anchors = True

    def advantages(self, ctx: BatchContext, batch: RowBatch, inputs, output: dict):
        completion_ids = batch.completion_ids
        num_local, num_tokens = completion_ids.shape
        # Each row's generated tokens, a truncated row's too: mask_truncated_completions masks its loss (TRL zeroes
        # its completion_mask), not its reward, so its steps stay in R as GRPO keeps its reward in the group's mean
        # and std; only the loss ignores its advantages.
        lengths = generated_lengths(completion_ids, batch.completion_mask, ctx.pad_token_id)
        # Rows that get process credit: scorable, in a group, no ±inf reward in the group (GRPO gives those 0).
        grouped = batch.group_ids != NO_GROUP
        nonfinite = torch.zeros(batch.num_rows, dtype=torch.bool)
        nonfinite[grouped] = nonfinite_reward_groups(
            ctx, batch.rewards_per_func[grouped.to(batch.rewards_per_func.device)], batch.group_ids[grouped],
            "process/nonfinite_reward_rate").cpu()
        credited = batch.local_rows(batch.scorable & grouped & ~nonfinite).tolist()
        prefixes = [0] * num_local if batch.prefix_lengths is None else batch.local_rows(batch.prefix_lengths).tolist()
        outcome = None
        if _arg(ctx.args, "process_outcome") == "final_step":
            outcome = batch.local_rows(total_rewards(batch.rewards_per_func, ctx.reward_weights).cpu()).tolist()

        # This process's rows: step ends and rewards (the outcome as a last step), and what enters the statistics.
        # Tool results and environment tokens (model_mask 0) are in no step and get advantage 0.
        model_mask = batch.model_mask.to(torch.float64).cpu()
        environments = ctx.environments
        # The prompts as TRL's reward functions got them: the dataset's, with an environment's reset() observation
        # (an environment that owns the data gives the whole prompt; the row then has no "prompt" column).
        generated = getattr(ctx.capture, "generated_prompts", None)
        prompts = generated if generated is not None and len(generated) == num_local else [x["prompt"] for x in inputs]
        local_steps, local_records = [], []
        for i in range(num_local):
            if not credited[i]:
                local_steps.append(None)
                local_records.append(None)
                continue
            ids = completion_ids[i, :lengths[i]].tolist()
            environment = environments[i] if environments else None
            row_mask = model_mask[i, :lengths[i]].tolist()
            unit = step_unit(ctx, row_mask)
            ends, rewards = self._step_rewards(ctx, prompts[i], inputs[i], ids, row_mask, unit, environment, i)
            record = {"steps": len(ends), "unscored": sum(r is None for r in rewards), "first_zero": None,
                      "thoughts": unit == "thoughts"}
            record["first_zero"] = next((k + 1 for k, r in enumerate(rewards) if r == 0.0), None)
            if outcome is not None:
                ends, rewards = [*ends, len(ids)], [*rewards, outcome[i]]
            # Steps ending inside a shared prefix (SRPO's suffix rows) are not trained: out of the statistics.
            record["rewards"] = [r if end > prefixes[i] else None for end, r in zip(ends, rewards)]
            local_steps.append(ends)
            local_records.append(record)

        records = ctx.gather_rows(local_records)  # every row of the batch, in TRL's global order
        if len(records) != batch.num_rows:
            raise RuntimeError(f"{ctx.speaker(self)}: {len(records)} rows of step rewards for {batch.num_rows} rows.")
        normalized = normalized_step_rewards(
            [None if r is None else r["rewards"] for r in records], batch.group_ids.tolist(),
            scale=ctx.scale_rewards)
        sequence = [sum(values) for values in normalized]  # a row's first trained token's advantage
        batch.log_advantages(sequence)
        batch.sequence_signs = torch.tensor(
            [0.0 if abs(s) <= SIGN_TOLERANCE else (1.0 if s > 0 else -1.0) for s in sequence], dtype=torch.float64)

        advantages = torch.zeros(num_local, num_tokens, dtype=torch.float64)
        for i, (ends, values) in enumerate(zip(local_steps, batch.local_rows(normalized))):
            if ends is not None:
                advantages[i, :lengths[i]] = torch.tensor(token_advantages(ends, values, lengths[i]),
                                                          dtype=torch.float64) * model_mask[i, :lengths[i]]
        self._log_metrics(ctx, records, ctx.speaker(self))
        batch.sequence_anchors = torch.tensor(sequence, dtype=torch.float64)
        return advantages.to(dtype=output["advantages"].dtype, device=output["advantages"].device)

    def _step_rewards(self, ctx: BatchContext, prompt, row: dict, ids: list[int], model_mask: list, unit: str,
                      environment, index: int) -> tuple[list[int], list]:
        """A row's step ends (exclusive token indices) and the step-reward function's rewards, checked. The steps are
        spans of the model's tokens (``process_steps``: model turns or thoughts, core.steps.step_spans); a step's
        reward lands on its last token (DeepSeekMath §4.1.3), so a tool result after it is credited with nothing."""
        tokenizer, delimiter = ctx.tokenizer, _arg(ctx.args, "process_thought_delimiter")
        spans = step_spans(ids, tokenizer, delimiter, model_mask, unit)
        if not spans:
            return [], []
        ends = [end for _, end in spans]
        steps = span_texts(ids, spans, tokenizer, delimiter)
        text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        columns = {key: value for key, value in row.items() if key != "prompt"}
        if environment is not None:
            columns["env"] = environment  # the rollout's environment (docs/multiturn.md#turn-rewards)
        rewards = self.step_reward(prompt, text, steps, **columns)
        name = getattr(self.step_reward, "__name__", repr(self.step_reward))
        where = f"row {index} of this process's batch (step {ctx.step})"
        return ends, checked_rewards(rewards, len(ends), repr(name), where)

    @staticmethod
    def _log_metrics(ctx: BatchContext, records: list, who: str) -> None:
        """Global metrics (every process holds every row's record): each over the credited rows."""
        rows = [r for r in records if r is not None]
        if not rows:
            return
        steps = sum(r["steps"] for r in rows)
        unscored_rows = sum(r["steps"] == r["unscored"] for r in rows)  # no step scored (or no step at all)
        one_step = sum(r["steps"] == 1 and r["thoughts"] for r in rows)  # (a one-turn episode is one step by design)
        first_zero = [r["first_zero"] for r in rows if r["first_zero"] is not None]
        ctx.metric("process/steps_per_completion", steps / len(rows))
        ctx.metric("process/unscored_step_rate", sum(r["unscored"] for r in rows) / max(steps, 1))
        ctx.metric("process/unscored_row_rate", unscored_rows / len(rows))
        ctx.metric("process/no_delimiter_rate", one_step / len(rows))
        ctx.metric("process/zero_step_rate", len(first_zero) / len(rows))
        if first_zero:
            ctx.metric("process/first_zero_step_mean", sum(first_zero) / len(first_zero))
        if unscored_rows:
            ctx.warn("process_unscored",
                     f"{who}: the step-reward function scored no step of some completions (every step "
                     "None, or an empty completion), so they get no process credit (advantage 0 unless "
                     "process_outcome='final_step'). `process/unscored_row_rate` logs their share.")
        if one_step:
            ctx.warn("process_one_step",
                     f"{who}: some completions hold no step delimiter (process_thought_delimiter) and are "
                     "one step, whose reward then acts as an outcome reward. Check the delimiter (and the prompt "
                     "asking for one step per line); `process/no_delimiter_rate` logs their share.")


def step_unit(ctx: BatchContext, model_mask: list) -> str:
    """How a row splits into steps (core.steps.STEP_UNITS): ``process_steps``, where ``"auto"`` is model turns for
    every row of a run with TRL's tool loop (``tools``, ``environment_factory``: a row that called no tool is a one-turn
    episode, one step like its group's turns) or for a row holding environment tokens (a ``rollout_func``'s
    ``env_mask``), and thoughts otherwise (docs/multiturn.md#process-credit)."""
    unit = _arg(ctx.args, "process_steps")
    if unit != "auto":
        return unit
    return "turns" if getattr(ctx.sampling, "tool_loop", False) or is_multi_turn(model_mask) else "thoughts"


def _arg(args, name: str):
    """A process field of the trainer's config ``args``, its default under a config without it (a plain
    GRPOConfig)."""
    from trl_credit.process.config import ProcessFields

    return getattr(args, name, ProcessFields.__dataclass_fields__[name].default)
