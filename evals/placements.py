"""Where an eval's attempts ran on a Ray cluster, for its report: each node with its hardware
and what ran there, and each attempt retried after a lost node."""

from __future__ import annotations

import html
from pathlib import Path

from pydantic import BaseModel, Field

from infra_agent.evals.metrics import EvalSummary
from infra_agent.evals.records import Placement


class NodeUse(BaseModel):
    """One node as the report shows it."""

    node_id: str
    node: str
    hardware: str
    """'<CPU model>, N cores, M GiB, GPUs' as the node reported it."""
    ray_resources: str
    """What the node offered Ray: 'CPU 2, GPU 0, memory 12.0 GiB, large_node 1'."""
    tries: dict[str, int] = Field(default_factory=dict)
    """Tries that ran there, by how they ended (finished, lost, failed, cancelled)."""


def _tries(summary: EvalSummary) -> list[tuple[dict[str, object], Placement]]:
    return [
        (a, Placement.model_validate(p)) for a in summary.attempts for p in a.get("placements", [])
    ]


def _hardware(p: Placement) -> str:
    h = p.hardware
    if h is None:
        return "-"
    gpus = f", {len(h.gpus)} GPU(s): {', '.join(sorted(set(h.gpus)))}" if h.gpus else ", no GPU"
    memory = f", {h.memory_gib:.1f} GiB" if h.memory_gib else ""
    return f"{h.cpu or 'CPU unknown'}, {h.cpu_count or '?'} cores{memory}{gpus}"


def _resources(p: Placement) -> str:
    shown = []
    for key, value in sorted(p.ray_resources.items()):
        if key.startswith("node:") or key.endswith("_group"):
            continue  # Ray's per-node bookkeeping resources
        if key in ("memory", "object_store_memory"):
            shown.append(f"{key} {value / (1 << 30):.1f} GiB")
        else:
            shown.append(f"{key} {value:g}")
    return ", ".join(shown) or "-"


def node_uses(summaries: list[EvalSummary]) -> list[NodeUse]:
    """Each node any try started on, in order of first use."""
    nodes: dict[str, NodeUse] = {}
    for s in summaries:
        for _, p in _tries(s):
            if not p.node_id:
                continue
            use = nodes.setdefault(p.node_id, NodeUse(node_id=p.node_id, node=p.node,
                                   hardware=_hardware(p), ray_resources=_resources(p)))  # fmt: skip
            use.tries[p.outcome] = use.tries.get(p.outcome, 0) + 1
    return list(nodes.values())


def retried_lines(summary: EvalSummary) -> list[str]:
    """One line per attempt that needed more than one try: where it was lost, where it went on."""
    out = []
    for a in summary.attempts:
        tries = [Placement.model_validate(p) for p in a.get("placements", [])]
        for lost, after in zip(tries, tries[1:], strict=False):
            out.append(
                f"{Path(str(a['task'])).name} attempt {a['index']}: {lost.outcome} on "
                f"{lost.node_id[:8] or '?'} ({lost.detail or 'no detail'}); retried on "
                f"{after.node_id[:8] or '(not started)'} from experiment {after.from_experiments + 1}"
                f", {after.outcome}"
            )
    return out


def nodes_html(summaries: list[EvalSummary]) -> str:
    """The report's 'Nodes' and 'Retried' sections ('' when every attempt ran locally)."""
    uses = node_uses(summaries)
    if not uses:
        return ""
    e = html.escape
    body = "".join(
        f"<tr><td>{e(u.node_id[:8])}</td><td>{e(u.node)}</td><td>{e(u.hardware)}</td>"
        f"<td>{e(u.ray_resources)}</td>"
        f"<td>{e(', '.join(f'{n} {k}' for k, n in u.tries.items()))}</td></tr>"
        for u in uses
    )
    retried = "".join(f"<li>{e(line)}</li>" for s in summaries for line in retried_lines(s))
    return (
        "<h2>Nodes</h2><table id='nodes'><thead><tr><th>node</th><th>host</th><th>hardware</th>"
        f"<th>offered to Ray</th><th>tries</th></tr></thead><tbody>{body}</tbody></table>"
        + (f"<h2>Retried</h2><ul id='retried'>{retried}</ul>" if retried else "")
    )
