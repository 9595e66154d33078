"""The installed TRL keeps every private name trl_credit relies on (the registry of trl_credit.trl_bridge.compat), and
trl_credit uses no private TRL name the registry does not list. No training: signatures, sources and one trainer
construction. Run it first against a new TRL release: a failure names the hook that moved."""

import ast
import dataclasses
import importlib
import inspect
import pathlib
import re
import textwrap

import pytest
import torch
import transformers
import trl
from packaging.version import Version
from trl import GRPOConfig, GRPOTrainer

import trl_credit
from trl_credit.trl_bridge import compat as trl_compat
from trl_credit.trl_bridge.compat import ATTRIBUTES, CALLED, CLASS_ATTRIBUTES, CONFIG_CLASS_ATTRIBUTES, CONFIG_FIELDS
from trl_credit.trl_bridge.compat import OVERRIDDEN, TRL_FUNCTIONS, TRL_GLOBALS, VLLM_ATTRIBUTES

pytestmark = pytest.mark.trl_smoke  # CI runs it on every supported TRL version

PACKAGE = pathlib.Path(trl_credit.__file__).parent
OWNERS = {"GRPOTrainer": GRPOTrainer, "Trainer": transformers.Trainer}
HOOKS = {**OVERRIDDEN, **CALLED}


def _static(owner, name) -> bool:
    for klass in owner.__mro__:
        if name in klass.__dict__:
            return isinstance(klass.__dict__[name], staticmethod)
    raise AttributeError(name)


def _params(function, static: bool) -> list[str]:
    names = list(inspect.signature(function).parameters)
    return names if static else names[1:]  # drop self


def _variadic(function) -> bool:
    kinds = {p.kind for p in inspect.signature(function).parameters.values()}
    return inspect.Parameter.VAR_POSITIONAL in kinds


