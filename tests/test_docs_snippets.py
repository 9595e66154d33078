"""What a user copies from the docs runs: every Python block of README.md, CONTRIBUTING.md and docs/*.md is executed
here, and every shell command names scripts and options that exist.

A Python block runs as written on the CPU, with these documented substitutions only (so the suite stays offline
and fast):

- ``HUB_MODELS``: Hub model ids in a block are replaced by the tiny random model of ``tests/tiny.py``;
- ``HUB_DATASETS``: ``load_dataset("my/...")`` calls are replaced by a small in-memory dataset with the same columns;
- ``TINY_RUN``: every method config (``trl_credit.<Method>Config``) is built with these fields on top of the
  block's own: one optimizer step of very short completions, nothing reported or saved, outputs in a temporary
  folder. Nothing here sets ``bf16`` or ``use_cpu``: a block a CPU user copies must run on a CPU as it is.

A block that cannot run on a CPU or offline (it needs a GPU, DeepSpeed, a Hub model that is not substituted) is
marked in the markdown with an HTML comment on the line before it, e.g. ``<!-- snippet: skip (needs a GPU) -->``;
``test_skipped_blocks_are_listed`` keeps that list explicit.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# Shell commands are also checked in these (they hold reproduction commands).
SHELL_MARKDOWN = [*MARKDOWN, ROOT / "BENCHMARKS.md", ROOT / "benchmarks" / "results" / "HISTORY.md",
                  ROOT / "examples" / "accelerate_configs" / "MULTI_NODE.md"]

HUB_MODELS = ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")
HUB_DATASETS = ('load_dataset("my/math-dataset", split="train")',)
TINY_RUN = dict(max_steps=1, max_completion_length=8, report_to="none", save_strategy="no", logging_steps=1)
# Python blocks that are not run, as "file:line" (the line number `code_blocks` gives: the opening fence's, 1-indexed).
SKIPPED: set[str] = {"docs/multiturn.md:112", "docs/testbed.md:432"}

SKIP_MARK = re.compile(r"<!--\s*snippet:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->")


def code_blocks(path: Path, language: str):
    """(line of the opening fence, code, skip reason or None) of every fenced block in ``language``."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}":
            start, body = i + 1, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = next((lines[j] for j in range(start - 2, -1, -1) if lines[j].strip()), "")
            mark = SKIP_MARK.search(before)
            blocks.append((start, "\n".join(body), mark.group("reason") if mark else None))
        i += 1
    return blocks


PYTHON_BLOCKS = [(f"{p.relative_to(ROOT)}:{line}", code, skip) for p in MARKDOWN
                 for line, code, skip in code_blocks(p, "python")]


def substitute(code: str, tiny_model_path: str) -> str:
    for model_id in HUB_MODELS:
        code = code.replace(f'"{model_id}"', repr(tiny_model_path))
    for call in HUB_DATASETS:
        code = code.replace(call, "_tiny_hub_dataset()")
    return code


def _tiny_hub_dataset():
    from datasets import Dataset

    prompts = [[{"role": "user", "content": f"What is {a} + {b}? Put the final answer in \\boxed{{}}."}]
               for a, b in [(1, 2), (3, 4)]]
    return Dataset.from_dict({"prompt": prompts, "answer": ["3", "7"]})


def test_every_python_block_is_run_or_listed():
    assert PYTHON_BLOCKS, "no Python block found: the extraction is broken"
    marked = {name for name, _, skip in PYTHON_BLOCKS if skip}
    assert marked == SKIPPED, f"blocks marked skip in the markdown {sorted(marked)} != SKIPPED {sorted(SKIPPED)}"


def test_substitutions_are_used():
    # A substitution no block uses has rotted (the docs changed): drop it, or the docs changed by mistake.
    text = "\n".join(code for _, code, _ in PYTHON_BLOCKS)
    for needle in [*(f'"{m}"' for m in HUB_MODELS), *HUB_DATASETS]:
        assert needle in text, f"substitution {needle} is used by no Python block"


