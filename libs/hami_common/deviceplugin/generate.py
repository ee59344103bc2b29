"""Generate the Python stubs of the device plugin API from ``v1beta1.proto`` with grpcio-tools.

``python -m hami_common.deviceplugin.generate`` writes ``api_pb2.py``, ``api_pb2.pyi`` and ``api_pb2_grpc.py``
beside this file (the root Makefile runs it before the tests; the files are build output, ignored by
git). ``--out DIR`` writes them elsewhere, which is how a test checks that the installed ones are fresh.
The proto is compiled as ``hami_common/deviceplugin/api.proto`` so the generated modules import each other by
their package path; the wire names come from ``package v1beta1`` and do not depend on the file name.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from grpc_tools import protoc

__all__ = ["GENERATED", "PROTO", "generate", "main"]

HERE: Final = Path(__file__).resolve().parent
PROTO: Final = HERE / "v1beta1.proto"
PACKAGE_DIR: Final = Path("hami_common") / "deviceplugin"
GENERATED: Final = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
# Generated code is not ours to lint: the gRPC plugin emits untyped Python (typed callers go through
# hami_common.deviceplugin.rpc) and the .pyi leaves generic Mappings bare.
_HEADER: Final = "# mypy: ignore-errors\n# ruff: noqa\n"


def render() -> dict[str, str]:
    """The generated files' contents, by file name."""
    with tempfile.TemporaryDirectory(prefix="protos") as tmp:
        source_root, out = Path(tmp) / "in", Path(tmp) / "out"
        (source_root / PACKAGE_DIR).mkdir(parents=True)
        out.mkdir()
        shutil.copyfile(PROTO, source_root / PACKAGE_DIR / "api.proto")
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{source_root}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                str(PACKAGE_DIR / "api.proto"),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit status {rc} on {PROTO.name}")
        texts = {name: (out / PACKAGE_DIR / name).read_text() for name in GENERATED}
    return {name: _HEADER + text for name, text in texts.items()}


def generate(out_dir: Path = HERE) -> list[Path]:
    """Write the stubs into ``out_dir``; files already up to date are left untouched."""
    written = []
    for name, text in render().items():
        target = out_dir / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write the stubs into")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in generate(args.out):
        print(f"generated {path.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
