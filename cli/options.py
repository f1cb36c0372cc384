"""The option values several commands parse the same way: `--param NAME=VALUE` (task scale
parameters) and `--budget` (a run's limits)."""

from __future__ import annotations

import re
from typing import Any

from infra_agent.errors import UserError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_BUDGET_KEYS = {
    "experiments": "experiments",
    "exp": "experiments",
    "wall": "wall_s",
    "time": "wall_s",
    "tokens": "tokens",
    "cost": "cost_usd",
    "turns": "turns",
    "looks": "looks",
}


def parse_budget(text: str | None) -> dict[str, Any]:
    """'8' (experiments) or 'experiments=8,wall=30m,tokens=200k,turns=40,cost=2.5,looks=16'."""
    if not text:
        return {}
    if text.strip().isdigit():
        return {"experiments": int(text)}
    out: dict[str, Any] = {}
    for part in text.split(","):
        key, _, raw = part.partition("=")
        key, raw = key.strip(), raw.strip().lower()
        if key not in _BUDGET_KEYS or not raw:
            raise UserError(
                f"--budget: '{part}' is not NAME=VALUE with NAME one of experiments, wall, tokens, turns, cost, looks"
            )
        field = _BUDGET_KEYS[key]
        m = re.fullmatch(r"([0-9.]+)([smhk]?)", raw)
        if m is None:
            raise UserError(f"--budget: '{raw}' is not a number (e.g. 8, 30m, 200k)")
        value = float(m.group(1))
        if field == "wall_s":
            value *= _UNITS.get(m.group(2) or "s", 1.0)
        elif m.group(2) == "k":
            value *= 1000
        elif m.group(2):
            raise UserError(f"--budget: unit '{m.group(2)}' does not apply to {key}")
        out[field] = int(value) if field in ("experiments", "tokens", "turns", "looks") else value
    return out


def parse_params(items: list[str]) -> dict[str, str]:
    """`--param NAME=VALUE` options as overrides for `experiments.arms.effective_params` (which
    converts each value to its default's type). A malformed item is a UserError."""
    params: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--param {item!r}: expected NAME=VALUE")
        params[name.strip()] = value.strip()
    return params
