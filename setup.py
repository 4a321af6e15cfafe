"""Build torch_oss._C against the installed torch.

    make build        (what `make test` and `make bench` run first), which is
    python3 setup.py build_ext --inplace     the extension, next to the Python package
    TORCH_OSS_NO_EXTENSION=1 pip install --no-build-isolation --no-deps -e .
                      once: makes `import torch_oss` find this tree from anywhere

The build is incremental: objects and ninja's dependency records stay under
build/, and the extension is rebuilt only when a file it is built from (any
source or header under csrc/, this file, the kernel generators) or the build
configuration (the knobs below, the torch and CUDA versions) changed; then
ninja recompiles only what that change touches. `pip install
--no-build-isolation -e .` on its own also works (it builds the extension too).

Knobs (environment variables):
  TORCH_CUDA_ARCH_LIST  CUDA archs, e.g. "9.0a" or "8.0;9.0a". Default: the visible
                        GPUs' archs (9.0 becomes 9.0a), or "9.0a" (Hopper) when no GPU is
                        visible: each arch costs a whole pass over the kernels (one arch
                        builds in about 8.5 minutes on 2 cores, two in about 17).
  TORCH_OSS_HEAD_DIMS   comma-separated attention head dims to compile for CUDA
                        (default: the generator's list, 32..256). Others are padded up.
  TORCH_OSS_CPU_ONLY=1  skip CUDA even when a toolkit is present.
  TORCH_OSS_DEBUG=1     -O0 -g host code, -lineinfo device code, assertions on.
  TORCH_OSS_SANITIZE    host-code sanitizers, e.g. "address,undefined": the C11 kernels
                        and the registration layer are built with -fsanitize=... (run
                        with the sanitizer runtime preloaded; see docs/testing.md).
  MAX_JOBS              parallel compile jobs (ninja and the C compile step).
  TORCH_OSS_SOFTMAX_KNOBS=1  debug only: builds the CUDA softmax planner with its
                        test knobs (csrc/cuda/softmax/softmax_test_knobs.cuh; all
                        zero = the normal plans), as the standalone self-test does.
  TORCH_OSS_NO_EXTENSION=1  package metadata only, no extension (the Makefile's
                        editable install, after build_ext --inplace built it).
"""

import importlib.util
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

from setuptools import find_packages, setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")
VERSION = "0.1.0"
DEFAULT_ARCHS = "9.0a"


def log(msg):
    print(f"[torch_oss] {msg}", file=sys.stderr, flush=True)


def env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


