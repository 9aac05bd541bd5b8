"""Checks the C++ recorder's frame walk without the GIL (pyframes.h) against the interpreter's
own frames, with the interpreter that runs it: `python check.py BUILD_DIR` builds the probe
module there and prints one line per case; exit status 0 when every case agrees (or when this
CPython has no such walk: then it says so)."""
import os
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "..", "..", "..", "python", "streamsan", "torch", "csrc")


def build(out_dir: str):
    os.makedirs(out_dir, exist_ok=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = os.path.join(out_dir, "pyframes_probe" + suffix)
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-shared", "-fPIC",
           "-I" + sysconfig.get_paths()["include"], "-I" + CSRC,
           os.path.join(HERE, "probe.cpp"), "-o", target]
    subprocess.run(cmd, check=True)
    sys.path.insert(0, out_dir)
    import pyframes_probe

    return pyframes_probe


def frames():
    """(file, function, line) of the caller's frames, innermost first."""
    f = sys._getframe(1)
    out = []
    while f is not None:
        out.append((f.f_code.co_filename, f.f_code.co_name, f.f_lineno))
        f = f.f_back
    return out


def main() -> int:
    probe = build(sys.argv[1])
    if not probe.fast():
        print(f"python {sys.version.split()[0]}: no frame walk without the GIL (the recorder takes the GIL)")
        return 0
    results = {}

    def plain():
        return probe.walk(), frames()

    def nested(n):
        if n == 0:
            return probe.walk(), frames()
        return nested(n - 1)

    def through_c():
        # Python called back from C (sorted's key): an entry frame of the C stack between.
        out = []
        sorted([1], key=lambda x: out.append((probe.walk(), frames())))
        return out[0]

    def generator():
        yield probe.walk(), frames()

    class Deep:
        def __call__(self):
            return plain()

    results["plain"] = plain()
    results["nested"] = nested(5)
    results["through C"] = through_c()
    results["generator"] = next(generator())
    results["method"] = Deep()()
    results["exec"] = eval("(lambda: (probe.walk(), frames()))()", {"probe": probe, "frames": frames})
    bad = 0
    for name, (walked, api) in results.items():
        ok = walked == api
        bad += not ok
        print(f"python {sys.version.split()[0]}: {name}: {'agree' if ok else 'DIFFER'} ({len(walked)} frames)")
        if not ok:
            print("  walked:", walked[:6])
            print("  api:   ", api[:6])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
