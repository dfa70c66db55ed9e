"""Exporting a run's final checkpoint to a transformers directory (safetensors).

``python -m node.export --checkpoint DIR --out DIR --info JSON`` runs as the job's
owner (mtc starts it with memory and time limits): loading a DCP checkpoint unpickles
its ``.metadata``, which the owner can write, so it never happens inside mtc. mtc then
takes back only the files it can check without unpickling (``TAKEN_BACK``).

This module imports nothing heavy: mtc reads its constants."""

EXPORT_INFO = "mtc_export.json"
# Exit status for "this checkpoint cannot be exported" (the last stderr line says why).
EXIT_EXPORT_ERROR = 3
# What mtc copies from the directory the export wrote, besides ``*.safetensors``.
TAKEN_BACK = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.json",
        "chat_template.jinja",
        EXPORT_INFO,
    }
)
