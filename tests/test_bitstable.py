"""Bit-stability across processes: every registered op, run on the same inputs in a fresh Python process, gives
the same bits as in this one (float32 under the interpreter, float32 and bfloat16 on a GPU): the `bit_stable`
field of every guarantee is checked here, not asserted."""

import hashlib
import json
import os
import subprocess
import sys

import torch

import gradkern
from conftest import DEVICE
from gradkern.registry import REGISTRY

HERE = os.path.dirname(os.path.abspath(__file__))


def _digest(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        flat = x.detach().cpu().contiguous().reshape(-1)  # (0-d results too)
        return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()
    return [_digest(v) for v in x]


def digests(device: str) -> dict:
    """op and dtype -> the digest of the op's result on its first "tiny" example (seeded inputs)."""
    dtypes = [torch.float32] if device == "cpu" else [torch.float32, torch.bfloat16]
    out = {}
    for name in sorted(REGISTRY):
        info = REGISTRY[name]
        for dtype in dtypes:
            if dtype not in info.dtypes:
                continue
            torch.manual_seed(1234)
            case = info.cases(device, dtype, "tiny")[0]
            out[f"{name} {dtype}"] = _digest(info.fn(*case.args, **case.kwargs))
    return out


def test_same_bits_in_a_fresh_process():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(gradkern.__file__)), HERE,
                                                    env.get("PYTHONPATH", "")] if p)
    script = "import json, sys, test_bitstable; print(json.dumps(test_bitstable.digests(sys.argv[1])))"
    res = subprocess.run([sys.executable, "-c", script, DEVICE], capture_output=True, text=True, env=env,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    fresh = json.loads(res.stdout.strip().splitlines()[-1])
    here = digests(DEVICE)
    assert set(fresh) == set(here) and fresh
    for key, want in fresh.items():
        assert here[key] == want, f"{key}: bits differ from a fresh process"
