"""Finds the CUDA Toolkit and NCCL under /usr/local/cuda (or $CUDA_PATH).

The generated repository always exists. Where the toolkit is present it exposes `:cuda` (headers,
cudart, NCCL), `:cuda_headers`, `:cudart` and `:cublas`, and `defs.bzl` says `CUDA_AVAILABLE = True`
(//third_party/cuda:cuda.bzl compiles .cu files with its nvcc); elsewhere `:cuda` is empty and GPU
targets are left out by `if_cuda`, so CPU-only machines build `//...` without the toolkit.
"""

def _cuda_configure_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(cuda_path + "/bin/nvcc")
    nccl = ctx.path(cuda_path + "/include/nccl.h")
    available = nvcc.exists and nccl.exists
    if available:
        ctx.symlink(cuda_path + "/include", "include")
        ctx.symlink(cuda_path + "/lib64", "lib64")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda",
    # CCCL has extension-less headers (<nv/target>, <cuda/std/...>) that cuda_fp16.h, hence nccl.h,
    # includes.
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh", "include/**/*.inl", "include/cccl/**"], allow_empty = True),
    includes = ["include", "include/cccl"],
    linkopts = [
        "-L{path}/lib64",
        "-Wl,-rpath,{path}/lib64",
        "-lcudart",
        "-lnccl",
    ],
)

# The headers alone, for C++ files that call the runtime API (linking :cudart).
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/*.h", "include/crt/*.hpp", "include/cccl/**"], allow_empty = True),
    includes = ["include", "include/cccl"],
)

# cudart as a shared library (libcudart.so.13, found through the rpath or LD_LIBRARY_PATH): what
# libraries with CUDA code link, since Bazel's tests link libraries as shared objects, which
# cannot take their cudart symbols from a static archive linked into the executable.
cc_library(
    name = "cudart",
    linkopts = [
        "-L{path}/lib64",
        "-Wl,-rpath,{path}/lib64",
        "-lcudart",
    ],
    deps = [":cuda_headers"],
)

# cuBLAS (shared: libcublas.so.13 and libcublasLt.so.13), for the products of the GPU layers.
cc_library(
    name = "cublas",
    linkopts = [
        "-L{path}/lib64",
        "-Wl,-rpath,{path}/lib64",
        "-lcublas",
        "-lcublasLt",
    ],
    deps = [":cudart"],
)

# The same shared cudart under the name code written before cuda_library linked it shared uses:
# one process must not hold a static and a shared copy of the runtime.
alias(
    name = "cudart_static",
    actual = ":cudart",
)

exports_files(["nvcc"])
""".format(path = cuda_path))
        ctx.symlink(cuda_path + "/bin/nvcc", "nvcc")
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda")

cc_library(name = "cuda_headers")

cc_library(name = "cudart")

cc_library(name = "cublas")

cc_library(name = "cudart_static")
""")
    ctx.file("defs.bzl", """
CUDA_AVAILABLE = {available}
CUDA_PATH = "{path}"

def if_cuda(if_true, if_false = []):
    return if_true if CUDA_AVAILABLE else if_false
""".format(available = available, path = cuda_path))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
