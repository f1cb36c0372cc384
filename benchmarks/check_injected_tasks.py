"""Every task with a fault (injected, or the engine's own code at declared `[fault] sites`),
checked end to end: `tasks check` (the symptom against the un-injected engine, or `diagnose`'s
where nothing is injected; the reference fix; the wrong fix) and `diagnose` (does the
localization measured on the live server name the fault's module and function?).

    .venv/bin/python benchmarks/check_injected_tasks.py [--tasks a,b] [--skip-check] [--skip-diagnose]
        [--json FILE]

Run it under the machine's heavy-job lock: each task starts several SGLang servers (one
experiment takes minutes on a 2-core machine). The fault's modules and functions are read from
the task's inject.patch (`tasks.sites.fault_sites`: the innermost function around the changed
lines) or its declared sites, never from the harness, and compared with what `diagnose` reports. Prints one table:
each experiment's verdict, ratio, 95% interval and wall time, and the 1-minute load average
before and after each task (the machine's load moves wall times and noise far more than the
code does).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from infra_agent.experiments.check import check_task
from infra_agent.experiments.diagnose import run_diagnosis
from infra_agent.tasks.registry import list_tasks
from infra_agent.tasks.sites import fault_sites, has_fault


def named(localization_function: str | None, sites: set[tuple[str, str]]) -> bool:
    if not localization_function or ":" not in localization_function:
        return False
    module, function = localization_function.split(":", 1)
    return any(
        module.endswith(rel.rsplit("/", 1)[-1]) and rel.endswith(module.rsplit("/", 1)[-1])
        and function.rsplit(".", 1)[-1] == name
        for rel, name in sites
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks", default="", help="Comma-separated names (default: every task with a fault)."
    )
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--skip-diagnose", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="Also write the rows here.")
    args = parser.parse_args()
    wanted = {n for n in args.tasks.split(",") if n}
    tasks = [t for t in list_tasks() if has_fault(t)]
    tasks = [t for t in tasks if not wanted or t.name in wanted]
    rows = []
    for task in tasks:
        row: dict[str, object] = {"task": task.name, "class": task.manifest.fault.failure_class
                                  if task.manifest.fault else ""}  # fmt: skip
        sites = fault_sites(task)
        row["injected"] = sorted(f"{rel}:{fn}" for rel, fn in sites)
        row["load_before"] = round(os.getloadavg()[0], 2)
        if not args.skip_check:
            check = check_task(task, progress=lambda msg, n=task.name: print(f"[{n}] {msg}"))
            row["check"] = check.model_dump(mode="json")
            print(check.render(), flush=True)
        if not args.skip_diagnose:
            started = time.monotonic()
            diagnosis = run_diagnosis(str(task.root))
            row["diagnose_s"] = round(time.monotonic() - started, 1)
            row["diagnosis"] = diagnosis.model_dump(mode="json")
            row["named"] = named(diagnosis.localization.function, sites)
            print(diagnosis.render(), flush=True)
        row["load_after"] = round(os.getloadavg()[0], 2)
        rows.append(row)
    print(
        "\ntask | symptom | reference | wrong fix | baseline | diagnose names the fault | load"
        " | injected"
    )
    for row in rows:
        cells = [str(row["task"])]
        check = row.get("check")
        if isinstance(check, dict):
            for r in check["rows"]:
                cells.append(
                    f"{r['verdict'] or '-'} {r['number'].split(';')[0]}"
                    + (f" [{r['duration_s']:.0f} s]" if r["duration_s"] else "")
                )
        else:
            cells += ["-", "-", "-", "-"]
        diag = row.get("diagnosis")
        cells.append(
            f"{row.get('named')} ({diag['localization']['function']})"
            if isinstance(diag, dict)
            else "-"
        )
        cells.append(f"{row['load_before']}->{row['load_after']}")
        cells.append(", ".join(row["injected"]))  # type: ignore[arg-type]
        print(" | ".join(cells))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
