# One image for every k3serve role (coordinator, attention, router, expert, http, local, ...):
# the subcommand is the container's first argument. Two targets:
#
#   docker build --target cpu  -t k3serve:0.1.0 .        # every kernel on the CPU (the default)
#   docker build --target cuda -t k3serve:0.1.0-cuda .   # also `--device cuda` (H100/H200, sm_90a)
#
#   docker run --rm -v /path/to/model:/models:ro -p 8000:8000 k3serve:0.1.0 \
#       http --server=ATTENTION_HOST:50051 --model=/models --port=8000
#
# Both build with Bazel on Debian 12 from Debian's packages (tools/install_deps.sh) and run on
# debian:12-slim with the shared libraries the binary links. The cuda target builds the same way
# with the CUDA Toolkit and NCCL at /usr/local/cuda (third_party/cuda/cuda_configure.bzl finds them
# and compiles the GPU code in), and runs with CUDA's runtime libraries (cudart, cuBLAS, cuBLASLt,
# NCCL) at /usr/local/cuda/lib64, the binary's rpath. Both come from NVIDIA's CUDA images: the
# devel image (toolkit, NCCL headers) and the runtime image (cudart, cuBLAS, NCCL), whose files
# are copied onto Debian, because the binary links Debian 12's gRPC, protobuf, Abseil, UCX and
# oneDNN, which NVIDIA's Ubuntu images do not carry at the same versions. The cuda target cannot be
# built where those base images cannot be pulled: mirror them into your registry and pass
#   --build-arg CUDA_DEVEL_IMAGE=REGISTRY/cuda:TAG-devel --build-arg CUDA_RUNTIME_IMAGE=REGISTRY/cuda:TAG-runtime
# The GPU driver (libcuda.so) is not in the image: the NVIDIA container toolkit mounts the host's.

# CUDA 13 (the version the GPU code is built and tested with; docs/GPU.md). Ubuntu 24.04's glibc
# is newer than Debian 12's, but NVIDIA builds the toolkit and libraries for glibc 2.28 and later.
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04

FROM ${CUDA_DEVEL_IMAGE} AS cuda-devel
FROM ${CUDA_RUNTIME_IMAGE} AS cuda-runtime

FROM debian:12 AS build-base
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY tools/install_deps.sh tools/install_deps.sh
RUN tools/install_deps.sh && rm -rf /var/lib/apt/lists/*

FROM build-base AS build-cpu
COPY . .
RUN bazel build -c opt //:k3serve && cp bazel-bin/k3serve /usr/local/bin/k3serve \
    && bazel shutdown

FROM build-base AS build-cuda
# The toolkit (nvcc, headers, cudart, cuBLAS) and NCCL, laid out the way cuda_configure looks for
# them: everything under /usr/local/cuda, NCCL's header and libraries included.
COPY --from=cuda-devel /usr/local/cuda/ /usr/local/cuda/
COPY --from=cuda-devel /usr/include/nccl.h /usr/local/cuda/include/
COPY --from=cuda-devel /usr/lib/x86_64-linux-gnu/libnccl.so* /usr/local/cuda/lib64/
COPY . .
# Fails unless the GPU code was compiled in (CUDA_AVAILABLE): an image without it would crash-loop
# on --device cuda.
RUN bazel build -c opt //:k3serve \
    && grep -q "CUDA_AVAILABLE = True" "$(bazel info output_base)/external/local_cuda/defs.bzl" \
    && cp bazel-bin/k3serve /usr/local/bin/k3serve && bazel shutdown

FROM debian:12-slim AS runtime-base
# The runtime halves of the -dev packages k3serve builds with (`ldd k3serve`).
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libabsl20220623 libgrpc++1.51 libprotobuf32 libgoogle-glog0v6 libgflags2.2 \
      libucx0 libnuma1 libcpp-httplib0.11 libpcre2-8-0 libssl3 libbrotli1 \
      ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# The manifests run it as this user (k8s/base/*.yaml securityContext).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/k3serve"]
CMD ["--help"]

FROM runtime-base AS cuda
USER 0:0
COPY --from=cuda-runtime /usr/local/cuda/lib64/libcudart.so.13* /usr/local/cuda/lib64/libcublas.so.13* \
     /usr/local/cuda/lib64/libcublasLt.so.13* /usr/local/cuda/lib64/
COPY --from=cuda-runtime /usr/lib/x86_64-linux-gnu/libnccl.so.2* /usr/local/cuda/lib64/
COPY --from=build-cuda /usr/local/bin/k3serve /usr/local/bin/k3serve
# Asks the NVIDIA container toolkit for the driver's compute libraries (the device plugin sets
# which GPUs).
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532

# The default target (last in the file): the CPU image.
FROM runtime-base AS cpu
COPY --from=build-cpu /usr/local/bin/k3serve /usr/local/bin/k3serve