def _return_arities(function) -> set:
    """Lengths of the tuples ``function``'s own ``return`` statements return (``None`` for a non-tuple)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    arities = set()

    def visit(node, top):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not top:
            return  # a nested function's returns are not the method's
        if isinstance(node, ast.Return):
            arities.add(len(node.value.elts) if isinstance(node.value, ast.Tuple) else None)
        for child in ast.iter_child_nodes(node):
            visit(child, False)

    visit(tree.body[0], True)
    return arities


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_exists_with_the_parameters_we_rely_on(name):
    hook = HOOKS[name]
    owner = OWNERS[hook.owner]
    assert hasattr(owner, name), f"{hook.owner}.{name} is gone (used by {hook.users})"
    function = getattr(owner, name)
    assert _static(owner, name) == hook.static, f"{hook.owner}.{name}: staticmethod changed"
    if _variadic(function):
        # trl 1.14.2's `_get_per_token_logps_and_entropies(model, *args, **kwargs)`: the targets take the parameters
        targets = [getattr(owner, t) for t in hook.dispatch if hasattr(owner, t)]
        assert targets, f"{hook.owner}.{name} takes *args and forwards to none of {hook.dispatch}"
        own = set(_params(function, hook.static))
        for target in targets:
            missing = [p for p in hook.params if p not in own and p not in _params(target, False)]
            assert not missing, f"{target.__qualname__} lacks {missing}"
        assert _params(targets[0], False)[:4] == list(hook.params[:4])  # passed positionally
        return
    params = _params(function, hook.static)
    if name in OVERRIDDEN:  # TRL calls our override: its parameters must be exactly TRL's
        assert params == list(hook.params), f"{hook.owner}.{name}{inspect.signature(function)}"
    else:  # we call it: what we pass must be there, in order
        assert params[: len(hook.params)] == list(hook.params), f"{hook.owner}.{name}{inspect.signature(function)}"


@pytest.mark.parametrize("name", sorted(n for n, hook in HOOKS.items() if hook.returns is not None))
def test_hook_returns_the_tuple_we_unpack(name):
    hook = HOOKS[name]
    owner = OWNERS[hook.owner]
    function = getattr(owner, name)
    functions = [getattr(owner, t) for t in hook.dispatch if hasattr(owner, t)] if _variadic(function) else [function]
    for function in functions:
        assert _return_arities(function) == {hook.returns}, f"{function.__qualname__} returns {_return_arities(function)}"


def _trl_credit_classes():
    import trl_credit.core.mixins as mixins
    import trl_credit.model_card as model_card
    from trl_credit.core.trainer import CreditTrainer  # the credit core: the TRL overrides of the presets built on it

    classes = [getattr(trl_credit, name) for name in ("CueGRPOTrainer", "OPPOTrainer", "DATPOTrainer", "SRPOTrainer")]
    return classes + [CreditTrainer, mixins.MethodRNGStateMixin, mixins.CPUMemoryMixin, model_card.MethodModelCardMixin]


def test_our_overrides_keep_trls_signatures():
    checked = set()
    for klass in _trl_credit_classes():
        for name, hook in OVERRIDDEN.items():
            if name not in klass.__dict__:
                continue
            checked.add(name)
            static = isinstance(klass.__dict__[name], staticmethod)
            assert static == hook.static, f"{klass.__name__}.{name}: TRL's is {'' if hook.static else 'not '}static"
            assert _params(getattr(klass, name), static) == list(hook.params), f"{klass.__name__}.{name}"
    assert checked == set(OVERRIDDEN)  # every registered hook is overridden somewhere, and checked there


# Attributes set outside GRPOTrainer.__init__, or only in some modes (vLLM).
# set only in some modes, or per batch: vLLM's; the tool loop's per-batch state (tools or environments), the
# environments' tool lists
_MODE_DEPENDENT = {"_last_loaded_step", "vllm_generation", "_async_tool_dicts", "_sync_tool_dicts",
                   "_batch_environments", "_env_tools"}


def _assigned_in(module) -> set:
    return set(re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=(?!=)", inspect.getsource(module)))


def test_attributes_we_read_are_set_by_trl(tiny_model_path, tiny_dataset, tmp_path):
    grpo_module = inspect.getmodule(GRPOTrainer)
    missing = sorted(set(ATTRIBUTES) - _assigned_in(grpo_module) - set(dir(GRPOTrainer)))
    assert not missing, f"GRPOTrainer no longer sets {missing}"
    assert all(hasattr(GRPOTrainer, name) for name in CLASS_ATTRIBUTES)

    from trl.generation.vllm_generation import VLLMGeneration

    vllm = _assigned_in(inspect.getmodule(VLLMGeneration)) | set(dir(VLLMGeneration))
    assert not sorted(set(VLLM_ATTRIBUTES) - vllm), "VLLMGeneration lost attributes trl_credit sets or reads"

    # And on a real (tiny) trainer: the attributes exist after construction.
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, report_to="none", use_cpu=True, save_strategy="no")
    trainer = GRPOTrainer(model=tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=tiny_dataset)
    absent = [name for name in ATTRIBUTES if name not in _MODE_DEPENDENT and not hasattr(trainer, name)]
    assert not absent, f"a constructed GRPOTrainer lacks {absent}"


def test_trl_colocate_push_is_what_the_cpu_fix_replaces():
    # trl_bridge.vllm_push replaces VLLMGeneration.sync_weights on vLLM's CPU platform by the same weights
    # (_iter_named_params) through vLLM's reload_weights: TRL's push must still load them through load_weights.
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(VLLMGeneration.sync_weights)
    assert trl_compat.COLOCATE_PUSH_CALL in source and "self._iter_named_params()" in source


def test_trl_calls_rollout_func_as_the_cores_adapter_takes_it():
    # The core installs a rollout's rollout_rows as TRL's rollout_func behind an adapter of TRL's (prompts, trainer).
    method, call = trl_compat.ROLLOUT_FUNC_CALL
    source = inspect.getsource(getattr(GRPOTrainer, method))
    assert source.count("self.rollout_func(") == 1 and call in source, f"GRPOTrainer.{method} calls rollout_func anew"


def test_config_fields_we_read_exist():
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert not sorted(set(CONFIG_FIELDS) - fields), "GRPOConfig lost fields trl_credit reads"
    assert all(hasattr(GRPOConfig, name) for name in CONFIG_CLASS_ATTRIBUTES)


@pytest.mark.parametrize("name", sorted(TRL_FUNCTIONS))
def test_imported_trl_functions_take_what_we_pass(name):
    module, params = TRL_FUNCTIONS[name]
    function = getattr(importlib.import_module(module), name, None)
    if name == "add_fused_lm_head" and Version(trl.__version__) < Version("1.15"):
        assert function is None and not trl_compat.HAS_FUSED_LM_HEAD and trl_compat.add_fused_lm_head is None
        return
    assert function is not None, f"{module}.{name} is gone"
    signature = inspect.signature(function).parameters
    assert list(signature)[: len(params)] == list(params), f"{module}.{name}{inspect.signature(function)}"
    assert getattr(trl_compat, name) is function or name == "parse_response"


@pytest.mark.parametrize("name", sorted(TRL_GLOBALS))
def test_trl_module_globals_we_touch_exist_from_their_version(name):
    module_name, since = TRL_GLOBALS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    present = module is not None and hasattr(module, name)
    assert present == (Version(trl.__version__) >= Version(since)), f"{module_name}.{name} on trl {trl.__version__}"
    if name == "_CHUNKED_LOGPROB_CHUNK_SIZE" and present:
        assert isinstance(module._CHUNKED_LOGPROB_CHUNK_SIZE, int) and module._CHUNKED_LOGPROB_CHUNK_SIZE > 0
        source = inspect.getsource(module)  # read at each call (not bound at import), so setting it takes effect
        assert re.search(r"apply\((?:.|\n)*?_CHUNKED_LOGPROB_CHUNK_SIZE", source)


def test_parse_response_shim_passes_tools_only_where_accepted(tiny_tokenizer):
    takes_tools = "tools" in inspect.signature(importlib.import_module("trl.chat_template_utils").parse_response).parameters
    assert takes_tools == (Version(trl.__version__) >= Version("1.16"))
    if not takes_tools:
        with pytest.raises(ValueError, match="tools"):
            trl_compat.parse_response(tiny_tokenizer, [1, 2], tools=[{"name": "f"}])


def test_installed_trl_is_in_the_supported_range():
    low, high = trl_compat.SUPPORTED_TRL
    assert low <= Version(Version(trl.__version__).base_version) < high
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert f'"trl>={low},<{high}"' in pyproject  # one range, stated in both places


# ------------------------------------------------------------------------------------------------ the scan
def _trl_private_names() -> set:
    """Private (single underscore) names of GRPOTrainer, transformers' Trainer, GRPOConfig and VLLMGeneration:
    methods, class attributes and the instance attributes their modules assign."""
    from trl.generation.vllm_generation import VLLMGeneration

    names = set(dir(GRPOTrainer)) | set(dir(GRPOConfig)) | set(dir(VLLMGeneration))
    for owner in (GRPOTrainer, transformers.Trainer, VLLMGeneration):
        names |= _assigned_in(inspect.getmodule(owner))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _grpo_public_attributes() -> set:
    """Public instance attributes GRPOTrainer adds to transformers' Trainer (undocumented, TRL may rename them)."""
    trainer_names = _assigned_in(inspect.getmodule(transformers.Trainer)) | set(dir(transformers.Trainer))
    grpo = _assigned_in(inspect.getmodule(GRPOTrainer)) - set(dir(GRPOTrainer))
    return {n for n in grpo - trainer_names if not n.startswith("_")}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != PACKAGE / "trl_bridge" / "compat.py":
            yield path.relative_to(PACKAGE.parent), path.read_text()


