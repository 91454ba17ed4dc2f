"""The private eval of each simulated family: its held-out prompts, scored by the same preference.

They live here, in code, not under a checkout's ``evals/`` (which holds only what a person wrote:
a fresh checkout's ``tracerl tenant list`` shows no tenant). What needs them writes them:
``make demo`` and ``tracerl up`` (``ensure_suite``: a missing suite of the simulated target, into
``gate.suites_dir``), tests and benches (``write_suites`` into a folder of their own)::

    python -m pipelines.sim.evals DIR [TENANT]   # writes DIR/TENANT/<task>/<task>.toml + .jsonl (acme)

The primary scorer measures on the text what the family's `liked` measures on the reply (the
gate sees text only, no finish reason). The tools family's items carry their tools twice: in
`messages`, rendered by `with_tools` exactly as the gateway renders them (the gate's backend
sends `messages` only), and as the item's `tools` for the tool_call scorer.
tests/sim/test_evals.py checks the written files against the families and the scorers against
`liked`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipelines.sim.env import HiddenPreference
from pipelines.sim.families import Fact, FollowUp, Style, Tools, families, model_input

TENANT = "acme"  # the simulated app's tenant (pipelines/sim/traffic.py, pipelines/loop/demo.py)

# Text form of FollowUp(min_answer_words=6): at least six words, then the end of a sentence ('.' or
# '!'), then a question, then at most a cut-off tail with no sentence end.
FOLLOWUP_PATTERN = r"^\s*(?:\S+\s+){5,}\S*[.!]\s+[^.!?]*\?[^.!?]*$"

HEADER = ("# Private eval for the simulated task {task!r} (pipelines/sim/families.py, written by\n"
          "# pipelines/sim/evals.py): held-out prompts whose topics never appear in simulated\n"
          "# traffic. {why}\n")


def scorer_toml(fam: Any) -> tuple[str, str]:
    """(why, [scorer] TOML) for `fam`."""
    if isinstance(fam, HiddenPreference):  # concise: complete (a full stop) and short, on the text alone
        return ("Users like a short, complete reply (one that ends with a full stop).",
                "[scorer]\nkind = \"rubric\"\n\n[[scorer.criteria]]\nname = \"complete-and-short\"\nweight = 1.0\n"
                "check = { kind = \"regex\", pattern = '^[\\s\\S]{1,180}\\.\\s*$' }\n")
    if isinstance(fam, FollowUp):
        return ("Users like an answer that ends by asking them a follow-up question.",
                f"[scorer]\nkind = \"regex\"\npattern = '{FOLLOWUP_PATTERN}'\n")
    if isinstance(fam, Fact):
        return ("Users like a reply that commits to a concrete turnaround (hours, days, weeks).",
                f"[scorer]\nkind = \"regex\"\nignore_case = true\npattern = '{fam.pattern}'\n")
    if isinstance(fam, Style):
        return ("Users like a reply that opens with a greeting.",
                f"[scorer]\nkind = \"regex\"\nignore_case = true\npattern = '{fam.pattern}'\n")
    if isinstance(fam, Tools):
        return ("Users like a reply that makes a valid call to one of the tools sent.",
                "[scorer]\nkind = \"tool_call\"  # the item's tools\n")
    raise ValueError(f"no eval recipe for family {getattr(fam, 'name', fam)!r}")


def items(fam: Any) -> list[dict]:
    out = []
    for m in fam.prompts("heldout"):
        if fam.tools:
            out.append({"messages": model_input(fam, m), "tools": list(fam.tools)})
        else:
            out.append({"messages": m})
    return out


def write_suite(fam: Any, root: Path, tenant: str = TENANT) -> Path:
    """`fam`'s suite into ``root/tenant/<task>/`` (replacing its two files); the TOML's path."""
    why, scorer = scorer_toml(fam)
    folder = Path(root) / tenant / fam.task
    folder.mkdir(parents=True, exist_ok=True)
    toml = folder / f"{fam.task}.toml"
    _write(folder / f"{fam.task}.jsonl", "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items(fam)))
    _write(toml, HEADER.format(task=fam.task, why=why) + f'name = "{fam.task}"\nrole = "primary"\n'
           f'items = "{fam.task}.jsonl"\n\n' + scorer)
    return toml


def _write(path: Path, text: str) -> None:
    """``text`` into ``path`` whole (a reader, or a second writer, never sees half a file)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_suites(root: str | Path, tenant: str = TENANT) -> Path:
    """Every simulated family's suite into ``root/tenant/<task>/``; returns ``root`` (so a
    config can name it: ``suites_dir = write_suites(tmp / "evals")``)."""
    for fam in families().values():
        write_suite(fam, Path(root), tenant)
    return Path(root)


def sim_family(task: str) -> Any | None:
    """The simulated family whose task is ``task``, or None (not a simulator's task)."""
    return next((f for f in families().values() if f.task == task), None)


def ensure_suite(suites_dir: str | Path, tenant: str, task: str) -> Path | None:
    """Write the simulated family's suite for tenant/task into ``suites_dir`` when the folder is
    missing (a suite there, the simulator's or someone's own, is left as it is); the folder
    written, or None (there already, or ``task`` is no simulated family's)."""
    fam = sim_family(task)
    folder = Path(suites_dir) / tenant / task
    if fam is None or folder.exists():
        return None
    return write_suite(fam, Path(suites_dir), tenant).parent


def main(root: str, tenant: str = TENANT) -> None:
    for fam in families().values():
        print(write_suite(fam, Path(root), tenant))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m pipelines.sim.evals DIR [TENANT]   (writes DIR/TENANT/<task>/, TENANT acme)")
    main(*sys.argv[1:])
