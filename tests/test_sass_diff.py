"""tools/sass_diff.py: its configurations, its comparison, and a whole run on stand-in tools (CPU only)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import stat
import subprocess

import pytest

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("sass_diff", _ROOT / "tools" / "sass_diff.py")
sass_diff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_diff)


def _sass(functions: dict[str, list[tuple[str, int]]]) -> str:
    """cuobjdump -sass text: per instruction two lines, the control bits in the high word's bits 41+."""
    out = "\n\tcode for sm_90\n\tarch = sm_90\n"
    for name, body in functions.items():
        out += f"\t\tFunction : {name}\n"
        for i, (text, control) in enumerate(body):
            out += (f"        /*{16 * i:04x}*/                   {text} ;   /* 0x0000000000007919 */\n"
                    f"                                                          /* 0x{(control << 41) | 0xFE2:016x} */\n")
    return out


def test_configurations_are_the_builds():
    # The loops of CMakeLists.txt, read from the file itself.
    cmake = (_ROOT / "CMakeLists.txt").read_text()
    items = [m.split() for m in re.findall(r"foreach\(\w+ IN ITEMS ([^)]*)\)", cmake)]
    dtypes, formats, dims, groups = items[:4]
    expected = {f"fwd_{d}_{f}_d{h}_h{g}" for d in dtypes for f in formats for h in dims for g in groups}
    assert len(sass_diff.CONFIGS) == 32 and {c[0] for c in sass_diff.CONFIGS} == expected
    elements = {c[0].split("_")[1]: c[1] for c in sass_diff.CONFIGS}
    assert elements == {"bf16": "__nv_bfloat16", "fp16": "__half"}


def test_functions_leave_out_addresses_and_keep_control_bits():
    a = sass_diff.functions(sass_diff.checked(_sass({"_Z1fv": [("HMMA.16816.F32 R0, R4, R8, R0", 0x7F1), ("EXIT", 0x7E1)]}),
                                              "test"))
    assert a == {"_Z1fv": [("HMMA.16816.F32 R0, R4, R8, R0", 0x7F1), ("EXIT", 0x7E1)]}
    # The same code at other addresses is the same.
    shifted = _sass({"_Z1fv": [("HMMA.16816.F32 R0, R4, R8, R0", 0x7F1), ("EXIT", 0x7E1)]}).replace("/*0000*/", "/*0100*/")
    assert sass_diff.functions(sass_diff.checked(shifted, "test")) == a


def test_compare_reports_every_kind_of_difference():
    base = {"_Z1fv": [("IADD3 R1, R2, R3, RZ", 0x7F1), ("EXIT", 0x7E1)], "_Z1gv": [("EXIT", 0x7E1)]}
    assert sass_diff.compare(base, dict(base)) == []
    # Another register, another stall count, one instruction more, a kernel gone.
    renamed = {**base, "_Z1fv": [("IADD3 R5, R2, R3, RZ", 0x7F1), ("EXIT", 0x7E1)]}
    assert sass_diff.compare(base, renamed) == [("_Z1fv", "2 -> 2 instructions, first difference at instruction 0")]
    rescheduled = {**base, "_Z1fv": [("IADD3 R1, R2, R3, RZ", 0x7F2), ("EXIT", 0x7E1)]}
    assert sass_diff.compare(base, rescheduled) == [("_Z1fv", "2 -> 2 instructions, first difference at instruction 0")]
    longer = {**base, "_Z1fv": base["_Z1fv"] + [("BRA 0x20", 0x7E0)]}
    assert sass_diff.compare(base, longer) == [("_Z1fv", "2 -> 3 instructions, first difference at instruction 2")]
    assert sass_diff.compare(base, {"_Z1fv": base["_Z1fv"]}) == [("_Z1gv", "only in BASE")]


