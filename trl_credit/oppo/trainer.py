"""OPPOTrainer: GRPOTrainer with OPPO's token-level advantages (docs/oppo.md, paper §4). Checked against trl 1.16.0.

What changes relative to GRPOTrainer, and nothing else:
- The global reward matrix (all processes) of TRL's ``_calculate_rewards`` is kept while the batch is built
  (:class:`trl_credit.mixins.RolloutCaptureMixin`), from which each group's k
  (completions the verifier, ``success_reward``, calls correct), its number of scorable completions G and each
  row's anchoring sign sign(A^seq) come (from the rewards, so that a row tying its group's mean gets 0).
- Unscorable completions (every reward function returned None) get advantage exactly 0 on every token and are left
  out of the group's token statistics, as TRL leaves them out of its baseline.
- ``get_off_policy_mask`` / ``get_gamma_weights`` (``off_policy_mask_threshold``, ``loss_type="vespo"``) make their
  per-sequence decision from the sequence's sign anchor sign(A^seq) (carried to the loss as
  ``oppo_sequence_advantages``), not from the signs of the per-token advantages.
- ``_generate_and_score_completions`` is wrapped: after TRL's own version (generation, rewards, GRPO advantages,
  old/ref log-probs), this process's completions are scored under the oracle prompts (one batched no-grad pass of
  B rows with a float32 LM head: the plain log-probs s_t come from TRL's old log-probs, from the log-probs recorded
  during HF generation by the wrapped ``_generate_single_turn`` (head in float32 too), or from vLLM's sampler, each
  only when computed with a float32 head; only where none exists, or with ``plain_logps="recompute"`` or a teacher,
  are the B plain rows scored in the same pass), the recursion of
  :mod:`trl_credit.oppo.recursion` turns them into Â (B, T), Â is normalized per group over the valid tokens of all
  processes (per-row sums/sums of squares/counts are gathered), and the (B, T) tensor replaces
  ``output["advantages"]``. TRL's ``_compute_loss`` takes (B, T) advantages as they are, for every ``loss_type``.
- A teacher (``oracle="teacher"``) is loaded, frozen and prepared like TRL's reference model.
"""

from __future__ import annotations

import contextlib
import textwrap

import torch
from trl import GRPOTrainer

from trl_credit.collectives import local_rows
from trl_credit.generation_hooks import GenerationRecorder
from trl_credit.trainer_logs import log_metric, warn_once, zero_nonfinite_groups
from trl_credit.trainer_setup import bind_success, check_single_turn, resolve_method_args, rollout_success
from trl_credit.success import unscorable_rows
from trl_credit.trl_compat import (
    HAS_FUSED_LM_HEAD,
    create_model_from_path,
    disable_dropout_in_model,
    get_config_model_id,
    prepare_deepspeed,
    prepare_fsdp,
    require_trl,
)
from trl_credit.model_card import MethodModelCardMixin
from trl_credit.anchors import decided_per_sequence, loss_sequence_anchors
from trl_credit.oppo.answers import answer_problem, check_answers, refuse_answer
from trl_credit.oppo.config import OPPOConfig
from trl_credit.oppo.oracle import (
    add_float32_head,
    add_float32_teacher_head,
    build_oracle_prompts,
    float32_head,
    score_evidence,
)
from trl_credit.oppo.recursion import (
    bayesian_value_recursion,
    group_moments,
    group_success_counts,
    normalize_with_group_moments,
    row_token_moments,
    sequence_anchor_signs,
)

__all__ = ["OPPOTrainer"]



