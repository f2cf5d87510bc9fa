"""Every gradkern kernel as a plain function: `gradkern.ops.<name>(...)`, with ATen's names and signatures for
ATen ops. Generated from the registry: an op is declared once, next to its kernel."""

from . import kernels as _kernels  # noqa: F401  (importing declares every op)
from .registry import REGISTRY as _REGISTRY

globals().update({_name: _info.fn for _name, _info in _REGISTRY.items()})
__all__ = sorted(_REGISTRY)
