"""PEP 517 build backend of the asyncps wheel: ``pip install ./python``.

The package is built by Bazel from the same sources and system libraries as
every other part of asyncps: ``bazel build //python:asyncps //server:ps_server
//tools:psctl`` in the source tree this folder belongs to (the folder above
python/), in Bazel's default configuration, so a build already done is
reused. The wheel then holds

  asyncps/                    the package: Python modules, the extension
                              (_native.so), its type stub and py.typed
  asyncps-V.data/scripts/     ps_server and psctl (installed beside the
                              interpreter, where asyncps.cluster finds them)
  asyncps-V.dist-info/        METADATA (from pyproject.toml), WHEEL,
                              entry_points.txt (asyncps-cluster), RECORD

and its version is common/version.h's, the one every binary reports.

With ``ASYNCPS_PREBUILT=DIR`` the wheel is packed from DIR/python/site,
DIR/server/ps_server and DIR/tools/psctl (a Bazel output tree or a test's
runfiles) without running Bazel.

The extension links Debian's gRPC, protobuf and Abseil and is compiled
against Debian's CPython headers, so the wheel is for this machine's kind:
the interpreter that builds it must load it (checked before packing).
There is no sdist: the wheel needs the whole source tree.
"""

import base64
import hashlib
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_PYTHON_DIR = os.path.dirname(_HERE)
_SCRIPTS = {"ps_server": "server/ps_server", "psctl": "tools/psctl"}


class BuildError(RuntimeError):
    pass


def _project():
    with open(os.path.join(_PYTHON_DIR, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _version(root):
    """kVersion of common/version.h."""
    candidates = [os.path.join(root, "common", "version.h"),
                  os.path.join(os.path.dirname(_PYTHON_DIR), "common",
                               "version.h")]
    for path in candidates:
        if os.path.exists(path):
            with open(path) as f:
                match = re.search(r'kVersion\[\] = "([^"]+)"', f.read())
            if match:
                return match.group(1)
    raise BuildError("no kVersion in common/version.h (looked at " +
                     ", ".join(candidates) + ")")


def _tag():
    impl = sys.implementation.name
    if impl != "cpython":
        raise BuildError(f"the extension is for CPython, not {impl}")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    platform = re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())
    return f"{py}-{py}-{platform}"


def _bazel_outputs():
    """Builds the package and binaries with Bazel; returns Bazel's output
    folder (bazel-bin)."""
    root = os.path.dirname(_PYTHON_DIR)
    if not os.path.exists(os.path.join(root, "WORKSPACE")):
        raise BuildError(
            f"{root} is not the asyncps source tree (no WORKSPACE): build the "
            "wheel from a clone (pip install ./python), or set "
            "ASYNCPS_PREBUILT to a Bazel output tree")
    targets = ["//python:asyncps", "//server:ps_server", "//tools:psctl"]
    print("asyncps: bazel build " + " ".join(targets), file=sys.stderr,
          flush=True)
    try:
        # Bazel's own output goes to stderr (pip -v shows it).
        subprocess.run(["bazel", "build", *targets], cwd=root, check=True,
                       stdout=sys.stderr)
        out = subprocess.run(["bazel", "info", "bazel-bin"], cwd=root,
                             check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError("bazel not found: deploy/install_deps.sh installs "
                         "it (Debian's bazel-bootstrap)") from None
    except subprocess.CalledProcessError as e:
        raise BuildError(f"{' '.join(e.cmd[:2])} failed with exit status "
                         f"{e.returncode} (its output is above)") from None
    return out.stdout.strip()


def _files(root):
    """{path in the wheel: (source file, executable)}."""
    site = os.path.join(root, "python", "site")
    package = os.path.join(site, "asyncps")
    if not os.path.exists(os.path.join(package, "_native.so")):
        raise BuildError(f"{package} has no _native.so")
    files = {}
    for folder, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".pyc"):
                continue
            path = os.path.join(folder, name)
            files[os.path.relpath(path, site)] = (path, False)
    for name, rel in _SCRIPTS.items():
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            raise BuildError(f"{path} is missing")
        files[f"data/scripts/{name}"] = (path, True)
    return files, site


def _check_loads(site):
    """The interpreter building the wheel must load its extension."""
    env = dict(os.environ, PYTHONPATH=site, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", "import asyncps"], env=env,
                       cwd=site, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(
            f"{sys.executable} cannot load the extension (it is built for "
            "Debian's python3 and system libraries; use python3 -m venv "
            f"--system-site-packages from it):\n{r.stderr[-2000:]}")


def _metadata(version):
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}",
             f"Version: {version}", f"Summary: {p['description']}"]
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    if "license" in p:
        lines.append(f"License: {p['license']['text']}")
    for dep in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {dep}")
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for dep in deps:
            lines.append(f'Requires-Dist: {dep}; extra == "{extra}"')
    return "\n".join(lines) + "\n"


def _dist_info(version):
    """{file name: text} of the .dist-info folder."""
    p = _project()
    info = {
        "METADATA": _metadata(version),
        "WHEEL": ("Wheel-Version: 1.0\nGenerator: asyncps_build\n"
                  f"Root-Is-Purelib: false\nTag: {_tag()}\n"),
        "top_level.txt": "asyncps\n",
    }
    scripts = p.get("scripts", {})
    if scripts:
        info["entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{name} = {target}\n" for name, target in scripts.items())
    return info


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "sha256=" + digest.rstrip(b"=").decode()


# PEP 517 hooks.

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory,
                                     config_settings=None):
    version = _version(os.environ.get("ASYNCPS_PREBUILT", ""))
    name = f"asyncps-{version}.dist-info"
    os.makedirs(os.path.join(metadata_directory, name), exist_ok=True)
    for file, text in _dist_info(version).items():
        with open(os.path.join(metadata_directory, name, file), "w") as f:
            f.write(text)
    return name


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    prebuilt = os.environ.get("ASYNCPS_PREBUILT", "")
    root = prebuilt or _bazel_outputs()
    version = _version(prebuilt)
    files, site = _files(root)
    _check_loads(site)

    data = f"asyncps-{version}.data"
    info = f"asyncps-{version}.dist-info"
    wheel_name = f"asyncps-{version}-{_tag()}.whl"
    records = []
    path = os.path.join(wheel_directory, wheel_name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        def add(arcname, payload, executable):
            entry = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            entry.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if executable else 0o644
            entry.external_attr = (stat.S_IFREG | mode) << 16
            whl.writestr(entry, payload)
            records.append(f"{arcname},{_record_hash(payload)},{len(payload)}")

        for arcname, (source, executable) in sorted(files.items()):
            if arcname.startswith("data/"):
                arcname = data + arcname[len("data"):]
            with open(source, "rb") as f:
                add(arcname, f.read(), executable)
        for file, text in _dist_info(version).items():
            add(f"{info}/{file}", text.encode(), False)
        records.append(f"{info}/RECORD,,")
        entry = zipfile.ZipInfo(f"{info}/RECORD",
                                date_time=(2020, 1, 1, 0, 0, 0))
        entry.external_attr = (stat.S_IFREG | 0o644) << 16
        whl.writestr(entry, "\n".join(records) + "\n")
    print(f"asyncps: wrote {path}", file=sys.stderr, flush=True)
    return wheel_name
