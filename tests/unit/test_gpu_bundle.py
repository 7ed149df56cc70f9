"""The GPU bench's bundle (bench/gpu/make_bundle.sh) carries what `kinetic serve` needs on a machine with no network:
each dependency of kinetic[serve] is in its wheels, on the machine already, or not needed by the bench, and the
server's app builds without the last kind. A device machine is lent for minutes; a server that cannot start there
loses them all (python-multipart, which FastAPI wants for the upload routes' forms at import, was missing once)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from tests.unit.test_declared_imports import dist_names

ROOT = Path(__file__).resolve().parents[2]
MAKE_BUNDLE = ROOT / "bench" / "gpu" / "make_bundle.sh"


def bundle_list(name: str) -> set[str]:
    """A bash array of make_bundle.sh, as normalized distribution names."""
    found = re.search(rf"^{name}=\(([^)]*)\)", MAKE_BUNDLE.read_text(), re.MULTILINE)
    assert found is not None, f"make_bundle.sh has no {name}=(...)"
    return dist_names(found.group(1).split())


def serve_dependencies() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dist_names(project["dependencies"] + project["optional-dependencies"]["serve"])


def test_every_serve_dependency_is_carried_present_or_not_needed() -> None:
    wheels, on_machine, not_needed = bundle_list("WHEELS"), bundle_list("ON_MACHINE"), bundle_list("NOT_NEEDED")
    assert "python-multipart" in wheels and "llama-cpp-python" in on_machine and "httpx2" in not_needed
    assert not (wheels & on_machine or wheels & not_needed or on_machine & not_needed)
    assert serve_dependencies() - (wheels | on_machine | not_needed) == set()


# In a fresh interpreter where the modules of the distributions named in argv[1] cannot be imported: every kinetic
# module imports, and the app `kinetic serve` builds for one model has its routes.
WITHOUT = """
import importlib, json, sys
from pathlib import Path
for module in json.loads(sys.argv[1]):
    sys.modules[module] = None
failed = {}
for name in json.loads(sys.argv[2]):
    try:
        importlib.import_module(name)
    except Exception as err:
        failed[name] = repr(err)
from kinetic.config.settings import ServerSettings
from kinetic.engine.llama import LlamaEngine
from tests.scripted import single_model_app
app = single_model_app(ServerSettings(), LlamaEngine(Path("unused.gguf")))
print(json.dumps({"failed": failed, "routes": len(app.routes)}))
"""


def test_the_server_builds_without_what_the_bundle_leaves_out() -> None:
    not_needed = bundle_list("NOT_NEEDED")
    modules = sorted(module for module, dists in packages_distributions().items()
                     if dist_names(dists) & not_needed)
    assert "huggingface_hub" in modules and "httpx2" in modules
    package = ROOT / "kinetic"
    names = sorted(".".join(path.relative_to(ROOT).with_suffix("").parts[:-1] if path.name == "__init__.py"
                            else path.relative_to(ROOT).with_suffix("").parts)
                   for path in package.rglob("*.py") if path.name != "__main__.py")
    found = subprocess.run([sys.executable, "-c", WITHOUT, json.dumps(modules), json.dumps(names)],
                           capture_output=True, text=True, check=True, cwd=ROOT, timeout=120)
    result = json.loads(found.stdout.splitlines()[-1])
    assert result["failed"] == {} and result["routes"] > 15
