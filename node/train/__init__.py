"""mtc's training runtime: the program that runs on the nodes.

Django-free on purpose (only torch, transformers, tokenizers, numpy, pyarrow and
tensorboard).
Started by the recipe's batch script, one torchrun per node::

    python -m torch.distributed.run --nnodes=N --node-rank=R --nproc-per-node=G \\
        --master-addr=HOST --master-port=PORT \\
        -m node.train.train --config /abs/run/dir/run.json

or as one plain process (world size 1). Modules, one concern each:

- ``config``      run.json → ``RunConfig`` (defaults, validation)
- ``presets``     model shapes (tiny … Llama 3 70B, Gemma 7B) and ``param_count``
- ``tokenizer``   a byte-level BPE trained locally on the run's text, cached in run_dir
- ``corpus``      documents of text, JSONL, Parquet, Arrow (stdlib sources by default)
- ``shards``      tokens on disk: pre-tokenized shard sets, the run's parallel token cache,
                  ``python -m node.train.shards tokenize`` (``mtc data tokenize``)
- ``data``        the sample order, the token cache's name
- ``tasks``       generated arithmetic with checkable answers; prompt/response JSONL
- ``model``       transformers Llama/Gemma, FSDP2 units, activation checkpointing, compile
- ``loss``        cross-entropy through lm_head in checkpointed chunks of tokens
- ``checkpoint``  torch.distributed.checkpoint saves, atomic, with resume discovery
- ``metrics``     metrics.jsonl + TensorBoard, tokens/s and MFU
- ``pretrain`` / ``sft`` / ``rl``  what one optimizer step computes for each recipe
- ``start``       where a run starts (resume / init_from / scratch) and its setup
- ``train``       the entry point and the loop

MFU (model FLOPs utilisation), as in the PaLM paper, appendix B::

    FLOPs per token = 6 * N + 12 * n_layers * (n_heads * head_dim) * seq_len
    MFU = tokens/s * FLOPs per token / peak FLOP/s of the devices used

N counts the parameters that take part in matmuls (every parameter except the input
embedding table, which is a lookup; a tied embedding counts once, as the output
projection). 6N is forward + backward of the dense layers, the second term the causal
attention scores and values. n_heads * head_dim is d_model for Llama. Peak FLOP/s per
device: dense BF16 by GPU model (``metrics.GPU_PEAK_FLOPS``, with NVIDIA's sources); on CPU
``MTC_PEAK_FLOPS`` (per process) or an *estimate* of 1e11 FLOP/s per core used.
"""
