"""README.md's numbers and commands stay in step with the repository: the test count it states, the files its
commands name, and its `trl-credit` commands (each parsed by the method's parser, the rest by `accelerate launch`'s)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DEFAULT_MARKEXPR = "not slow and not vllm and not deepspeed"  # pyproject's addopts: the default suite


def _bash_commands(text: str) -> list[str]:
    """Each command of the README's bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split(" #", 1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def _default_suite_size(request) -> int:
    """Tests the default suite collects: this session's when it is the whole default run, else a fresh collection."""
    config = request.config
    paths = {Path(arg.split("::")[0]).resolve() for arg in config.args}
    if config.option.markexpr == DEFAULT_MARKEXPR and not config.option.keyword and paths <= {ROOT / "tests", ROOT}:
        return len(request.session.items)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    found = re.search(r"^(\d+)(?:/\d+)? tests? collected", result.stdout, re.M)
    assert found, result.stdout[-3000:] + result.stderr[-3000:]
    return int(found.group(1))


def test_the_stated_test_count_is_within_5_percent_of_the_suite(request):
    stated = re.search(r"the default suite, about ([\d,]+) tests", README)
    assert stated, "README.md states the default suite's size as 'the default suite, about N tests'"
    stated = int(stated.group(1).replace(",", ""))
    size = _default_suite_size(request)
    assert abs(size - stated) <= 0.05 * stated, f"README says about {stated} tests, the default suite has {size}"


def test_the_files_its_commands_name_exist():
    named = set()
    for command in _bash_commands(README):
        named.update(re.findall(r"(?<![\w./-])((?:examples|benchmarks|tests|docs|\.ci)/[\w./-]*\w)", command))
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert named and not missing, missing


def test_its_trl_credit_commands_parse():
    from accelerate.commands.launch import launch_command_parser

    from trl_credit.cli import _resolve_accelerate_config
    from trl_credit.scripts import make_parser
    from trl_credit.train import METHODS, method_classes, method_defaults

    commands = [c for c in _bash_commands(README) if c.startswith("trl-credit ")]
    assert len(commands) >= 4  # the four papers' recipes
    for command in commands:
        words = shlex.split(re.sub(r"<[^>]+>", "placeholder", command))[1:]
        method, args = words[0], words[1:]
        assert method in METHODS, command
        args = [str(ROOT / a) if a.startswith("examples/") else a for a in args]
        parser = make_parser(method_classes(method)[1], method_defaults(method), args)
        *_, config_left, cli_left = parser.parse_args_and_config(args, return_remaining_strings=True,
                                                                 separate_remaining_strings=True)
        try:  # what the method's parser leaves must be accelerate launch's
            launch_command_parser().parse_args([*_resolve_accelerate_config(config_left + cli_left), "script.py"])
        except SystemExit:
            pytest.fail(f"accelerate launch does not take {config_left + cli_left} of: {command}")
