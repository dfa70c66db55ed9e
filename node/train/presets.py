"""Model shapes by family: ``tiny`` for CPU tests up to the published Llama and Gemma
shapes. Each becomes a transformers config (see ``model.hf_config``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Preset:
    family: str  # llama | gemma (what the recipe names)
    name: str
    arch: str  # llama | gemma | gemma2 (which transformers model class)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position: int = 8192
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    description: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Preset:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _llama(name, v, d, layers, heads, kv, inter, desc, *, tie=False, theta=500000.0):
    return Preset(
        "llama",
        name,
        "llama",
        v,
        d,
        layers,
        heads,
        kv,
        d // heads,
        inter,
        rope_theta=theta,
        rms_norm_eps=1e-5,
        tie_embeddings=tie,
        description=desc,
    )


def _gemma(name, v, d, layers, heads, kv, hd, inter, desc, *, arch="gemma"):
    return Preset(
        "gemma",
        name,
        arch,
        v,
        d,
        layers,
        heads,
        kv,
        hd,
        inter,
        tie_embeddings=True,
        description=desc,
    )


_ALL = (
    _llama("tiny", 1024, 64, 2, 4, 2, 256, "CPU tests: 2 layers, d=64", theta=10000.0),
    _llama("small", 8192, 512, 8, 8, 4, 1408, "32M parameters: 8 layers, d=512", theta=10000.0),
    _llama("llama3.2-1b", 128256, 2048, 16, 32, 8, 8192, "Llama 3.2 1B shape", tie=True),
    _llama("llama3.2-3b", 128256, 3072, 28, 24, 8, 8192, "Llama 3.2 3B shape", tie=True),
    _llama("llama3-8b", 128256, 4096, 32, 32, 8, 14336, "Llama 3 8B shape"),
    _llama("llama3-70b", 128256, 8192, 80, 64, 8, 28672, "Llama 3 70B shape"),
    _llama("llama3.1-405b", 128256, 16384, 126, 128, 8, 53248, "Llama 3.1 405B shape"),
    _gemma("tiny", 1024, 64, 2, 4, 1, 16, 256, "CPU tests: 2 layers, d=64"),
    _gemma("small", 8192, 512, 8, 8, 1, 64, 2048, "34M parameters: 8 layers, d=512"),
    _gemma("gemma-2b", 256000, 2048, 18, 8, 1, 256, 16384, "Gemma 2B shape"),
    _gemma("gemma-7b", 256000, 3072, 28, 16, 16, 256, 24576, "Gemma 7B shape"),
    _gemma("gemma2-2b", 256000, 2304, 26, 8, 4, 256, 9216, "Gemma 2 2B shape", arch="gemma2"),
    _gemma("gemma2-9b", 256000, 3584, 42, 16, 8, 256, 14336, "Gemma 2 9B shape", arch="gemma2"),
    _gemma("gemma2-27b", 256000, 4608, 46, 32, 16, 128, 36864, "Gemma 2 27B shape", arch="gemma2"),
)

# PRESETS[family][name] -> Preset
PRESETS: dict[str, dict[str, Preset]] = {}
for _p in _ALL:
    PRESETS.setdefault(_p.family, {})[_p.name] = _p


def get_preset(family: str, name: str) -> Preset:
    try:
        return PRESETS[family][name]
    except KeyError:
        names = ", ".join(PRESETS.get(family, {})) or "(unknown family)"
        raise ValueError(f"no {family} model preset {name!r}; choose one of: {names}") from None


def param_count(preset: Preset | str, family: str = "llama") -> int:
    """Parameters of the transformers model built from ``preset`` (a Preset or a name)."""
    p = preset if isinstance(preset, Preset) else get_preset(family, preset)
    d, hd = p.hidden_size, p.head_dim
    attn = d * p.num_heads * hd * 2 + d * p.num_kv_heads * hd * 2
    mlp = 3 * d * p.intermediate_size
    norms = (4 if p.arch == "gemma2" else 2) * d
    total = p.num_layers * (attn + mlp + norms) + d + p.vocab_size * d
    if not p.tie_embeddings:
        total += p.vocab_size * d
    return total


def matmul_param_count(p: Preset) -> int:
    """N of the MFU formula: parameters in matmuls (all but the input embedding lookup)."""
    n = param_count(p)
    return n if p.tie_embeddings else n - p.vocab_size * p.hidden_size
