"""CreditConfig (issue 22): one config whose fields are the union of the parts' fields, the parts chosen by
``rollout``, ``credit`` and ``modifiers``, validated together; from Python, the command line and a YAML recipe."""

from dataclasses import MISSING, fields

import pytest
from transformers import HfArgumentParser
from trl import GRPOConfig, TrlParser

import trl_credit
from trl_credit import CreditConfig, CueGRPOConfig, DATPOConfig, OPPOConfig, SRPOConfig
from trl_credit.cue_grpo.config import CueGRPOFields
from trl_credit.datpo.config import DATPOFields
from trl_credit.oppo.config import OPPOFields
from trl_credit.prime.config import PrimeFields
from trl_credit.process.config import ProcessFields
from trl_credit.srpo.config import SRPOFields

SHARED = {"success_reward", "success_threshold", "log_credit_rows"}
METHOD_CONFIGS = [CueGRPOConfig, OPPOConfig, DATPOConfig, SRPOConfig]
# Each part's fields and the selection that turns them on (issue 22).
PARTS = [
    (CueGRPOConfig, CueGRPOFields, {"modifiers": ["cue"]}, "the 'cue' modifier, which is not in modifiers="),
    (OPPOConfig, OPPOFields, {"credit": "oppo"}, "the 'oppo' credit, but credit="),
    (DATPOConfig, DATPOFields, {"rollout": "trees", "credit": "blocks"}, "the 'trees' rollout, but rollout="),
    (SRPOConfig, SRPOFields, {"rollout": "resets"}, "the 'resets' rollout, but rollout="),
]


def _config(**kwargs):
    return CreditConfig("my_run", use_cpu=True, **kwargs)


def _default(f):
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _own_fields(config_class):
    """The fields a config adds to GRPOConfig and the shared mixins."""
    grpo = {f.name for f in fields(GRPOConfig)}
    return {f.name: f for f in fields(config_class) if f.name not in grpo | SHARED}


def test_the_union_holds_every_method_field_with_its_default_and_help():
    union = _own_fields(CreditConfig)
    expected = {"rollout", "credit", "modifiers"}
    for config_class, mixin, _, _ in PARTS:
        method = _own_fields(config_class)
        assert set(method) == {f.name for f in fields(mixin)}  # the mixin holds all of the method's own fields
        expected |= set(method)
        for name, f in method.items():
            assert (str(union[name].type), _default(union[name]), union[name].metadata) == (
                str(f.type), _default(f), f.metadata), name
    # Parts without a method config of their own (the process credits): the mixin's fields, as declared.
    expected |= {f.name for f in fields(ProcessFields)} | {f.name for f in fields(PrimeFields)}
    assert set(union) == expected
    assert {name: _default(union[name]) for name in ("rollout", "credit", "modifiers")} == {
        "rollout": "groups", "credit": "outcome", "modifiers": []}
    assert all(issubclass(CreditConfig, mixin)
               for mixin in (CueGRPOFields, OPPOFields, DATPOFields, SRPOFields, ProcessFields, PrimeFields))


def test_grpo_fields_keep_their_positions_and_defaults():
    grpo = [f.name for f in fields(GRPOConfig)]
    assert [f.name for f in fields(CreditConfig)][: len(grpo)] == grpo
    config = _config()
    assert config.output_dir == "my_run"
    assert (config.rollout, config.credit, config.modifiers) == ("groups", "outcome", [])
    assert (config.log_credit_rows, config.success_reward, config.success_threshold) == (0, None, 1.0)
    union = {f.name: f for f in fields(CreditConfig)}
    assert {f.name for f in fields(GRPOConfig) if _default(f) != _default(union[f.name])
            or f.metadata != union[f.name].metadata} == set()
    reference = GRPOConfig("my_run", use_cpu=True)
    values = {f.name: getattr(reference, f.name) for f in fields(GRPOConfig)}
    assert {name: getattr(config, name) for name in values} == values
    assert _config(success_reward="1").success_reward == 1  # SuccessArguments' validation ran
    assert trl_credit.CreditConfig is CreditConfig and "CreditConfig" in trl_credit.__all__


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rollout": "beams"}, r"rollout='beams'; accepted: 'groups' .*'resets' .*'trees'"),
        ({"credit": "ppo"}, r"credit='ppo'; accepted: 'outcome' .*'blocks' .*'oppo' .*'process'"),
        ({"modifiers": ["rarity"]}, r"modifiers=\['rarity'\]: unknown 'rarity'; accepted: 'cue'"),
        ({"modifiers": ["cue", "cue"]}, r"modifiers=\['cue', 'cue'\] repeats \['cue'\]"),
        ({"modifiers": "cue"}, r"modifiers='cue'; accepted: a list of names"),
        ({"rollout": "trees"}, r"rollout='trees' with credit='outcome': rollout='trees' needs credit='blocks'"),
        ({"credit": "blocks"}, r"credit='blocks' with rollout='groups': credit='blocks' needs rollout='trees'"),
        ({"rollout": "resets", "credit": "blocks"}, r"credit='blocks' needs rollout='trees'"),
        ({"rollout": "trees", "credit": "oppo"}, r"rollout='trees' needs credit='blocks'"),
    ],
)
def test_a_bad_selection_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _config(**kwargs)


