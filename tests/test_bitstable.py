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

SCRIPT = r"""
import hashlib, json, sys, torch
import gradkern
from gradkern.registry import REGISTRY

def digest(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return hashlib.sha256(x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    return [digest(v) for v in x]

DTYPES = [torch.float32] if sys.argv[1] == "cpu" else [torch.float32, torch.bfloat16]
out = {}
for name in sorted(REGISTRY):
    info = REGISTRY[name]
    for dtype in DTYPES:
        if dtype not in info.dtypes:
            continue
        torch.manual_seed(1234)
        case = info.cases(sys.argv[1], dtype, "tiny")[0]
        out[f"{name} {dtype}"] = digest(info.fn(*case.args, **case.kwargs))
print(json.dumps(out))
"""


def _digest(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return hashlib.sha256(x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    return [_digest(v) for v in x]


def test_same_bits_in_a_fresh_process():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(gradkern.__file__)),
                                                    env.get("PYTHONPATH", "")] if p)
    res = subprocess.run([sys.executable, "-c", SCRIPT, DEVICE], capture_output=True, text=True, env=env,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    fresh = json.loads(res.stdout.strip().splitlines()[-1])
    # the same bits in this process
    for key, want in fresh.items():
        name, dtype_name = key.split(" ")
        dtype = getattr(torch, dtype_name.replace("torch.", ""))
        info = REGISTRY[name]
        torch.manual_seed(1234)
        case = info.cases(DEVICE, dtype, "tiny")[0]
        got = info.fn(*case.args, **case.kwargs)
        assert _digest(got) == want, f"{key}: bits differ from a fresh process"
    assert set(fresh) >= {f"{n} torch.float32" for n in REGISTRY if torch.float32 in REGISTRY[n].dtypes}
