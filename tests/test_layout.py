"""The package's folders are its layers: each imports only the layers below it, nothing in the
core imports a framework, no module imports itself in a loop, and every public import path works."""
import ast
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, worker_env

PACKAGE = REPO / "horovod_accordion"

# What each part of the package may import of the package, besides itself. A part is a folder or a
# top-level module; the top-level modules named as public paths are faces of a folder.
MAY_IMPORT = {
    "core": set(),
    "torch_common": {"core"},
    "torch": {"core", "torch_common"},
    "tensorflow": {"core"},
    "keras": {"core", "tensorflow"},
    "keras3": {"core", "tensorflow"},
    "hooks": {"core", "torch_common"},
    "ddp": {"core", "torch_common", "hooks"},
    "fsdp": {"core", "torch_common", "hooks"},
    "trainers": {"core", "torch_common", "hooks"},
    "lightning": {"trainers"},
    "accelerate": {"trainers"},
    "ray_train": {"trainers"},
    "advise": {"core", "torch_common"},
    "tools": set(),
    "examples": {"torch", "keras", "ddp", "lightning", "accelerate", "ray_train"},
    "moved": set(),  # it names the old paths and their new modules as strings, imported when asked for
    "__init__": {"core", "moved"},
}
FRAMEWORKS = {"torch", "tensorflow", "tf_keras", "keras", "horovod", "lightning", "accelerate", "ray", "mpi4py"}
# Horovod's public paths (and ours beside them) that the docs and users import.
PUBLIC = ["horovod_accordion", "horovod_accordion.torch", "horovod_accordion.tensorflow",
          "horovod_accordion.keras", "horovod_accordion.keras3", "horovod_accordion.ddp",
          "horovod_accordion.fsdp", "horovod_accordion.lightning", "horovod_accordion.accelerate",
          "horovod_accordion.ray_train", "horovod_accordion.advise", "horovod_accordion.examples.demo",
          "horovod_accordion.tools.install_horovod", "horovod_accordion.tools.plot"]


def module_name(path):
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def imports(path):
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def part(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def test_every_part_has_a_place_in_the_layers():
    assert {part(name) for name in MODULES} == set(MAY_IMPORT)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_no_layer_above_its_own(name):
    own = part(name)
    wrong = sorted({target for target in imports(MODULES[name])
                    if target.startswith("horovod_accordion.") and part(target) not in MAY_IMPORT[own] | {own}})
    assert not wrong, f"{name} ({own}) imports {wrong}; it may import {sorted(MAY_IMPORT[own])}"


def test_the_core_imports_no_framework():
    for name, path in MODULES.items():
        if part(name) == "core":
            framework = sorted({target for target in imports(path) if target.split(".")[0] in FRAMEWORKS})
            assert not framework, f"{name} imports {framework}"
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, json, pkgutil, importlib, horovod_accordion.core as core\n"
         "for info in pkgutil.iter_modules(core.__path__): importlib.import_module('horovod_accordion.core.' + info.name)\n"
         "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r)))" % (sorted(FRAMEWORKS),)],
        cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(loaded.stdout) == []


def test_no_module_imports_itself_through_a_loop():
    graph = {name: {target for target in imports(path) if target in MODULES and target != name}
             for name, path in MODULES.items()}
    state = {}

    def visit(name, trail):
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                pytest.fail("import loop: " + " -> ".join(trail[trail.index(target):] + [target]))
            if target not in state:
                visit(target, trail + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_a_ddp_state_pickled_by_0_2_0_loads_through_its_old_module_paths():
    """0.2.0 pickled ``horovod_accordion.ddp.state.AccordionState`` holding its compression
    (``horovod_accordion.compression``), policy and loss scale (``horovod_accordion.torch_loss_scale``):
    those paths moved, and unpickling imports them."""
    script = ("import pickle, sys\n"
              "state = pickle.load(open(sys.argv[1], 'rb'))\n"
              "from horovod_accordion.ddp import AccordionState\n"
              "from horovod_accordion.core.compression import PowerSGD\n"
              "assert type(state) is AccordionState and isinstance(state.compression, PowerSGD), state\n"
              "assert tuple(state.compression.levels) == (4, 1) and state.window_steps == 5, state.__dict__\n"
              "assert state._schedule_options['interval'] == 3 and state.levels == {}\n"
              "print('ok')")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script, str(REPO / "tests" / "data" / "ddp_state_0.2.0.pkl")],
                          cwd=REPO, env=worker_env({"PYTHONPATH": f"{REPO / 'tests' / 'no_horovod'}:{REPO}"}),
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_every_public_import_path_imports():
    script = ("import importlib, json, sys\n"
              "for name in sys.argv[1:]:\n"
              "    module = importlib.import_module(name)\n"
              "    missing = [n for n in getattr(module, '__all__', []) if not hasattr(module, n)]\n"
              "    assert not missing, (name, missing)\n"
              "print('ok')")
    done = subprocess.run([sys.executable, "-c", script, *PUBLIC], cwd=REPO, env=worker_env(),
                          capture_output=True, text=True, timeout=240)
    assert done.stdout.strip().endswith("ok"), done.stderr[-3000:]
