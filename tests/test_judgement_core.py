"""Every interval and every verdict is computed in the judgement core (`judgement/`): an AST scan
of the package (tests, benchmarks and the bundled tasks left out) finds none elsewhere.

Outside `judgement/` a module may read a verdict (compare it, look it up, map it to a colour)
but not produce one that claims an effect: no `Verdict.IMPROVED` or `Verdict.REGRESSED` (nor
`Verdict("IMPROVED")`) assigned, returned or passed on, no microbenchmark word (FASTER, SLOWER,
SAME, AMBIGUOUS) produced, no `Decision`, `Comparison` or `RateComparison` built. And it may
compute no interval: no quantile, percentile, bootstrap or binomial call (numpy, scipy,
statistics, math.comb), no import of scipy.stats, no normal quantile written as a number
(1.96, 1.645, 2.576, 0.8416), no function named for an interval. NO_CHANGE, FAILED, INCORRECT
and REJECTED are left to the cascade: they claim no effect, and no interval decides them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = "judgement"

CLAIMS = {"IMPROVED", "REGRESSED"}
"""Verdicts that claim an effect: only the core decides them."""
WORDS = {"FASTER", "SLOWER", "SAME", "AMBIGUOUS"}
"""The microbenchmark's words for a decision (`judgement.decision.Decision.word`)."""
CALLS = {
    "quantile", "quantiles", "nanquantile", "percentile", "nanpercentile", "bootstrap",
    "comb", "binom", "binomtest", "binom_test", "ppf", "interval",
}  # fmt: skip
"""Calls (by their last name) that compute an interval or a tail."""
Z_VALUES = {1.96, 1.959964, 1.645, 2.576, 0.8416, 0.841621}
"""Normal quantiles: a number like these is an interval written by hand."""
NAMED = ("interval", "wilson", "clopper", "bootstrap", "quantile", "percentile")
"""Words in a function's name that say it computes an interval or a quantile."""
BUILT = {"Decision", "Comparison", "RateComparison"}
"""The core's result types: built only by the core."""


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _reads(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """True where `node` is only read: compared, looked up, a dict key, iterated over, or a
    docstring/annotation (through any tuple, list, set or conditional holding it)."""
    child, parent = node, parents.get(id(node))
    while isinstance(parent, ast.Tuple | ast.List | ast.Set | ast.IfExp | ast.BoolOp | ast.Starred):
        child, parent = parent, parents.get(id(parent))
    if isinstance(parent, ast.Compare | ast.Expr):
        return True
    if isinstance(parent, ast.Subscript):
        return True  # a lookup, or a Literal[...] type
    if isinstance(parent, ast.Dict):
        return any(key is child for key in parent.keys)
    return isinstance(parent, ast.For | ast.comprehension) and parent.iter is child


def _verdict_name(node: ast.AST) -> str | None:
    """`X` for `Verdict.X` (any `...Verdict.X`), else None."""
    if not isinstance(node, ast.Attribute):
        return None
    base = node.value
    named = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
    return node.attr if named == "Verdict" else None


def _imported(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound by imports from the core, and names bound by imports from anywhere else."""
    core: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            into = core if (node.module or "").startswith(f"infra_agent.{CORE}") else other
            into.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                into = core if a.name.startswith(f"infra_agent.{CORE}") else other
                into.add(a.asname or a.name.partition(".")[0])
    return core, other


def _call_name(node: ast.Call, core: set[str]) -> str | None:
    """The called name (its last part), or None when the core is called (`f` or `mod.f` with
    `f` or `mod` imported from the core)."""
    func = node.func
    if isinstance(func, ast.Attribute):
        base = func.value
        return None if isinstance(base, ast.Name) and base.id in core else func.attr
    name = getattr(func, "id", "")
    return None if name in core else name


def violations(source: str, where: str = "<source>") -> list[str]:
    """Each interval or verdict computed in `source`, as 'where:line: what'."""
    tree = ast.parse(source)
    parents = _parents(tree)
    core, other = _imported(tree)
    found: list[str] = []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        name = _verdict_name(node)
        if name in CLAIMS and not _reads(node, parents):
            say(node, f"Verdict.{name} produced")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in WORDS and not _reads(node, parents):
                say(node, f"microbenchmark verdict {node.value!r} produced")
        if isinstance(node, ast.Constant) and isinstance(node.value, float):
            if node.value in Z_VALUES:
                say(node, f"normal quantile {node.value} (an interval by hand)")
        if isinstance(node, ast.Call):
            called = _call_name(node, core) or ""
            if called in CALLS or called.startswith("binom"):
                say(node, f"{called}() computes an interval or a tail")
            built = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if built in BUILT and built not in other:  # not a type of that name from elsewhere
                say(node, f"{built} built")
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if called == "Verdict" and any(a in CLAIMS for a in args):
                say(node, "Verdict(...) of a claim produced")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scipy.stats"):
            say(node, "scipy.stats imported")
        if isinstance(node, ast.Import) and any(
            a.name.startswith("scipy.stats") for a in node.names
        ):
            say(node, "scipy.stats imported")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any(word in node.name.lower() for word in NAMED):
                say(node, f"function {node.name} named for an interval")
    return found


def scanned() -> list[Path]:
    """The package's modules outside the core (tests, benchmarks, bundled tasks left out)."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (CORE, "tests", "benchmarks", "bundled_tasks", "build", ".venv"):
            continue
        if any(part.startswith(".") or part.endswith(".egg-info") for part in rel.parts):
            continue
        out.append(path)
    return out


def test_no_interval_or_verdict_is_computed_outside_the_core() -> None:
    found = [v for path in scanned() for v in violations(path.read_text(), str(path.relative_to(ROOT)))]  # fmt: skip
    assert found == []


def test_the_scan_covers_the_package_but_not_the_core() -> None:
    names = {str(p.relative_to(ROOT)) for p in scanned()}
    assert "experiments/measure.py" in names and "feedback/bench/runner.py" in names
    assert "serving/load/metrics.py" in names and not any(n.startswith("judgement/") for n in names)


def test_the_core_itself_is_what_the_scan_would_flag() -> None:
    """Not vacuous: the core computes what the scan looks for."""
    core = ROOT / CORE
    said = " ".join(v for p in core.glob("*.py") for v in violations(p.read_text(), p.name))
    for what in ("quantile()", "comb()", "Verdict.IMPROVED", "'FASTER'", "Decision built"):
        assert what in said, what


PLANTED = {
    "np.quantile(ratios, [0.025, 0.975])": "quantile()",
    "statistics.quantiles(xs, n=20)": "quantiles()",
    "np.percentile(values, 99)": "percentile()",
    "scipy.stats.bootstrap((xs,), np.median)": "bootstrap()",
    "math.comb(n, k) / 2**n": "comb()",
    "binomtest(k, n).proportion_ci()": "binomtest()",
    "stats.norm.ppf(0.975)": "ppf()",
    "low = mean - 1.96 * sd": "normal quantile",
    "from scipy.stats import binom": "scipy.stats imported",
    "verdict = Verdict.IMPROVED": "Verdict.IMPROVED produced",
    "return Verdict.REGRESSED, reasons": "Verdict.REGRESSED produced",
    "record(verdict=Verdict.IMPROVED if lo > 1 else Verdict.NO_CHANGE)": "Verdict.IMPROVED",
    "v = Verdict('IMPROVED')": "Verdict(...) of a claim",
    "word = 'FASTER' if lo > 1 else 'AMBIGUOUS'": "'FASTER' produced",
    "from infra_agent.judgement import Decision\nd = Decision(Verdict.NO_CHANGE, [])": "Decision built",
    "c = Comparison(speedup=1.0, ci_low=1, ci_high=1)": "Comparison built",
    "def wilson_interval(k, n):\n    return 0, 1": "named for an interval",
}


def test_a_planted_interval_or_verdict_fails_the_scan() -> None:
    for source, what in PLANTED.items():
        found = violations(source)
        assert any(what in v for v in found), (source, found)


def test_reading_a_verdict_or_calling_the_core_is_not_computing_one() -> None:
    read = """
'''A docstring that says FASTER.'''
if result.verdict is Verdict.IMPROVED and c.verdict not in ("FASTER", "SLOWER"):
    pass
if verdict in (Verdict.IMPROVED, Verdict.REGRESSED):
    pass
COLOURS = {Verdict.IMPROVED: "green", Verdict.REGRESSED: "red"}
colour = COLOURS[Verdict.IMPROVED]
start = Verdict.NO_CHANGE
wins = [e for e in found if e.verdict == Verdict.IMPROVED]
Word = Literal["FASTER", "SLOWER"]
from infra_agent.judgement.intervals import binom_upper_tail
from infra_agent.judgement import rates
from infra_agent.judgement.describe import percentile
from infra_agent.trajectories.atif import Decision
tail = binom_upper_tail(k, n, 0.5) + percentile(values, 99)
low, high = rates.interval(counts)
review = Decision(action="approve")
for v in (Verdict.IMPROVED, Verdict.REGRESSED):
    pass
"""
    assert violations(read) == []
