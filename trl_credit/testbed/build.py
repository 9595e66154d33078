"""``python -m trl_credit.testbed.build [--steps N]``: build (or find) the tiny testbed model and print its folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from trl_credit.testbed.model import Recipe, testbed_model_path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    for field in dataclasses.fields(Recipe):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    recipe = Recipe(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Recipe)})
    path = testbed_model_path(recipe, progress=True)
    with open(os.path.join(path, "build.json")) as f:
        info = json.load(f)
    print(json.dumps({k: v for k, v in info.items() if k != "recipe"}, indent=1))
    print(path)


if __name__ == "__main__":
    main()
