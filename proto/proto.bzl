"""cc_grpc_library: protoc + grpc_cpp_plugin from /usr/bin, without @com_google_protobuf."""

def cc_grpc_library(name, src, deps = [], grpc = True):
    """Compiles one .proto file into a C++ library (messages, and services when grpc is True).

    Args:
      name: the cc_library's name.
      src: the .proto file in this package.
      deps: other cc_grpc_library targets whose .proto files `src` imports.
      grpc: whether to generate service stubs too.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) "
    if grpc:
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin "
    cmd += "$(location " + src + ")"
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_proto_srcs" for d in deps],
        outs = outs,
        cmd = cmd,
    )
    native.filegroup(
        name = name + "_proto_srcs",
        srcs = [src],
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:grpc", "//third_party:protobuf"],
    )