@pytest.mark.parametrize("name, code, skip", PYTHON_BLOCKS, ids=[b[0] for b in PYTHON_BLOCKS])
def test_python_block_runs(name, code, skip, tiny_model_path, tmp_path, monkeypatch):
    if skip:
        pytest.skip(f"{name}: {skip}")
    import trl_credit

    monkeypatch.chdir(tmp_path)  # blocks write their outputs (output_dir, credit.html) to the working directory
    for method in ("CueGRPO", "OPPO", "DATPO", "SRPO", "Credit"):
        real = getattr(trl_credit, f"{method}Config")

        def tiny_config(*args, _real=real, **kwargs):
            kwargs = {**kwargs, **TINY_RUN, "output_dir": str(tmp_path / "out")}
            return _real(*args[1:], **kwargs)  # args[0], if given, is the block's output_dir

        monkeypatch.setattr(trl_credit, f"{method}Config", tiny_config)
    namespace = {"__name__": "__snippet__", "_tiny_hub_dataset": _tiny_hub_dataset}
    exec(compile(substitute(code, tiny_model_path), name, "exec"), namespace)
    trainer = namespace.get("trainer")
    if trainer is not None and trainer.state.global_step:
        assert trainer.state.global_step == 1  # TINY_RUN reached the config: the block ran one step, not a full run


@pytest.mark.parametrize("page", ["srpo", "oppo", "datpo", "cue_grpo", "composition"])
def test_quick_starts_stop_after_a_few_steps(page):
    # The method pages' quick starts run as written on a CPU: without max_steps TRL trains 3 epochs over the dataset.
    blocks = [code for _, code, _ in code_blocks(ROOT / "docs" / f"{page}.md", "python") if "trainer.train()" in code]
    assert blocks, f"docs/{page}.md has no training block"
    match = re.search(r"max_steps=(\d+),\s*#", blocks[0])
    assert match and int(match.group(1)) <= 20, f"docs/{page}.md's quick start sets no small max_steps with a comment"


# ------------------------------------------------------------------------------------------------- shell commands
def shell_commands(path: Path):
    """Commands of the ```bash blocks (continuation lines joined, comments dropped), with their opening line."""
    for line, code, _ in code_blocks(path, "bash"):
        joined = re.sub(r"\\\n\s*", " ", code)
        for command in joined.splitlines():
            command = command.split(" #")[0].strip()
            if command and not command.startswith("#"):
                yield f"{path.relative_to(ROOT)}:{line}", command


def inline_commands(path: Path):
    """Inline `python benchmarks/...` / `bash benchmarks/...` commands (CONTRIBUTING's table of scripts)."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for command in re.findall(r"`((?:python|bash) (?:benchmarks|examples)/[^`]+)`", line):
            yield f"{path.relative_to(ROOT)}:{number}", command


SHELL_COMMANDS = [c for p in SHELL_MARKDOWN for c in (*shell_commands(p), *inline_commands(p))]


def _python_scripts(command: str):
    """(script path, its --options) of every `python <script>.py ...` in a command (also after `&&`)."""
    for part in re.split(r"&&|;|&(?!\S)", command):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        words = [w for w in words if "=" not in w or w.startswith("-")]  # drop leading VAR=value assignments
        for i, word in enumerate(words):
            if word.endswith(".py") and i > 0 and Path(words[i - 1]).name.startswith("python"):
                options = [w.split("=")[0] for w in words[i + 1:] if w.startswith("--")]
                yield word, options


def test_shell_commands_name_existing_files():
    assert SHELL_COMMANDS
    for where, command in SHELL_COMMANDS:
        for word in shlex.split(command.replace("<", "'<").replace(">", ">'")):
            if re.fullmatch(r"(examples|benchmarks|tests|docs)/[\w./{},-]+\.(py|yaml|sh|md)", word):
                for path in _expand_braces(word):
                    assert (ROOT / path).exists(), f"{where}: `{command}` names {path}, which does not exist"


def _expand_braces(word: str):
    match = re.search(r"\{([^}]+)\}", word)
    if not match:
        return [word]
    return [p for alt in match.group(1).split(",") for p in _expand_braces(word[:match.start()] + alt + word[match.end():])]


def test_benchmark_commands_use_real_options():
    # Every --option of a documented `python benchmarks/<script>.py` command is spelled out in that script's
    # argparse (an abbreviation such as --seed for --seeds is not: the scripts refuse abbreviations).
    checked = 0
    for where, command in SHELL_COMMANDS:
        for script, options in _python_scripts(command):
            if not script.startswith("benchmarks/"):
                continue
            source = (ROOT / script).read_text()
            # options a script takes from a module beside it or from the shared harness package (the mechanism
            # scripts' benchmarks/harness/mechanisms.py)
            for imported, package, name in re.findall(r"^import ([\w.]+)|^from ([\w.]+) import (\w+)", source,
                                                      flags=re.M):
                module = (imported or package).replace(".", "/")
                for sibling in ((ROOT / script).parent / f"{module}.py", ROOT / "benchmarks" / f"{module}.py",
                                ROOT / "benchmarks" / module / "__init__.py", ROOT / "benchmarks" / module / f"{name}.py"):
                    if sibling.exists():
                        source += sibling.read_text()
            for option in options:
                assert re.search(rf"""["']{re.escape(option)}["']""", source), (
                    f"{where}: `{command}` passes {option}, which {script} does not define")
            assert "allow_abbrev=False" in source, f"{script} accepts abbreviated options (allow_abbrev=False)"
            checked += 1
    assert checked >= 5


