"""The presets take TRL's signature: ``(model, reward_funcs=None, args=None, ...)`` with GRPOTrainer's positional
arguments in GRPOTrainer's order, the method's own arguments by keyword only, and a missing reward source refused as
GRPOTrainer refuses it."""

from __future__ import annotations

import inspect

import pytest
from trl import GRPOTrainer

import trl_credit
from trl_credit import CreditTrainer, CueGRPOTrainer, DATPOTrainer, OPPOTrainer, SRPOTrainer

PRESETS = [CueGRPOTrainer, OPPOTrainer, DATPOTrainer, SRPOTrainer, CreditTrainer]
GRPO = [p for name, p in inspect.signature(GRPOTrainer.__init__).parameters.items() if name != "self"]


@pytest.mark.parametrize("trainer_class", PRESETS, ids=lambda c: c.__name__)
def test_positional_parameters_are_grpo_trainers(trainer_class):
    parameters = [p for name, p in inspect.signature(trainer_class.__init__).parameters.items() if name != "self"]
    positional = [p for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    # GRPOTrainer's first parameters, same names, same defaults (reward_funcs and args optional as in TRL) ...
    assert [(p.name, p.default) for p in positional] == [(p.name, p.default) for p in GRPO[:len(positional)]]
    assert [p.name for p in positional[:3]] == ["model", "reward_funcs", "args"]
    assert positional[1].default is None and positional[2].default is None
    # ... then either the rest of GRPOTrainer's list or *pargs that takes it positionally; the method's own
    # arguments are keyword-only, so a positional GRPOTrainer argument can never land in one of them.
    rest = parameters[len(positional):]
    if rest and rest[0].kind is rest[0].VAR_POSITIONAL:
        rest = rest[1:]
    else:
        assert len(positional) == len(GRPO)
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in rest), rest


def test_a_grpo_argument_given_positionally_reaches_its_place(tiny_dataset, tmp_path):
    # environment_factory is GRPOTrainer's 14th argument: given positionally, SRPO reads it before loading a model
    # (it used to land in step_checker): an environment may own the reward, so without reward_funcs SRPO refuses
    # only when no environment is given, and with one it goes on to load the model (which does not exist).
    args = trl_credit.SRPOConfig(str(tmp_path), use_cpu=True)
    position = [p.name for p in GRPO].index("environment_factory")
    pargs = [None] * (position - 3)
    pargs[[p.name for p in GRPO].index("optimizers") - 3] = (None, None)
    pargs[0] = tiny_dataset

    class Environment:
        def reset(self, **kwargs):
            return None

    with pytest.raises(ValueError, match="No reward source provided"):
        SRPOTrainer("not/loaded", None, args, *pargs)
    with pytest.raises(OSError):  # offline: the model "not/loaded" is not found, past the reward-source check
        SRPOTrainer("not/loaded", None, args, *pargs, Environment)
    with pytest.raises(TypeError, match="unexpected keyword argument 'train_datasets'"):
        SRPOTrainer("not/loaded", lambda completions, **kw: [0.0] * len(completions), args, train_datasets=[])


@pytest.mark.parametrize("trainer_class", [OPPOTrainer, DATPOTrainer, CueGRPOTrainer, SRPOTrainer],
                         ids=lambda c: c.__name__)
def test_a_missing_reward_source_is_refused_as_grpo_trainer_does(trainer_class, tiny_model_path, tiny_dataset,
                                                                  tmp_path):
    config = getattr(trl_credit, trainer_class.__name__.replace("Trainer", "Config"))
    args = config(str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=8, num_generations=4)
    with pytest.raises(ValueError, match="No reward source provided. Pass `reward_funcs`"):
        trainer_class(tiny_model_path, args=args, train_dataset=tiny_dataset)
