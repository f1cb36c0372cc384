"""The output health guard: each rule fires on what it names and stays quiet on healthy text."""

import random

from infra_agent.feedback.health import (
    HealthRules,
    StreamGuard,
    check_output,
    compare_health,
    find_loop,
    score_outputs,
)


def healthy_ids(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1024) for _ in range(n)]


def test_random_tokens_are_healthy() -> None:
    for seed in range(20):
        ids = healthy_ids(256, seed)
        assert check_output("def return cache prefix " * 3, ids).healthy


def test_repetition_loop_is_found_with_its_period() -> None:
    ids = healthy_ids(20) + [7, 8, 9] * 30
    result = check_output("x", ids)
    assert [i.rule for i in result.issues] == ["repetition_loop"]
    period, span, start = find_loop(ids, HealthRules())  # type: ignore[misc]
    assert period == 3 and span == 90 and start == 20


def test_short_repeats_are_not_loops() -> None:
    ids = healthy_ids(30) + [5] * 10 + healthy_ids(30, 1)
    assert check_output("x", ids).healthy


def test_loop_on_text_without_token_ids() -> None:
    assert not check_output("the cache " * 20).healthy
    assert check_output("the cache is warm and the queue is short").healthy


def test_garbled_text() -> None:
    garbled = "ok \ufffd\x01\x02 text \ue000\ufffd"
    result = check_output(garbled, None)
    assert [i.rule for i in result.issues] == ["garbled_text"]
    assert check_output(
        "plain ascii, one \ufffd in a line long enough: " + " ".join(map(str, range(40)))
    ).healthy
    # With a known alphabet, rare characters count as bad.
    rules = HealthRules(alphabet="abcdefghijklmnopqrstuvwxyz ")
    assert not check_output("abc ЖЖЖ def", rules=rules).healthy


def test_spec_rules_follow_the_public_thresholds() -> None:
    ids = healthy_ids(200)
    low = check_output("x", ids, {"spec_accept_length": 1.2})
    assert [i.rule for i in low.issues] == ["spec_low_accept_length"]
    # Below 128 generated tokens the accept length is not judged yet.
    assert check_output("x", ids[:100], {"spec_accept_length": 1.2}).healthy
    assert check_output("x", ids, {"spec_accept_length": 2.7}).healthy
    high = check_output("x", ids, {"spec_accept_length": 3.0, "spec_accept_rate": 0.98})
    assert [i.rule for i in high.issues] == ["spec_high_accept_rate"]
    derived = check_output("x", ids, {"spec_accept_token_num": 97, "spec_draft_token_num": 100})
    assert [i.rule for i in derived.issues] == ["spec_high_accept_rate"]


def test_stream_guard_aborts_once_on_a_loop() -> None:
    guard = StreamGuard()
    trips = []
    for chunk in [healthy_ids(16)] + [[4, 5]] * 40:
        issue = guard.feed(token_ids=chunk)
        if issue:
            trips.append((len(guard.token_ids), issue.rule))
    assert len(trips) == 1
    assert trips[0][1] == "repetition_loop"
    assert trips[0][0] < 16 + 80  # caught before the stream ended


def test_stream_guard_spec_rule_waits_for_128_tokens() -> None:
    guard = StreamGuard()
    ids = healthy_ids(300)
    tripped_at = None
    for i in range(0, 300, 10):
        if guard.feed(token_ids=ids[i : i + 10], meta={"spec_accept_length": 1.1}):
            tripped_at = len(guard.token_ids)
            break
    assert tripped_at == 130


def test_compare_health_names_the_rule_and_ignores_a_chance_trip() -> None:
    healthy = [("t", healthy_ids(100, s), None) for s in range(40)]
    base = score_outputs(healthy)
    looping = score_outputs(healthy[:20] + [("t", [1, 2] * 50, None)] * 20)
    problems = compare_health(base, looping)
    assert len(problems) == 1 and "repetition_loop" in problems[0] and "20/40" in problems[0]
    one_trip = score_outputs(healthy[:39] + [("t", [1, 2] * 50, None)])
    assert compare_health(base, one_trip) == []
    assert compare_health(looping, looping) == []
    assert base.as_health()["unhealthy"] == 0 and "unhealthy" in looping.render()


def test_loops_in_short_outputs_are_found_relative_to_their_length() -> None:
    rules = HealthRules()
    assert [rules.loop_span(n) for n in (16, 32, 96, 400)] == [8, 16, 48, 48]
    # 16 tokens: a quarter generated, the rest one repeated token (the padding cheat).
    padded = healthy_ids(4) + [9] * 12
    assert [i.rule for i in check_output("x", padded).issues] == ["repetition_loop"]
    # 32 tokens: 8 generated, then the same 8 three more times.
    block = healthy_ids(8, 3)
    assert not check_output("x", block * 4).healthy
    # Healthy short outputs stay healthy: random tokens, and a short repeat inside one.
    for seed in range(200):
        assert check_output("x", healthy_ids(16, seed)).healthy
    assert check_output("x", healthy_ids(10) + [5] * 6).healthy  # 6 < 8 tokens
    # The online guard keeps the absolute span: a stream is not cut at its first few repeats.
    guard = StreamGuard()
    assert guard.feed(token_ids=healthy_ids(4) + [9] * 12) is None
