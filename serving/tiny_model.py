"""A tiny Llama-architecture model generated locally: no hub access is needed or used.

`write_tiny_model(folder, seed=0)` writes `config.json`, a tokenizer trained here with the
`tokenizers` library on a synthetic ASCII corpus (`tokenizer.json`, `tokenizer_config.json`),
and, unless `weights=False`, seeded random weights in `model.safetensors` (written with numpy; no
safetensors package needed). Without weights the server runs with `--load-format dummy`.

Why real random weights by default: SGLang's dummy weights are uniform in +-1e-3, so every
next-token distribution is almost exactly uniform and a log-probability comparison between two
arms carries no information. Seeded weights at a realistic scale (logit std ~1.5) give peaked,
reproducible distributions that the accuracy gate can compare.

The vocabulary is ASCII words and pieces (Metaspace, no byte fallback), so random tokens decode
to clean text: garbled characters in an output point at the server, not at the model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

VOCAB_SIZE = 1024
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 352
MAX_POSITIONS = 8192
SPECIAL = ["<unk>", "<s>", "</s>"]

_WORDS = (
    "def return import from class self if else elif for while in not and or is None True False "
    "async await yield lambda with as try except finally raise assert pass break continue global "
    "print len range list dict set tuple str int float bool open read write path file line text "
    "request response server client model token cache prefix decode prefill batch kernel tensor "
    "layer attention scheduler queue memory page block thread lock event stream graph shape size "
    "the a an of to and that this it on at by be are was were has have had do does did can will "
    "value index count total result error status config args kwargs data item key name type "
    "test check assert equal greater less start stop begin end first last next previous run time"
).split()
_SYMBOLS = ["(", ")", "[", "]", "{", "}", ":", ",", ".", "=", "==", "+", "-", "*", "/", "->", "_"]


def corpus(seed: int = 0, lines: int = 4000) -> list[str]:
    """Deterministic synthetic code-and-prose lines (ASCII only) to train the tokenizer on."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        parts = [
            rng.choice(_WORDS) if rng.random() < 0.8 else rng.choice(_SYMBOLS) for _ in range(n)
        ]
        if rng.random() < 0.3:
            parts.append(str(rng.randint(0, 999)))
        out.append(" ".join(parts))
    return out


def train_tokenizer(seed: int = 0, vocab_size: int = VOCAB_SIZE):  # -> tokenizers.Tokenizer
    """A BPE tokenizer trained on `corpus(seed)`, Metaspace pre-tokenizer and decoder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False, min_frequency=1
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    # Pad to the exact size so the embedding table and the vocabulary agree.
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_tokens([f"w{i}" for i in range(missing)])
    return tok


def config(vocab_size: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def random_weights(vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 weights named as HF Llama checkpoints name them."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": normal((vocab_size, HIDDEN), 1.0),
        "model.norm.weight": np.ones(HIDDEN, np.float32),
        # std 1.5/sqrt(hidden): logits after the final RMSNorm have std ~1.5 (peaked, not uniform)
        "lm_head.weight": normal((vocab_size, HIDDEN), 1.5 / HIDDEN**0.5),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        std = 1.0 / HIDDEN**0.5
        w[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        w[p + "self_attn.q_proj.weight"] = normal((HEADS * head_dim, HIDDEN), std)
        w[p + "self_attn.k_proj.weight"] = normal((KV_HEADS * head_dim, HIDDEN), std)
        w[p + "self_attn.v_proj.weight"] = normal((KV_HEADS * head_dim, HIDDEN), std)
        w[p + "self_attn.o_proj.weight"] = normal((HIDDEN, HEADS * head_dim), std)
        w[p + "mlp.gate_proj.weight"] = normal((INTERMEDIATE, HIDDEN), std)
        w[p + "mlp.up_proj.weight"] = normal((INTERMEDIATE, HIDDEN), std)
        w[p + "mlp.down_proj.weight"] = normal((HIDDEN, INTERMEDIATE), 1.0 / INTERMEDIATE**0.5)
    return w


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors format: u64 header length, JSON header (dtype, shape, offsets), raw data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


def write_tiny_model(folder: Path, *, seed: int = 0, weights: bool = True) -> Path:
    """Write the model folder (idempotent for the same seed) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / ".tiny-model"
    want = json.dumps({"seed": seed, "weights": weights, "vocab": VOCAB_SIZE, "layers": LAYERS})
    if stamp.is_file() and stamp.read_text() == want:
        return folder
    tok = train_tokenizer(seed)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": MAX_POSITIONS,
                "add_bos_token": True,
                "clean_up_tokenization_spaces": False,
            },
            indent=1,
        )
    )
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )
    (folder / "config.json").write_text(json.dumps(config(tok.get_vocab_size()), indent=1))
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2})
    )
    target = folder / "model.safetensors"
    if weights:
        write_safetensors(target, random_weights(tok.get_vocab_size(), seed))
    elif target.exists():
        target.unlink()
    stamp.write_text(want)
    return folder
