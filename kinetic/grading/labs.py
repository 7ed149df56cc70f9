"""Finding a lab's rules: `labs/<lab folder>/grading.py`, by the folder's path or by the lab's id.

Adding a lab is adding a folder: its `grading.py` defines `lab = Lab("lab-XX-YY", ...)` and the
checks. An id (`lab-04-02`) is looked up as a folder named `lab-04-02` or `lab-04-02-<anything>`
in the current folder (a student inside the lab folder), in `./labs/` and in the `labs/` of
every folder above, then in the `labs/` next to the kinetic package (a source checkout).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from kinetic.grading.checks import Lab

RULES_FILE = "grading.py"


class LabNotFound(LookupError):
    pass


def _matches(folder: Path, lab_id: str) -> bool:
    name = folder.name.lower()
    return (name == lab_id or name.startswith(lab_id + "-")) and (folder / RULES_FILE).is_file()


def lab_roots(cwd: Path | None = None) -> list[Path]:
    cwd = (cwd or Path.cwd()).resolve()
    roots = [cwd, *[parent / "labs" for parent in [cwd, *cwd.parents]]]
    roots.append(Path(__file__).resolve().parents[2] / "labs")  # a source checkout's labs/
    return list(dict.fromkeys(roots))


def find_lab_folder(spec: str, cwd: Path | None = None) -> Path:
    path = Path(spec)
    if path.is_file() and path.name == RULES_FILE:
        return path.parent.resolve()
    if path.is_dir():
        if (path / RULES_FILE).is_file():
            return path.resolve()
        raise LabNotFound(f"{spec} has no {RULES_FILE}: a lab folder holds its checks in {RULES_FILE}")
    lab_id = spec.lower()
    if not re.fullmatch(r"[\w.-]+", lab_id):
        raise LabNotFound(f"no lab folder at {spec}")
    roots = lab_roots(cwd)
    for root in roots:
        if _matches(root, lab_id):
            return root
        if root.is_dir():
            for folder in sorted(root.iterdir()):
                if folder.is_dir() and _matches(folder, lab_id):
                    return folder.resolve()
    looked = ", ".join(str(r) for r in roots if r.is_dir()) or "no labs/ folder"
    raise LabNotFound(f"no lab {spec!r}: looked for a folder {spec}[-...] with a {RULES_FILE} in {looked}; "
                      "give the lab folder's path instead")


def load_lab(spec: str, cwd: Path | None = None) -> Lab:
    folder = find_lab_folder(spec, cwd)
    module_name = "kinetic_lab_" + re.sub(r"\W", "_", folder.name)
    if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(folder / RULES_FILE):
        module = sys.modules[module_name]
    else:
        loader_spec = importlib.util.spec_from_file_location(module_name, folder / RULES_FILE)
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module  # dataclasses in the rules file look their module up
        loader_spec.loader.exec_module(module)
    lab = getattr(module, "lab", None)
    if not isinstance(lab, Lab):
        raise LabNotFound(f"{folder / RULES_FILE} defines no `lab = Lab(...)`")
    lab.folder = folder
    return lab
