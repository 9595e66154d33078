"""CueGRPOConfig defaults (paper) and validation errors."""

import pytest

from trl_credit import CueGRPOConfig


def _config(tmp_path, **kwargs):
    return CueGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)


def test_paper_defaults(tmp_path):
    config = _config(tmp_path)
    assert (config.cue_partition, config.cue_weighting) == ("cue", "cr")
    assert (config.cue_epsilon, config.cue_rho, config.cue_tau) == (0.5, 0.75, 1.05)
    assert (config.cue_gamma_min, config.cue_gamma_max, config.cue_judge_max_new_tokens) == (0.3, 3.0, 512)
    assert (config.cue_judge_head_chars, config.cue_judge_tail_chars) == (200, 500)
    assert config.cue_resolved_alpha == 0.8
    assert _config(tmp_path, cue_weighting="uarl").cue_resolved_alpha == 0.5
    assert _config(tmp_path, cue_weighting="uarl", cue_alpha=0.9).cue_resolved_alpha == 0.9


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cue_partition": "kmeans"}, "cue_partition='kmeans'; accepted"),
        ({"cue_weighting": "softmax"}, "cue_weighting='softmax'; accepted"),
        ({"cue_alpha": 1.5}, "cue_alpha=1.5"),
        ({"cue_epsilon": -0.1}, "cue_epsilon=-0.1"),
        ({"cue_rho": 2.0}, "cue_rho=2.0"),
        ({"cue_tau": 0.0}, "cue_tau=0.0"),
        ({"cue_gamma_min": 1.2}, "cue_gamma_min=1.2"),
        ({"cue_gamma_max": 0.9}, "cue_gamma_max=0.9"),
        ({"cue_judge_completions": "some"}, "cue_judge_completions='some'"),
        ({"cue_judge_max_new_tokens": 0}, "cue_judge_max_new_tokens=0"),
        ({"cue_judge_dtype": "int8"}, "cue_judge_dtype='int8'"),
    ],
)
def test_invalid_values_name_the_argument(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _config(tmp_path, **kwargs)


def test_normalize_then_sum_is_accepted():
    # A_i > 0 under TRL's normalize_then_sum still means "above its group" (per-group z-scores summed).
    from trl_credit import CueGRPOConfig

    config = CueGRPOConfig(output_dir="/tmp/x", multi_objective_aggregation="normalize_then_sum", use_cpu=True)
    assert config.multi_objective_aggregation == "normalize_then_sum"