def test_learning_refuses_abbreviated_seed(capsys):
    # CONTRIBUTING.md documented `learning.py --seed 0`, which argparse took as an abbreviation of --seeds. An
    # abbreviation is now refused, so a typo cannot silently select another option.
    import importlib.util

    spec = importlib.util.spec_from_file_location("learning_cli", ROOT / "benchmarks" / "learning" / "learning.py")
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    with pytest.raises(SystemExit) as exit_info:  # --methods bogus: the old parser stopped there, after parsing
        learning.main(["--seed", "0", "--methods", "bogus"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --seed 0" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------- recipes
RECIPES = {"srpo": "SRPOConfig", "cue_grpo": "CueGRPOConfig", "oppo": "OPPOConfig", "datpo": "DATPOConfig"}


@pytest.mark.parametrize("method", sorted(RECIPES))
def test_recipe_header_says_how_to_run_on_a_cpu(method):
    # The recipes are GPU settings (bf16); the header's "On a CPU add:" arguments must build the config on a CPU.
    import torch
    import trl_credit
    from trl_credit.scripts import make_parser

    recipe = ROOT / "examples" / "recipes" / f"{method}.yaml"
    header = recipe.read_text().split("\n\n")[0]
    assert header.startswith("# GPU settings"), f"{recipe.name}: the header does not say these are GPU settings"
    cpu_args = shlex.split(re.search(r"^# On a CPU add: (.+)$", header, flags=re.M).group(1))
    config_class = getattr(trl_credit, RECIPES[method])
    argv = ["--config", str(recipe), *cpu_args]
    _, config, _ = make_parser(config_class, argv=argv).parse_args_and_config(args=argv)
    assert (config.bf16, config.use_cpu, config.use_vllm) == (False, True, False)
    assert "8bit" not in str(config.optim)  # bitsandbytes' optimizers need a GPU
    if not torch.cuda.is_available():  # and without them the recipe stops on a CPU, which is why the header exists
        argv = ["--config", str(recipe)]
        with pytest.raises(ValueError, match="bf16"):
            make_parser(config_class, argv=argv).parse_args_and_config(args=argv)


# --------------------------------------------------------------------------------------------------------- links
def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"docs/{page.name} is not in the README's Documentation list"


def test_relative_links_point_to_existing_files():
    for path in SHELL_MARKDOWN:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links to {target}, which does not exist"


def test_benchmarks_md_is_the_current_state_and_links_its_history():
    # BENCHMARKS.md holds the latest numbers per question (a newcomer reads it in minutes); earlier runs move to
    # benchmarks/results/HISTORY.md, which it links, so nothing measured is lost.
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert len(text.splitlines()) <= 450
    assert "(benchmarks/results/HISTORY.md" in text and (ROOT / "benchmarks" / "results" / "HISTORY.md").exists()
