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


def test_every_page_installs_the_package_from_its_wheel_file_not_from_the_index():
    """``pip install 'horovod_accordion[ddp]'`` fails: the package is not on PyPI. Every page names
    the wheel file, as the install page does (or installs the checkout, ``-e '.[...]'``)."""
    from_the_index = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?horovod_accordion\[")
    wrong = [f"{page.relative_to(REPO)}: {found.group()}" for page in PAGES
             for found in from_the_index.finditer(" ".join(page.read_text().split()))]  # across line breaks
    assert not wrong, "pages that install from the package index:\n" + "\n".join(wrong)


def test_the_install_page_has_a_block_per_route_and_the_cpu_torch_of_the_docker_build():
    """Without the CPU line pip takes PyPI's CUDA torch; the index is the one the Docker build uses."""
    install = REPO / "docs" / "getting-started" / "install.md"
    [cpu_index] = re.findall(r"`PIP_EXTRA_INDEX_URL` \| `(\S+)`", (REPO / "docs" / "clusters.md").read_text())
    [torch_pin] = re.findall(r"^\s*(torch==\S+)$", (REPO / "setup.cfg").read_text(), re.M)[:1]
    cpu_line = f"pip install {torch_pin} --index-url {cpu_index}"
    blocks = [code for _, language, code in code_blocks(install) if language == "bash"]
    version = re.search(r'__version__ = "(.+)"', (REPO / "horovod_accordion" / "__init__.py").read_text())[1]
    for extra in ("torch", "tensorflow", "ddp", "trainers"):
        wheel_line = f"pip install 'horovod_accordion-{version}-py3-none-any.whl[{extra}]'"
        assert any(wheel_line in code for code in blocks), f"no block installs the {extra} route: {wheel_line}"
    for extra in ("torch", "ddp"):
        [block] = [code for code in blocks if f"whl[{extra}]'" in code]
        assert cpu_line in block and block.index(cpu_line) < block.index(f"whl[{extra}]'"), (extra, block)
    assert any(code.strip() == cpu_line for code in blocks), cpu_line


def test_every_grad_scaler_a_page_builds_names_its_device():
    """``torch.amp.GradScaler()`` is CUDA's: on a CPU torch it disables itself and trains at scale 1."""
    bare = [f"{page.relative_to(REPO)}: {line.strip()}" for page in PAGES
            for _, language, code in code_blocks(page) if language == "python"
            for line in code.splitlines() if re.search(r"GradScaler\(\s*\)", line)]
    assert not bare, "GradScaler() without a device:\n" + "\n".join(bare)
