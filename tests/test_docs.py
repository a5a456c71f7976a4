"""The documentation stays true: the site builds without a warning, the command-line reference is
the parsers' own, every shell and Python snippet in README.md and docs/ is run here unless it says
why not, and the contract page names every message, event, field and error code the code has.

Snippet convention: a fenced block must name its language. A ``sh``/``bash``/``shell``/``console``
or ``python``/``py`` block is run by :func:`test_snippet_runs` (shell in a scratch folder that sees
the checkout's ``.venv``, ``scripts`` and ``examples``; Python with this interpreter), unless the
nearest non-blank line before its fence is ``<!-- not run: REASON -->``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from myna import messages
from myna.events import EVENT_TYPES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
SHELL = {"sh", "bash", "shell", "console"}
PYTHON = {"python", "py"}
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(\S.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)\s*$")


@dataclasses.dataclass
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def snippets(page: Path) -> list[Snippet]:
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), None)
        assert end is not None, f"{page.name}:{i + 1}: a fence that never closes"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(before)
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end])
        found.append(Snippet(page, i + 1, lang, code + "\n", marker.group(1) if marker else None))
        i = end + 1
    return found


ALL = [s for page in PAGES for s in snippets(page)]
RUN = [s for s in ALL if s.lang in SHELL | PYTHON and s.not_run is None]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MYNA_", "LIVEKIT_"))}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's notice about MkDocs 2.0 on every build
    return env


# -- the site ------------------------------------------------------------------------------
def test_the_site_builds_strictly_without_a_warning(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=180, env=_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "WARNING" not in out, out
    assert (tmp_path / "site" / "contract" / "index.html").exists()
    assert "myna.session.Session" in (tmp_path / "site" / "api" / "index.html").read_text()


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in DOCS.glob("*.md") if f": {p.name}" not in nav] == []


def test_the_readme_links_only_to_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    assert targets and [t for t in targets if not (ROOT / t).exists()] == []


#: What a user-facing page must not carry: pointers outside the repository, the project's own issue
#: history, or README sections that now live in docs/.
_STALE = re.compile(r"\.\./shared|\bDESIGN\b|shared[/]research|dsm_spec|\b[Ii]ssues? ?#?\d+|\bthe issue\b"
                    r"|README[:\s]+\"?[A-Z]")


def test_no_tracked_file_points_outside_the_repository_or_to_issues():
    """Sources, tests, scripts and examples too: a clone holds no design folder, and the project's
    own issue history means nothing to its users."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".sh", ".js", ".html", ".toml", ".yml", ".txt") or name == "tests/test_docs.py":
            continue
        text = path.read_text(errors="replace")
        found += [(name, m.group()) for m in _STALE.finditer(text) if not m.group().startswith("README")]
    assert found == []


def test_no_page_points_outside_the_repository_or_to_issues():
    hand_written = [p for p in [*PAGES, ROOT / "CHANGELOG.md"] if p.name != "cli.md"]
    assert [(p.name, m.group()) for p in hand_written for m in _STALE.finditer(p.read_text())] == []


def test_the_command_line_help_cites_no_issue_or_readme_section():
    text = (DOCS / "cli.md").read_text()
    assert [m.group() for m in _STALE.finditer(text)] == []


# -- the command-line reference ------------------------------------------------------------
def test_the_cli_reference_is_generated_from_the_parsers():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr
                                  + "\nrun: .venv/bin/python scripts/cli_reference.py (then commit docs/cli.md)")


def test_the_cli_reference_covers_every_command():
    text = (DOCS / "cli.md").read_text()
    for command in ("myna serve", "myna say", "myna token", "myna room", "myna worker", "myna talk", "myna bench ttfa",
                    "myna bench capacity", "myna bench speech"):
        assert f"`{command}`" in text, command
    assert "--max-turn-chars" in text and "--engine" in text