def _tool(path: pathlib.Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository with a csrc/ whose 'kernel' is one line, and stand-in nvcc and cuobjdump: the
    cubin is that line and the configuration's source, and its SASS one instruction of that text."""
    root = tmp_path / "repo"
    (root / "csrc" / "sparse_mla" / "instantiations").mkdir(parents=True)
    (root / "csrc" / "sparse_mla" / "instantiations" / "fwd_instantiation.cu.in").write_text(
        "@ELEMENT@ @FORMAT@ @HEAD_DIM@ @HEAD_GROUPS@")
    kernel = root / "csrc" / "sparse_mla" / "kernel.cuh"
    kernel.write_text("IADD3 R1, R2, R3\n")
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    monkeypatch.setattr(sass_diff, "REPO", root)
    nvcc = _tool(tmp_path / "nvcc", """#!/bin/sh
[ "$1" = "--version" ] && { echo fake nvcc; exit 0; }
out=""; inc=""; cu=""
while [ $# -gt 0 ]; do
  case "$1" in -o) out="$2"; shift ;; -I*) [ -z "$inc" ] && inc="${1#-I}" ;; *.cu) cu="$1" ;; esac
  shift
done
printf '%s %s\n' "$(head -1 "$inc/sparse_mla/kernel.cuh")" "$(cat "$cu")" > "$out"
""")
    cuobjdump = _tool(tmp_path / "cuobjdump", r"""#!/bin/sh
printf '\tarch = sm_90\n\t\tFunction : _Z6kernelv\n        /*0000*/   %s ;   /* 0x0000000000007919 */\n                /* 0x000fe20000000000 */\n' "$(cat "$2")"
""")
    args = ["--nvcc", nvcc, "--cuobjdump", cuobjdump, "--cache", str(tmp_path / "cache"), "--jobs", "2",
            "--only", "kFp8DsMla_d576"]
    return kernel, args


def test_same_tree_is_identical(repo, capsys):
    _, args = repo
    assert sass_diff.main([*args, "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "| fwd_bf16_kFp8DsMla_d576_h2 | sm_120a | 1 | none |" in out
    assert "(nvcc version unknown)" in out  # the stand-in prints no release
    assert "sm_90: 4 of 4 configurations identical" in out


def test_a_changed_kernel_is_reported(repo, capsys):
    kernel, args = repo
    assert sass_diff.main([*args, "--archs", "sm_90", "HEAD"]) == 0  # fills the cache
    kernel.write_text("IADD3 R5, R2, R3\n")
    assert sass_diff.main([*args, "--archs", "sm_90", "--show", "10", "HEAD"]) == 1
    out = capsys.readouterr().out
    assert "1 -> 1 instructions, first difference at instruction 0" in out
    assert "sm_90: 0 of 4 configurations identical" in out
    # Each configuration's own source reached nvcc: the template was filled in.
    assert "-IADD3 R1, R2, R3 __half kFp8DsMla 576 2  [0007f1]" in out
    assert "+IADD3 R5, R2, R3 __half kFp8DsMla 576 2  [0007f1]" in out


def test_cached_files_are_checked(repo, tmp_path, capsys):
    # A cache file left empty (a run cut short, a full disk) is an error, not an empty kernel list.
    _, args = repo
    assert sass_diff.main([*args, "--archs", "sm_90", "HEAD"]) == 0
    cached = next((tmp_path / "cache").rglob("fwd_bf16_kFp8DsMla_d576_h1.sass"))
    cached.write_text("")
    assert sass_diff.main([*args, "--archs", "sm_90", "HEAD"]) == 2
    assert "cuobjdump printed a function without instructions" in capsys.readouterr().err
    assert not list((tmp_path / "cache").rglob("*.tmp"))


@pytest.mark.parametrize("script", [
    # cuobjdump 13.0 from pip without nvdisasm: fails.
    "#!/bin/sh\necho \"Could not find executable file 'nvdisasm'\" >&2\nexit 1\n",
    # Function headers and no instructions.
    "#!/bin/sh\nprintf '\\t\\tFunction : _Z6kernelv\\n'\n",
])
def test_disassembly_without_nvdisasm_is_an_error(repo, tmp_path, capsys, script):
    _, args = repo
    args[args.index("--cuobjdump") + 1] = _tool(tmp_path / "cuobjdump_broken", script)
    assert sass_diff.main([*args, "HEAD"]) == 2
    assert "needs nvdisasm on PATH" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--archs", "90"], "--archs: comma-separated targets"),
    (["--archs", "sm_90 sm_120a"], "--archs: comma-separated targets"),
    (["--only", "kFp4"], "--only: no configuration's stem contains 'kFp4'"),
    (["--jobs", "0"], "--jobs: at least 1"),
    (["--cuobjdump", "/no/such/cuobjdump"], "cuobjdump: '/no/such/cuobjdump' is not an executable file"),
    (["HEAD", "no-such-revision"], "BASE/HEAD: git does not know revision 'no-such-revision'"),
])
def test_bad_arguments_name_the_argument(repo, capsys, flags, message):
    _, args = repo
    args = [a for a in args if a not in ("kFp8DsMla_d576", "--only")]
    assert sass_diff.main([*args, *flags] if flags[0] == "HEAD" else [*args, *flags, "HEAD"]) == 2
    assert message in capsys.readouterr().err


def test_targets_are_listed_once(repo, capsys):
    _, args = repo
    assert sass_diff.main([*args, "--archs", "sm_90,sm_90", "HEAD"]) == 0
    assert capsys.readouterr().out.count("sm_90: 4 of 4 configurations identical") == 1
