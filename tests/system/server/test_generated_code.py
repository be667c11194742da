"""The committed protobuf/gRPC modules must equal a fresh generation from proto/."""

from __future__ import annotations

import subprocess
import sys

from mwms_testkit import REPO

ROOT = REPO


def test_committed_generated_code_is_fresh(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), str(tmp_path)],
        check=True,
        capture_output=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*"))
    assert generated, "generation produced nothing"
    for rel in generated:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is not committed: run `make proto`"
        assert committed.read_text() == (tmp_path / rel).read_text(), f"{rel} is stale: run `make proto`"
