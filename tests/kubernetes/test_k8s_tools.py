"""The tool-level suite the local backend passes (tests/sandbox/test_tools.py), run here against
the Kubernetes backend: every Leaf tool result, byte for byte, through the pod's exec stream.

The tests are the local suite's own functions, collected again in this module, where the `tools`
fixture (tests/kubernetes/conftest.py) opens a Kubernetes sandbox on the API double.
"""

from __future__ import annotations

from tests.sandbox import test_tools as local_suite

for _name, _test in vars(local_suite).items():
    if _name.startswith("test_") and callable(_test):
        globals()[_name] = _test
