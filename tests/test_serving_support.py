"""Shared pieces of the serving tests (no tests here): a tiny causal LM saved the way
the registry exports versions (transformers save_pretrained, safetensors, a fast
tokenizer with a chat template), and registry rows that point at it."""

from __future__ import annotations

from pathlib import Path

import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CORPUS = ["hello world, the quick brown fox jumps over the lazy dog."] * 40


def tiny_model_save(path: Path, *, chat: bool = True) -> Path:
    """A 2-layer Llama with a 300-token byte-level BPE: built here, nothing downloaded."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """Where an export lives (under the data dir, readable by the accounts replicas run
    as), not pytest's tmp dir: that is root's alone (0700)."""
    import shutil
    import tempfile

    from django.conf import settings

    root = Path(settings.DATA_DIR) / "registry"
    root.mkdir(mode=0o711, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="tiny-model-", dir=root))
    path.chmod(0o755)
    tiny_model_save(path)
    for file in path.iterdir():  # safetensors writes 0600; the registry's intake 0644
        file.chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def version_make(export_path: Path, *, name: str = "tiny", number: int = 1, alias: str = ""):
    from registry.models import Model, ModelAlias, ModelVersion, VersionState

    model, _ = Model.objects.get_or_create(name=name)
    version = ModelVersion.objects.create(
        model=model, number=number, state=VersionState.READY, export_path=str(export_path)
    )
    if alias:
        ModelAlias.objects.create(model=model, alias=alias, version=version)
    return version


def redis_forget_serving() -> None:
    """Endpoint ids restart with each test's database: forget earlier tests' traffic."""
    from serving.traffic import redis_client

    client = redis_client()
    keys = list(client.scan_iter("mtc:serving:*"))
    if keys:
        client.delete(*keys)


@pytest.fixture(scope="module")
def replica_server(tiny_model_dir):
    """The replica's HTTP server on a free port in this process (no Slurm job)."""
    import threading

    from node.replica.generation import Generator
    from node.replica.server import ReplicaServer

    token = "test-replica-token"
    server = ReplicaServer(("127.0.0.1", 0), Generator(str(tiny_model_dir), name="tiny@1"), token)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    yield server, token
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
