"""SRPOTrainer: the credit core's preset for SRPO / RRPO (docs/srpo.md, paper §4, Algorithm 2): the reset-and-
resample rollouts (:class:`trl_credit.srpo.parts.Resets`, which says how they hook into TRL's GRPOTrainer) and the
group-normalized outcome within each sub-group (:class:`trl_credit.core.trainer.GroupOutcome` over the record's groups: base
group, each shared-prefix group; docs/srpo.md#advantages). Evaluation (``model.eval()``): plain iid generation from
the wrapped prompts and TRL's GRPO advantages.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from trl_credit.core.setup import grpo_arguments, resolve_method_args
from trl_credit.core.trainer import CreditTrainer, GroupOutcome
from trl_credit.srpo.config import SRPOConfig
from trl_credit.srpo.parts import Resets

__all__ = ["SRPOTrainer"]


class SRPOTrainer(CreditTrainer):
    """Self-Reset (``reset="self"``), Random-Reset (``reset="random"``) and oracle-reset (``reset="oracle"``)
    Policy Optimization on top of GRPOTrainer: :class:`~trl_credit.srpo.parts.Resets` rollouts (per prompt a base
    group, seeds, a reset per seed, suffixes from each reset state; paper §4.2, Algorithm 2) and
    :class:`~trl_credit.core.trainer.GroupOutcome` credit within each sub-group (paper §4.3).

    ``step_checker``: a callable ``(question, thoughts) -> int | None`` (the 1-indexed first wrong thought, None when
    none is wrong; ``question`` is the prompt's last user message before the rollout template wraps it) overriding
    ``SRPOConfig.step_checker``. Needed by ``reset="oracle"``; with any reset mode it adds the localization quality
    metrics. The ``srpo/`` metrics are listed in docs/srpo.md#metrics (srpo/step_metrics.py logs them).
    """

    _tag_names = ["trl", "srpo", "trl_credit"]  # + "rrpo" with reset="random" (__init__)
    _name = "SRPO"
    _paper = {
        "title": "Credit Assignment with Resets in Language Model Reasoning",
        "id": "2605.25507",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{samanta2026credit,
                title        = {{Credit Assignment with Resets in Language Model Reasoning}},
                author       = {Ankur Samanta and Akshayaa Magesh and Ayush Jain and Youliang Yu and Daniel Jiang and Kavosh Asadi and Kaveh Hassani and Paul Sajda and Jalaj Bhandari and Yonathan Efroni},
                year         = 2026,
                eprint       = {arXiv:2605.25507},
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: SRPOConfig | None = None,
        *pargs,
        step_checker: Callable[[str, list[str]], int | None] | None = None,
        **kwargs,
    ):
        args = resolve_method_args(args, SRPOConfig, model, "SRPOTrainer", "SRPO")
        environment = grpo_arguments(model, reward_funcs, args, pargs, kwargs).get("environment_factory")
        if reward_funcs is None and environment is None:  # an environment's get_reward may be the reward (TRL's)
            # TRL's wording, so scripts and tests that match it keep working.
            raise ValueError(
                "No reward source provided. Pass `reward_funcs`: SRPOTrainer's seeds are the rollouts the "
                "`success_reward` function scores as incorrect."
            )
        if args.reset == "random":
            # RRPO is the random-reset variant only: set before GRPOTrainer.__init__, which copies the tags onto the
            # model (add_model_tags), whence push_to_hub adds them to the card.
            self._tag_names = [*self._tag_names, "rrpo"]
        super().__init__(
            model, reward_funcs, args, *pargs,  # GRPOTrainer's other arguments, positional in its order or by name
            rollout=Resets(step_checker=step_checker), credit=GroupOutcome("srpo/nonfinite_reward_rate"), **kwargs,
        )

    # What tests and benchmarks read on the trainer, kept by the part.
    @property
    def _reset_rng(self):
        return self.rollout.rng

    @property
    def _step_checker(self):
        return self.rollout.step_checker

    @property
    def _rollout_template(self):
        return self.rollout.rollout_template
