"""The `sources` filegroup every package with C++ files gives //tests/lint."""

def lint_sources(extensions = ["cc", "h"]):
    """Declares :sources, this package's files with `extensions`, for the
    lint tests (clang-format, thread-safety analysis)."""
    native.filegroup(
        name = "sources",
        srcs = native.glob(["*." + e for e in extensions]),
        visibility = ["//tests/lint:__pkg__"],
    )
