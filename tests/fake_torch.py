"""A fake ``torch`` package on disk for the bootstrap tests (not a test module): no GPU can
exist here, so the CUDA surface the replay bootstrap reads is scripted.

``write_fake_torch`` lays out ``site/torch`` (``__init__``, ``_C``, ``cuda``, ``cuda.memory``)
from the sources a test gives; ``CUDA_DEVICE`` is the part most fakes share: lazy init as
torch.cuda does it (calls queued until ``init``) and one 24 GiB device.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

TORCH_INIT = "__version__ = '2.9.1+fake'\nfrom . import cuda, _C\n"
#: an OOM observer hook that ignores its callback
C_NO_OBSERVER = "def _cuda_attach_out_of_memory_observer(cb):\n    pass\n"
CUDA_DEVICE = """
_queued, _init = [], False
def _lazy_call(fn, **kw):
    fn() if _init else _queued.append(fn)
def init():
    global _init
    _init = True
    for fn in _queued:
        fn()
def is_initialized():
    return _init
def device_count():
    return 1
class _P:
    name, total_memory = "Fake", 24 * 1024 ** 3
def get_device_properties(i):
    return _P()
"""


def write_fake_torch(
    root: Path,
    *,
    cuda: str,
    memory: str,
    torch_init: str = TORCH_INIT,
    c_module: str = C_NO_OBSERVER,
) -> Path:
    """``root/site/torch`` from these sources (dedented); returns ``root/site``, the folder to
    put on ``PYTHONPATH``."""
    site = root / "site"
    pkg = site / "torch"
    (pkg / "cuda").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(torch_init))
    (pkg / "_C.py").write_text(textwrap.dedent(c_module))
    (pkg / "cuda" / "__init__.py").write_text(textwrap.dedent(cuda))
    (pkg / "cuda" / "memory.py").write_text(textwrap.dedent(memory))
    return site
