"""The credit core: one trainer over GRPOTrainer that owns every TRL override, and the three kinds of parts a credit
method is made of (docs/design.md#the-credit-core).

Every generation batch runs in one fixed order:

1. **rollout** (:class:`Rollout`): which rows exist and how they are generated (GRPO's groups, SRPO's resets,
   DATPO's trees); it returns TRL's batch and its :class:`~trl_credit.core.batch.RowBatch` record (a rollout that
   builds the rows itself does so inside TRL's ``rollout_func``, which the core installs: :meth:`Rollout.rollout_rows`);
2. **credit** (:class:`Credit`): the advantages over the record's groups (GRPO's group-normalized outcome, OPPO's
   value recursion, DATPO's block Monte Carlo);
3. **modifiers** (:class:`Modifier`, in order): transforms of those advantages (Cue-GRPO's rarity weights);
4. the core writes TRL's batch once (:func:`training_batch`): the advantages, cut to this process's rows once, and
   the sequence anchors; a rollout that builds its own rows (``Rollout.builds_rows``: DATPO's trees) turns the batch
   and the advantages into the rows TRL trains on (:meth:`Rollout.training_batch`).

Before the credit, on a rollout whose credit aggregates outcomes (``Rollout.outcomes``: DATPO's leaves), the core
hands those outcomes to every modifier that acts at the outcome stage (``Modifier.acts_on_outcomes``: Cue-GRPO's
rarity weights) and keeps the result in the record (``RowBatch.outcomes``) for the credit (:func:`outcome_stage`).

The TRL hooks a part needs around generation, batching and the loss are middlewares: the core's override calls
each part's hook in order (rollout, credit, modifiers), every hook receiving ``proceed``, the rest of the chain
ending in TRL's own method; a part that does not need a hook inherits the pass-through default. So a method is pure
math + parts + a config + a short preset (a subclass of :class:`CreditTrainer` that picks its parts), and overrides
no TRL method itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

from trl import GRPOConfig, GRPOTrainer

from trl_credit.core.advantages import grouped_advantages, normalize_then_sum_advantages
from trl_credit.core.anchors import SEQUENCE_ANCHORS, batch_sequence_anchors, decided_per_sequence
from trl_credit.core.batch import NO_GROUP, Outcomes, RowBatch, fill_record, trl_groups
from trl_credit.core.collectives import trl_global_advantages
from trl_credit.core.context import BatchContext, hook_context
from trl_credit.core.generation import one_weight_push
from trl_credit.core.logs import nonfinite_reward_groups, replace_logged_advantages, zero_nonfinite_groups
from trl_credit.core.mixins import RolloutCapture, checking_empty_completions
from trl_credit.core.registry import register_part
from trl_credit.core.row_count import NUM_ROWS, micro_batch, renormalized_loss
from trl_credit.core.setup import bind_success, check_single_turn, speaker
from trl_credit.core.success import total_rewards
from trl_credit.model_card import MethodModelCardMixin
from trl_credit.trl_bridge.compat import hidden_library_deprecations
from trl_credit.trl_bridge.vllm_push import fix_colocate_push

__all__ = [
    "Part", "Rollout", "Credit", "Modifier", "GroupRollout", "GroupOutcome", "CreditTrainer", "CreditStep",
    "credit_step", "fill_record", "outcome_stage", "training_batch", "builds_rows_in_rollout_func",
]


class Part:
    """What every part may hook into; each default passes straight through to the rest of the chain."""

    name = "part"

    def setup(self, trainer) -> None:
        """After ``GRPOTrainer.__init__``: check the trainer's settings, load helper models. The one hook that gets the
        trainer; every other gets a :class:`~trl_credit.core.context.BatchContext` (docs/design.md#the-batch-context)."""

    def generate_single_turn(self, ctx, proceed, prompt_ids, images, multimodal_fields, num_generations,
                             has_tool_images=False):
        """Around TRL's ``_generate_single_turn`` (e.g. to record what HF ``generate`` computes on the way)."""
        return proceed(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def prepare_inputs(self, ctx, proceed, generation_batch):
        """Around TRL's ``_prepare_inputs`` (the split of a generation batch into micro-batches)."""
        return proceed(generation_batch)

    def micro_batch_loss(self, ctx, proceed, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Around the Trainer's ``compute_loss`` of one micro-batch."""
        return proceed(model, inputs, return_outputs, num_items_in_batch)

    def loss(self, ctx, proceed, model, inputs):
        """Around TRL's ``_compute_loss`` (the advantages and masks reaching TRL's loss math)."""
        return proceed(model, inputs)

    def rng_state(self) -> dict:
        """Random state this part owns, JSON-able, saved with checkpoints (keys distinct from other parts')."""
        return {}

    def set_rng_state(self, state: dict) -> None:
        pass


class Rollout(Part):
    """Which rows a generation batch holds."""

    resumes_tool_loop = False
    """True for a rollout that generates rows of its own from prefixes and resumes TRL's tool loop in them
    (``core.tool_loop``): it accepts ``tools`` and an ``environment_factory`` (a user's ``rollout_func`` stays
    refused). One that builds its rows itself (:meth:`rollout_rows`: SRPO's resets) returns its finished multi-turn
    rows with ``tool_loop`` (:class:`~trl_credit.core.tool_loop.BuiltRows`), which the core hands TRL in place of its
    own tool loop over them; DATPO's trees, whose base rows are TRL's, resume the loop for their branches only.
    Otherwise a rollout that builds its rows itself refuses both."""

    builds_rows = False
    """True for a rollout whose training rows are not the record's (DATPO's trees: a row per branch too): the core
    then has :meth:`training_batch` build them (marked with ``row_count.NUM_ROWS``, the same count on every process)
    and owns their variable row count: it splits them into micro-batches without dropping a row
    (``row_count.micro_batch``) and weighs every row the same in the loss (``row_count.renormalized_loss``);
    otherwise the core writes the advantages into TRL's batch."""

    def generate_and_score(self, ctx: BatchContext, inputs, capture: RolloutCapture) -> tuple[dict, RowBatch | None]:
        """TRL's batch (``_generate_and_score_completions``'s output for this process's rows) and its record, or
        None as the record when no credit applies (the batch is trained as TRL built it)."""
        output = ctx.trl_batch(inputs)
        return output, trl_groups(ctx, capture.rewards(ctx.speaker(self)), output["completion_ids"].size(0))

    def outcomes(self, ctx: BatchContext, batch: RowBatch) -> Outcomes | None:
        """The outcomes this rollout's credit aggregates (DATPO's leaves), asked by the core only when a modifier acts
        at the outcome stage; None (the default): the credit values the rows themselves."""
        return None

    def trained_prompt(self, prompt):
        """A dataset prompt as this rollout trains on it (the model card's quick start uses it); default: unchanged."""
        return prompt

    def rollout_rows(self, ctx: BatchContext, prompts: list) -> dict:
        """Not overridden (the default): TRL generates the rows. Overridden (SRPO's resets): the rows of this
        process's ``prompts`` (one per prompt row, as TRL duplicated them), built by the rollout itself. The core then
        installs it as TRL's ``rollout_func`` (:meth:`CreditTrainer._rollout_func_of_parts`), which TRL's
        ``_generate`` calls inside the generation batch, and this hook gets the batch's context (``ctx.inputs`` are
        the rows ``prompts`` came from). Returns TRL's ``rollout_func`` dict: ``prompt_ids``, ``completion_ids``,
        ``logprobs`` and optionally ``env_mask`` (TRL's ``tool_mask``: 0 keeps a token out of the loss)."""
        raise NotImplementedError(f"{type(self).__name__}.rollout_rows: TRL generates this rollout's rows")

    def training_batch(self, ctx: BatchContext, batch: RowBatch, inputs, output: dict, advantages) -> dict:
        """With :attr:`builds_rows`: this process's rows TRL trains on, built from TRL's batch of the record's rows and
        what the credit and the modifiers returned."""
        raise NotImplementedError(f"{type(self).__name__} sets builds_rows but does not build the rows "
                                  "(training_batch)")


class Credit(Part):
    """How an outcome becomes advantages. It returns them and writes nothing into TRL's batch: what the loss needs
    beside them goes into the record (``batch.sequence_anchors``), which the core writes into TRL's batch."""

    sets_sequence_anchors = False
    """True for a credit whose (B, T) advantages carry ``batch.sequence_anchors``: TRL's per-sequence decisions are
    then made from them, and (B, T) advantages without them are refused in the loss (trl_credit/core/anchors.py)."""

    def advantages(self, ctx: BatchContext, batch: RowBatch, inputs, output: dict):
        raise NotImplementedError


class Modifier(Part):
    """A transform of the credit's advantages."""

    acts_on_outcomes = False
    """True for a modifier that also acts at the outcome stage: on a rollout that declares outcomes
    (:meth:`Rollout.outcomes`), the core calls :meth:`leaf_outcomes` before the credit, which aggregates the outcomes
    it returns (Cue-GRPO's rarity weights on DATPO's leaves); :meth:`apply` runs after the credit as for every
    modifier."""

    def leaf_outcomes(self, ctx: BatchContext, batch: RowBatch, outcomes: Outcomes):
        """The outcomes' rewards (L,) after this modifier (``outcomes.rewards`` as the earlier modifiers left them)."""
        raise NotImplementedError

    def apply(self, ctx: BatchContext, batch: RowBatch, inputs, output: dict, advantages):
        raise NotImplementedError


@register_part("rollout", "groups", help="GRPO's iid groups")
class GroupRollout(Rollout):
    """GRPO's rollouts: ``num_generations`` iid completions per prompt, generated by TRL."""

    name = "groups"


def builds_rows_in_rollout_func(rollout: Rollout) -> bool:
    """Whether ``rollout`` overrides :meth:`Rollout.rollout_rows` (its rows come from TRL's ``rollout_func``)."""
    return type(rollout).rollout_rows is not Rollout.rollout_rows


@register_part("credit", "outcome", help="GRPO's group-normalized outcome")
class GroupOutcome(Credit):
    """GRPO's group-normalized outcome over the record's groups (``nonfinite_metric`` logs the share of groups holding
    a ±inf reward, which get 0 as in TRL: ``trainer_logs.nonfinite_reward_groups``).

    Over TRL's own groups (``batch.group_size`` set) these are the advantages TRL computed, of every row (the core's
    :func:`~trl_credit.core.collectives.trl_global_advantages`; this process's rows when the core kept none), with 0 for every row of a group
    holding a ±inf reward (``trainer_logs.zero_nonfinite_groups``). Over other groups
    (SRPO's sub-groups) they are every row of the record, which the core cuts to this process's rows once, after the
    modifiers; they are computed here as TRL would over ``batch.group_ids`` (:mod:`trl_credit.core.advantages`, with TRL's
    ``multi_objective_aggregation``, ``scale_rewards`` and reward weights); rows of :data:`NO_GROUP` get 0 and stay
    out of every statistic, and TRL's completions table shows these advantages."""

    name = "outcome"

    def __init__(self, nonfinite_metric: str = "credit/nonfinite_reward_rate", speaks_as: str | None = None):
        self.nonfinite_metric = nonfinite_metric
        self.speaks_as = speaks_as  # the part whose computation this is (OPPO's credit uses one), for messages

    def advantages(self, ctx: BatchContext, batch: RowBatch, inputs, output: dict):
        if batch.group_size is not None:
            # TRL's advantages of every row when the core kept them (global: the core cuts them once), else TRL's own
            everyone = getattr(ctx.capture, "trl_global_advantages", None)
            trl = everyone if everyone is not None and len(everyone) == batch.num_rows else output["advantages"]
            return zero_nonfinite_groups(ctx, trl, batch.rewards_per_func, self.nonfinite_metric,
                                         part=self.speaks_as or self)
        rewards_per_func, group_ids = batch.rewards_per_func, batch.group_ids
        grouped = group_ids != NO_GROUP
        nonfinite_reward_groups(ctx, rewards_per_func[grouped.to(rewards_per_func.device)], group_ids[grouped],
                                self.nonfinite_metric, part=self.speaks_as or self)
        if ctx.multi_objective_aggregation == "normalize_then_sum":
            # Each reward function z-scored within each group, weighted sum, one batch-wide rescale (TRL's GDPO).
            advantages = normalize_then_sum_advantages(rewards_per_func, group_ids, ctx.reward_weights,
                                                       valid=grouped)
        else:
            rewards = total_rewards(rewards_per_func, ctx.reward_weights)  # NaN when unscorable
            advantages = grouped_advantages(rewards, group_ids, scale=ctx.scale_rewards, valid=grouped)
        batch.log_advantages(advantages.tolist())
        trl_advantages = output["advantages"]
        return advantages.to(trl_advantages.device).to(trl_advantages.dtype)  # global: the core cuts them once


def outcome_stage(trainer, ctx: BatchContext, batch: RowBatch) -> None:
    """The outcome stage, before the credit: the rollout's outcomes (``Rollout.outcomes``) through every modifier that
    acts on outcomes, in order, kept in ``batch.outcomes`` for the credit. Nothing when no modifier acts on outcomes
    or the rollout declares none (``batch.outcomes`` stays None)."""
    acting = [modifier for modifier in trainer.modifiers if modifier.acts_on_outcomes]
    if not acting:
        return
    outcomes = trainer.rollout.outcomes(ctx, batch)
    if outcomes is None:
        return
    for modifier in acting:
        outcomes.rewards = modifier.leaf_outcomes(ctx, batch, outcomes)
    batch.outcomes = outcomes


def training_batch(trainer, ctx: BatchContext, batch: RowBatch, inputs, output: dict, advantages) -> tuple[dict, Any]:
    """The one write of TRL's batch per generation batch: the sequence anchors (this process's rows) and the
    advantages, cut from every row of the record to this process's rows here and only here (a credit or modifier
    may return either: :meth:`RowBatch.is_global`); a rollout that builds its own rows (``builds_rows``) builds them
    from TRL's batch and the advantages instead. Returns TRL's training batch and the advantages as written."""
    trl_advantages = output["advantages"]
    if batch.sequence_anchors is not None:  # this process's rows, as TRL's advantages
        output[SEQUENCE_ANCHORS] = batch.local_rows(batch.sequence_anchors).to(
            dtype=trl_advantages.dtype, device=trl_advantages.device)
    if trainer.rollout.builds_rows:
        return trainer.rollout.training_batch(ctx, batch, inputs, output, advantages), advantages
    if batch.is_global(advantages):
        advantages = batch.local_rows(advantages)
    output["advantages"] = advantages
    return output, advantages


def credit_step(trainer, ctx: BatchContext, inputs, capture: RolloutCapture) -> tuple[dict, RowBatch | None, Any]:
    """One generation batch through ``trainer``'s parts (module docstring): rollout, record filled, outcome stage,
    credit, modifiers, TRL's batch written. Returns TRL's training batch, the record (None when the rollout left the
    batch to TRL) and the advantages as the modifiers left them (this process's rows)."""
    output, batch = trainer.rollout.generate_and_score(ctx, inputs, capture)
    ctx.record = batch
    if batch is None:
        return output, None, output["advantages"]
    fill_record(batch, inputs, output, capture, ctx.tokenizer if ctx.has_model else None)
    outcome_stage(trainer, ctx, batch)
    advantages = trainer.credit.advantages(ctx, batch, inputs, output)
    for modifier in trainer.modifiers:
        advantages = modifier.apply(ctx, batch, inputs, output, advantages)
    output, advantages = training_batch(trainer, ctx, batch, inputs, output, advantages)
    return output, batch, advantages


@dataclasses.dataclass(frozen=True)
class CreditStep:
    """What an ``on_credit`` callback receives, once per generation batch (training and evaluation), after the
    rollout, the credit and the modifiers ran (docs/design.md#watching-the-credit). To observe, not to change: the
    tensors are the ones TRL trains on."""

    trainer: Any
    inputs: list
    """The generation batch TRL handed to ``_generate_and_score_completions`` (this process's prompts)."""
    record: RowBatch | None
    """The batch's record (every row of all processes: rewards, groups, success, ...); None when no credit applied
    (a rollout may leave a batch to TRL: DATPO's evaluation batches), and then ``advantages`` are TRL's."""
    advantages: Any
    """This process's advantages, ``(B,)`` or ``(B, T)``, as the credit and the modifiers left them."""
    output: dict
    """TRL's training batch as the loss receives it (``completion_ids``, ``completion_mask``, ``advantages``, ...)."""
    context: BatchContext | None = None
    """The :class:`~trl_credit.core.context.BatchContext` the parts got for this batch (args, mode, step, metrics, ...)."""
    trl_advantages: Any = None
    """This process's advantages ``(B,)`` as TRL computed them, before any part acted (GRPO's group-normalized outcome
    over TRL's groups, in ``output``'s row order); None when the training batch is not TRL's (a rollout that builds its
    own rows: DATPO's trees)."""


class CreditTrainer(MethodModelCardMixin, GRPOTrainer):
    """GRPOTrainer whose generation batches run rollout -> credit -> modifiers (module docstring). Without parts it
    trains as GRPOTrainer: TRL's rollouts and TRL's advantages."""

    _tag_names = ["trl", "grpo", "trl_credit"]
    _name = "GRPO"
    _paper = {"title": None, "id": None, "citation": None}

    def __init__(self, model, reward_funcs=None, args=None, *pargs, rollout: Rollout | None = None,
                 credit: Credit | None = None, modifiers=None,
                 on_credit: Callable[[CreditStep], None] | list[Callable[[CreditStep], None]] | None = None, **kwargs):
        # The library's one upward import, on purpose and at construction (tests/test_import_graph.py's UPWARD): a bare
        # CreditTrainer builds its parts by name and defaults to CreditConfig, the union of every part's fields, so the
        # composition must know every method (config.py imports them) while the methods subclass this class.
        from trl_credit.config import CreditConfig, refusal, selected_parts

        self._credit_callbacks = []
        callbacks = list(on_credit) if isinstance(on_credit, (list, tuple)) else [] if on_credit is None else [on_credit]
        for callback in callbacks:
            self.add_credit_callback(callback)
        if type(self) is CreditTrainer:  # a composed method: its config selects its parts (a preset has its own)
            from trl_credit.core.setup import resolve_method_args

            if args is None or not isinstance(args, GRPOConfig) or isinstance(args, CreditConfig):
                args = resolve_method_args(args, CreditConfig, model, "CreditTrainer", "Credit")
        self.rollout, self.credit, self.modifiers = selected_parts(args, rollout, credit, modifiers)
        reason = refusal(self.rollout.name, self.credit.name, [m.name for m in self.modifiers])
        if reason is not None:
            raise ValueError(f"{type(self).__name__} cannot combine these parts: {reason}")
        if type(self) is CreditTrainer:
            self._name = " x ".join(part.name for part in self.parts)
            self._tag_names = [*self._tag_names, *(part.name for part in self.parts)]
        with hidden_library_deprecations():  # PEFT's checkpointing calls (trl_compat)
            super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        fix_colocate_push(self)  # where TRL's colocate push cannot load (vLLM's CPU platform): trl_bridge.vllm_push
        if hasattr(self.args, "success_reward"):  # a method config (SuccessArguments): the verifier, checked now
            bind_success(self)
        if builds_rows_in_rollout_func(self.rollout):
            # The rollout's own rows (Rollout.rollout_rows) through TRL's rollout_func, set here and nowhere else; a
            # user's rollout_func, tools or environments would replace or bypass them: refused first.
            check_single_turn(self, speaker(self, self.rollout), "its rollout builds the rows itself (SRPO's resets "
                              "generate a second group from a prefix of a failed rollout)",
                              tool_loop=self.rollout.resumes_tool_loop)
            self.rollout_func = self._rollout_func_of_parts
        for part in self.parts:
            part.setup(self)

    def add_credit_callback(self, callback: Callable[[CreditStep], None]) -> None:
        """Call ``callback(step)`` with a :class:`CreditStep` once per generation batch, after the credit (the same as
        ``on_credit=``). Callbacks run in the order added, on every process (each with its own rows)."""
        if not callable(callback):
            raise TypeError(f"on_credit: expected a callable taking a CreditStep, got {type(callback).__name__}")
        self._credit_callbacks.append(callback)

    @property
    def parts(self) -> list[Part]:
        """The rollout, the credit and the modifiers, in the order their hooks run."""
        return [self.rollout, self.credit, *self.modifiers]

    def _through_parts(self, hook: str, trl_method):
        """``trl_method`` wrapped by every part's ``hook``: the rollout's outermost, TRL's innermost. Each hook gets
        the context of the generation batch in progress, or outside one a context without a batch."""
        ctx = self._batch_context if self._batch_context is not None else hook_context(self)
        proceed = trl_method
        for part in reversed(self.parts):
            proceed = functools.partial(getattr(part, hook), ctx, proceed)
        return proceed

    # ------------------------------------------------------------------ the generation batch
    # Each TRL name below is overridden here and nowhere else (tests/test_trl_overrides.py); what several concerns
    # need around one TRL method is a piece called in order inside its one override.
    _rollout_capture: RolloutCapture | None = None
    _built_tool_loop = None  # a rollout's finished multi-turn rows, for TRL's _generate (core.tool_loop.BuiltRows)
    _generation_lockstep = None  # TRL's tool loop resumed across processes in lockstep (core.tool_loop.Lockstep)
    _batch_context: BatchContext | None = None  # the generation batch's, inside _generate_and_score_completions
    _hook_context: tuple | None = None  # ((step, mode), context) of hooks outside a batch (context.hook_context)

    @contextlib.contextmanager
    def _capturing_rollouts(self) -> Iterator[RolloutCapture]:
        """Inside, what TRL's ``_generate`` and ``_calculate_rewards`` return for the batch is kept in
        ``self._rollout_capture`` (no copy). Rewards of rows outside the batch (DATPO's branches, SRPO's seeds) go
        through ``GRPOTrainer._calculate_rewards`` itself (``collectives.rewards_of_extra_rows``), so they never
        replace the batch's. Outside, nothing is kept."""
        outer = self._rollout_capture
        self._rollout_capture = RolloutCapture()
        try:
            yield self._rollout_capture
        finally:
            self._rollout_capture = outer

    @contextlib.contextmanager
    def _in_batch_context(self, inputs, capture) -> Iterator[BatchContext]:
        """The generation batch's :class:`BatchContext`, handed to every part's hook inside (one per batch)."""
        outer = self._batch_context
        self._batch_context = BatchContext.for_trainer(self, inputs, capture)
        try:
            yield self._batch_context
        finally:
            self._batch_context = outer

    def _rollout_func_of_parts(self, prompts, trainer):
        """TRL's ``rollout_func`` when the rollout builds its rows (:meth:`Rollout.rollout_rows`). TRL's ``_generate``
        calls ``rollout_func(prompts, self)`` (trl 1.14.2 to 1.16); the rollout gets the generation batch's context
        instead of the trainer (outside a batch, which TRL never does, a context without one)."""
        ctx = self._batch_context if self._batch_context is not None else hook_context(self)
        output = self.rollout.rollout_rows(ctx, prompts)
        # finished multi-turn rows: TRL's _generate runs its tool loop over a rollout_func's rows when it has tools,
        # so _tool_call_loop hands it these instead (Rollout.resumes_tool_loop)
        self._built_tool_loop = output.pop("tool_loop", None)
        return output

    def _trl_generate_and_score_completions(self, inputs):
        """TRL's own generation batch, for rollouts; kept in the batch's capture with a copy of its advantages (what
        ``CreditStep.trl_advantages`` hands ``on_credit``) and TRL's advantages of every row (``GroupOutcome``'s)."""
        output = super()._generate_and_score_completions(inputs)
        capture = self._rollout_capture
        if capture is not None:
            capture.trl_output = output
            capture.trl_advantages = output["advantages"].detach().clone()
            if capture.rewards_per_func is not None:
                capture.trl_global_advantages = trl_global_advantages(self, capture.rewards_per_func,
                                                                      output["advantages"])
        return output

    def _generate_and_score_completions(self, inputs):
        # One vLLM weight push for the whole phase (base rollouts and every extra call the parts make:
        # generation.one_weight_push); TRL's rollouts and the global rewards of this batch captured for the parts;
        # TRL's generation context calls renamed methods (hidden_library_deprecations).
        with one_weight_push(self):
            with self._capturing_rollouts() as capture, hidden_library_deprecations(), \
                    self._in_batch_context(inputs, capture) as ctx:
                output, batch, advantages = credit_step(self, ctx, inputs, capture)
            if batch is not None:
                if batch.table_advantages is not None:  # the parts' values over GRPO's, written once
                    replace_logged_advantages(self, batch.table_advantages)
                self._log_credit(output, block_ids=batch.block_ids)
            if self._credit_callbacks:
                # TRL's advantages belong to its rows: only when the rows trained are TRL's batch itself
                trl_advantages = capture.trl_advantages if output is capture.trl_output else None
                step = CreditStep(trainer=self, inputs=inputs, record=batch, advantages=advantages, output=output,
                                  context=ctx, trl_advantages=trl_advantages)
                for callback in self._credit_callbacks:
                    callback(step)
        return output

    def _generate(self, prompts):
        # TRL 1.16 reads each completion's last token in here: empty completions are refused by name first
        # (mixins.checking_empty_completions, around the rollout_func or whatever _generate_single_turn is).
        with checking_empty_completions(self):
            result = super()._generate(prompts)
        if self._rollout_capture is not None:
            self._rollout_capture.generated = result
            self._rollout_capture.generated_prompts = list(prompts)
        return result

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        # Rows a rollout finished itself, tool loop included (Rollout.resumes_tool_loop: SRPO's resets), are what TRL's
        # loop returns for them; any other call is TRL's loop.
        built, self._built_tool_loop = self._built_tool_loop, None
        if built is None:
            return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, logprobs, images,
                                           multimodal_fields)
        return built.as_tool_loop_result(completion_ids, logprobs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._rollout_capture is not None:
            self._rollout_capture.rewards_per_func = rewards_per_func
        return rewards_per_func

    # ------------------------------------------------------------------ TRL hooks, handed to the parts
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        generate = self._through_parts("generate_single_turn", super()._generate_single_turn)
        if self._generation_lockstep is not None:  # TRL's tool loop resumed by a part, in lockstep across processes
            return self._generation_lockstep.call(generate, prompt_ids, images, multimodal_fields, num_generations,
                                                  has_tool_images)
        # empty completions: checked above this override, where TRL's _generate receives them (checking_empty_completions)
        return generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def _prepare_inputs(self, generation_batch):
        # Rows a rollout built (a count TRL's floor-dividing split would cut) are split here without dropping any;
        # evaluation batches are TRL's.
        if self.rollout.builds_rows and self.model.training:
            split = functools.partial(micro_batch, self)
        else:
            split = super()._prepare_inputs
        return self._through_parts("prepare_inputs", split)(generation_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = self._through_parts("micro_batch_loss", super().compute_loss)
        return loss(model, inputs, return_outputs, num_items_in_batch)

    def _compute_loss(self, model, inputs):
        required_by = speaker(self, self.credit) if self.credit.sets_sequence_anchors else None
        with batch_sequence_anchors(inputs, required_by):
            loss = self._through_parts("loss", super()._compute_loss)(model, inputs)
        if self.model.training and NUM_ROWS in inputs:  # rows a rollout built: weighed against the generation batch
            loss = renormalized_loss(self, loss, inputs)
        return loss

    # Per-sequence decisions of TRL's loss (off_policy_mask_threshold, VESPO) with per-token advantages: a credit that
    # sets sequence anchors (OPPO's sign(A^seq), trl_credit/core/anchors.py) has them decided per sequence; otherwise TRL's.
    get_off_policy_mask = decided_per_sequence("get_off_policy_mask")
    get_gamma_weights = decided_per_sequence("get_gamma_weights")

    # ------------------------------------------------------------------ checkpoints (MethodRNGStateMixin)
    def _method_rng_state(self) -> dict:
        state = {}
        for part in self.parts:
            state.update(part.rng_state())
        return state

    def _set_method_rng_state(self, state: dict) -> None:
        for part in self.parts:
            part.set_rng_state(state)
