"""OPPO's part of the credit core (trl_credit/core/trainer.py): :class:`ValueRecursion`, the credit that turns each
completion's outcome into per-token advantages (B, T) by the Bayesian value recursion (docs/oppo.md, paper §4). OPPO's
rollout is GRPO's (:class:`~trl_credit.core.trainer.GroupRollout`); composed, it credits any rollout's groups (SRPO's reset
sub-groups) and hands the per-row modifiers (Cue-GRPO's) each row's sign(A^seq) (docs/oppo.md#composition).

What it does around TRL, per generation batch:
- From the batch's record (:class:`~trl_credit.core.batch.RowBatch`: TRL's global reward matrix, the verifier's
  decisions, scorable rows, group ids) come each group's k (completions the verifier, ``success_reward``, calls
  correct), its number of scorable completions G and each row's anchoring sign sign(A^seq) (from the rewards, so
  that a row tying its group's mean gets 0). Unscorable rows, and rows of no group, get advantage exactly 0 on every
  token and stay out of the group's token statistics, as TRL leaves unscorable rows out of its baseline.
- This process's completions are scored under the oracle prompts (one batched no-grad pass of B rows with a float32
  LM head: the plain log-probs s_t come from TRL's old log-probs, from the log-probs recorded during HF generation
  (:meth:`ValueRecursion.generate_single_turn`, head in float32 too), or from vLLM's sampler, each only when computed
  with a float32 head; only where none exists, or with ``plain_logps="recompute"`` or a teacher, are the B plain rows
  scored in the same pass), the recursion of :mod:`trl_credit.oppo.recursion` turns them into Â (B, T), Â is
  normalized per group over the valid tokens of all processes (per-row sums/sums of squares/counts are gathered),
  and the (B, T) tensor becomes the batch's advantages. TRL's ``_compute_loss`` takes (B, T) advantages as they are,
  for every ``loss_type``.
- ``off_policy_mask_threshold`` / ``loss_type="vespo"`` make their per-sequence decision from the sequence's sign
  anchor sign(A^seq), put in the record (``RowBatch.sequence_anchors``) and carried to the loss by the core
  (trl_credit/core/anchors.py).
- A teacher (``oracle="teacher"``) is loaded, frozen and prepared like TRL's reference model
  (:meth:`ValueRecursion.setup`).
"""

from __future__ import annotations

import contextlib

import torch

from trl_credit.core.batch import NO_GROUP, RowBatch
from trl_credit.core.context import BatchContext
from trl_credit.core.trainer import Credit, GroupOutcome
from trl_credit.generation.hooks import GenerationRecorder, runs_hf_generate
from trl_credit.oppo.answers import answer_problem, check_answers, refuse_answer, resolve_answer_column
from trl_credit.oppo.config import OPPOFields
from trl_credit.trl_bridge import privates as bridge
from trl_credit.oppo.oracle import (
    add_float32_head,
    add_float32_teacher_head,
    build_oracle_prompts,
    float32_head,
    score_evidence,
)
from trl_credit.oppo.recursion import (
    bayesian_value_recursion,
    evidence_ranking,
    group_moments,
    group_success_counts,
    normalize_with_group_moments,
    row_token_moments,
    sequence_anchor_signs,
)
from trl_credit.core.registry import register_part
from trl_credit.core.setup import bind_success, is_composed, speaker
from trl_credit.trl_bridge.compat import (
    HAS_FUSED_LM_HEAD,
    create_model_from_path,
    disable_dropout_in_model,
    get_config_model_id,
    prepare_deepspeed,
    prepare_fsdp,
)

__all__ = ["ValueRecursion", "load_teacher"]

#: Pairs of training's ``oppo/evidence_auc`` before a value at chance or below warns (a batch holds a few dozen).
EVIDENCE_AUC_WARN_PAIRS = 256


