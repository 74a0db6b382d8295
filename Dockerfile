# One image for every k3serve role (coordinator, attention, router, expert, http, local, ...):
# the subcommand is the container's first argument.
#
#   docker build -t k3serve:0.1.0 .
#   docker run --rm -v /path/to/model:/models:ro -p 8000:8000 k3serve:0.1.0 \
#       http --server=ATTENTION_HOST:50051 --model=/models --port=8000
#
# Stage 1 builds with Bazel on Debian 12 from Debian's packages (tools/install_deps.sh); stage 2
# is Debian 12 slim with only the shared libraries the binary links.
FROM debian:12 AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY tools/install_deps.sh tools/install_deps.sh
RUN tools/install_deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN bazel build -c opt //:k3serve && cp bazel-bin/k3serve /usr/local/bin/k3serve \
    && bazel shutdown

FROM debian:12-slim
# The runtime halves of the -dev packages k3serve builds with (`ldd k3serve`).
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libabsl20220623 libgrpc++1.51 libprotobuf32 libgoogle-glog0v6 libgflags2.2 \
      libucx0 libnuma1 libcpp-httplib0.11 libpcre2-8-0 libssl3 libbrotli1 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/k3serve /usr/local/bin/k3serve
# The manifests run it as this user (k8s/*.yaml securityContext).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/k3serve"]
CMD ["--help"]
