"""Trainer mixins every method trainer carries (through :class:`trl_credit.model_card.MethodModelCardMixin`), and
the pieces the credit core calls inside its TRL overrides (:class:`RolloutCapture`,
:func:`checking_empty_completions`: a clear error instead of TRL's IndexError on an empty (0-token) completion):

- :class:`MethodRNGStateMixin`: random state a method owns is checkpointed with the Trainer's own generators.
- :class:`CPUMemoryMixin`: on the CPU, TRL's fused log-prob head in small tiles and large buffers returned to the
  OS when freed (docs/design.md#memory-on-the-cpu).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import platform
from collections.abc import Iterator, Sequence

import torch

from trl_credit.core.logs import warn_once
from trl_credit.core.setup import speaker
from trl_credit.trl_bridge.compat import small_logprob_tiles

__all__ = [
    "RolloutCapture",
    "MethodRNGStateMixin",
    "checking_empty_completions",
    "refuse_empty_completions",
    "refuse_empty_rows",
    "CPUMemoryMixin",
    "return_freed_buffers",
]


@dataclasses.dataclass
class RolloutCapture:
    """TRL's outputs for one generation batch, as TRL computed them (no copy)."""

    generated: tuple | None = None
    """What ``GRPOTrainer._generate`` returned: ``(prompt_ids, completion_ids, tool_mask, completions, ...)`` of this
    process's rows (trl 1.16.0)."""
    generated_prompts: list | None = None
    """The prompts ``GRPOTrainer._generate`` generated from (this process's rows): the dataset's, or with an
    ``environment_factory`` each with its environment's ``reset()`` observation appended to the last message."""
    rewards_per_func: torch.Tensor | None = None
    """What ``GRPOTrainer._calculate_rewards`` returned: (rows of all processes in process order, reward funcs)."""
    trl_output: dict | None = None
    """TRL's batch dict of this process's rows, as ``GRPOTrainer._generate_and_score_completions`` returned it to the
    rollout (the core's ``_trl_generate_and_score_completions``; the dict itself, which the core later writes)."""
    trl_advantages: torch.Tensor | None = None
    """A copy of ``trl_output["advantages"]`` taken when TRL returned it, before any part acted (a copy: the core
    replaces the dict's entry with the parts' advantages)."""
    trl_global_advantages: torch.Tensor | None = None
    """TRL's advantages of every row (all processes, in process order), before TRL cut them to this process's rows
    (the core's ``trl_global_advantages``: TRL's values bit for bit); None when the rewards were not captured."""

    def rewards(self, trainer_name: str) -> torch.Tensor:
        if self.rewards_per_func is None:
            raise RuntimeError(f"{trainer_name}: the rewards of this batch were not captured from `_calculate_rewards` "
                               "(did a subclass bypass it?).")
        return self.rewards_per_func


class MethodRNGStateMixin:
    """Trainer mixin: random state a method owns is checkpointed and restored with the Trainer's own generators.

    transformers' ``Trainer`` saves python/numpy/torch generator states per process in each checkpoint (private
    ``_save_rng_state``) and restores them when training resumes at the step it stopped (``_load_rng_state``). A
    trainer with more state that decides its draws (SRPO's reset generator, Cue-GRPO's round counter that seeds the
    random partition) returns it as a JSON-able dict from ``_method_rng_state`` and takes it back in
    ``_set_method_rng_state``. It is written to ``trl_credit_rng_state_{process_index}.json`` next to the Trainer's
    file and read at the same moment, so a resumed run repeats the draws of a run that never stopped.
    """

    def _method_rng_state(self) -> dict:
        return {}

    def _set_method_rng_state(self, state: dict) -> None:
        pass

    def _method_rng_file(self, folder: str) -> str:
        return os.path.join(folder, f"trl_credit_rng_state_{self.args.process_index}.json")

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        state = self._method_rng_state()
        if state:
            with open(self._method_rng_file(output_dir), "w", encoding="utf-8") as f:
                json.dump(state, f)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is None or not self._method_rng_state():
            return
        path = self._method_rng_file(checkpoint)
        if not os.path.isfile(path):
            warn_once(
                self,
                "method_rng_state",
                f"{type(self).__name__}: the checkpoint has no {os.path.basename(path)} (saved by an older trl_credit "
                "or with fewer processes): the method's random state starts afresh, so the resumed run does not "
                "repeat the draws of an uninterrupted one.",
            )
            return
        with open(path, encoding="utf-8") as f:
            self._set_method_rng_state(json.load(f))


def refuse_empty_completions(trainer, completion_ids: Sequence[Sequence[int]], source: str, part=None) -> None:
    """Raise a clear error for completions of 0 tokens, which TRL 1.16's GRPOTrainer cannot train on: its
    ``_generate`` reads the last token of every completion (an IndexError on an empty one). ``part``: the part whose
    generation it was, named in a composed trainer (``trainer_setup.speaker``)."""
    refuse_empty_rows(speaker(trainer, part), completion_ids, source)


