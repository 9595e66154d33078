"""OPPOTrainer: GRPOTrainer with OPPO's token-level advantages (docs/oppo.md, paper §4). Checked against trl 1.16.0.

A preset of the credit core (:class:`~trl_credit.core.trainer.CreditTrainer`): GRPO's rollouts
(:class:`~trl_credit.core.trainer.GroupRollout`) and OPPO's credit (:class:`~trl_credit.oppo.parts.ValueRecursion`, whose
docstring says what changes relative to GRPOTrainer). This class only checks its arguments before any model is
loaded and picks those parts; it overrides no TRL method.
"""

from __future__ import annotations

import textwrap

from trl_credit.core.setup import resolve_method_args
from trl_credit.core.trainer import CreditTrainer, GroupRollout
from trl_credit.oppo.answers import check_answers, resolve_answer_column
from trl_credit.oppo.config import OPPOConfig
from trl_credit.oppo.parts import ValueRecursion
from trl_credit.trl_bridge.compat import require_trl

__all__ = ["OPPOTrainer"]


class OPPOTrainer(CreditTrainer):
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
        *pargs,
        teacher_model=None,
        teacher_processing_class=None,
        **kwargs,
    ):
        args = resolve_method_args(args, OPPOConfig, model, "OPPOTrainer", "OPPO")
        # Fail before loading any model.
        resolve_answer_column(args, train_dataset)
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

        # GRPOTrainer's other arguments, positional (in its order) or by name, go through unchanged.
        super().__init__(
            model,
            reward_funcs,
            args,
            train_dataset,
            eval_dataset,
            *pargs,
            rollout=GroupRollout(),
            credit=ValueRecursion(teacher, teacher_processing_class),
            **kwargs,
        )

    @property
    def teacher_model(self):
        """The frozen, prepared teacher of ``oracle="teacher"`` (None with the self-oracle)."""
        return self.credit.teacher_model
