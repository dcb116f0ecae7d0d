"""Real Python signatures for the extension's functions, and its .pyi stub.

pybind11 writes a function's signature only as the first line of its
docstring, which ``inspect.signature`` and ``help()`` cannot use on a
builtin. ``expose()`` replaces each function and method of the extension
module by a thin Python function carrying that signature (an
``inspect.Signature``) and the rest of the docstring, and names the classes
as ``asyncps``'s own. ``stub_text()`` writes the same signatures as a type
stub; ``write_stub(path)`` writes the stub of ``asyncps._native`` (the
Bazel build does, and the wheel carries it).
"""

import ast
import inspect
import re

_FIRST_LINE = re.compile(r"^(\w+)\((.*)\)(?: -> (.+))?$")
_NATIVE_PREFIX = "asyncps._native."


class _Text:
    """An annotation or default shown exactly as written."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _clean(text):
    return text.replace(_NATIVE_PREFIX, "")


def parse(doc):
    """(inspect.Signature, the docstring's remaining text) from a pybind11
    docstring, or None when its first line is not one signature (an
    overloaded function's is not)."""
    if not doc:
        return None
    first, _, rest = doc.partition("\n")
    match = _FIRST_LINE.match(first.strip())
    if not match:
        return None
    name, params, ret = match.groups()
    try:
        fn = ast.parse(f"def {name}({params}) -> {ret or 'None'}: ...").body[0]
    except SyntaxError:
        return None

    def annotation(node):
        if node is None:
            return inspect.Parameter.empty
        return _Text(_clean(ast.unparse(node)))

    def default(node):
        if node is None:
            return inspect.Parameter.empty
        try:
            return ast.literal_eval(node)
        except ValueError:
            return _Text(_clean(ast.unparse(node)))

    P = inspect.Parameter
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = []
    for i, (arg, d) in enumerate(zip(positional, defaults)):
        ann = P.empty if (i == 0 and arg.arg == "self") else annotation(
            arg.annotation)
        params.append(P(arg.arg, P.POSITIONAL_OR_KEYWORD, default=default(d),
                        annotation=ann))
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL,
                        annotation=annotation(a.vararg.annotation)))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=default(d),
                        annotation=annotation(arg.annotation)))
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD,
                        annotation=annotation(a.kwarg.annotation)))
    signature = inspect.Signature(params,
                                  return_annotation=annotation(fn.returns))
    return signature, rest.strip("\n")


def _signed(fn, signature, doc, name, qualname, module):
    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    call.__signature__ = signature
    call.__doc__ = doc
    call.__name__ = name
    call.__qualname__ = qualname
    call.__module__ = module
    return call


def _is_native_function(value):
    return type(value).__name__ in ("builtin_function_or_method",
                                    "instancemethod")


def expose(native, public):
    """Gives the functions and methods of extension module `native` their
    Python signatures, and its classes the module name `public`."""
    for name, value in list(vars(native).items()):
        if isinstance(value, type) and value.__module__ in (native.__name__,
                                                            public):
            value.__module__ = public
            for attr, member in list(vars(value).items()):
                if not _is_native_function(member):
                    continue
                fn = getattr(value, attr)
                parsed = parse(fn.__doc__)
                if parsed:
                    setattr(value, attr,
                            _signed(fn, *parsed, attr,
                                    f"{value.__name__}.{attr}", public))
        elif _is_native_function(value):
            parsed = parse(value.__doc__)
            if parsed:
                setattr(native, name,
                        _signed(value, *parsed, name, name, public))


def _property_type(prop):
    parsed = parse("f" + (prop.fget.__doc__ or "").split("\n")[0]) \
        if prop.fget else None
    if parsed and parsed[0].return_annotation is not inspect.Signature.empty:
        return repr(parsed[0].return_annotation)
    return "Any"


def _stub_signature(signature):
    """The signature as stub text: defaults that are not literals become
    `...`."""
    params = []
    for p in signature.parameters.values():
        if isinstance(p.default, _Text):
            p = p.replace(default=_Text("..."))
        params.append(p)
    return str(signature.replace(parameters=params))


def _doc_lines(doc, indent):
    if not doc:
        return []
    text = doc.replace('"""', "'''").replace("\\", "\\\\")
    return [indent + '"""' + text.strip() + '"""']


def stub_text(native, public):
    """A .pyi stub of extension module `native` after expose()."""
    lines = [
        f'"""Type stubs of {native.__name__} (written by '
        'asyncps._signatures from the extension; do not edit)."""',
        "",
        "from typing import Any, Callable, Dict, List, Optional, "
        "Sequence, Tuple, Union",
        "",
        "import numpy",
        "",
    ]
    for name, value in sorted(vars(native).items()):
        if name.startswith("_") and name != "__version__":
            continue
        if isinstance(value, type) and value.__module__ == public:
            bases = ", ".join(b.__name__ for b in value.__bases__
                              if b.__module__ == "builtins" and
                              b is not object)
            lines += ["", f"class {name}({bases}):" if bases else
                      f"class {name}:"]
            lines += _doc_lines(value.__doc__, "    ")
            body = 0
            for attr, member in vars(value).items():
                # object's own comparison signature stays (a narrower one
                # in a stub is an incompatible override).
                if attr in ("__eq__", "__ne__"):
                    continue
                if isinstance(member, property):
                    kind = _property_type(member)
                    lines += ["    @property",
                              f"    def {attr}(self) -> {kind}: ..."]
                    if member.fset:
                        lines += [f"    @{attr}.setter",
                                  f"    def {attr}(self, value: {kind}) "
                                  "-> None: ..."]
                    body += 1
                elif callable(member) and hasattr(member, "__signature__"):
                    lines.append(f"    def {attr}"
                                 f"{_stub_signature(member.__signature__)}: ...")
                    body += 1
            if body == 0 and not value.__doc__:
                lines.append("    ...")
        elif callable(value) and hasattr(value, "__signature__"):
            lines += ["", f"def {name}{_stub_signature(value.__signature__)}: ..."]
        elif isinstance(value, str):
            lines += ["", f"{name}: str"]
    return "\n".join(lines) + "\n"


def write_stub(path):
    """Writes the stub of asyncps._native to `path`."""
    import asyncps
    from asyncps import _native

    with open(path, "w") as out:
        out.write(stub_text(_native, asyncps.__name__))