def _our_config_fields() -> set:
    configs = [getattr(trl_credit, n) for n in ("CueGRPOConfig", "OPPOConfig", "DATPOConfig", "SRPOConfig")]
    return {f.name for c in configs for f in dataclasses.fields(c)} - {f.name for f in dataclasses.fields(GRPOConfig)}


def _class_level_names(text: str) -> set:
    """Methods defined and names assigned in the bodies of the classes of a module's source."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.Assign):
                    names |= {target.id for target in item.targets if isinstance(target, ast.Name)}
    return names


def _scan(sources) -> list[str]:
    """Uses of private TRL names in ``sources`` ((path, text) pairs) that trl_compat's registry does not list."""
    private = _trl_private_names()
    registered = set(HOOKS) | set(ATTRIBUTES) | set(CLASS_ATTRIBUTES) | set(VLLM_ATTRIBUTES) | set(CONFIG_CLASS_ATTRIBUTES)
    public_attributes = _grpo_public_attributes()
    public_methods = {n for n in dir(GRPOTrainer) if not n.startswith("_") and callable(getattr(GRPOTrainer, n))}
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)} - _our_config_fields()
    problems = set()
    for path, text in sources:
        for name in re.findall(r"(?:\.|\bdef |^\s+)(_[A-Za-z]\w*)\b", text, re.M):
            if name in private and name not in registered:
                problems.add(f"{path}: private TRL name {name}")
        for name in re.findall(r"\b(?:self|trainer)\.([a-z]\w*)", text):
            if name in public_attributes and name not in ATTRIBUTES:
                problems.add(f"{path}: GRPOTrainer attribute {name}")
        for name in _class_level_names(text):  # overrides of GRPOTrainer's public methods
            if name in public_methods and name not in OVERRIDDEN:
                problems.add(f"{path}: override of GRPOTrainer.{name}")
        for name in re.findall(r"\bargs\.([a-z]\w*)", text):
            if name in grpo_fields and name not in CONFIG_FIELDS:
                problems.add(f"{path}: GRPOConfig field {name}")
        for module in re.findall(r"^\s*(?:from|import) (trl\.[\w.]+)", text, re.M):
            problems.add(f"{path}: imports {module} (import TRL's non-public modules in trl_compat)")
    return sorted(problems)