DEBUG = env_flag("TORCH_OSS_DEBUG")
SANITIZE = os.environ.get("TORCH_OSS_SANITIZE", "").strip()
SANITIZE_FLAGS = [f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer", "-g"] if SANITIZE else []
WITH_CUDA = CUDA_HOME is not None and not env_flag("TORCH_OSS_CPU_ONLY")


def cuda_arch_list():
    """Sets TORCH_CUDA_ARCH_LIST when the user did not, and returns it."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if not archs:
        if torch.cuda.is_available():
            found = []
            for i in range(torch.cuda.device_count()):
                major, minor = torch.cuda.get_device_capability(i)
                arch = f"{major}.{minor}" + ("a" if (major, minor) == (9, 0) else "")
                if arch not in found:
                    found.append(arch)
            archs = ";".join(found)
        else:
            archs = DEFAULT_ARCHS
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    return archs


def head_dims():
    text = os.environ.get("TORCH_OSS_HEAD_DIMS", "").strip()
    gen = load_generator()
    if not text:
        return list(gen.DEFAULT_HEAD_DIMS)
    dims = sorted({int(x) for x in text.replace(";", ",").split(",") if x.strip()})
    if not dims or dims[0] < 1 or dims[-1] > 256:
        raise SystemExit(f"TORCH_OSS_HEAD_DIMS={text!r}: expected head dims between 1 and 256")
    return dims


def load_generator():
    path = os.path.join(CSRC, "cuda", "attention", "generate_attention_kernels.py")
    spec = importlib.util.spec_from_file_location("generate_attention_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_if_changed(path, text):
    """Writes text to path unless the file already holds it, so its mtime
    changes only when its content does."""
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def build_config_stamp(lines):
    """build/config.txt: the build configuration, rewritten only when it
    changes. The extension depends on it, so a changed knob rebuilds it."""
    return write_if_changed(os.path.join(ROOT, "build", "config.txt"), "\n".join(lines) + "\n")


def tree_files(*suffixes):
    """Every file under csrc/ with one of these suffixes (generated sources excluded)."""
    generated = os.path.join(CSRC, "cuda", "attention", "generated")
    out = []
    for folder, subfolders, files in os.walk(CSRC):
        subfolders[:] = sorted(d for d in subfolders if os.path.join(folder, d) != generated)
        out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(suffixes)]
    return out


def object_is_current(obj, cmd):
    """Whether obj was compiled by exactly cmd and is newer than its source and
    every header the compiler listed in obj's .d file."""
    try:
        with open(obj + ".cmd") as f:
            if f.read() != "\0".join(cmd):
                return False
        with open(obj + ".d") as f:
            deps = f.read().replace("\\\n", " ").split(":", 1)[1].split()
        built = os.path.getmtime(obj)
        return all(os.path.getmtime(d) <= built for d in deps)
    except (OSError, IndexError):
        return False


class BuildWithC11(BuildExtension):
    """torch's BuildExtension compiles every non-CUDA source as C++. The CPU
    kernels are C11, so compile them here with the C compiler (in parallel,
    only those whose source, headers or command changed) and hand the objects
    to the link step.

    Incremental builds: torch's BuildExtension forces a rebuild (ninja then
    finds nothing to do, but the extension is linked again); here the
    extension is skipped when it is newer than every file it depends on
    (Extension.depends lists all of csrc/, setup.py, the generators and the
    configuration stamp), and when it is not, ninja recompiles only what
    changed. Objects stay in build/temp, also under `pip install -e`, whose
    own build folder is a fresh temporary one each time."""

    def finalize_options(self):
        force = self.force
        super().finalize_options()
        self.force = force
        self.build_temp = os.path.join(ROOT, "build", "temp")

    def build_extensions(self):
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
        cc = cc.split()
        jobs = int(os.environ.get("MAX_JOBS", os.cpu_count() or 1))
        # -fno-trapping-math lets the compiler turn the selects of oss_expf into
        # vector blends; nothing here relies on floating-point exceptions.
        # -Wno-psabi: the 32-byte vector type of the CPU tile product changes the
        # calling convention of static helpers without AVX; nothing is exported.
        flags = ["-std=c11", "-fPIC", "-fopenmp-simd", "-fno-trapping-math", "-Wall", "-Wextra", "-Wno-psabi",
                 f"-I{CSRC}"]
        flags += ["-O0", "-g"] if DEBUG else ["-O3", "-DNDEBUG"]
        flags += SANITIZE_FLAGS
        if WITH_CUDA:
            flags += ["-DOSS_WITH_CUDA", f'-DOSS_CUDA_ARCHS="{os.environ["TORCH_CUDA_ARCH_LIST"]}"']
        for ext in self.extensions:
            c_sources = getattr(ext, "c_sources", [])
            out_dir = os.path.join(self.build_temp, "c11")
            os.makedirs(out_dir, exist_ok=True)

            def compile_one(src):
                obj = os.path.join(out_dir, os.path.relpath(src, CSRC).replace(os.sep, "_") + ".o")
                cmd = cc + flags + ["-c", src, "-o", obj]
                if self.force or not object_is_current(obj, cmd):
                    log(" ".join(cmd))
                    subprocess.run(cmd + ["-MMD", "-MF", obj + ".d"], check=True)
                    with open(obj + ".cmd", "w") as f:
                        f.write("\0".join(cmd))
                return obj

            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                ext.extra_objects = list(ext.extra_objects or []) + list(pool.map(compile_one, c_sources))
        super().build_extensions()


def make_extension():
    c_sources = [os.path.join(CSRC, "common.c")] + sorted(
        os.path.join(CSRC, "cpu", f) for f in os.listdir(os.path.join(CSRC, "cpu")) if f.endswith(".c")
    )
    # No -fvisibility=hidden: it gives this library private copies of libstdc++'s
    # facet ids, and then formatting a number into an error message crashes.
    cxx_flags = (["-O0", "-g"] if DEBUG else ["-O3"]) + SANITIZE_FLAGS
    link_flags = [f"-fsanitize={SANITIZE}"] if SANITIZE else []
    sources = [os.path.join(CSRC, "torch_ops.cpp")]
    # What the extension is rebuilt for (BuildWithC11): every source and header
    # of csrc/ (the .cu files are sources), this file, the generators and the
    # configuration; ninja then finds what each change touches.
    config = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}", f"cuda {WITH_CUDA and torch.version.cuda}",
              f"debug {DEBUG}", f"sanitize {SANITIZE}"]
    depends = tree_files(".h", ".cuh", ".c", ".py") + [os.path.abspath(__file__)]
    if not WITH_CUDA:
        log("no CUDA toolkit found (or TORCH_OSS_CPU_ONLY=1): building the CPU-only extension")
        ext = CppExtension("torch_oss._C", sources, extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags,
                           depends=depends + [build_config_stamp(config)])
        ext.c_sources = c_sources
        return ext

    archs = cuda_arch_list()
    dims = head_dims()
    # The Hopper (wgmma) forward needs the arch-specific sm_90a target.
    sm90 = any(a.strip().lower().split("+")[0] == "9.0a" for a in archs.replace(" ", ";").split(";"))
    cuda_dir = os.path.join(CSRC, "cuda")
    generated_dir = os.path.join(cuda_dir, "attention", "generated")
    generated = load_generator().generate(dims, generated_dir, sm90=sm90)
    cu_sources = [f for f in tree_files(".cu") if f.startswith(cuda_dir + os.sep)]
    log(f"CUDA build: archs={archs} attention head dims={dims} hopper forward={sm90} ({len(cu_sources) + len(generated)} .cu files)")
    nvcc_flags = [
        "-DOSS_WITH_CUDA",
        f"-I{CSRC}",  # every include is written relative to csrc/
        # torch disables the half operators for its own reasons; the kernels use them.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "--expt-relaxed-constexpr",
        "-lineinfo",
    ] + (["-O0", "-g"] if DEBUG else ["-O3"])
    if env_flag("TORCH_OSS_SOFTMAX_KNOBS"):
        nvcc_flags.append("-DOSS_SOFTMAX_TEST_KNOBS")
    threads = os.environ.get("NVCC_THREADS")
    if threads:
        nvcc_flags.append(f"--threads={threads}")
    config += [f"archs {archs}", f"head dims {dims}", f"nvcc {' '.join(nvcc_flags)}"]
    ext = CUDAExtension(
        "torch_oss._C",
        sources + cu_sources + generated,
        extra_compile_args={"cxx": cxx_flags + ["-DOSS_WITH_CUDA"], "nvcc": nvcc_flags},
        extra_link_args=link_flags,
        depends=depends + [build_config_stamp(config)],
    )
    ext.c_sources = c_sources
    return ext


setup(
    name="torch_oss",
    version=VERSION,
    description="Open softmax and FlashAttention-style attention kernels for PyTorch",
    license="BSD-3-Clause",
    packages=find_packages(include=["torch_oss", "torch_oss.*"]),
    ext_modules=[] if env_flag("TORCH_OSS_NO_EXTENSION") else [make_extension()],
    cmdclass={"build_ext": BuildWithC11.with_options(use_ninja=True)},
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
    zip_safe=False,
)
