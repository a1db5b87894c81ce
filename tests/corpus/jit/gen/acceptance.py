"""Prints how much of tests/corpus/jit/ a ptxd binary accepts, by family and
ABI, with the sub_reasons of the refusals (`ptxd verify`, no daemon needed).

Usage: python3 tests/corpus/jit/gen/acceptance.py [PTXD_BINARY]
"""
import collections
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    ptxd = sys.argv[1] if len(sys.argv) > 1 else "target/debug/ptxd"
    for fam in ("nvrtc", "triton", "inductor"):
        with open(os.path.join(ROOT, fam, "manifest.json")) as f:
            manifest = json.load(f)
        by_abi = collections.defaultdict(lambda: [0, 0])
        reasons = collections.Counter()
        for k in manifest["kernels"]:
            r = subprocess.run([ptxd, "verify", "--symbol", k["entry"], os.path.join(ROOT, k["file"])],
                               capture_output=True, text=True)
            key = k.get("abi", fam) + (" -G" if "-G" in k.get("options", []) else "")
            by_abi[key][1] += 1
            if r.returncode == 0:
                by_abi[key][0] += 1
            else:
                m = re.search(r"\(([a-z_0-9]+)\)", r.stdout + r.stderr)
                reasons[m.group(1) if m else (r.stdout + r.stderr).strip()[:60]] += 1
        total = sum(v[1] for v in by_abi.values())
        ok = sum(v[0] for v in by_abi.values())
        print(f"{fam}: {ok}/{total} accepted")
        for abi, (a, t) in sorted(by_abi.items()):
            print(f"  {abi}: {a}/{t}")
        for reason, count in reasons.most_common():
            print(f"  refused {reason}: {count}")


if __name__ == "__main__":
    main()