def test_trl_credit_uses_no_unregistered_private_trl_name():
    problems = _scan(_sources())
    assert not problems, "register these in trl_credit/trl_bridge/compat.py:\n" + "\n".join(problems)


def test_the_scan_reports_each_kind_of_unregistered_use():
    snippet = (
        "from trl.trainer.utils import nanstd\n"
        "class X:\n"
        "    def log(self, logs, start_time=None):\n"
        "        self._get_train_sampler()\n"
        "        return self.beta, self.args.epsilon\n"
    )
    report = "\n".join(_scan([("x.py", snippet)]))
    for expected in ("name _get_train_sampler", "attribute beta", "field epsilon", "imports trl.trainer.utils",
                     "override of GRPOTrainer.log"):
        assert expected in report, report


def test_design_doc_hook_table_lists_exactly_what_the_core_overrides():
    import trl_credit.core.mixins as mixins
    import trl_credit.model_card as model_card
    from trl_credit.core.trainer import CreditTrainer

    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    table = text[text.index("| class | overridden `GRPOTrainer` methods | why |") :].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        who, methods = line.split("|")[1:3]
        rows[who.strip()] = {name for name in re.findall(r"`(\w+)`", methods) if name in OVERRIDDEN}
    assert rows["`CreditTrainer`"] == set(CreditTrainer.__dict__) & set(OVERRIDDEN)
    # the trainers are presets: their parts hook in through the core, the class itself overrides nothing
    for name in ("CueGRPOTrainer", "OPPOTrainer", "DATPOTrainer", "SRPOTrainer"):
        assert set(getattr(trl_credit, name).__dict__) & set(OVERRIDDEN) == set(), name
    assert rows["the four presets"] == set()
    mixin_classes = [mixins.MethodRNGStateMixin, mixins.CPUMemoryMixin, model_card.MethodModelCardMixin]
    assert set(mixin_classes) >= {k for k in model_card.MethodModelCardMixin.__mro__ if set(k.__dict__) & set(OVERRIDDEN)}
    shared = {name for mixin in mixin_classes for name in mixin.__dict__} & set(OVERRIDDEN)
    assert rows["`MethodModelCardMixin` (in the core)"] == shared


