"""The benchmarks' --plot: their side-by-side figures drawn as a PNG (matplotlib)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.image

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_bench_plots_its_figures_beside_their_baselines(tmp_path):
    png = tmp_path / "bench.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench"), "--messages", "4000", "--runs", "1", "--only", "library", "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"plotted in {png}" in done.stderr
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    height, width, _ = matplotlib.image.imread(png).shape
    assert width == 990 and height > 300  # 9 inches at 110 dpi; a row per figure


def test_a_plot_without_matplotlib_is_one_line(tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None; sys.path.insert(0, sys.argv[1]); "
        "import benchplot; benchplot.bars('x.png', 't', [], 'u')"
    )
    done = subprocess.run([sys.executable, "-c", code, str(SCRIPTS)], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert (
        done.returncode == 1
        and done.stderr.strip() == "--plot needs matplotlib: pip install matplotlib (it is in kl's test extra)"
    )
    assert not (tmp_path / "x.png").exists()