def causal_lm(trainer):
    """The causal LM whose forward TRL patched (the PEFT base model), which ``generate`` and the log-prob passes run."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def reduced_precision(ctx: BatchContext) -> bool:
    """Whether the policy's LM head computes below float32 unless OPPO makes it float32 (bf16/fp16 autocast or
    weights): then log-probs computed outside OPPO's float32 head cannot serve as s_t."""
    head = ctx.causal_lm.get_output_embeddings()
    reduced = (torch.bfloat16, torch.float16)
    return ctx.mixed_precision in ("bf16", "fp16") or head.weight.dtype in reduced


def records_generation_logps(ctx: BatchContext) -> bool:
    """Whether s_t is recorded during generation: HF ``generate`` (not vLLM, not continuous batching), the
    self-oracle with ``plain_logps="auto"``, and TRL's own rollouts. A ``rollout_func`` (SRPO's resets) builds its
    rows from several generation calls (a suffix row's completion is a prefix from one call and a suffix from
    another, under the rollout's prompt), so no one call's record lines up with the rows: s_t is scored instead. So
    does TRL's tool loop: a completion is one call per model turn with tool results between them, and each call's
    record would start at the completion's first token."""
    args, sampling = ctx.args, ctx.sampling
    return (
        args.oracle == "self"
        and args.plain_logps == "auto"
        and runs_hf_generate(sampling)
        and not sampling.custom_rollout
        and not getattr(sampling, "tool_loop", False)
    )


def load_teacher(trainer, teacher, teacher_processing_class):
    """Load (if a name), check the tokenizer, freeze and prepare the teacher like GRPOTrainer's ``ref_model``."""
    from transformers import AutoTokenizer

    args = trainer.args
    who = speaker(trainer, "oppo")
    name = teacher if isinstance(teacher, str) else get_config_model_id(teacher.config)
    if teacher_processing_class is None:
        passed = (f"{type(trainer).__name__}(credit=ValueRecursion(teacher_processing_class=...))"
                  if is_composed(trainer) else f"{type(trainer).__name__}(teacher_processing_class=...)")
        try:
            teacher_processing_class = AutoTokenizer.from_pretrained(name, trust_remote_code=args.trust_remote_code)
        except Exception as error:  # noqa: BLE001 - any loading failure means we cannot check the vocabulary
            raise ValueError(
                f"{who} could not load the teacher's tokenizer from {name!r} to check it matches the policy's "
                f"({error}); pass it: {passed}."
            ) from error
    teacher_tokenizer = getattr(teacher_processing_class, "tokenizer", teacher_processing_class)
    student_vocab, teacher_vocab = bridge.tokenizer(trainer).get_vocab(), teacher_tokenizer.get_vocab()
    if student_vocab != teacher_vocab:
        differing = sorted(set(student_vocab.items()) ^ set(teacher_vocab.items()))[:5]
        raise ValueError(
            f"{who}: the teacher must share the policy's tokenizer (it scores the policy's token ids), but the "
            f"vocabularies differ: policy {len(student_vocab)} tokens, teacher {name!r} {len(teacher_vocab)} "
            f"tokens, e.g. {differing}. Use a teacher of the same model family/tokenizer, or oracle='self'."
        )

    if isinstance(teacher, str):
        init_kwargs = dict(args.teacher_model_init_kwargs or {})
        if args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
            init_kwargs["device_map"] = None  # as GRPOTrainer does for its models
        init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        teacher = create_model_from_path(teacher, **init_kwargs)
    elif args.teacher_model_init_kwargs is not None:
        raise ValueError(
            "`teacher_model_init_kwargs` is set but the teacher was passed as an instantiated model; "
            "load it with those kwargs yourself or pass its name."
        )
    largest_id = max(student_vocab.values())
    teacher_head = teacher.get_output_embeddings()
    # Under ZeRO-3 the teacher is loaded partitioned (as TRL's reference model): each process holds an empty
    # placeholder weight, and DeepSpeed keeps the real shape in `ds_shape`.
    head_rows = None if teacher_head is None else getattr(teacher_head.weight, "ds_shape",
                                                          teacher_head.weight.shape)[0]
    if head_rows is not None and head_rows <= largest_id:
        raise ValueError(
            f"{who}: the teacher has {head_rows} output rows but the tokenizer has ids up to "
            f"{largest_id}: it cannot score every token of the policy's vocabulary."
        )
    teacher.eval()
    teacher.requires_grad_(False)
    if args.disable_dropout:
        disable_dropout_in_model(teacher)
    # TRL's fused log-prob head (and temperature), so o_t and s_t come from `_get_per_token_logps_and_entropies` as
    # TRL's own log-probs do; in float32 (docs/oppo.md#evidence): the teacher only scores the evidence.
    add_float32_teacher_head(teacher, trainer.temperature)
    if trainer.is_deepspeed_enabled:
        return prepare_deepspeed(teacher, trainer.accelerator)
    if trainer.is_fsdp_enabled:
        return prepare_fsdp(teacher, trainer.accelerator)
    return trainer.accelerator.prepare_model(teacher, evaluation_mode=True)