def refuse_empty_rows(who: str, completion_ids: Sequence[Sequence[int]], source: str) -> None:
    """:func:`refuse_empty_completions`' check and error, speaking as ``who`` (``BatchContext.speaker``)."""
    empty = [row for row, ids in enumerate(completion_ids) if len(ids) == 0]
    if empty:
        raise ValueError(
            f"{who}: {source} returned an empty completion (0 tokens) for {len(empty)} of "
            f"{len(completion_ids)} rows (first: row {empty[0]}). GRPOTrainer cannot train on one either (TRL reads "
            "each completion's last token). HF generate, continuous batching and vLLM return the EOS token when the "
            "model stops at once; a custom generation or rollout_func must return it too."
        )


@contextlib.contextmanager
def checking_empty_completions(trainer) -> Iterator[None]:
    """While TRL's ``_generate`` runs (the core's override enters this around it): the completions it receives are
    checked by :func:`refuse_empty_completions` before TRL reads them, those of a ``rollout_func`` and of
    ``_generate_single_turn`` alike. The generation is wrapped where TRL calls it, on the instance, around whatever
    ``trainer._generate_single_turn`` is (the core's override, a subclass's override of it, or a function the user set
    on the instance), so a completion emptied above the core is refused too. Generation calls made through
    :func:`~trl_credit.core.generation.generate_from_prefixes` inside it (SRPO's seeds, localization, suffixes) are
    not: a method handles those itself."""
    had_own_rollout = "rollout_func" in trainer.__dict__
    had_own_generate = "_generate_single_turn" in trainer.__dict__
    rollout_func, generate = trainer.rollout_func, trainer._generate_single_turn

    def checked_rollout_func(prompts, trainer_):
        output = rollout_func(prompts, trainer_)
        refuse_empty_completions(trainer, output["completion_ids"], "the rollout_func")
        return output

    def checked_generate(*args, **kwargs):
        completion_ids, logprobs = generate(*args, **kwargs)
        if not getattr(trainer, "_in_extra_generation", False):  # TRL's own rollout call, not a part's extra one
            refuse_empty_completions(trainer, completion_ids, "the generation (_generate_single_turn)")
        return completion_ids, logprobs

    if rollout_func is not None:
        trainer.rollout_func = checked_rollout_func
    trainer._generate_single_turn = checked_generate
    try:
        yield
    finally:
        if had_own_generate:
            trainer._generate_single_turn = generate
        else:
            del trainer._generate_single_turn
        if had_own_rollout:
            trainer.rollout_func = rollout_func
        else:
            trainer.__dict__.pop("rollout_func", None)


# glibc's M_MMAP_THRESHOLD (malloc.h); see `return_freed_buffers`.
_M_MMAP_THRESHOLD = -3
_CPU_MMAP_THRESHOLD = 128 * 1024


_chosen_mmap_threshold: int | None = None  # the threshold this process set (the first call's), None: not set yet


def return_freed_buffers(threshold: int | None = None) -> bool:
    """glibc only (Linux): allocations of ``threshold`` bytes (default 128 KiB) and more get their own memory mapping,
    returned to the OS as soon as they are freed. Returns whether the setting is in force.

    By default glibc raises that threshold as large blocks are freed (up to 32 MB), so the activations of a CPU
    forward/backward (tens of MB each, freed and reallocated in different sizes around the tensors autograd keeps)
    come from the heap, which fragments and never shrinks: in the README's SRPO job the process held ~2.9 GB after a
    forward that kept 0.3 GB. Not free: each such buffer is then a fresh, page-faulted mapping (the README's job took
    ~1.1x the time, ``benchmarks/cost/cpu_memory.py``). A process-wide setting, made once: the first call's threshold is
    kept (a benchmark may choose its own before building trainers); left alone when the user set
    ``MALLOC_MMAP_THRESHOLD_`` (any value: glibc applies it at start-up) or the C library is not glibc.
    """
    global _chosen_mmap_threshold
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if _chosen_mmap_threshold is not None:
        return True
    threshold = threshold or _CPU_MMAP_THRESHOLD
    try:
        made = bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False
    if made:
        _chosen_mmap_threshold = threshold
    return made


class CPUMemoryMixin:
    """Trainer mixin: training on the CPU, large buffers go back to the OS when freed (:func:`return_freed_buffers`)
    and TRL's log-prob passes use small vocabulary tiles
    (:func:`trl_credit.trl_bridge.compat.small_logprob_tiles`, for the whole training step: generation-phase passes and the
    loss); both change no numbers. With them the README's SRPO job peaks at about a third of the memory
    (docs/design.md#memory-on-the-cpu)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.accelerator.device.type == "cpu":
            return_freed_buffers()

    def training_step(self, model, inputs, num_items_in_batch):
        with small_logprob_tiles(self.accelerator.device):
            return super().training_step(model, inputs, num_items_in_batch)
