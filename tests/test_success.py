"""Success = the verifier's raw reward >= threshold; unscorable = every reward function returned None."""

import math

import pytest
import torch

from trl_credit.core.success import resolve_success_index, success_rows, total_rewards, unscorable_rows

NAN = math.nan


def test_resolve_by_default_name_and_index():
    names = ["accuracy_reward", "format_reward"]
    assert resolve_success_index(None, names) == 0
    assert resolve_success_index("format_reward", names) == 1
    assert resolve_success_index(1, names) == 1


@pytest.mark.parametrize("bad", ["length_reward", 2, -1])
def test_resolve_refuses_unknown_with_the_accepted_names(bad):
    with pytest.raises(ValueError, match="success_reward") as error:
        resolve_success_index(bad, ["accuracy_reward", "format_reward"])
    assert "accuracy_reward" in str(error.value)


def test_resolve_refuses_ambiguous_name():
    with pytest.raises(ValueError, match=r"pass its index \(\[0, 1\]\)"):
        resolve_success_index("r", ["r", "r"])


def test_wrong_but_formatted_is_not_a_success():
    # columns: accuracy (0/1), format (0/1). Row 1: wrong answer, good format -> total 1.0 but not correct.
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [NAN, 1.0], [NAN, NAN], [1.0, NAN]])
    assert success_rows(rewards, 0, 1.0).tolist() == [True, False, False, False, True]
    assert success_rows(rewards, 1, 1.0).tolist() == [True, True, True, False, False]
    assert unscorable_rows(rewards).tolist() == [False, False, False, True, False]
    totals = total_rewards(rewards, torch.tensor([1.0, 0.5]))
    assert totals[:3].tolist() == [1.5, 0.5, 0.5] and math.isnan(totals[3]) and totals[4].item() == 1.0


@pytest.mark.parametrize("config_name", ["CueGRPOConfig", "OPPOConfig", "DATPOConfig", "SRPOConfig"])
def test_every_config_has_success_fields_validated(config_name):
    import trl_credit

    config_class = getattr(trl_credit, config_name)
    config = config_class(output_dir="/tmp/unused", bf16=False, success_reward="3")
    assert config.success_reward == 3 and config.success_threshold == 1.0
    with pytest.raises(ValueError, match="success_reward"):
        config_class(output_dir="/tmp/unused", bf16=False, success_reward=0.5)
    with pytest.raises(ValueError, match="success_threshold"):
        config_class(output_dir="/tmp/unused", bf16=False, success_threshold=float("nan"))
