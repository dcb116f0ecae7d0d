"""C++ (and gRPC) code from .proto files with the system protoc.

Debian's protoc and grpc_cpp_plugin match the installed libprotobuf and
libgrpc++ (deploy/install_deps.sh); Bazel 4.2.3's own proto rules would
fetch a protobuf source tree, which an offline build cannot.
"""

def cc_proto(name, protos, imports = [], grpc = False, deps = [], visibility = None, codegen_visibility = None):
    """Generates <name>_codegen (protoc) and the cc_library <name>_cc_proto.

    protoc runs with this package's directory as its import path, so the
    generated files sit next to each other in the package's output directory:
    users include "<package>/x.pb.h" (the output root is on every compile's
    include path), and a generated file's own include of another one
    ("x.pb.h" for `import "x.proto"`) resolves in its directory. Descriptors
    keep the names the .proto files were given to protoc ("x.proto").

    Args:
      name: prefix of the two targets.
      protos: the .proto files to compile (in this package).
      imports: other .proto files of this package they import.
      grpc: also generate gRPC service code (x.grpc.pb.*).
      deps: cc_library targets of the imported files' code.
      visibility: of the cc_library.
      codegen_visibility: of the genrule (its outputs).
    """
    bases = [p[:-len(".proto")] for p in protos]
    hdrs = [b + ".pb.h" for b in bases]
    srcs = [b + ".pb.cc" for b in bases]
    if grpc:
        hdrs += [b + ".grpc.pb.h" for b in bases]
        srcs += [b + ".grpc.pb.cc" for b in bases]
    cmd = "protoc --proto_path=$$(dirname $(location %s)) --cpp_out=$(@D) " % protos[0]
    if grpc:
        cmd = ("plugin=$$(command -v grpc_cpp_plugin) || " +
               "{ echo 'grpc_cpp_plugin not found (deploy/install_deps.sh installs it)' >&2; exit 1; }; " +
               cmd + "--grpc_out=$(@D) --plugin=protoc-gen-grpc=$$plugin ")
    cmd += " ".join(["$(location %s)" % p for p in protos])
    native.genrule(
        name = name + "_codegen",
        srcs = protos + imports,
        outs = hdrs + srcs,
        cmd = cmd,
        visibility = codegen_visibility,
    )
    native.cc_library(
        name = name + "_cc_proto",
        srcs = srcs,
        hdrs = hdrs,
        visibility = visibility,
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
    )
