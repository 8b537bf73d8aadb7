import subprocess
import sys


def test_core_policies_and_fallbacks_never_import_tvm():
    code = (
        "import sys, tvm_rtask.core, tvm_rtask.policies, tvm_rtask.fallbacks\n"
        "bad = sorted(m for m in sys.modules if m == 'tvm' or m.startswith('tvm.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
