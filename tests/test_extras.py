"""Our engine extras are TRL's: `pip install trl_credit[vllm]` / `[deepspeed]` installs exactly what `trl[vllm]` /
`trl[deepspeed]` does, so a user never gets an engine version TRL refuses (our `vllm` extra once admitted vLLM
0.10-0.21 and 0.32+, outside TRL 1.16's 0.22.0-0.31.0)."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def extra_requirements(distribution: str, extra: str) -> list[Requirement]:
    found = []
    for text in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}) and not (
                requirement.marker.evaluate({"extra": ""})):
            found.append(requirement)
    return found


@pytest.mark.parametrize("extra", ["vllm", "deepspeed"])
def test_engine_extra_is_trls(extra):
    ours = [Requirement(text) for text in tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][extra]]
    assert [(r.name, r.extras, str(r.specifier)) for r in ours] == [("trl", {extra}, "")], ours
    # ... and the installed TRL has that extra, with the engine in it
    trls = extra_requirements("trl", extra)
    assert extra in {r.name for r in trls}, [str(r) for r in trls]


def test_trl_vllm_range_is_what_our_docs_say():
    """docs/platforms.md names the vLLM range of the supported TRL; a TRL upgrade that moves it fails here."""
    (vllm,) = [r for r in extra_requirements("trl", "vllm") if r.name == "vllm"]
    docs = (PYPROJECT.parent / "docs" / "platforms.md").read_text()
    assert all(spec.version in docs for spec in vllm.specifier), (str(vllm.specifier), "docs/platforms.md")
