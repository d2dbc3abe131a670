"""The documentation: the site builds with `mkdocs build --strict` (a broken link, reference or
page fails), and every code block of the README and the docs is either run by a test, which
the block names, or marked as shown only, with the reason."""
import pathlib
import re
import subprocess
import sys

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK = re.compile(r"(?:<!--\s*(?P<marker>.*?)\s*-->\s*\n)?^```(?P<language>\w*)\n(?P<code>.*?)^```$", re.S | re.M)


def code_blocks(page):
    """``[(marker, language, code)]`` of ``page``'s fenced blocks; the marker is the HTML comment on
    the line before the block, or ''."""
    return [(m["marker"] or "", m["language"], m["code"]) for m in BLOCK.finditer(page.read_text())]


def test_every_code_block_runs_in_a_test_or_says_why_it_is_shown_only():
    unmarked, untested = [], []
    for page in PAGES:
        name = page.relative_to(REPO)
        for marker, _, code in code_blocks(page):
            if marker.startswith("test:"):
                test_file = REPO / marker.split()[1]
                if not test_file.is_file() or str(name) not in test_file.read_text():
                    untested.append(f"{name}: {marker}")
            elif not re.match(r"shown only: \S", marker):
                unmarked.append(f"{name}: {code.splitlines()[0] if code else '(empty)'}")
    assert not unmarked, "blocks with neither '<!-- test: FILE ... -->' nor '<!-- shown only: why -->':\n" + \
        "\n".join(unmarked)
    assert not untested, "'test:' markers whose test file does not read the page:\n" + "\n".join(untested)


def test_the_site_builds_strictly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    reference = (tmp_path / "reference" / "index.html").read_text()
    assert ":class:" not in reference, "a Sphinx role renders literally"
    torch_compression = reference[reference.index('id="horovod_accordion.torch.compression.Compression"'):]
    torch_compression = torch_compression[:torch_compression.index('<div class="doc doc-object')]
    assert "powersgd" in torch_compression and "topk" in torch_compression, torch_compression[:3000]
    torch_optimizer = reference[reference.index('id="horovod_accordion.torch.optimizer.DistributedOptimizer"'):]
    torch_optimizer = torch_optimizer[:torch_optimizer.index('<div class="doc doc-object')]
    assert "<table" in torch_optimizer and "<code>tensorboard_dir</code>" in torch_optimizer, torch_optimizer[:3000]
