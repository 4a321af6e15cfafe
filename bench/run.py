"""`make bench`: the comparison benchmarks of docs/performance.md on the GPU when one
is visible (else on the CPU, smaller grids): softmax, attention, the attention
score variants, variable-length batches, decode, cross-entropy (and the fused LM head + loss), and the Llama-style model when
transformers is installed. Tables
on stdout; JSON and PNG plots under results/ (or $TORCH_OSS_RESULTS)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script, *args):
    cmd = [sys.executable, os.path.join(HERE, script), *args]
    print("\n$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


def main():
    codes = [run("softmax.py"), run("attention.py"), run("variants.py"), run("varlen.py"), run("decode.py"),
             run("cross_entropy.py"), run("cross_entropy.py", "--linear")]
    if os.path.exists(os.path.join(HERE, "model.py")):
        codes.append(run("model.py"))
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