@register_part("credit", "oppo", help="OPPO's token value recursion", fields=OPPOFields,
               check_after_grpo="_check_oppo_after_grpo")
class ValueRecursion(Credit):
    """OPPO's credit: per-token advantages (B, T) by the Bayesian value recursion, with a self- or teacher-oracle
    (module docstring). ``teacher`` / ``teacher_processing_class``: what ``oracle="teacher"`` scores with (a name or
    a model, and its tokenizer); loaded and prepared in :meth:`setup` as :attr:`teacher_model`."""

    name = "oppo"

    def __init__(self, teacher=None, teacher_processing_class=None):
        self._teacher_source = (teacher, teacher_processing_class)
        self.teacher_model = None
        # s_t recorded during a batch's HF generation (one list per row) lives in the batch's context:
        # ctx.scratch(self)["generation_logps"], absent or None when not recorded.
        self.outcome = GroupOutcome(nonfinite_metric="oppo/nonfinite_reward_rate", speaks_as=self.name)
        self.evidence_ranking_seen = [0.0, 0]  # training's wins and pairs so far (oppo/evidence_auc's warning)

    # ------------------------------------------------------------------------------------------------ TRL hooks
    def setup(self, trainer) -> None:
        # Any rollout's rows are credited: TRL's (with its tool loop or environments), a user's rollout_func, a rollout
        # part's (SRPO's resets). Tool results and environment tokens carry no evidence and get no credit
        # (docs/multiturn.md#oppo).
        bind_success(trainer)
        # OPPOTrainer checks the answer column before loading any model; a composed trainer checks it here.
        who, config = speaker(trainer, self), type(trainer.args).__name__
        resolve_answer_column(trainer.args, trainer.train_dataset, who, config)
        check_answers(trainer.train_dataset, trainer.args.answer_column, "train_dataset", who, config)
        check_answers(trainer.eval_dataset, trainer.args.answer_column, "eval_dataset", who, config)
        if bridge.is_vlm(trainer):
            raise ValueError(
                f"{speaker(trainer, self)} does not support vision-language processors: the oracle pass scores text "
                "prompts only."
            )
        # TRL 1.16's `use_liger_kernel` only swaps layer kernels (its fused loss is refused by GRPOTrainer); the loss is
        # still `_compute_loss`, which takes (B, T) advantages, so it needs no refusal here.
        if trainer.args.oracle == "teacher":
            self.teacher_model = load_teacher(trainer, *self._teacher_source)
        else:  # the policy scores the evidence: its extra pass runs a float32 LM head (docs/oppo.md#evidence)
            add_float32_head(causal_lm(trainer), trainer.temperature)
        self._teacher_source = (None, None)  # the prepared teacher is kept, not what it was built from

    def generate_single_turn(self, ctx, proceed, prompt_ids, images, multimodal_fields, num_generations,
                             has_tool_images=False):
        """TRL's generation; with HF ``generate`` and the self-oracle, the plain log-probs s_t of the sampled tokens
        are recorded on the way (:class:`~trl_credit.generation.hooks.GenerationRecorder`) for :meth:`advantages`,
        with the LM head in float32 like the extra pass's (so the tokens are sampled from float32 logits, as with
        TRL's ``cast_lm_head_to_fp32``)."""
        scratch = ctx.scratch(self)
        scratch["generation_logps"] = None
        if not records_generation_logps(ctx):
            return proceed(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        recorder = GenerationRecorder(ctx.sampling.temperature, logps=True)
        model = ctx.causal_lm
        with recorder.attached_to(model), float32_head(model) as head_in_float32:
            completion_ids, logprobs = proceed(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        # A head that could not run in float32 (e.g. with a LoRA adapter) under reduced precision: not s_t.
        usable = head_in_float32 or not reduced_precision(ctx)
        scratch["generation_logps"] = recorder.logps(completion_ids) if usable else None
        return completion_ids, logprobs

    # Per-sequence decisions of TRL's loss. `off_policy_mask_threshold` keeps a sequence when its advantage is >= 0
    # (or its KL is small) and VESPO picks its gamma weighting by the advantage's sign, both meant per sequence. With
    # (B, T) advantages TRL would decide per token, and after the group normalization the tokens of one completion
    # can have both signs. OPPO's sequence-level direction is the sign anchor sign(A^seq) (paper Eq. 21), so both
    # decide from it: `token_advantages` puts it in the record, the core hands it to the loss (trl_credit/core/anchors.py).
    sets_sequence_anchors = True

    # ------------------------------------------------------------------------------------------------ the credit
    def advantages(self, ctx: BatchContext, batch: RowBatch, inputs, output: dict):
        try:
            # GRPO's advantages are not used (OPPO's replace them), only what computing them reports: the warning
            # and `oppo/nonfinite_reward_rate` of groups with a ±inf reward, and TRL's completions table
            self.outcome.advantages(ctx, batch, inputs, output)
            advantages, _ = self.token_advantages(ctx, batch, inputs, output)
        finally:
            ctx.scratch(self)["generation_logps"] = None  # this batch's generation record is used once
        return advantages

    def _group_statistics(self, ctx: BatchContext, batch: RowBatch):
        """Per global row: sign(A^seq) (from the rewards, ties exact; 0 for rows of no group); per global group (the
        record's ``group_ids``, any layout): k (correct completions, by the verifier) and the number of scorable
        completions G."""
        rewards_per_func, scorable, correct = batch.rewards_per_func, batch.scorable, batch.success
        anchor_signs = sequence_anchor_signs(
            rewards_per_func,
            ctx.reward_weights,
            batch.group_ids,
            ctx.success_index,
            ctx.args.multi_objective_aggregation,
        )
        num_correct, num_scorable = group_success_counts(correct, scorable, batch.group_ids)
        # Global rows, so every process logs the same rate: k / G of the whole batch.
        num_scorable_rows = int(scorable.sum())
        ctx.metric("oppo/success_rate", int(correct.sum()) / num_scorable_rows if num_scorable_rows else 0.0)
        verifier_scored = ~torch.isnan(rewards_per_func[:, ctx.success_index])
        if num_scorable_rows and not bool(verifier_scored.any()):
            name = ctx.success_reward_name
            ctx.warn(
                "oppo_verifier_none",
                f"{ctx.speaker(self)}: the `success_reward` function ({name!r}) returned None for every "
                "completion other reward "
                "functions scored, so no completion counts as correct and the prior is k = 0 in every group. Set "
                "`success_reward` to your verifier (its name or index in `reward_funcs`). `oppo/success_rate` logs "
                "k/G.",
            )
        return anchor_signs, num_correct, num_scorable

    def _existing_plain_logps(self, ctx: BatchContext, batch: RowBatch, output) -> torch.Tensor | None:
        """s_t (B, T) from what this step already computed, or None (then the extra pass scores the plain rows). Like
        o_t, s_t must come from a float32 LM head (docs/oppo.md#evidence)."""
        args, sampling = ctx.args, ctx.sampling
        if args.oracle != "self" or args.plain_logps == "recompute":
            return None
        reduced = reduced_precision(ctx)
        old_logps = output.get("old_per_token_logps")
        # TRL's own pass: exactly s_t (trl<1.15's cast_lm_head_to_fp32 head still runs under autocast)
        if old_logps is not None and ((args.cast_lm_head_to_fp32 and HAS_FUSED_LM_HEAD) or not reduced):
            return old_logps
        completion_ids = batch.completion_ids
        recorded = ctx.scratch(self).get("generation_logps")
        if recorded is not None and len(recorded) == completion_ids.size(0):
            table = torch.zeros(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
            for row, values in enumerate(recorded):
                if len(values) > completion_ids.size(1):
                    return None
                table[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
            return table
        sampled = output.get("sampling_per_token_logps")
        plain_sampling = (
            not reduced  # vLLM's log-probs come from its own (serving dtype) head
            and sampling.use_vllm
            and (sampling.top_p is None or sampling.top_p >= 1.0)
            and (sampling.top_k is None or sampling.top_k <= 0)
            and not sampling.min_p
            and (sampling.repetition_penalty is None or sampling.repetition_penalty == 1.0)
        )
        if sampled is not None and plain_sampling and not torch.isnan(sampled[batch.completion_mask.bool()]).any():
            return sampled  # vLLM's log-probs of the sampled tokens under temperature-only sampling
        return None

    @staticmethod
    def _batch_answers(ctx: BatchContext, inputs) -> list:
        column = ctx.args.answer_column
        answers = []
        for row, x in enumerate(inputs):
            answer = x.get(column) if isinstance(x, dict) else None
            problem = answer_problem(answer) if isinstance(x, dict) and column in x else "is missing"
            if problem is not None:
                where = f"row {row} of this process's batch (step {ctx.step})"
                refuse_answer(column, where, answer, problem, ctx.speaker("oppo"), type(ctx.args).__name__)
            answers.append(answer)
        return answers

    def token_advantages(self, ctx: BatchContext, batch: RowBatch, inputs, output) -> tuple[torch.Tensor, torch.Tensor]:
        """OPPO's normalized advantages Ã (B, T) of this process's rows and their anchors sign(A^seq) (B,)."""
        args = ctx.args
        device = batch.completion_ids.device
        completion_mask = batch.completion_mask
        answers = self._batch_answers(ctx, inputs)  # fail before any scoring pass

        # Each local row's group, and whether it is in one (a row of no group gets advantage 0).
        group_ids = batch.local_rows(batch.group_ids).to(device)
        row_in_group = group_ids != NO_GROUP
        group_index = group_ids.clamp(min=0)  # a valid index for rows of no group; their credit is masked out
        statistics = self._group_statistics(ctx, batch)
        # Each row's sequence direction, for the modifiers that act per row (Cue-GRPO's positive set, which scales
        # the positive part of a row's credit).
        batch.sequence_signs = statistics[0].cpu()
        # ... and the anchors of TRL's per-sequence decisions in the loss (0 for rows of no group, as seq_advantages)
        batch.sequence_anchors = batch.sequence_signs.masked_fill(batch.group_ids == NO_GROUP, 0.0)
        anchor_signs, num_correct, num_scorable = (t.to(device) for t in statistics)
        row_scorable = batch.local_rows(batch.scorable).to(device)
        row_credited = row_scorable & row_in_group
        # Only sign(A^seq) enters Eq. 21, and it is taken from the rewards rather than from TRL's float32 advantage:
        # a row tying its group's mean (or in a zero-variance group, or unscorable) gets exactly 0, not ±1e-7.
        seq_advantages = batch.local_rows(anchor_signs).masked_fill(~row_in_group, 0.0).to(output["advantages"].dtype)
        if num_correct.numel() == 0:
            # No row of the whole batch (every process: the statistics are global) is in a group, e.g. SRPO's resets
            # with no base group when every reset group falls back (no incorrect seed; the rollout warns and logs
            # srpo/fallback_rate). Nothing to credit: every row gets 0 like any row of no group, and no extra pass.
            return torch.zeros(completion_mask.shape, dtype=output["advantages"].dtype, device=device), seq_advantages
        # Tokens that carry OPPO credit: the completion's tokens of scorable rows in a group. Other rows keep TRL's
        # loss mask but get advantage 0 and stay out of the group's token moments. The recursion runs over the whole
        # completion (the oracle scores all of it), but TRL trains only the tokens of the record's loss mask (SRPO: not
        # a suffix row's shared prefix), so the group moments are taken over those: Ã is normalized where it is trained.
        # Tool results and environment tokens (batch.model_mask 0) are not the model's actions: the oracle pass reads
        # them (they stay in both contexts), but they carry no evidence, so the value is carried across them unchanged,
        # and get no advantage (docs/multiturn.md#oppo: l_{t+1} = l_t + m_t log lambda_t).
        credit_mask = (completion_mask * batch.model_mask.to(completion_mask.dtype)
                       * row_credited.unsqueeze(1).to(completion_mask.dtype))
        trained_mask = batch.loss_mask * row_credited.unsqueeze(1).to(batch.loss_mask.dtype)

        # Oracle prompts x ⊕ y*, tokenized by TRL itself (processing_class + chat template + chat_template_kwargs),
        # from the prompts the completions were generated from (a rollout that rewrites them says so in the record).
        prompts = batch.prompts
        if len(prompts) != len(inputs):
            raise RuntimeError(f"{ctx.speaker(self)}: the record holds {len(prompts)} rollout prompts for "
                               f"{len(inputs)} rows.")
        oracle_prompts = build_oracle_prompts(prompts, answers, args.oracle_template)
        oracle_prompt_ids, _, _ = ctx.tokenize(oracle_prompts)

        student_logps = self._existing_plain_logps(ctx, batch, output)
        extra_pass_rows = 1.0 if student_logps is not None else 2.0
        if student_logps is None and records_generation_logps(ctx):
            ctx.warn(
                "oppo_plain_logps",
                f"{ctx.speaker(self)} could not take the plain log-probs s_t from the generation (its record did "
                "not line up with "
                "the completions, e.g. beam search or a custom generate, or under bf16/fp16 the LM head could not "
                "run in float32, e.g. with a LoRA adapter on it), so its extra pass also scores the B plain rows "
                "(2B rows, ~2x the cost). `oppo/extra_pass_rows` logs 2 on such steps.",
            )
        scorer = ctx.policy if args.oracle == "self" else self.teacher_model
        train = ctx.mode == "train"
        batch_size = args.per_device_train_batch_size if train else args.per_device_eval_batch_size
        # float32 LM head for o_t (and s_t when scored here); the teacher's head is float32 from loading
        with float32_head(ctx.causal_lm) if args.oracle == "self" else contextlib.nullcontext():
            oracle_logps, student_logps = score_evidence(
                ctx,
                scorer,
                oracle_prompt_ids,
                batch.prompt_ids,
                batch.prompt_mask,
                batch.completion_ids,
                completion_mask,
                student_logps=student_logps,
                batch_size=batch_size,
            )
        # Rows the extra pass scored, per row of the batch: 1 (the paper's one extra pass) or 2 (plain rows too).
        ctx.metric("oppo/extra_pass_rows", extra_pass_rows)

        credit = bayesian_value_recursion(
            oracle_logps,
            student_logps,
            credit_mask,
            seq_advantages,
            num_correct[group_index],
            num_scorable[group_index],
            args.evidence_clip,
            args.prior_strength,
            anchoring=args.direction_anchoring,
            state_tracking=args.state_tracking,
            clipping=args.evidence_clipping,
            use_prior=args.use_prior,
            log_lambda_only=args.log_lambda_only,
        )

        # Group normalization over the valid tokens of the whole group, which may live on several processes: the
        # gathered per-row moments are the global rows in TRL's order, those of rows in no group left out.
        row_moments = row_token_moments(credit.advantages, trained_mask)
        all_row_moments = ctx.gather(row_moments)
        moments = group_moments(all_row_moments, batch.group_ids.to(device), num_correct.numel())
        advantages = normalize_with_group_moments(
            credit.advantages, credit_mask, group_ids, moments, eps=args.advantage_eps
        )
        self._log_metrics(ctx, credit, advantages, trained_mask, row_scorable, row_credited)
        self._log_evidence_ranking(ctx, batch, (credit.log_lambda * credit_mask).sum(dim=1))
        return advantages.to(output["advantages"].dtype), seq_advantages

    def _log_evidence_ranking(self, ctx: BatchContext, batch: RowBatch, evidence_totals: torch.Tensor) -> None:
        """``oppo/evidence_auc``: how often a correct completion's total evidence beats an incorrect one's of the same
        prompt (0.5: the scorer ignores the answer; docs/oppo.md#metrics). Logged on steps with such a pair; warned
        once when, over training's first ``EVIDENCE_AUC_WARN_PAIRS`` pairs or more, it is no better than chance."""
        totals = ctx.gather(evidence_totals.to(torch.float64))  # the global rows, in TRL's order
        wins, pairs = evidence_ranking(totals, batch.success, batch.scorable, batch.group_ids)
        if not pairs:
            return
        ctx.metric("oppo/evidence_auc", wins / pairs)
        if ctx.mode != "train":
            return
        seen = self.evidence_ranking_seen
        seen[0], seen[1] = seen[0] + wins, seen[1] + pairs
        if seen[1] >= EVIDENCE_AUC_WARN_PAIRS and seen[0] / seen[1] <= 0.5:
            ctx.warn(
                "oppo_evidence_auc",
                f"{ctx.speaker(self)}: the oracle's evidence ranks a correct completion above an incorrect one of the "
                f"same prompt in {seen[0] / seen[1]:.2f} of {seen[1]} pairs (0.5 is chance): the scorer does not read "
                f"the answer that `oracle_template` appends ({ctx.args.oracle_template!r}), so OPPO's per-token credit "
                "is noise around GRPO's direction. Try oracle='teacher' with a model that reads it, or a template in "
                "the words the model was trained on. `oppo/evidence_auc` logs it every step.",
            )

    @staticmethod
    def _log_metrics(ctx: BatchContext, credit, advantages, credit_mask, scorable, credited) -> None:
        mask = credit_mask.to(torch.float64)
        local = torch.stack(
            [
                (credit.values.to(torch.float64) * mask).sum(),
                mask.sum(),
                (credit.evidence_clipped.to(torch.float64) * mask).sum(),
                (advantages.abs().to(torch.float64) * mask).sum(),
                (credit.prior_values.to(torch.float64) * credited.to(torch.float64)).sum(),
                credited.to(torch.float64).sum(),
                (~scorable).to(torch.float64).sum(),
                torch.tensor(float(scorable.numel()), dtype=torch.float64, device=mask.device),
            ]
        )
        gathered = ctx.gather(local).view(-1, 8).sum(0).tolist()
        value_sum, tokens, clipped, abs_sum, prior_sum, credited_rows, unscorable, rows = gathered
        tokens = max(tokens, 1.0)
        ctx.metric("oppo/value_mean", value_sum / tokens)
        ctx.metric("oppo/evidence_clip_rate", clipped / tokens)
        ctx.metric("oppo/advantage_abs_mean", abs_sum / tokens)
        ctx.metric("oppo/prior_value_mean", prior_sum / max(credited_rows, 1.0))
        ctx.metric("oppo/unscorable_rate", unscorable / max(rows, 1.0))