class OPPOTrainer(MethodModelCardMixin, GRPOTrainer):
    """[`~trl.GRPOTrainer`] whose advantages are OPPO's per-token advantages (B, T) (docs/oppo.md).

    Arguments are GRPOTrainer's, with ``args`` an [`OPPOConfig`], plus:
        teacher_model (`str` or `PreTrainedModel`, *optional*): the frozen scorer for ``oracle="teacher"``
            (overrides ``args.teacher_model_name_or_path``). It must use the policy's tokenizer.
        teacher_processing_class (*optional*): the teacher's tokenizer, compared with the policy's; by default it
            is loaded from the teacher's name or path.

    Refused at construction: a dataset without the answer column or with an answer that is None, empty, NaN or
    not a string/number (rows of iterable datasets: when their batch arrives), tools/rollout functions/environments
    (OPPO rescores TRL's single-turn completions), vision-language processors (the oracle pass carries no images), a
    teacher whose vocabulary differs from the policy's.
    """

    _tag_names = ["trl", "grpo", "oppo", "trl_credit"]
    _name = "OPPO"
    _paper = {
        "title": "OPPO: Bayesian Value Recursion for Token-Level Credit Assignment in LLM Reasoning",
        "id": "2605.21851",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{li2026oppo,
                title        = {{OPPO: Bayesian Value Recursion for Token-Level Credit Assignment in LLM Reasoning}},
                author       = {Yu Li and Rui Miao and Tian Lan and Zhengling Qi},
                year         = 2026,
                eprint       = {arXiv:2605.21851},
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: OPPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        teacher_model=None,
        teacher_processing_class=None,
        **kwargs,
    ):
        args = resolve_method_args(args, OPPOConfig, model, "OPPOTrainer", "OPPO")
        # Fail before loading any model.
        check_answers(train_dataset, args.answer_column, "train_dataset")
        check_answers(eval_dataset, args.answer_column, "eval_dataset")
        if args.use_liger_kernel:  # before 1.15 Liger computes log-probs from the head's weight, under autocast
            require_trl("1.15", "OPPOTrainer with use_liger_kernel=True (older TRL bypasses OPPO's float32 LM head)")
        teacher = teacher_model if teacher_model is not None else args.teacher_model_name_or_path
        if args.oracle == "teacher" and teacher is None:
            raise ValueError(
                "OPPOConfig(oracle='teacher') needs a teacher: pass `teacher_model=` (name or model) to OPPOTrainer "
                "or set `teacher_model_name_or_path`."
            )
        if args.oracle == "self" and teacher is not None:
            raise ValueError(
                "A `teacher_model` was given but OPPOConfig.oracle is 'self': set `oracle='teacher'` to score with it."
            )

        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            **kwargs,
        )
        check_single_turn(self, "OPPOTrainer")
        bind_success(self)
        if self._is_vlm:
            raise ValueError(
                "OPPOTrainer does not support vision-language processors: the oracle pass scores text prompts only."
            )
        # TRL 1.16's `use_liger_kernel` only swaps layer kernels (its fused loss is refused by GRPOTrainer); the loss is
        # still `_compute_loss`, which takes (B, T) advantages, so it needs no refusal here.
        self.teacher_model = None
        if args.oracle == "teacher":
            self.teacher_model = self._load_teacher(teacher, teacher_processing_class)
        else:  # the policy scores the evidence: its extra pass runs a float32 LM head (docs/oppo.md#evidence)
            add_float32_head(self._causal_lm(), self.temperature)

    # ------------------------------------------------------------------------------------------------ teacher
    def _load_teacher(self, teacher, teacher_processing_class):
        """Load (if a name), check the tokenizer, freeze and prepare the teacher like GRPOTrainer's ``ref_model``."""
        from transformers import AutoTokenizer

        args = self.args
        name = teacher if isinstance(teacher, str) else get_config_model_id(teacher.config)
        if teacher_processing_class is None:
            try:
                teacher_processing_class = AutoTokenizer.from_pretrained(name, trust_remote_code=args.trust_remote_code)
            except Exception as error:  # noqa: BLE001 - any loading failure means we cannot check the vocabulary
                raise ValueError(
                    f"OPPO could not load the teacher's tokenizer from {name!r} to check it matches the policy's "
                    f"({error}); pass `teacher_processing_class=` to OPPOTrainer."
                ) from error
        teacher_tokenizer = getattr(teacher_processing_class, "tokenizer", teacher_processing_class)
        student_vocab, teacher_vocab = self._tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
        if student_vocab != teacher_vocab:
            differing = sorted(set(student_vocab.items()) ^ set(teacher_vocab.items()))[:5]
            raise ValueError(
                f"OPPO's teacher must share the policy's tokenizer (it scores the policy's token ids), but the "
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
        if teacher_head is not None and teacher_head.weight.shape[0] <= largest_id:
            raise ValueError(
                f"OPPO's teacher has {teacher_head.weight.shape[0]} output rows but the tokenizer has ids up to "
                f"{largest_id}: it cannot score every token of the policy's vocabulary."
            )
        teacher.eval()
        teacher.requires_grad_(False)
        if args.disable_dropout:
            disable_dropout_in_model(teacher)
        # TRL's fused log-prob head (and temperature), so o_t and s_t come from `_get_per_token_logps_and_entropies` as
        # TRL's own log-probs do; in float32 (docs/oppo.md#evidence): the teacher only scores the evidence.
        add_float32_teacher_head(teacher, self.temperature)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(teacher, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(teacher, self.accelerator)
        return self.accelerator.prepare_model(teacher, evaluation_mode=True)

    # ------------------------------------------------------------------------------------------------ hooks
    def _causal_lm(self):
        """The causal LM whose forward TRL patched (the PEFT base model), which ``generate`` and the log-prob passes
        run."""
        model = self.accelerator.unwrap_model(self.model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    def _reduced_precision(self) -> bool:
        """Whether the policy's LM head computes below float32 unless OPPO makes it float32 (bf16/fp16 autocast or
        weights): then log-probs computed outside OPPO's float32 head cannot serve as s_t."""
        head = self._causal_lm().get_output_embeddings()
        reduced = (torch.bfloat16, torch.float16)
        return self.accelerator.mixed_precision in ("bf16", "fp16") or head.weight.dtype in reduced

    def _records_generation_logps(self) -> bool:
        return (
            self.args.oracle == "self"
            and self.args.plain_logps == "auto"
            and not self.use_vllm
            and not self.use_transformers_continuous_batching
        )

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation; with HF ``generate`` and the self-oracle, the plain log-probs s_t of the sampled tokens
        are recorded on the way (:class:`~trl_credit.generation_hooks.GenerationRecorder`), with the LM head in float32 like the
        extra pass's (so the tokens are sampled from float32 logits, as with TRL's ``cast_lm_head_to_fp32``)."""
        if not self._records_generation_logps():
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        recorder = GenerationRecorder(self.temperature, logps=True)
        with recorder.attached(self), float32_head(self._causal_lm()) as head_in_float32:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        # A head that could not run in float32 (e.g. with a LoRA adapter) under reduced precision: not s_t.
        usable = head_in_float32 or not self._reduced_precision()
        self._oppo_generation_logps = recorder.logps(completion_ids) if usable else None
        return completion_ids, logprobs

    def _generate_and_score_completions(self, inputs):
        self._oppo_generation_logps = None
        with self._capturing_rollouts() as rollouts:  # the global rewards, for k, G and sign(A^seq)
            output = super()._generate_and_score_completions(inputs)
            output["advantages"] = zero_nonfinite_groups(
                self, output["advantages"], rollouts.rewards("OPPOTrainer"), "oppo/nonfinite_reward_rate"
            )
            output["advantages"], output["oppo_sequence_advantages"] = self._oppo_advantages(inputs, output)
        self._log_credit(output)
        return output

    # Per-sequence decisions of TRL's loss. `off_policy_mask_threshold` keeps a sequence when its advantage is >= 0
    # (or its KL is small) and VESPO picks its gamma weighting by the advantage's sign, both meant per sequence. With
    # (B, T) advantages TRL would decide per token, and after the group normalization the tokens of one completion
    # can have both signs. OPPO's sequence-level direction is the sign anchor sign(A^seq) (paper Eq. 21), so both
    # decide from it: a completion the verifier ranks above its group's mean is kept / weighted as positive as a whole.
    # TRL declares both methods static, so they stay static with TRL's signatures; the anchors of the batch in the loss
    # reach them through `loss_sequence_anchors`.
    def _compute_loss(self, model, inputs):
        with loss_sequence_anchors(inputs.get("oppo_sequence_advantages")):
            return super()._compute_loss(model, inputs)

    get_off_policy_mask = decided_per_sequence("get_off_policy_mask")
    get_gamma_weights = decided_per_sequence("get_gamma_weights")

    # ------------------------------------------------------------------------------------------------ OPPO
    def _group_statistics(self, num_generations: int):
        """Per global row: scorable and sign(A^seq) (from the rewards, ties exact); per global group: k (correct
        completions, by the verifier) and the number of scorable completions G."""
        if self._rollout_capture is None:
            raise RuntimeError("OPPOTrainer: OPPO's advantages are computed while `_generate_and_score_completions` "
                               "builds the batch (inside its rollout capture).")
        rewards_per_func = self._rollout_capture.rewards("OPPOTrainer")  # global: every process's rows
        scorable = ~unscorable_rows(rewards_per_func)
        correct = rollout_success(self, rewards_per_func)
        num_correct, num_scorable = group_success_counts(correct, scorable, num_generations)
        anchor_signs = sequence_anchor_signs(
            rewards_per_func,
            self.reward_weights,
            num_generations,
            self._success_index,
            self.args.multi_objective_aggregation,
        )
        # Global rows, so every process logs the same rate: k / G of the whole batch.
        num_scorable_rows = int(scorable.sum())
        log_metric(self, "oppo/success_rate", int(correct.sum()) / num_scorable_rows if num_scorable_rows else 0.0)
        verifier_scored = ~torch.isnan(rewards_per_func[:, self._success_index])
        if num_scorable_rows and not bool(verifier_scored.any()):
            name = self.reward_func_names[self._success_index]
            warn_once(
                self,
                "oppo_verifier_none",
                f"OPPO's `success_reward` function ({name!r}) returned None for every completion other reward "
                "functions scored, so no completion counts as correct and the prior is k = 0 in every group. Set "
                "`success_reward` to your verifier (its name or index in `reward_funcs`). `oppo/success_rate` logs "
                "k/G.",
            )
        return scorable, num_correct, num_scorable, anchor_signs

    def _existing_plain_logps(self, output) -> torch.Tensor | None:
        """s_t (B, T) from what this step already computed, or None (then the extra pass scores the plain rows). Like
        o_t, s_t must come from a float32 LM head (docs/oppo.md#evidence)."""
        args = self.args
        if args.oracle != "self" or args.plain_logps == "recompute":
            return None
        reduced = self._reduced_precision()
        old_logps = output.get("old_per_token_logps")
        # TRL's own pass: exactly s_t (trl<1.15's cast_lm_head_to_fp32 head still runs under autocast)
        if old_logps is not None and ((args.cast_lm_head_to_fp32 and HAS_FUSED_LM_HEAD) or not reduced):
            return old_logps
        completion_ids = output["completion_ids"]
        recorded = self._oppo_generation_logps
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
            and self.use_vllm
            and (self.top_p is None or self.top_p >= 1.0)
            and (self.top_k is None or self.top_k <= 0)
            and not self.min_p
            and (self.repetition_penalty is None or self.repetition_penalty == 1.0)
        )
        if sampled is not None and plain_sampling and not torch.isnan(sampled[output["completion_mask"].bool()]).any():
            return sampled  # vLLM's log-probs of the sampled tokens under temperature-only sampling
        return None

    def _batch_answers(self, inputs) -> list:
        column = self.args.answer_column
        answers = []
        for row, x in enumerate(inputs):
            answer = x.get(column) if isinstance(x, dict) else None
            problem = answer_problem(answer) if isinstance(x, dict) and column in x else "is missing"
            if problem is not None:
                where = f"row {row} of this process's batch (step {self.state.global_step})"
                refuse_answer(column, where, answer, problem)
            answers.append(answer)
        return answers

    def _oppo_advantages(self, inputs, output) -> tuple[torch.Tensor, torch.Tensor]:
        args = self.args
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        device = output["completion_ids"].device
        num_rows = len(inputs)
        completion_mask = output["completion_mask"]
        answers = self._batch_answers(inputs)  # fail before any scoring pass

        # Each local row's global group, with TRL's layout: rows of all processes in process order, groups of
        # `num_generations` consecutive rows (a group may span processes).
        rows = local_rows(self, num_rows)
        group_ids = torch.arange(rows.start, rows.stop, device=device) // num_generations
        statistics = self._group_statistics(num_generations)
        scorable, num_correct, num_scorable, anchor_signs = (t.to(device) for t in statistics)
        row_scorable = scorable[rows]
        # Only sign(A^seq) enters Eq. 21, and it is taken from the rewards rather than from TRL's float32 advantage:
        # a row tying its group's mean (or in a zero-variance group, or unscorable) gets exactly 0, not ±1e-7.
        seq_advantages = anchor_signs[rows].to(output["advantages"].dtype)
        # Tokens that carry OPPO credit: the loss mask's tokens of scorable rows. Unscorable rows keep TRL's loss mask
        # but get advantage 0 and stay out of the group's token moments.
        credit_mask = completion_mask * row_scorable.unsqueeze(1).to(completion_mask.dtype)

        # Oracle prompts x ⊕ y*, tokenized by TRL itself (processing_class + chat template + chat_template_kwargs).
        prompts = [x["prompt"] for x in inputs]
        oracle_prompts = build_oracle_prompts(prompts, answers, args.oracle_template)
        oracle_prompt_ids, _, _ = self._tokenize_prompts(oracle_prompts)

        student_logps = self._existing_plain_logps(output)
        extra_pass_rows = 1.0 if student_logps is not None else 2.0
        if student_logps is None and self._records_generation_logps():
            warn_once(
                self,
                "oppo_plain_logps",
                "OPPO could not take the plain log-probs s_t from the generation (its record did not line up with "
                "the completions, e.g. beam search or a custom generate, or under bf16/fp16 the LM head could not "
                "run in float32, e.g. with a LoRA adapter on it), so its extra pass also scores the B plain rows "
                "(2B rows, ~2x the cost). `oppo/extra_pass_rows` logs 2 on such steps.",
            )
        scorer = self.model if args.oracle == "self" else self.teacher_model
        batch_size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        # float32 LM head for o_t (and s_t when scored here); the teacher's head is float32 from loading
        with float32_head(self._causal_lm()) if args.oracle == "self" else contextlib.nullcontext():
            oracle_logps, student_logps = score_evidence(
                self,
                scorer,
                oracle_prompt_ids,
                output["prompt_ids"],
                output["prompt_mask"],
                output["completion_ids"],
                completion_mask,
                student_logps=student_logps,
                batch_size=batch_size,
            )
        # Rows the extra pass scored, per row of the batch: 1 (the paper's one extra pass) or 2 (plain rows too).
        log_metric(self, "oppo/extra_pass_rows", extra_pass_rows)

        credit = bayesian_value_recursion(
            oracle_logps,
            student_logps,
            credit_mask,
            seq_advantages,
            num_correct[group_ids],
            num_scorable[group_ids],
            args.evidence_clip,
            args.prior_strength,
            anchoring=args.direction_anchoring,
            state_tracking=args.state_tracking,
            clipping=args.evidence_clipping,
            use_prior=args.use_prior,
            log_lambda_only=args.log_lambda_only,
        )

        # Group normalization over the valid tokens of the whole group, which may live on several processes.
        row_moments = row_token_moments(credit.advantages, credit_mask)
        all_row_moments = self.accelerator.gather(row_moments)
        all_group_ids = torch.arange(all_row_moments.size(0), device=device) // num_generations
        moments = group_moments(all_row_moments, all_group_ids)
        advantages = normalize_with_group_moments(
            credit.advantages, credit_mask, group_ids, moments, eps=args.advantage_eps
        )
        self._log_oppo_metrics(credit, advantages, credit_mask, row_scorable)
        return advantages.to(output["advantages"].dtype), seq_advantages

    def _log_oppo_metrics(self, credit, advantages: torch.Tensor, completion_mask: torch.Tensor, scorable) -> None:
        mask = completion_mask.to(torch.float64)
        local = torch.stack(
            [
                (credit.values.to(torch.float64) * mask).sum(),
                mask.sum(),
                (credit.evidence_clipped.to(torch.float64) * mask).sum(),
                (advantages.abs().to(torch.float64) * mask).sum(),
                (credit.prior_values.to(torch.float64) * scorable.to(torch.float64)).sum(),
                scorable.to(torch.float64).sum(),
                (~scorable).to(torch.float64).sum(),
                torch.tensor(float(scorable.numel()), dtype=torch.float64, device=mask.device),
            ]
        )
        gathered = self.accelerator.gather(local).view(-1, 8).sum(0).tolist()
        value_sum, tokens, clipped, abs_sum, prior_sum, scored_rows, unscorable, rows = gathered
        tokens = max(tokens, 1.0)
        log_metric(self, "oppo/value_mean", value_sum / tokens)
        log_metric(self, "oppo/evidence_clip_rate", clipped / tokens)
        log_metric(self, "oppo/advantage_abs_mean", abs_sum / tokens)
        log_metric(self, "oppo/prior_value_mean", prior_sum / max(scored_rows, 1.0))
        log_metric(self, "oppo/unscorable_rate", unscorable / max(rows, 1.0))
