"""Secret redaction: known env values, provider key shapes, headers; no damage to ordinary text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra_agent.redact import REDACTED, Redactor, redact_text, secret_env_values


@pytest.mark.parametrize(
    "text, secret",
    [
        ("Authorization: Bearer abcdefghijklmnop123", "abcdefghijklmnop123"),
        ("curl -H 'authorization: Basic dXNlcjpwYXNzd29yZA=='", "dXNlcjpwYXNzd29yZA=="),
        ("key sk-proj-4f9Qm2LxZr7TbN1vW8yKc3Hd here", "sk-proj-4f9Qm2LxZr7TbN1vW8yKc3Hd"),
        ("ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
        ("HF hf_QwErTyUiOpAsDfGhJkLzXcVbNm12345678.", "hf_QwErTyUiOpAsDfGhJkLzXcVbNm12345678"),
        ("aws AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
        (
            "zai 0123456789abcdef0123456789abcdef.AbCdEfGhIjKlMnOp",
            "0123456789abcdef0123456789abcdef.AbCdEfGhIjKlMnOp",
        ),
        ("postgres://admin:s3cr3tpass@db:5432/x", "s3cr3tpass"),
        ('{"api_key": "my-api-key-value-1"}', "my-api-key-value-1"),
        ("OPENAI_API_KEY=abc.def-ghi-jkl", "abc.def-ghi-jkl"),
        ("password = 'p4ssw0rd!x'", "p4ssw0rd!x"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
    ],
)
def test_shapes_are_redacted(text: str, secret: str) -> None:
    out = Redactor().text(text)
    assert secret not in out
    assert REDACTED in out


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens: 4096",
        "the token embeddings are cached per layer",
        "tokenizer: meta-llama/Llama-3.1-8B",
        "speedup 1.62x (95% CI 1.55-1.70), key-value cache hit 90%",
        "patch sha " + "a" * 64,
        '{"prompt_tokens": 900, "num_tokens": "123456"}',
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert Redactor().text(text) == text


def test_env_values_by_name_pattern_including_json_escaped_form() -> None:
    env = {"MY_SERVICE_TOKEN": 'v4lue"with\\quote', "PATH": "/usr/bin:/bin", "SHORT_KEY": "abc"}
    values = secret_env_values(["*TOKEN*", "*KEY*"], env)
    assert values == ['v4lue"with\\quote']  # PATH does not match; 3 characters are too short
    redactor = Redactor(values)
    assert redactor.text('x v4lue"with\\quote y') == f"x {REDACTED} y"
    as_json = json.dumps({"note": 'v4lue"with\\quote'})
    assert "v4lue" not in redactor.text(as_json)
    assert json.loads(redactor.text(as_json)) == {"note": REDACTED}  # still valid JSON


def test_tree_redacts_values_of_secret_named_keys_and_nested_strings() -> None:
    tree = {
        "db_password": "hunter2hunter2",
        "max_tokens": 4096,
        "args": ["Bearer abcdefghijklmn"],
        "n": 1.5,
    }
    out = Redactor().tree(tree)
    assert out == {
        "db_password": REDACTED,
        "max_tokens": 4096,
        "args": [f"Bearer {REDACTED}"],
        "n": 1.5,
    }


def test_redact_text_uses_the_current_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_SECRET", "plain-value-0001")
    assert redact_text("got plain-value-0001 back") == f"got {REDACTED} back"
    monkeypatch.setenv("ACME_SECRET", "plain-value-0002")  # a changed value is picked up
    assert redact_text("got plain-value-0002 back") == f"got {REDACTED} back"


@pytest.mark.parametrize(
    "text",
    [
        'say "Authorization: Bearer abcdefghijklmnop" twice',
        'api_key="sk-proj-4f9Qm2LxZr7TbN1vW8yKc3Hd"\nnext line\\ with backslash',
        "-----BEGIN PRIVATE KEY-----\nMIIEow\nno end marker",
        'password: "p4ssw0rd!x"\t{"token": "abcdef123456"}',
        "postgres://admin:s3cr3tpass@db/x and 0123456789abcdef0123456789abcdef.AbCdEfGhIjKlMnOp",
    ],
)
def test_redacting_a_json_document_keeps_it_json_and_matches_per_string(text: str) -> None:
    redactor = Redactor()
    doc = {"content": text, "nested": [{"arguments": text}], "n": 3}
    fast = json.loads(redactor.json(doc))  # must parse: the one-pass path was taken
    assert fast == {
        "content": redactor.text(text),
        "nested": [{"arguments": redactor.text(text)}],
        "n": 3,
    }
    assert REDACTED in fast["content"]


def test_store_writers_redact_every_record(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from infra_agent.store import open_store
    from infra_agent.store.records import DecisionAction, DecisionRecord, ExperimentRecord
    from infra_agent.store.verdict import Evidence, ExperimentResult, Verdict

    monkeypatch.setenv("VENDOR_TOKEN", "tok-0000-plain-1111")
    result = ExperimentResult(
        task="t", patch_id="p", verdict=Verdict.FAILED, reasons=["crashed: tok-0000-plain-1111"],
        evidence=Evidence(log_tail="HTTP 401 Authorization: Bearer abcdefghijklmnopq", extra={"note": "x"}),
    )  # fmt: skip
    store = open_store(tmp_path / "runs.db")
    store.put_experiment(written := ExperimentRecord(task="t", patch_id="p", result=result))
    exp = store.get_experiment(written.id)
    assert exp is not None
    assert (
        exp.result.reasons == [f"crashed: {REDACTED}"]
        and "abcdefghijklmnopq" not in exp.result.evidence.log_tail
    )
    assert exp.result.evidence.extra == {"note": "x"} and exp.patch_id == "p"
    decision = DecisionRecord(proposal_id="x", reviewer="r", action=DecisionAction.REJECT, patch_hash="h",
                              comment="my key is sk-proj-4f9Qm2LxZr7TbN1vW8yKc3Hd")  # fmt: skip
    store.add_decision(decision)
    assert store.decisions("x")[0].comment == f"my key is {REDACTED}"


# -- the batch gate: an RE2 superset of the exact rules ---------------------------------------
_SHAPE_TEXTS = [
    "Authorization: Bearer abcdefghijklmnop123",
    "curl -H 'authorization: Basic dXNlcjpwYXNzd29yZA=='",
    "x-api-key: 0123456789abcdef",
    "key sk-proj-4f9Qm2LxZr7TbN1vW8yKc3Hd here",
    "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
    "HF hf_QwErTyUiOpAsDfGhJkLzXcVbNm12345678.",
    "xoxb-1234567890-abcdefghij",
    "aws AKIAIOSFODNN7EXAMPLE and ASIAIOSFODNN7EXAMPLE",
    "AIzaSyA-1234567890abcdefghijklmnopqrstu",
    "zai 0123456789abcdef0123456789abcdef.AbCdEfGhIjKlMnOp",
    "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib3QifQ.c2lnbmF0dXJl",
    "postgres://admin:s3cr3tpass@db:5432/x",
    '{"api_key": "my-api-key-value-1"}',
    '{\\"db_password\\": \\"hunter2hunter2\\"}',
    "OPENAI_API_KEY=abc.def-ghi-jkl",
    "password = 'p4ssw0rd!x'",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "TOKEN:\u00a0abcdefgh",  # Python's \s includes no-break space; RE2's \s does not
    "Bearer\u3000abcdefghijk",
    "to\u212aen: abcdefgh",  # KELVIN SIGN lower-cases to 'k'
    "secret\u2028=\u2028abcdefgh",
    "max_tokens: 4096",
    "the token embeddings are cached per layer",
    "task-0123456789abcdefghij",
]
_FRAGMENTS = [
    "token", "TOKEN", "Secret", "passwd", "api_key", "api-key", "credentials", "bearer", "Bearer",
    "authorization", "sk-", "ghp_", "hf_", "xoxb-", "AKIA", "AIza", "eyJ", "://", "u:p@", ".",
    "-----BEGIN PRIVATE KEY-----", '"', "'", '\\"', ":", "=", " ", "\t", "\n", "\u00a0", "\u2009",
    "\u212a", "0123456789abcdef", "ABCDEFGHIJKLMNOP", "abcdefgh", "12345678", "_", "-", ",", "{",
    "é", "İ", "zq8-plain-looking-value-4471",
]  # fmt: skip


def _gate_matches(redactor: Redactor, texts: list[str]) -> list[bool]:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.match_substring_regex(pa.array(texts), redactor.gate).to_pylist()  # type: ignore[no-any-return]


def test_gate_space_class_is_exactly_pythons_unicode_whitespace() -> None:
    import re
    import sys

    import pyarrow as pa
    import pyarrow.compute as pc

    from infra_agent.secret_shapes import RE2_SPACE as _RE2_SPACE

    chars = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    python = [re.fullmatch(r"\s", c) is not None for c in chars]
    re2 = pc.match_substring_regex(pa.array(chars), f"^[{_RE2_SPACE}]$").to_pylist()
    assert python == re2


def test_gate_matches_every_string_the_exact_rules_change() -> None:
    """The batch path skips strings the gate does not match, so the gate must be a superset:
    shape examples, Unicode spaces and case folds, and 20,000 random compositions of the shapes'
    parts."""
    import random

    redactor = Redactor(["zq8-plain-looking-value-4471", 'v4lue"with\\quote'])
    rng = random.Random(1234)
    texts = list(_SHAPE_TEXTS) + [
        "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 12))) for _ in range(20_000)
    ]
    texts += [json.dumps(t) for t in texts[:2000]] + ['x v4lue"with\\quote', 'v4lue\\"with']
    changed = [t for t in texts if redactor.text(t) != t]
    assert len(changed) > 1000  # the corpus exercises the rules
    missed = [
        t for t, hit in zip(changed, _gate_matches(redactor, changed), strict=True) if not hit
    ]
    assert missed == []
    # ...and it stays quiet on ordinary text, which is what makes it cheap
    assert (
        _gate_matches(redactor, ["speedup 1.62x", "max_tokens: 4096", "task-3 ok"]) == [False] * 3
    )


def test_gate_follows_case_folding_into_ascii() -> None:
    """Case-insensitive shapes run on text.lower(): every character that lower-cases to an ASCII
    letter must be matched by the gate's case-insensitive literal."""
    import sys

    folds = [
        chr(c)
        for c in range(128, sys.maxunicode + 1)
        if not 0xD800 <= c <= 0xDFFF and len(chr(c).lower()) == 1 and chr(c).lower().isascii()
    ]
    assert folds  # e.g. KELVIN SIGN
    redactor = Redactor()
    for c in folds:
        word = "bearer".replace("e", c.lower()) if c.lower() == "e" else f"to{c}en"
        text = f"{word}: abcdefghijkl" if "to" in word else f"{word} abcdefghijkl"
        if redactor.text(text) != text:
            assert _gate_matches(redactor, [text]) == [True], repr(c)


def test_tables_equal_per_string_redaction() -> None:
    import pyarrow as pa

    redactor = Redactor(["zq8-plain-looking-value-4471"])
    texts = [*_SHAPE_TEXTS, "plain", "", "got zq8-plain-looking-value-4471"]
    messages = pa.list_(pa.struct([("content", pa.string()), ("n", pa.int64())]))
    table = pa.table(
        {
            "messages": pa.array(
                [[{"content": t, "n": i}] for i, t in enumerate(texts)] + [None], messages
            ),
            "text": pa.array([*texts, None]),
        }
    )
    out = redactor.table(table)
    assert out.schema == table.schema
    assert out.column("text").to_pylist() == [*map(redactor.text, texts), None]
    assert out.column("messages").to_pylist() == [
        [{"content": redactor.text(t), "n": i}] for i, t in enumerate(texts)
    ] + [None]
    plain = pa.table({"messages": pa.array([[{"content": "ok", "n": 1}]], messages)})
    assert redactor.table(plain) is plain
