"""cuda_library: CUDA C++ (.cu) compiled by the toolkit's nvcc for Hopper, as a cc_library.

Each .cu file becomes one position-independent object, built by a genrule that runs
<CUDA_PATH>/bin/nvcc (found by //third_party/cuda:cuda_configure.bzl) for sm_90a machine code plus
compute_90a PTX, with every nvcc, ptxas and host-compiler warning an error (register spills
included). The objects are the srcs of a cc_library that links the shared cudart (a library
linked as a shared object, as Bazel's tests link them, cannot take cudart from a static archive
linked into the executable), so cc_library, cc_binary and cc_test targets depend on it as on any
other library. Without the toolkit the
library is empty: targets that need it set `target_compatible_with = if_cuda([], [...missing...])`
so that `bazel build //...` and `bazel test //...` skip them.

The .cu files see only the files named in srcs, hdrs and `cuda_hdrs` (they are compiled outside
Bazel's C++ rules), each included by its path from the workspace root.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_PATH")

# Hopper's own instructions (sm_90a) and its PTX for the driver to compile on a later sm_90a chip.
CUDA_GENCODE = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_90a,code=compute_90a",
]

CUDA_COPTS = [
    "-std=c++20",
    "-O3",
    "-lineinfo",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC,-Wall,-Wextra",
    "-Xptxas=-warn-spills,-warn-lmem-usage",
    "--Werror=all-warnings",
]

def cuda_library(name, srcs, hdrs = [], cuda_hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library of the objects nvcc makes from `srcs` (.cu files).

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: the library's public headers (also visible to the .cu files).
      cuda_hdrs: other headers the .cu files include.
      deps: cc_library dependencies of the library's users (their headers are not visible to nvcc).
      copts: extra nvcc options.
      **kwargs: passed to the cc_library (visibility, alwayslink, tags...).
    """
    objs = []
    if CUDA_AVAILABLE:
        for src in srcs:
            if not src.endswith(".cu"):
                fail("cuda_library srcs must be .cu files: " + src)
            stem = src[:-len(".cu")]
            obj = "_cuda_objs/%s/%s.pic.o" % (name, stem)
            native.genrule(
                name = "%s_nvcc_%s" % (name, stem.replace("/", "_")),
                srcs = [src] + hdrs + cuda_hdrs,
                outs = [obj],
                cmd = " ".join(
                    ["%s/bin/nvcc -c" % CUDA_PATH] + CUDA_GENCODE + CUDA_COPTS + copts +
                    ["-I.", "-o $@", "$(location %s)" % src],
                ),
                message = "nvcc " + src,
            )
            objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        **kwargs
    )