# -- snippets ------------------------------------------------------------------------------
def test_every_fence_names_its_language_and_every_mark_has_a_reason():
    assert [s.id for s in ALL if not s.lang] == []
    # A mark on a block that is never run anyway (json, text …) is a mistake: it hides nothing.
    assert [s.id for s in ALL if s.not_run is not None and s.lang not in SHELL | PYTHON] == []


def test_the_readme_keeps_its_two_commands():
    """The commands the front page promises, verbatim: the main job, and the tests (CI's)."""
    readme = {s.code.split("#")[0].strip() for s in snippets(ROOT / "README.md") if s.lang in SHELL}
    assert {"bash scripts/serve.sh", "bash scripts/test.sh"} <= readme
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.fixture
def scratch(tmp_path):
    """A folder where a snippet's relative paths (.venv/bin/myna, scripts/, examples/) work and
    whatever it writes (hello.wav) stays out of the checkout."""
    for name in (".venv", "scripts", "examples"):
        if (ROOT / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("snippet", RUN, ids=[s.id for s in RUN])
def test_snippet_runs(snippet, scratch):
    if snippet.lang in SHELL:
        argv = ["bash", "-euo", "pipefail", "-c", snippet.code]
    else:
        argv = [sys.executable, "-c", snippet.code]
    proc = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, f"{snippet.id} failed ({proc.returncode}):\n{snippet.code}\n{proc.stdout}\n{proc.stderr}"


def test_the_cheap_commands_are_among_those_run():
    """The convention is not an escape hatch: the front page's local commands are run."""
    run = "".join(s.code for s in RUN if s.page.name == "README.md")
    assert "myna --version" in run and "myna say" in run and "MynaTTSService()" in run and "livekit.TTS()" in run


# -- the contract page against the code ----------------------------------------------------
CONTRACT = (DOCS / "contract.md").read_text() if (DOCS / "contract.md").exists() else ""
#: How the code names an error code where it raises or sends one.
_RAISED = re.compile(r'(?:BadMessage|EngineError|HTTPError|SpeechError|AuthError|LimitExceeded|ErrorEvent|MynaError|'
                     r'_error|_refuse|openai_error|_error_response)\(\s*(?:\d{3},\s*)?(?:code=)?"([a-z]+(?:_[a-z]+)*)"'
                     r'|\bcode="([a-z_]+)"|"([a-z]+_expired)"')
#: Codes that never reach a client: a start-up failure, printed by the command line.
_START_UP_ONLY = {"no_voice"}


def _codes_in_code() -> set[str]:
    codes = set()
    for path in [*ROOT.glob("plugin/myna/**/*.py"), *ROOT.glob("server/myna/**/*.py")]:
        if "bench" in path.parts:  # tooling
            continue
        for match in _RAISED.finditer(path.read_text()):
            codes.add(next(g for g in match.groups() if g))
    return codes - _START_UP_ONLY


def test_the_contract_names_every_error_code_the_code_has():
    codes = _codes_in_code()
    assert len(codes) > 40  # (the pattern still finds them)
    assert sorted(c for c in codes | {"unavailable"} if f"`{c}`" not in CONTRACT) == []


def test_the_contract_names_every_event_and_its_fields():
    for kind, cls in EVENT_TYPES.items():
        assert f"`{kind}`" in CONTRACT, kind
        for field in dataclasses.fields(cls):
            key = field.metadata.get("key", field.name)
            assert f"`{key}`" in CONTRACT, (kind, key)


def test_the_contract_names_every_message_and_its_fields():
    for cls in (messages.Text, messages.EndTurn, messages.Interrupt, messages.Cancel, messages.Commit,
                messages.Pause, messages.Resume, messages.Config):
        kind = re.search(r'"type": "(\w+)"', cls.__doc__).group(1)
        assert f"| `{kind}` |" in CONTRACT, kind
        for field in dataclasses.fields(cls):
            if field.name != "prepare":  # the `prepare` message, not a field
                assert f"`{field.name}`" in CONTRACT, (kind, field.name)
    assert "`prepare`" in CONTRACT and f"1–{messages.MAX_TURN_ID} characters" in CONTRACT