# ------------------------------------------------------------------------------------------------ shims
def test_require_trl_names_the_version_needed(monkeypatch):
    monkeypatch.setattr(trl_compat, "TRL_VERSION", Version("1.14.2"))
    with pytest.raises(ValueError, match=r"frobnication needs trl>=1\.15"):
        trl_compat.require_trl("1.15", "frobnication")
    trl_compat.require_trl("1.14.2", "frobnication")  # met: no error


def test_oppo_refuses_liger_before_trl_1_15_before_loading_a_model(monkeypatch, tiny_dataset, tmp_path):
    from trl_credit import OPPOConfig, OPPOTrainer

    monkeypatch.setattr(trl_compat, "TRL_VERSION", Version("1.14.2"))
    monkeypatch.setattr(trl_compat, "TRL_LOGPS_NEED_TRITON", False)  # as on 1.14.2, whatever TRL runs this test
    args = OPPOConfig(str(tmp_path), use_liger_kernel=True, use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match=r"use_liger_kernel=True.*needs trl>=1\.15"):
        OPPOTrainer(model="not/loaded", reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                    train_dataset=tiny_dataset, args=args)


class _TinyLM(torch.nn.Module):
    def __init__(self, head):
        super().__init__()
        self.body, self.head = torch.nn.Linear(8, 8), head

    def get_output_embeddings(self):
        return self.head

    def forward(self, x):
        return self.head(self.body(x))


def test_float32_heads_without_trls_fused_head(monkeypatch):
    """trl<1.15 (no add_fused_lm_head): the teacher's nn.Linear head computes float32 logits under bf16 autocast,
    equal to a float64 reference of the same bf16 weights; a head that is not a plain nn.Linear is refused."""
    from trl_credit.oppo import oracle

    monkeypatch.setattr(oracle, "HAS_FUSED_LM_HEAD", False)
    torch.manual_seed(0)
    teacher = _TinyLM(torch.nn.Linear(8, 50)).to(torch.bfloat16)
    hidden = torch.randn(3, 8).to(torch.bfloat16)
    reference = hidden.double() @ teacher.head.weight.double().T + teacher.head.bias.double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = teacher.head(hidden)
    oracle.add_float32_teacher_head(teacher, temperature=0.7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        after = teacher.head(hidden)
    assert before.dtype == torch.bfloat16 and after.dtype == torch.float32
    torch.testing.assert_close(after.double(), reference, atol=1e-5, rtol=1e-5)
    assert (before.double() - reference).abs().max() > 1e-3  # bf16 logits were off: the check is not vacuous

    oracle.add_float32_head(_TinyLM(torch.nn.Linear(8, 50)), temperature=1.0)  # plain head: nothing to add
    wrapped = torch.nn.Sequential(torch.nn.Linear(8, 50))
    for add in (oracle.add_float32_head, oracle.add_float32_teacher_head):
        with pytest.raises(ValueError, match=r"plain torch.nn.Linear head.*Sequential.*trl>=1\.15"):
            add(_TinyLM(wrapped), 1.0)


def test_a_trl_that_cannot_compute_log_probs_here_is_refused_before_loading(monkeypatch, tiny_dataset):
    """trl 1.15.x without Triton (CPU-only PyTorch): GRPOTrainer's fused LM head has no implementation and fails at
    the first log-prob pass; each trainer says so at construction instead."""
    import importlib.util

    version = Version(Version(trl.__version__).base_version)
    expected = Version("1.15") <= version < Version("1.16") and importlib.util.find_spec("triton") is None
    assert trl_compat.TRL_LOGPS_NEED_TRITON == expected
    monkeypatch.setattr(trl_compat, "TRL_LOGPS_NEED_TRITON", True)
    for name in ("CueGRPOTrainer", "OPPOTrainer", "DATPOTrainer", "SRPOTrainer"):
        with pytest.raises(ImportError, match=rf"{name} cannot train with trl .* needs Triton"):
            getattr(trl_credit, name)(model="not/loaded", reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                      train_dataset=tiny_dataset)
