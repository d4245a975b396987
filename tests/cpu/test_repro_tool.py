"""tools/repro_check.py: a reproducibility mismatch is explained by diffoscope."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from tool_loading import load_tool, needs

# --- the reproducibility tool --------------------------------------------------------------


def _tiny_library(tmp_path: Path, text: str) -> bytes:
    source = tmp_path / f"{text}.c"
    source.write_text(f'const char *mok_marker = "{text}";\n')
    output = tmp_path / f"{text}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", output, source], check=True)
    return output.read_bytes()


@needs("diffoscope")
def test_repro_check_explains_a_mismatch_with_diffoscope(tmp_path):
    """Two wheels whose module differs in one string: diffoscope names the member that differs."""
    so_name = "mok/_C_sm90a.cpython-312-x86_64-linux-gnu.so"
    for index, text in enumerate(("first", "other")):
        with zipfile.ZipFile(tmp_path / f"{index}.whl", "w") as wheel:
            wheel.writestr(so_name, _tiny_library(tmp_path, text))
            wheel.writestr("mok/x.py", b"x")
    report = "\n".join(load_tool("repro_check").explain(tmp_path / "0.whl", tmp_path / "1.whl"))
    assert so_name in report  # the member; how deep diffoscope goes depends on the tools it finds
    assert "mok/x.py" not in report
