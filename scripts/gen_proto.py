"""Regenerates the protobuf and gRPC Python modules (with .pyi stubs) from proto/ into an output root.

Usage: python scripts/gen_proto.py [OUT_ROOT]   (default: the repository root, so files land in mwms/v1/)
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def generate(out_root: Path) -> list[Path]:
    """Generates code for every .proto under proto/ into out_root and returns the written files."""
    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the message above")
    written = []
    for source in sources:
        package_dir = out_root / Path(source).parent
        for parent in [package_dir, *package_dir.relative_to(out_root).parents]:
            init = out_root / parent / "__init__.py" if parent != Path(".") else None
            if init is not None and not init.exists():
                init.write_text("")
        written.extend(sorted(package_dir.glob(Path(source).stem + "_pb2*")))
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for path in generate(out):
        print(path.relative_to(out))
