"""lookup_skeletons ranks by relevance, shows the score, and leaves irrelevant skeletons out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry
from infra_agent.tools.skeletons import load_skeletons, rank_skeletons, relevant_skeletons

DECODE_SPLIT_NORM_QUERIES = [
    find_task("decode-split-norm").manifest.title,
    "every split recomputes the softmax max and denominator over the whole sequence",
]


@pytest.mark.parametrize("query", DECODE_SPLIT_NORM_QUERIES)
def test_the_decode_split_norm_query_ranks_split_k_combine_first(query: str) -> None:
    found = relevant_skeletons(query, load_skeletons(), top_k=7)
    names = [s.name for s, _, _ in found]
    assert names[0] == "split-k-combine", found
    assert "hoist-invariant-normalization" in names  # the weaker fix, ranked below
    assert "ack-before-free" not in names and "serving-batch-knobs" not in names
    ranked = {s.name: score for s, score, _ in rank_skeletons(query, load_skeletons())}
    assert ranked["split-k-combine"] > ranked["hoist-invariant-normalization"]
    assert ranked["ack-before-free"] < 0.15  # below the threshold: left out, not just last


def test_lookup_shows_scores_and_says_when_nothing_is_relevant(tmp_path: Path) -> None:
    ctx = ToolContext(
        task=find_task("decode-split-norm"), store=open_store(tmp_path / "r.db"), run_id="r"
    )
    reg = default_registry()
    result = reg.call("lookup_skeletons", json.dumps({"query": DECODE_SPLIT_NORM_QUERIES[0]}), ctx)
    assert result.content.startswith("relevance ")
    assert result.data is not None and result.data["skeletons"][0] == "split-k-combine"
    assert result.data["scores"] == sorted(result.data["scores"], reverse=True)
    assert "less relevant skeletons left out" in result.content
    none = reg.call("lookup_skeletons", json.dumps({"query": "tokenizer unicode emoji"}), ctx)
    assert none.error is None and none.content.startswith("no skeleton is relevant")
