"""``python -m node.export --checkpoint DIR --out DIR --info JSON``: write ``--out``
(which must not exist yet) from the DCP checkpoint. Exit 0 done, 3 the checkpoint
cannot be exported (last stderr line: why), 1 a crash (a traceback)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import EXIT_EXPORT_ERROR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node.export")
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--info", default="{}", help="provenance saved beside (JSON object)")
    args = parser.parse_args(argv)
    from .hf import ExportError, checkpoint_export  # torch and transformers

    try:
        summary = checkpoint_export(
            checkpoint=args.checkpoint, out_dir=args.out, info=json.loads(args.info)
        )
    except ExportError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_EXPORT_ERROR
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
