"""The ctypes bindings against include/xlog_cuda.h and include/xlog/testing.h.

The header is parsed (comments stripped, then regular expressions over the
cbindgen output) and every declaration is checked against the package:
functions and their exact parameter/return types, #define constants, and
the struct layouts, both computed from the header with the C alignment
rules and measured by a C program compiled with gcc against the header.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import subprocess

import pytest

import xlog_cuda as xc
from xlog_cuda import _library

from conftest import HEADER, REPO_ROOT, TESTING_HEADER

pytestmark = pytest.mark.skipif(not os.path.isfile(HEADER), reason=f"{HEADER} not in this checkout")


def _header_text(path: str = HEADER) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _typedefs(text: str) -> dict:
    """Scalar typedefs: `typedef uint32_t xlog_stream;` -> {'xlog_stream': 'uint32_t'}."""
    return dict((alias, base) for base, alias in re.findall(r"typedef\s+(\w+)\s+(\w+)\s*;", text))


def _structs(text: str) -> dict:
    """{'xlog_block': [('void *', 'ptr'), ...], ...} in declaration order."""
    out = {}
    for name, body in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*\w+\s*;", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            m = re.match(r"(.*?)(\w+)$", decl)
            assert m, f"cannot parse field {decl!r} of {name}"
            fields.append((m.group(1).strip(), m.group(2)))
        out[name] = fields
    return out


def _functions(text: str) -> dict:
    """{'xlog_allocate': ('xlog_status', ['struct xlog_runtime *', ...])}."""
    out = {}
    for ret, name, params in re.findall(r"^([\w][\w\s\*]*?)\s*\b(xlog_\w+)\s*\(([^)]*)\)\s*;", text, flags=re.M):
        if ret.strip() == "typedef":
            continue
        params = params.strip()
        types = []
        if params and params != "void":
            for p in params.split(","):
                p = " ".join(p.replace("*", " * ").split())
                m = re.match(r"(.*?)\s*\b(\w+)$", p)
                types.append(m.group(1).strip())
        out[name] = (" ".join(ret.replace("*", " * ").split()), types)
    return out


def _defines(text: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"#define\s+(XLOG_\w+)\s+(-?\d+)\b", text)}


# The production header and the testing header (test and debug entry
# points), which the package binds too.
PUBLIC_TEXT = _header_text() if os.path.isfile(HEADER) else ""
TESTING_TEXT = _header_text(TESTING_HEADER) if os.path.isfile(TESTING_HEADER) else ""
TEXT = PUBLIC_TEXT + "\n" + TESTING_TEXT

SCALARS = {
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "uint8_t": ctypes.c_uint8,
    "size_t": ctypes.c_size_t,
}
STRUCTS = {
    "xlog_block": _library.XlogBlock,
    "xlog_use": _library.XlogUse,
    "xlog_config": _library.XlogConfig,
    "xlog_stats": _library.XlogStats,
    "xlog_live_block": _library.XlogLiveBlock,
    "xlog_tag_stat": _library.XlogTagStat,
    "xlog_close_report": _library.XlogCloseReport,
}


def _ctype_of(c_type: str):
    """The ctypes type the package must use for a C type of the header."""
    typedefs = _typedefs(TEXT)
    words = [w for w in c_type.replace("*", " * ").split() if w not in ("const", "struct")]
    stars = words.count("*")
    base = " ".join(w for w in words if w != "*")
    is_const = "const" in c_type.split()
    if base == "xlog_host_fn" and stars == 0:
        return _library.HOST_FN
    if base == "xlog_runtime":  # opaque: the handle is a void*-sized token
        base_type, stars = ctypes.c_void_p, stars - 1
    elif base == "void":
        if stars == 0:
            return None
        base_type, stars = ctypes.c_void_p, stars - 1
    elif base == "char":
        if stars == 1 and is_const:
            return ctypes.c_char_p
        base_type = ctypes.c_char
    elif base in STRUCTS:
        base_type = STRUCTS[base]
    else:
        while base in typedefs:
            base = typedefs[base]
        base_type = SCALARS[base]
    for _ in range(stars):
        base_type = ctypes.POINTER(base_type)
    return base_type


def test_header_parses_into_the_known_api():
    functions = _functions(TEXT)
    # A parser that finds nothing would make every check below vacuous.
    assert len(functions) >= 25, sorted(functions)
    assert {"xlog_allocate", "xlog_runtime_open", "xlog_stream_enqueue_host"} <= set(functions)
    assert set(_structs(TEXT)) == set(STRUCTS)


def test_test_entry_points_are_declared_only_in_the_testing_header():
    testing = _functions(TESTING_TEXT)
    assert set(testing) == {
        "xlog_sim_inject_fault",
        "xlog_debug_panic",
        "xlog_testing_interop_reset",
        "xlog_sim_deny_peer_access",
        "xlog_sim_stream_begin_capture",
        "xlog_sim_stream_end_capture",
        "xlog_sim_touch",
        "xlog_sim_touch_faults",
    }
    assert not set(testing) & set(_functions(PUBLIC_TEXT)), "test-only functions in xlog_cuda.h"
    assert "XLOG_FAULT_ALLOC" not in PUBLIC_TEXT and "xlog_fault" not in PUBLIC_TEXT
    assert '#include "../xlog_cuda.h"' in TESTING_TEXT


def test_every_header_function_is_bound_with_exact_types():
    functions = _functions(TEXT)
    assert sorted(functions) == sorted(_library.PROTOTYPES), "package prototypes differ from the header's functions"
    lib = xc.load_library()
    for name, (ret, params) in functions.items():
        restype, argtypes = _library.PROTOTYPES[name]
        assert restype is _ctype_of(ret), f"{name} returns {ret}"
        expected = [_ctype_of(p) for p in params]
        assert list(argtypes) == expected, f"{name}({', '.join(params)})"
        fn = getattr(lib, name)
        assert fn.restype is restype and list(fn.argtypes) == expected, f"{name} not declared on the library"


def test_host_callback_type_matches_header():
    m = re.search(r"typedef\s+void\s*\(\*\s*xlog_host_fn\s*\)\s*\(\s*void\s*\*\s*\w*\s*\)\s*;", TEXT)
    assert m, "xlog_host_fn is no longer `void (*)(void *)`"
    assert _library.HOST_FN._restype_ is None
    assert _library.HOST_FN._argtypes_ == (ctypes.c_void_p,)


def test_defines_match_python_enums():
    defines = _defines(TEXT)
    status = {k[len("XLOG_"):].removeprefix("ERR_"): v for k, v in defines.items()
              if k == "XLOG_OK" or k.startswith("XLOG_ERR_")}
    assert status == {s.name: s.value for s in xc.Status}
    for prefix, enum in (("XLOG_ACCESS_", xc.Access), ("XLOG_BACKEND_", xc.Backend),
                         ("XLOG_ALLOCATOR_", xc.Allocator), ("XLOG_FAULT_", xc.Fault)):
        found = {k[len(prefix):]: v for k, v in defines.items() if k.startswith(prefix)}
        assert found == {m.name: m.value for m in enum}, prefix
    version = ".".join(str(defines[f"XLOG_VERSION_{p}"]) for p in ("MAJOR", "MINOR", "PATCH"))
    assert xc.version() == version


def test_status_names_come_from_the_library():
    for s in xc.Status:
        expected = "XLOG_OK" if s is xc.Status.OK else f"XLOG_ERR_{s.name}"
        assert s.c_name == expected
        assert f"#define {expected} {s.value}" in TEXT
    assert xc.status_name(99) == "XLOG_STATUS_UNKNOWN"
    assert xc.status_name(-1) == "XLOG_STATUS_UNKNOWN"


# ---- struct layout ----

def _scalar_size_align(c_type: str):
    if "*" in c_type:
        return ctypes.sizeof(ctypes.c_void_p), ctypes.alignment(ctypes.c_void_p)
    base = c_type.replace("const", "").replace("struct", "").strip()
    if base in STRUCTS:
        layout = _layout_from_header(base)
        return layout["size"], layout["align"]
    typedefs = _typedefs(TEXT)
    while base in typedefs:
        base = typedefs[base]
    t = SCALARS[base]
    return ctypes.sizeof(t), ctypes.alignment(t)


def _layout_from_header(name: str) -> dict:
    """Offsets by the C rules: each field at the next multiple of its
    alignment; the size rounded up to the largest alignment."""
    offset, align, fields = 0, 1, {}
    for c_type, field in _structs(TEXT)[name]:
        size, a = _scalar_size_align(c_type)
        offset = (offset + a - 1) // a * a
        fields[field] = (offset, size)
        offset += size
        align = max(align, a)
    return {"fields": fields, "size": (offset + align - 1) // align * align, "align": align}


def _layout_of_ctypes(cls) -> dict:
    fields = {}
    for field, _ in cls._fields_:
        desc = getattr(cls, field)
        fields[field] = (desc.offset, desc.size)
    return {"fields": fields, "size": ctypes.sizeof(cls), "align": ctypes.alignment(cls)}


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_layout_matches_header_by_c_rules(name):
    header_fields = [f for _, f in _structs(TEXT)[name]]
    assert [f for f, _ in STRUCTS[name]._fields_] == header_fields, "field names/order differ"
    assert _layout_of_ctypes(STRUCTS[name]) == _layout_from_header(name)


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64", "aarch64") or ctypes.sizeof(ctypes.c_void_p) != 8,
    reason="the known sizes are those of an LP64 ABI",
)
def test_struct_sizes_known_values_lp64():
    # Measured with gcc against the header (see the compiled test below).
    assert ctypes.sizeof(_library.XlogBlock) == 32
    assert ctypes.sizeof(_library.XlogUse) == 40
    assert ctypes.sizeof(_library.XlogStats) == 184
    assert ctypes.sizeof(_library.XlogConfig) == 80
    assert ctypes.sizeof(_library.XlogLiveBlock) == 88
    assert ctypes.sizeof(_library.XlogTagStat) == 56
    assert ctypes.sizeof(_library.XlogCloseReport) == 32
    assert _library.XlogConfig.track_call_sites.offset == 64
    assert _library.XlogStats.peak_live_blocks.offset == 152
    assert ctypes.sizeof(_library.XlogConfig) == 80
    assert _library.XlogUse.access.offset == 32
    assert _library.XlogConfig.log_path.offset == 32
    assert _library.XlogConfig.wait_on_pressure.offset == 48
    assert _library.XlogConfig.cache.offset == 49
    assert _library.XlogConfig.pool_release_threshold.offset == 56
    assert _library.XlogConfig.sim_devices.offset == 68
    assert _library.XlogConfig.memory.offset == 72
    # struct_size leads (a u32, then padding), so later fields can be added.
    assert _library.XlogStats.struct_size.offset == 0
    assert _library.XlogStats.live_bytes.offset == 8
    assert _library.XlogStats.reserved_bytes.offset == 128


def test_struct_layout_matches_gcc(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc/cc) on PATH")
    lines = []
    for name in sorted(STRUCTS):
        lines.append(f'printf("{name} size %zu align %zu\\n", sizeof({name}), _Alignof({name}));')
        for _, field in _structs(TEXT)[name]:
            lines.append(
                f'printf("{name}.{field} %zu %zu\\n", offsetof({name}, {field}), '
                f"sizeof((({name} *)0)->{field}));"
            )
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xlog_cuda.h\"\n"
        "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n"
    )
    exe = tmp_path / "layout"
    build = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(REPO_ROOT, "include"), str(source), "-o", str(exe)],
        capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    measured = {}
    for line in filter(None, out):
        parts = line.split()
        if parts[1] == "size":
            measured.setdefault(parts[0], {"fields": {}})
            measured[parts[0]]["size"] = int(parts[2])
            measured[parts[0]]["align"] = int(parts[4])
        else:
            struct, field = parts[0].split(".")
            measured[struct]["fields"][field] = (int(parts[1]), int(parts[2]))
    assert set(measured) == set(STRUCTS)
    for name, cls in STRUCTS.items():
        assert _layout_of_ctypes(cls) == measured[name], name
