"""Reproducing corruption under load on the live server, and what the measurements say about it.

`diagnose_corruption(harness, arm)`: the same seeded requests served at the task's concurrency and
one at a time, each output compared with its prompt and output scored alone; where in the
outputs the corruption starts; and what the server's own memory checks logged meanwhile (SGLang
checks its KV pools whenever it is idle and logs double frees and use-after-free of KV pages).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from infra_agent.judgement.intervals import poisson_upper
from infra_agent.tasks.diagnose import DIAGNOSE_SEED, Diagnosis, Localization

POOL_CHECK = re.compile(r"double free|use-after-free|memory leak|leak detected", re.IGNORECASE)


def diagnose_corruption(harness: Any, arm: Any) -> Diagnosis:
    server = harness.server(arm)
    log_before = len(server.log_path.read_text(errors="replace").splitlines())
    loaded = harness.serve(arm, DIAGNOSE_SEED)
    alone = harness.serve(arm, DIAGNOSE_SEED, concurrency=1)
    bad_loaded, bad_alone = harness.corrupted(loaded), harness.corrupted(alone)
    n = len(loaded)
    rate, ucb = 1e3 * len(bad_loaded) / n, 1e3 * poisson_upper(len(bad_loaded)) / n
    lines = server.log_path.read_text(errors="replace").splitlines()[log_before:]
    checks = [line.strip() for line in lines if POOL_CHECK.search(line)]
    positions = Counter(s.worst_position for s in bad_loaded)
    limit = float(harness.params["corruption_nats"])
    clean_shift = max((s.max_shift_nats for s in loaded if s not in bad_loaded), default=0.0)
    needs_load = len(bad_loaded) > 0 and not bad_alone
    if checks:
        stage = "KV cache slots: the server's pool check finds pages freed while still in use"
    elif needs_load:
        stage = "KV cache slots shared between requests in flight (only with concurrency)"
    else:
        stage = None
    return Diagnosis(
        reproduced=len(bad_loaded) > 0,
        symptom=f"{len(bad_loaded)} of {n} requests served together ({rate:.1f} per 1k, 95% "
        f"upper bound {ucb:.1f}) returned distributions that their own tokens scored alone do "
        f"not give (log-probs moved > {limit} nats); served one at a time: {len(bad_alone)} of {len(alone)}",
        measured={
            "corrupted_per_1k": rate,
            "corruption_ucb_per_1k": ucb,
            "corrupted_alone": float(len(bad_alone)),
            "clean_max_shift_nats": clean_shift,
            "pool_check_lines": float(len(checks)),
        },
        localization=Localization(
            stage=stage,
            detail="corruption appears only when requests are in flight together"
            if needs_load
            else "",
        ),
        evidence=[
            f"largest log-prob shift among clean requests: {clean_shift:.4f} nats (threshold "
            f"{limit})",
            "first corrupted output position: "
            + (", ".join(f"{p}: {c}" for p, c in sorted(positions.items())[:8]) or "none"),
            *(f"server log: {line[:200]}" for line in checks[:4]),
        ],
        instruments=["load vs alone rescoring", "server pool checks (log)"],
    )
