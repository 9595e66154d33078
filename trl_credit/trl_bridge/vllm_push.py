"""TRL's colocate weight push, where it cannot work: vLLM's CPU platform (a difference from TRL, docs/platforms.md).

TRL 1.14.2 to 1.16 push the policy to a colocated vLLM by calling the engine model's ``load_weights`` with one
``(name, tensor)`` at a time (``VLLMGeneration.sync_weights``). ``load_weights`` hands each tensor to its
parameter's ``weight_loader``. On vLLM's CPU platform the linear layers' weights are repacked for oneDNN after the
first load (``process_weights_after_loading``): the ``Parameter`` left in the module is an empty one without a
``weight_loader``, so TRL's first push dies with ``AttributeError: 'Parameter' object has no attribute
'weight_loader'`` (the plain ``GRPOTrainer`` too; tests/engines/test_vllm_colocate.py keeps a test that it still
does, so the fix is dropped when vLLM or TRL stop needing it).

vLLM's own ``model_runner.reload_weights(weights_iterator=...)`` restores the checkpoint-format parameters, loads the
given tensors through them, and repacks: :func:`reload_push` streams TRL's own ``_iter_named_params()`` (the same
names, the same ZeRO-3 gathers and PEFT merge as TRL's push) into it. :func:`fix_colocate_push` installs it on the
trainer's ``vllm_generation`` only where TRL's push cannot work (colocate mode on vLLM's CPU platform); everywhere
else TRL's push runs untouched.
"""

from __future__ import annotations

import logging
import types

__all__ = ["vllm_generation", "colocate_push_fails", "reload_push", "fix_colocate_push"]

logger = logging.getLogger(__name__)


def vllm_generation(trainer):
    """The trainer's ``VLLMGeneration`` (TRL's vLLM driver: server or colocate) when it generates with vLLM, else None
    (read duck-typed, so the generation modules and their tests need no TRL)."""
    return getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None


def _model_runner(vllm_generation):
    # The path TRL's own push reads (VLLMGeneration.sync_weights, colocate branch).
    return vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner


def colocate_push_fails(vllm_generation) -> bool:
    """Whether TRL's colocate push cannot load into this engine: colocate mode on vLLM's CPU platform, whose linear
    layers are repacked after loading (module docstring)."""
    if getattr(vllm_generation, "mode", None) != "colocate" or getattr(vllm_generation, "llm", None) is None:
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def reload_push(vllm_generation) -> None:
    """``VLLMGeneration.sync_weights`` for colocate mode, loading through vLLM's ``reload_weights``: the same wake-up
    (sleep mode), the same weights in the same order (``_iter_named_params``: gathered under ZeRO-3, PEFT adapters
    merged), the same prefix-cache reset afterwards."""
    if vllm_generation.enable_sleep_mode:
        vllm_generation.llm.wake_up(tags=["weights"])
        vllm_generation._llm_weights_sleeping = False
    _model_runner(vllm_generation).reload_weights(weights_iterator=vllm_generation._iter_named_params())
    vllm_generation.llm.reset_prefix_cache()


def fix_colocate_push(trainer) -> bool:
    """Replace ``trainer.vllm_generation.sync_weights`` (on the instance) by :func:`reload_push` where TRL's push
    cannot work (:func:`colocate_push_fails`); returns whether it did. Called once by the credit core after
    ``GRPOTrainer.__init__``; a plain ``GRPOTrainer`` can call it too."""
    engine = vllm_generation(trainer)
    if engine is None or not colocate_push_fails(engine):
        return False
    engine.sync_weights = types.MethodType(reload_push, engine)
    logger.info(
        "trl_credit: vLLM colocate on the CPU platform: the policy's weights reach vLLM through its reload_weights "
        "instead of TRL's load_weights push, which cannot load into repacked CPU layers (docs/platforms.md)."
    )
    return True
