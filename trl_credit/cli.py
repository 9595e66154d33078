"""``trl-credit <method> [--config recipe.yaml] [flags]``: TRL's ``trl grpo`` for the credit methods.

    trl-credit srpo                                                   # the offline CPU run (SmolLM2, arithmetic)
    trl-credit srpo --config srpo.yaml --num_processes 8 --config_file zero2.yaml      # a paper recipe on 8 GPUs
    trl-credit oppo --model_name_or_path Qwen/Qwen3-4B-Instruct-2507 --dataset_name <hub id> --reward_funcs accuracy

Methods: ``grpo`` (TRL's GRPOTrainer), ``cue_grpo``, ``oppo``, ``datpo``, ``srpo``, ``credit`` (the composed method:
``--rollout``, ``--credit``, ``--modifiers``). Shaped as TRL's CLI (trl/cli/commands/training.py, trl 1.16): the
method's parser (TrlParser over the script arguments, the method's config and ``ModelConfig``, every flag of ``trl
grpo`` and the method's own) reads the command line and the ``--config`` recipe; what it does not know goes to
``accelerate launch`` (``--num_processes``, ``--config_file``, ``--num_machines``, ...; ``--accelerate_config <name>``
names one of the configs TRL ships, ``zero2``, ``multi_gpu``, ...), which starts ``python -m trl_credit.train`` with
the rest. The run ends with the scripts' closing summary (:func:`trl_credit.scripts.training_summary`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["main"]

_USAGE = "usage: trl-credit {method} [--config recipe.yaml] [training flags] [accelerate launch flags]"


def _subtract_subsequence(items: list[str], subsequence: list[str]) -> list[str]:
    """``items`` without the ordered ``subsequence`` (the flags the parser left for the launcher)."""
    remaining, rest = iter(subsequence), []
    current = next(remaining, None)
    for item in items:
        if current is not None and item == current:
            current = next(remaining, None)
        else:
            rest.append(item)
    return rest


def _resolve_accelerate_config(launch_args: list[str]) -> list[str]:
    """``--accelerate_config <path or name>`` -> ``--config_file <path>``; a name is one of TRL's shipped configs."""
    if "--accelerate_config" not in launch_args:
        return launch_args
    index = launch_args.index("--accelerate_config")
    if index + 1 >= len(launch_args):
        raise SystemExit("trl-credit: --accelerate_config needs a value: a file or the name of one of TRL's configs.")
    name = launch_args[index + 1]
    path = Path(name)
    if not path.is_file():
        import importlib.resources as resources

        shipped = resources.files("trl").joinpath("accelerate_configs")
        names = sorted(p.name[: -len(".yaml")] for p in shipped.iterdir() if p.name.endswith(".yaml"))
        if name not in names:
            raise SystemExit(f"trl-credit: --accelerate_config {name!r} is neither a file nor one of TRL's configs "
                             f"({', '.join(names)}).")
        path = shipped.joinpath(f"{name}.yaml")
    return ["--config_file", str(path), *launch_args[:index], *launch_args[index + 2:]]


def main(argv: list[str] | None = None) -> int:
    from trl_credit.train import METHODS

    argv = list(sys.argv[1:] if argv is None else argv)
    usage = _USAGE.replace("{method}", "{" + ",".join(METHODS) + "}")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage + "\n\n" + "\n\n".join(__doc__.split("\n\n")[1:]).replace("``", "`").strip("\n"))
        return 0
    method, args = argv[0], argv[1:]
    if method not in METHODS:
        print(f"{usage}\ntrl-credit: unknown method {method!r}: use one of {', '.join(METHODS)}.", file=sys.stderr)
        return 2

    from accelerate.commands.launch import launch_command, launch_command_parser

    from trl_credit.scripts import make_parser
    from trl_credit.train import method_classes, method_defaults

    _, config_class = method_classes(method)
    parser = make_parser(config_class, method_defaults(method), args)
    parser.prog = f"trl-credit {method}"
    # -h exits here with the method's flags; a bad value fails here, before the launcher starts anything.
    *_, config_remaining, cli_remaining = parser.parse_args_and_config(
        args, return_remaining_strings=True, separate_remaining_strings=True
    )
    launch_args = _resolve_accelerate_config(config_remaining + cli_remaining)
    script_args = _subtract_subsequence(args, cli_remaining)
    # As a module (`python -m trl_credit.train`), not a file: a file would put the package's own folder first on
    # sys.path, where its modules (config, models, tasks, ...) would shadow top-level ones of the same name.
    launch = launch_command_parser().parse_args([*launch_args, "--module", "trl_credit.train", method, *script_args])
    try:
        launch_command(launch)
    except subprocess.CalledProcessError as error:  # the training process printed its own traceback
        return error.returncode or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
