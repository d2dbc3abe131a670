"""Patch an unpacked Horovod 0.28.1 sdist so it builds against torch 2.13 and TF 2.21.

Each edit is a literal replacement that must match exactly once; a miss means the sdist
is not the one these patches were measured on, and the build stops here instead of
failing twenty minutes later inside the compiler.

1. torch >= 2.1 headers require C++17 (fixed upstream in #3998, unreleased).
2. TF >= 2.16 moved xla_builder.h; the XLA ops only matter for GPU runs with
   HOROVOD_ENABLE_XLA_OPS, so they are compiled out for TF >= 2.16.
The third fix (TF's headers under include/external/) is an include path, set by
build_horovod.sh through CPLUS_INCLUDE_PATH.
"""
import pathlib
import sys

EDITS = [
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    ("horovod/torch/CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    (
        "horovod/tensorflow/xla_mpi_ops.cc",
        "#if TENSORFLOW_VERSION >= 2006000000",
        "#if TENSORFLOW_VERSION >= 2006000000 && TENSORFLOW_VERSION < 2016000000",
    ),
]


def main(source_dir):
    root = pathlib.Path(source_dir)
    for relative_path, old, new in EDITS:
        path = root / relative_path
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            sys.exit(f"patch_horovod: expected one '{old}' in {path}, found {count}")
        path.write_text(text.replace(old, new))
        print(f"patch_horovod: {relative_path}: {old!r} -> {new!r}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: patch_horovod.py UNPACKED_SDIST_DIR")
    main(sys.argv[1])