def _other_value(value):
    """A value different from a field's default (the refusal compares with the default before any type check)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return "not the default"


@pytest.mark.parametrize("config_class, mixin, selection, message", PARTS, ids=["cue", "oppo", "trees", "resets"])
def test_every_field_of_an_unselected_part_is_refused(config_class, mixin, selection, message):
    for f in fields(mixin):
        with pytest.raises(ValueError, match=rf"^{f.name} is a field of {message}"):
            _config(**{f.name: _other_value(_default(f))})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cue_alpha": 0.5}, r"cue_alpha is a field of the 'cue' modifier, which is not in modifiers=\[\]: add 'cue' "
                             r"to modifiers or leave cue_alpha at its default \(None\)"),
        ({"evidence_clip": 2.0, "modifiers": ["cue"]},
         r"evidence_clip is a field of the 'oppo' credit, but credit='outcome': set credit='oppo'"),
        ({"max_forks": 2, "rollout": "resets"}, r"max_forks is a field of the 'trees' rollout, but rollout='resets': "
                                                r"set rollout='trees'"),
        ({"reset": "random", "rollout": "trees", "credit": "blocks"},
         r"reset is a field of the 'resets' rollout, but rollout='trees': set rollout='resets'"),
    ],
)
def test_the_refusal_names_the_field_and_what_selects_its_part(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _config(**kwargs)


def test_a_selected_parts_fields_are_taken():
    config = _config(rollout="resets", credit="oppo", modifiers=("cue",), cue_alpha=0.5, evidence_clip=2.0,
                     reset="random", thought_delimiter="\\n")
    assert (config.modifiers, config.cue_alpha, config.evidence_clip, config.reset) == (["cue"], 0.5, 2.0, "random")
    assert config.thought_delimiter == "\n"  # SRPO's check turns a literal "\n" into a newline
    assert config.cue_resolved_alpha == 0.5  # the mixins' properties
    # SRPO fills the default split before GRPOConfig's post-init: half of G = 8 resampled
    assert (config.reset_groups, config.suffixes_per_reset, config.num_base_generations) == (1, 4, 4)
    trees = _config(rollout="trees", credit="blocks", max_forks=2)
    assert trees.max_forks == 2 and trees.reset_groups is None
    with pytest.raises(ValueError, match="num_base_generations is defined for rollout='resets' only"):
        trees.num_base_generations
    oppo = _config(credit="oppo", teacher_model_init_kwargs='{"dtype": "bfloat16"}')
    assert oppo.teacher_model_init_kwargs == {"dtype": "bfloat16"}  # OPPO's dict field parsed from JSON


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rollout": "resets", "reset": "never"}, r"reset must be 'self' \(SRPO\), 'random' \(RRPO\)"),
        ({"rollout": "resets", "num_generations": 5, "reset_groups": 2, "suffixes_per_reset": 2},
         r"num_generations \(5\) must equal reset_groups \* suffixes_per_reset"),
        ({"modifiers": ["cue"], "cue_partition": "kmeans"}, r"cue_partition='kmeans'; accepted"),
        ({"credit": "oppo", "oracle": "nobody"}, r"`oracle` must be one of"),
        ({"rollout": "trees", "credit": "blocks", "fork_method": "nowhere"}, r"`fork_method` must be one of"),
    ],
)
def test_the_selected_parts_checks_run(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _config(**kwargs)


@pytest.mark.parametrize(
    "selection, expected",
    [
        ({}, ["grpo"]),
        ({"rollout": "resets", "credit": "oppo", "modifiers": ["cue"]},
         ["srpo_fields", "grpo", "srpo_after_grpo", "oppo_after_grpo", "cue_grpo_after_grpo"]),
        ({"rollout": "trees", "credit": "blocks"}, ["grpo", "datpo_after_grpo"]),
    ],
)
def test_each_selected_check_runs_once_before_or_after_grpo_as_its_method_config(monkeypatch, selection, expected):
    calls = []

    def record(owner, name, label):
        original = getattr(owner, name)

        def wrapper(self):
            calls.append(label)
            return original(self)

        monkeypatch.setattr(owner, name, wrapper)

    record(GRPOConfig, "__post_init__", "grpo")
    record(SRPOFields, "_check_srpo_fields", "srpo_fields")
    for mixin, method in [(SRPOFields, "srpo"), (DATPOFields, "datpo"), (OPPOFields, "oppo"),
                          (CueGRPOFields, "cue_grpo")]:
        record(mixin, f"_check_{method}_after_grpo", f"{method}_after_grpo")
    _config(**selection)
    assert calls == expected


def test_command_line_selects_the_parts():
    parser = HfArgumentParser(CreditConfig)
    (config,) = parser.parse_args_into_dataclasses(
        ["--output_dir", "cli_run", "--use_cpu", "true", "--rollout", "resets", "--credit", "oppo", "--modifiers",
         "cue", "--cue_alpha", "0.5", "--reset", "random", "--success_reward", "1"]
    )
    assert (config.rollout, config.credit, config.modifiers) == ("resets", "oppo", ["cue"])
    assert (config.cue_alpha, config.reset, config.success_reward, config.suffixes_per_reset) == (0.5, "random", 1, 4)
    (plain,) = parser.parse_args_into_dataclasses(["--output_dir", "cli_run", "--use_cpu", "true"])
    assert (plain.rollout, plain.credit, plain.modifiers) == ("groups", "outcome", [])
    with pytest.raises(ValueError, match="cue_alpha is a field of the 'cue' modifier"):
        parser.parse_args_into_dataclasses(["--output_dir", "cli_run", "--use_cpu", "true", "--cue_alpha", "0.5"])
    with pytest.raises(SystemExit):  # argparse's choices: "invalid choice: 'rarity'"
        parser.parse_args_into_dataclasses(["--output_dir", "cli_run", "--modifiers", "rarity"])


def _yaml(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def test_a_yaml_recipe_selects_the_parts(tmp_path):
    recipe = _yaml(tmp_path, "output_dir: yaml_run\nuse_cpu: true\nrollout: resets\ncredit: oppo\n"
                             "modifiers: [cue]\ncue_alpha: 0.5\nevidence_clip: 2.0\n")
    (config,) = TrlParser((CreditConfig,)).parse_args_and_config(["--config", recipe])
    assert (config.output_dir, config.rollout, config.credit, config.modifiers) == ("yaml_run", "resets", "oppo", ["cue"])
    assert (config.cue_alpha, config.evidence_clip, config.reset_groups) == (0.5, 2.0, 1)
    # the command line overrides the recipe
    (config,) = TrlParser((CreditConfig,)).parse_args_and_config(
        ["--config", recipe, "--modifiers", "cue", "--cue_alpha", "0.25"])
    assert (config.modifiers, config.cue_alpha) == (["cue"], 0.25)
    # the scripts' parser (script arguments + config + model) takes it too
    from trl_credit.scripts import make_parser

    _, config, _ = make_parser(CreditConfig, argv=[]).parse_args_and_config(["--config", recipe])
    assert (config.rollout, config.credit, config.modifiers) == ("resets", "oppo", ["cue"])
    # a bare `modifiers: cue` is one string, not a list: refused with the YAML spelling
    bare = _yaml(tmp_path, "output_dir: yaml_run\nuse_cpu: true\nmodifiers: cue\n")
    with pytest.raises(ValueError, match=r"modifiers='cue'; accepted: a list .*YAML: modifiers: \[cue\]"):
        TrlParser((CreditConfig,)).parse_args_and_config(["--config", bare])
