"""The "is it working" ranges (trl_credit.evaluation.health): what they accept, and that each method page documents its own."""

import re
from pathlib import Path

from trl_credit.evaluation.health import HEALTH_CHECKS, health_check, outside

ROOT = Path(__file__).resolve().parent.parent


def test_ranges_mark_the_degenerate_values():
    assert outside("srpo/single_thought_rate", 1.0) and not outside("srpo/single_thought_rate", 0.5)
    assert outside("srpo/fallback_rate", 1.0) and not outside("srpo/fallback_rate", 0.75)
    assert outside("oppo/success_rate", 0.0) and not outside("oppo/success_rate", 0.1)
    assert outside("oppo/evidence_auc", 0.5) and not outside("oppo/evidence_auc", 0.6)  # 0.5: chance
    assert not outside("oppo/extra_pass_rows", 2.0)  # a cost (the extra pass scored twice the rows), not a failure
    assert outside("datpo/no_fork_rate", 0.25) and not outside("datpo/no_fork_rate", 0.0)
    assert outside("cue/frac_positive_advantage_excluded", 1.0)
    assert outside("frac_reward_zero_std", 1.0) and not outside("frac_reward_zero_std", 0.5)
    assert not outside("srpo/seed_rounds", 4.0) and health_check("srpo/seed_rounds") is None  # no range: never marked


def _section(page: str, anchor: str) -> str:
    text = (ROOT / page).read_text()
    headings = [(m.start(), m.group(2)) for m in re.finditer(r"^(#+) (.+)$", text, re.M)]
    slug = lambda title: re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")  # GitHub's anchors
    starts = [i for i, (_, title) in enumerate(headings) if slug(title) == anchor]
    assert starts, f"{page} has no section #{anchor}"
    start = headings[starts[0]][0]
    end = headings[starts[0] + 1][0] if starts[0] + 1 < len(headings) else len(text)
    return text[start:end]


def test_every_check_is_documented_where_the_summary_points():
    for check in HEALTH_CHECKS:
        page, anchor = check.page.split("#")
        section = _section(page, anchor)
        assert f"`{check.metric}`" in section, (check.metric, page)
        if anchor == "is-it-working":  # the method pages' tables give the range
            assert f"| `{check.metric}` | {check.healthy} |" in section, (check.metric, page)
    for page in ("docs/srpo.md", "docs/oppo.md", "docs/datpo.md", "docs/cue_grpo.md"):  # TRL's own, on every page
        assert "| `frac_reward_zero_std` | < 1 |" in _section(page, "is-it-working")


def test_every_logged_method_metric_is_in_the_readme_list():
    # Every literal "<prefix>/<name>" of the package that is not a warning's key (warn_once, BatchContext.warn) is a
    # logged metric; the README lists them all (section "Logging"). Metric names built with placeholders are listed
    # by hand there.
    source = "\n".join(path.read_text() for path in (ROOT / "trl_credit").rglob("*.py"))
    names = set(re.findall(r'"((?:srpo|oppo|datpo|cue|credit)/[a-z_]+)"', source))
    warn_keys = set(re.findall(r'warn_once\(\s*\w+,\s*"([^"]+)"', source))  # a part's own: ctx.warn("key", ...)
    warn_keys |= set(re.findall(r'\.warn\(\s*"([^"]+)"', source))
    metrics = names - warn_keys
    assert {"srpo/single_thought_rate", "oppo/value_mean", "datpo/v_root", "cue/weight_spread"} <= metrics
    readme = (ROOT / "README.md").read_text()
    listed = readme[readme.index("- **Logging**"):readme.index("**No silent degeneration.**")]
    missing = sorted(name for name in metrics if f"`{name}`" not in listed and f"{name}`" not in listed)
    assert missing == [], missing
